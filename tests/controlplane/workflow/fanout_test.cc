// Fan-out and the reach of a cancel: awaitAll collects N calls with one wake-up, a cancel goes
// down the call tree and reaches an invocation waiting to retry, and a replica leaves the
// invocations of handlers it does not know to one that does (rolling upgrades).
#include <atomic>
#include <map>
#include <mutex>
#include <thread>

#include <catch2/catch.hpp>

#include "controlplane/workflow/engine.h"
#include "controlplane/workflow/operations.h"
#include "tests/controlplane/workflow/fixture.h"
#include "tests/support/matchers.h"
#include "tests/support/wait.h"

namespace krane::workflow {
namespace {

using krane::testing::eventually;
using namespace std::chrono_literals;

// "Worker.h" waits on an awakeable that the test settles; "Parent.h" fans out to N workers and
// collects them with awaitAll. The test counts how often the parent's handler runs.
class FanOutTest : public WorkflowTest {
 protected:
  static constexpr int kWorkers = 40;

  Engine& start() {
    return engine([&](Engine& e) {
      REQUIRE_THAT(e.registerService(ServiceDefinition::service("Worker").handler(
                       "h",
                       [&](Context& ctx, const std::string& input) -> absl::StatusOr<std::string> {
                         Awakeable w = ctx.awakeable();
                         ctx.runVoid("publish",
                                     [&] {
                                       std::lock_guard lock(mu_);
                                       awakeables_[input] = w.id;
                                       return absl::OkStatus();
                                     })
                             .IgnoreError();
                         return ctx.await(w.future);
                       })),
                   IsOk());
      REQUIRE_THAT(e.registerService(ServiceDefinition::service("Parent").handler(
                       "h",
                       [&](Context& ctx, const std::string&) -> absl::StatusOr<std::string> {
                         ++parent_runs_;
                         std::vector<Future> calls;
                         for (int i = 0; i < kWorkers; ++i) {
                           calls.push_back(ctx.call("Worker", "h", "", std::to_string(i)));
                         }
                         auto all = ctx.awaitAll(calls);
                         if (!all.ok()) return all.status();
                         std::string out;
                         for (const auto& r : *all) out += (r.ok() ? *r : "!") + " ";
                         return out;
                       })),
                   IsOk());
    });
  }

  std::string awakeableOf(int worker) {
    std::lock_guard lock(mu_);
    auto it = awakeables_.find(std::to_string(worker));
    return it == awakeables_.end() ? "" : it->second;
  }
  size_t published() {
    std::lock_guard lock(mu_);
    return awakeables_.size();
  }
  int64_t waitingFor(const std::string& id) {
    return scalar("SELECT COALESCE(waiting_for, -1) FROM workflow_invocations WHERE id = ?", {id});
  }

  std::mutex mu_;
  std::map<std::string, std::string> awakeables_;
  std::atomic<int> parent_runs_{0};
};

TEST_CASE_METHOD(FanOutTest, "awaitAll collects a fan-out with one wake-up", "[fanout]") {
  Engine& e = start();
  auto parent = e.send({"Parent", "h", "", ""});
  REQUIRE_THAT(parent, IsOk());
  REQUIRE(eventually([&] {
    return statusOf(*parent) == "suspended" && published() == static_cast<size_t>(kWorkers);
  }));
  CHECK(waitingFor(*parent) == kWorkers);
  CHECK(parent_runs_.load() == 1);

  // Settled in reverse order, one rejected: every settle but the last only counts down.
  for (int i = kWorkers - 1; i >= 1; --i) {
    if (i == 7) {
      REQUIRE_THAT(e.rejectAwakeable(awakeableOf(i), "worker 7 broke"), IsOk());
    } else {
      REQUIRE_THAT(e.resolveAwakeable(awakeableOf(i), std::to_string(i * 10)), IsOk());
    }
  }
  REQUIRE(eventually([&] { return waitingFor(*parent) == 1; }));
  CHECK(statusOf(*parent) == "suspended");
  CHECK(parent_runs_.load() == 1);

  REQUIRE_THAT(e.resolveAwakeable(awakeableOf(0), "0"), IsOk());
  auto r = e.awaitResult(*parent, 20s);
  REQUIRE_THAT(r, IsOk());
  std::string expected;
  for (int i = 0; i < kWorkers; ++i) expected += (i == 7 ? "!" : std::to_string(i * 10)) + " ";
  CHECK(*r == expected);
  INFO("one execution to fan out, one to collect: awaiting one by one would take " << kWorkers + 1);
  CHECK(parent_runs_.load() == 2);
  auto journal = showInvocation(*pool_, *parent);
  REQUIRE_THAT(journal, IsOk());
  REQUIRE_FALSE(journal->journal.empty());
  CHECK(journal->journal.back().kind == "await_all");
  CHECK(journal->journal.back().name == "n=40");
}

TEST_CASE_METHOD(FanOutTest, "awaitAll of settled futures and of none does not suspend",
                 "[fanout]") {
  std::atomic<int> runs{0};
  Engine& e = engine([&](Engine& e) {
    REQUIRE_THAT(e.registerService(ServiceDefinition::service("Quick").handler(
                     "h",
                     [&](Context& ctx, const std::string&) -> absl::StatusOr<std::string> {
                       ++runs;
                       auto none = ctx.awaitAll({});
                       if (!none.ok() || !none->empty()) return absl::InternalError("not empty");
                       Awakeable a = ctx.awakeable();
                       Awakeable b = ctx.awakeable();
                       ctx.resolveAwakeable(a.id, "a");
                       ctx.rejectAwakeable(b.id, "b failed");
                       Future t = ctx.timer(1ms);
                       auto all = ctx.awaitAll({a.future, b.future, a.future, t});
                       if (!all.ok()) return all.status();
                       if (all->size() != 4u) return absl::InternalError("not 4 outcomes");
                       return strCat(*(*all)[0], "|", messageOf((*all)[1].status()), "|",
                                     *(*all)[2], "|", (*all)[3].ok() ? "fired" : "?");
                     })),
                 IsOk());
  });
  auto r = e.call({"Quick", "h", "", ""}, 20s);
  REQUIRE_THAT(r, IsOk());
  CHECK(*r == "a|b failed|a|fired");
}

// A cancel of the parent reaches the workers it is waiting for, which run their compensations.
TEST_CASE_METHOD(FanOutTest, "a cancel goes down the call tree", "[fanout][cancel]") {
  Engine& e = start();
  auto parent = e.send({"Parent", "h", "", ""});
  REQUIRE(eventually([&] {
    return statusOf(*parent) == "suspended" && published() == static_cast<size_t>(kWorkers);
  }));
  REQUIRE_THAT(e.resolveAwakeable(awakeableOf(3), "done early"), IsOk());
  REQUIRE(eventually([&] {
    return scalar(
               "SELECT COUNT(*) FROM workflow_invocations WHERE service = 'Worker'"
               " AND status = 'succeeded'") == 1;
  }));
  REQUIRE_THAT(e.cancel(*parent), IsOk());
  CHECK_THAT(e.awaitResult(*parent, 20s), IsError(absl::StatusCode::kCancelled));
  REQUIRE(eventually([&] {
    return scalar(
               "SELECT COUNT(*) FROM workflow_invocations WHERE service = 'Worker'"
               " AND status = 'cancelled'") == kWorkers - 1;
  }));
  CHECK(scalar("SELECT COUNT(*) FROM workflow_invocations WHERE service = 'Worker'"
               " AND status = 'succeeded'") == 1);
  CHECK(parent_runs_.load() <= 3);
}

// A cancel does not wait out the retry delay of an invocation that is waiting to retry.
TEST_CASE_METHOD(WorkflowTest, "a cancel reaches an invocation waiting to retry",
                 "[fanout][cancel]") {
  std::atomic<int> undone{0};
  Engine& e = engine([&](Engine& e) {
    RetryPolicy p;
    p.initial_interval = std::chrono::minutes(10);
    p.max_attempts = 5;
    REQUIRE_THAT(
        e.registerService(
            ServiceDefinition::service("Stuck")
                .handler("h",
                         [&](Context& ctx, const std::string&) -> absl::StatusOr<std::string> {
                           ctx.compensateRun("undo", [&] {
                             ++undone;
                             return absl::OkStatus();
                           });
                           return ctx.run("depot", []() -> absl::StatusOr<std::string> {
                             return absl::UnavailableError("depot is down");
                           });
                         })
                .retry(p)),
        IsOk());
  });
  auto id = e.send({"Stuck", "h", "", ""});
  REQUIRE(eventually([&] {
    return scalar("SELECT attempts FROM workflow_invocations WHERE id = ?", {*id}) == 1 &&
           statusOf(*id) == "ready";
  }));
  REQUIRE_THAT(e.cancel(*id), IsOk());
  CHECK_THAT(e.awaitResult(*id, 10s), IsError(absl::StatusCode::kCancelled));
  CHECK(statusOf(*id) == "cancelled");
  CHECK(undone.load() == 1);
}

// A cancel that arrives while an attempt runs is not parked behind that attempt's retry delay.
TEST_CASE_METHOD(WorkflowTest, "a cancel during a failing attempt skips the retry delay",
                 "[fanout][cancel]") {
  std::atomic<bool> in_step{false}, release{false};
  Engine& e = engine([&](Engine& e) {
    RetryPolicy p;
    p.initial_interval = std::chrono::minutes(10);
    REQUIRE_THAT(e.registerService(
                     ServiceDefinition::service("Slow")
                         .handler("h",
                                  [&](Context& ctx, const std::string&) {
                                    return ctx.run("depot", [&]() -> absl::StatusOr<std::string> {
                                      in_step = true;
                                      while (!release) std::this_thread::sleep_for(5ms);
                                      return absl::UnavailableError("depot is down");
                                    });
                                  })
                         .retry(p)),
                 IsOk());
  });
  auto id = e.send({"Slow", "h", "", ""});
  REQUIRE(eventually([&] { return in_step.load(); }));
  REQUIRE_THAT(e.cancel(*id), IsOk());
  release = true;
  CHECK_THAT(e.awaitResult(*id, 10s), IsError(absl::StatusCode::kCancelled));
}

// During a rolling upgrade a replica that does not know a handler leaves its invocations alone;
// a replica that knows it runs them.
TEST_CASE_METHOD(WorkflowTest, "an unknown handler waits for a replica that knows it",
                 "[fanout][upgrade]") {
  Engine& old_replica = engine([&](Engine& e) {
    REQUIRE_THAT(
        e.registerService(ServiceDefinition::service("Deploy").handler(
            "h", [](Context&, const std::string&) { return absl::StatusOr<std::string>("v1"); })),
        IsOk());
  });
  Engine new_replica(pool_, fastOptions());
  REQUIRE_THAT(
      new_replica.registerService(
          ServiceDefinition::service("Deploy")
              .handler("h", [](Context&,
                               const std::string&) { return absl::StatusOr<std::string>("v2"); })
              .handler("promote",
                       [](Context&, const std::string&) {
                         return absl::StatusOr<std::string>("promoted");
                       })),
      IsOk());
  REQUIRE_THAT(
      new_replica.registerService(ServiceDefinition::service("Routing").handler(
          "h", [](Context&, const std::string&) { return absl::StatusOr<std::string>("routed"); })),
      IsOk());
  // Stored by the new version before any replica of it runs.
  auto promote = new_replica.send({"Deploy", "promote", "", ""});
  auto route = new_replica.send({"Routing", "h", "", ""});
  REQUIRE_THAT(promote, IsOk());
  REQUIRE_THAT(route, IsOk());
  CHECK_THAT(old_replica.call({"Deploy", "h", "", ""}, 20s), IsOk());
  std::this_thread::sleep_for(300ms);  // many claim rounds of the old replica
  CHECK(statusOf(*promote) == "ready");
  CHECK(statusOf(*route) == "ready");

  new_replica.start();
  CHECK(*new_replica.awaitResult(*promote, 20s) == "promoted");
  CHECK(*new_replica.awaitResult(*route, 20s) == "routed");
  new_replica.stop();
}

}  // namespace
}  // namespace krane::workflow
