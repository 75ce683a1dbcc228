// BuildSlotService on the workflow engine and a real MariaDB, driven by a deploy-like workflow:
// the cap holds under 50 concurrent acquirers, production waiters are promoted before preview
// ones, a waiter cancelled before it got a slot leaves the wait list, and both handlers are
// idempotent.
#include "controlplane/services/buildslot/buildslot.h"

#include <atomic>
#include <map>
#include <mutex>
#include <thread>

#include <catch2/catch.hpp>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/wrappers.pb.h>

#include "controlplane/workflow/engine.h"
#include "controlplane/workflow/typed.h"
#include "tests/controlplane/workflow/fixture.h"
#include "tests/support/matchers.h"
#include "tests/support/threads.h"
#include "tests/support/wait.h"

namespace krane::services::buildslot {
namespace {

using krane::testing::eventually;
using workflow::Awakeable;
using workflow::Context;
using workflow::Engine;
using workflow::invocation;
using workflow::resultAs;
using workflow::ServiceDefinition;
using namespace std::chrono_literals;

// The Build workflow's input, and the data of its compensation: {"workspace", "production"}.
google::protobuf::Struct buildInput(const std::string& ws, bool production) {
  google::protobuf::Struct s;
  (*s.mutable_fields())["workspace"].set_string_value(ws);
  (*s.mutable_fields())["production"].set_bool_value(production);
  return s;
}

std::vector<std::string> ids(const google::protobuf::RepeatedPtrField<std::string>& list) {
  return {list.begin(), list.end()};
}

std::vector<std::string> ids(const google::protobuf::RepeatedPtrField<SlotWaiter>& list) {
  std::vector<std::string> out;
  for (const auto& w : list) out.push_back(w.deployment_id());
  return out;
}

ReleaseSlotRequest releaseOf(const std::string& deployment_id) {
  ReleaseSlotRequest r;
  r.set_deployment_id(deployment_id);
  return r;
}

class BuildSlotTest : public workflow::WorkflowTest {
 protected:
  BuildSlotTest() {
    for (const char* ws : {"ws1", "ws2"}) {
      REQUIRE_THAT(
          (*pool_->acquire())
              ->exec("INSERT INTO workspaces (id, name, slug, created_at) VALUES (?,?,?,1)",
                     {ws, ws, ws}),
          IsOk());
    }
  }
  void setQuota(const std::string& ws, int n) {
    REQUIRE_THAT((*pool_->acquire())
                     ->exec("INSERT INTO quotas (workspace_id, max_concurrent_builds, created_at)"
                            " VALUES (?, ?, 1)",
                            {ws, n}),
                 IsOk());
  }

  // A deploy-like workflow keyed by deployment id; input buildInput(workspace, production).
  Engine& start() {
    return engine([&](Engine& e) {
      REQUIRE_THAT(e.registerService(buildSlotService(pool_)), IsOk());
      using Input = google::protobuf::Struct;
      using Output = google::protobuf::StringValue;
      workflow::Handler build = workflow::typed<Input, Output>(
          [&](Context& ctx, const Input& in) -> absl::StatusOr<Output> {
            const std::string ws = in.fields().at("workspace").string_value();
            const std::string me = ctx.key();
            Awakeable slot = ctx.awakeable();
            workflow::compensate(ctx, "release slot", in, [](Context& ctx, const Input& in) {
              workflow::send(ctx, kServiceName, "Release",
                             in.fields().at("workspace").string_value(), releaseOf(ctx.key()));
              return absl::OkStatus();
            });
            AcquireSlotRequest acquire;
            acquire.set_deployment_id(me);
            acquire.set_awakeable_id(slot.id);
            acquire.set_is_production(in.fields().at("production").bool_value());
            auto acquired =
                workflow::await(ctx, workflow::call<AcquireSlotResponse>(
                                         ctx, kServiceName, "AcquireOrWait", ws, acquire));
            if (!acquired.ok()) return acquired.status();
            if (auto got = ctx.await(slot.future); !got.ok()) return got.status();
            auto built = ctx.runVoid("build", [&] {
              {
                std::lock_guard lock(mu_);
                order_.push_back(me);
              }
              const int now = ++building_;
              int prev = max_building_.load();
              while (now > prev && !max_building_.compare_exchange_weak(prev, now)) {
              }
              while (true) {
                {
                  std::lock_guard lock(mu_);
                  if (!closed_.count(me)) break;
                }
                std::this_thread::sleep_for(5ms);
              }
              std::this_thread::sleep_for(20ms);
              --building_;
              return absl::OkStatus();
            });
            if (!built.ok()) return built;
            workflow::send(ctx, kServiceName, "Release", ws, releaseOf(me));
            Output out;
            out.set_value("built");
            return out;
          });
      REQUIRE_THAT(
          e.registerService(ServiceDefinition::virtualObject("Build").exclusive("run", build)),
          IsOk());
    });
  }

  // Safe on any thread (no assertion here): the caller checks the result.
  static absl::StatusOr<std::string> send(Engine& e, const std::string& id, const std::string& ws,
                                          bool production) {
    return e.send(invocation("Build", "run", id, buildInput(ws, production)));
  }
  std::string deploy(Engine& e, const std::string& id, const std::string& ws, bool production) {
    auto r = send(e, id, ws, production);
    CHECK_THAT(r, IsOk());
    return r.ok() ? *r : "";
  }

  // "holder" takes the one slot of ws1 and builds until the test lets it go (closed_).
  std::string holdSlot(Engine& e, bool production) {
    {
      std::lock_guard lock(mu_);
      closed_.insert("holder");
    }
    const std::string holder = deploy(e, "holder", "ws1", production);
    REQUIRE(eventually([&] { return slots(e, "ws1").active_size() == 1; }));
    return holder;
  }

  BuildSlots slots(Engine& e, const std::string& ws) {
    auto r =
        resultAs<BuildSlots>(e.call(invocation(kServiceName, "Slots", ws, SlotsRequest()), 10s));
    CHECK_THAT(r, IsOk());
    return r.ok() ? *r : BuildSlots();
  }

  std::mutex mu_;
  std::vector<std::string> order_;
  std::set<std::string> closed_;  // deployments whose build step waits
  std::atomic<int> building_{0}, max_building_{0};
};

TEST_CASE_METHOD(BuildSlotTest, "cap is respected under fifty concurrent acquirers",
                 "[build-slot]") {
  setQuota("ws1", 3);
  Engine& e = start();
  std::vector<std::thread> ts;
  std::vector<std::string> invocations(50);
  krane::testing::ThreadFailures failures;
  for (int i = 0; i < 50; ++i) {
    ts.emplace_back([&, i] {
      auto id = send(e, "d" + std::to_string(i), "ws1", i % 2 == 0);
      if (failures.expectOk(id, "send d" + std::to_string(i))) invocations[i] = *id;
    });
  }
  for (auto& t : ts) t.join();
  CHECK(failures.all() == std::vector<std::string>{});
  for (const auto& id : invocations) {
    auto r = e.awaitResult(id, 120s);
    REQUIRE_THAT(r, IsOk());
  }
  CHECK(max_building_.load() <= 3);
  INFO("slots were used in parallel");
  CHECK(max_building_.load() >= 2);
  CHECK(order_.size() == 50u);
  REQUIRE(eventually([&] {
    BuildSlots s = slots(e, "ws1");
    return s.active().empty() && s.production().empty() && s.preview().empty();
  }));
}

TEST_CASE_METHOD(BuildSlotTest, "production waiters are promoted before preview ones",
                 "[build-slot]") {
  setQuota("ws1", 1);
  Engine& e = start();
  const std::string holder = holdSlot(e, false);
  std::vector<std::string> invs;
  invs.push_back(deploy(e, "p1", "ws1", false));
  REQUIRE(eventually([&] { return slots(e, "ws1").preview_size() == 1; }));
  invs.push_back(deploy(e, "p2", "ws1", false));
  REQUIRE(eventually([&] { return slots(e, "ws1").preview_size() == 2; }));
  invs.push_back(deploy(e, "x1", "ws1", true));
  REQUIRE(eventually([&] { return slots(e, "ws1").production_size() == 1; }));
  BuildSlots s = slots(e, "ws1");
  CHECK(ids(s.active()) == std::vector<std::string>{"holder"});
  CHECK(ids(s.preview()) == std::vector<std::string>{"p1", "p2"});
  CHECK(ids(s.production()) == std::vector<std::string>{"x1"});
  {
    std::lock_guard lock(mu_);
    closed_.clear();
  }
  REQUIRE_THAT(e.awaitResult(holder, 30s), IsOk());
  for (const auto& id : invs) REQUIRE_THAT(e.awaitResult(id, 30s), IsOk());
  std::lock_guard lock(mu_);
  CHECK(order_ == std::vector<std::string>{"holder", "x1", "p1", "p2"});
}

TEST_CASE_METHOD(BuildSlotTest, "release of a waiter that never got a slot", "[build-slot]") {
  setQuota("ws1", 1);
  Engine& e = start();
  const std::string holder = holdSlot(e, true);
  const std::string waiter = deploy(e, "w", "ws1", false);
  REQUIRE(eventually([&] { return slots(e, "ws1").preview_size() == 1; }));
  // Cancelling the waiting deploy runs its compensation: Release of a deployment still waiting.
  REQUIRE_THAT(e.cancel(waiter), IsOk());
  CHECK(absl::IsCancelled(e.awaitResult(waiter, 20s).status()));
  REQUIRE(eventually([&] { return slots(e, "ws1").preview().empty(); }));
  {
    std::lock_guard lock(mu_);
    closed_.clear();
  }
  REQUIRE_THAT(e.awaitResult(holder, 20s), IsOk());
  REQUIRE(eventually([&] { return slots(e, "ws1").active().empty(); }));
  std::lock_guard lock(mu_);
  INFO("the cancelled waiter was never promoted");
  CHECK(order_ == std::vector<std::string>{"holder"});
}

// A waiter whose deploy was killed while it waited (a kill runs no compensation, so it never
// leaves the list): the release passes it over, or the slot would go to a deploy that will never
// give it back, and every later one would wait for good.
TEST_CASE_METHOD(BuildSlotTest, "a release passes over a waiter whose deploy ended",
                 "[build-slot]") {
  for (const std::string& sql : krane::testing::appTenancySql()) exec(sql);
  setQuota("ws1", 1);
  Engine& e = start();
  const std::string holder = holdSlot(e, false);
  const std::string dead = deploy(e, "dead", "ws1", true);  // production: first in line
  REQUIRE(eventually([&] { return slots(e, "ws1").production_size() == 1; }));
  const std::string alive = deploy(e, "alive", "ws1", false);
  REQUIRE(eventually([&] { return slots(e, "ws1").preview_size() == 1; }));
  REQUIRE_THAT(e.kill(dead), IsOk());
  INFO("a kill runs no compensation: the killed deploy stays in line");
  CHECK(slots(e, "ws1").production_size() == 1);
  exec(
      "INSERT INTO deployments (id, workspace_id, project_id, app_id, environment_id, status,"
      " invocation_id, created_at) VALUES ('dead', 'ws', 'proj', 'app', 'prod', 'building', ?, 1)",
      {dead});
  {
    std::lock_guard lock(mu_);
    closed_.clear();
  }
  REQUIRE_THAT(e.awaitResult(holder, 20s), IsOk());
  INFO("the slot went to the live waiter, which built and gave it back");
  CHECK_THAT(e.awaitResult(alive, 20s), IsOk());
  REQUIRE(eventually([&] { return slots(e, "ws1").active().empty(); }));
  const BuildSlots end = slots(e, "ws1");
  CHECK(end.production().empty());
  CHECK(end.preview().empty());
  std::lock_guard lock(mu_);
  CHECK(order_ == std::vector<std::string>{"holder", "alive"});
}

TEST_CASE_METHOD(BuildSlotTest, "handlers are idempotent and refuse bad input", "[build-slot]") {
  // ws2 has no quota row: the default cap of 1 applies.
  Engine& e = start();
  auto acquire = [&](const std::string& d) {
    AcquireSlotRequest req;
    req.set_deployment_id(d);
    req.set_awakeable_id("prm_unknown_" + d);
    req.set_is_production(true);
    return e.call(invocation(kServiceName, "AcquireOrWait", "ws2", req), 10s);
  };
  // On the wire: proto3 JSON with the field names (false is the default, so it is left out).
  CHECK(*acquire("d1") == R"({"acquired":true})");
  CHECK(*acquire("d1") == R"({"acquired":true})");
  CHECK(*acquire("d2") == "{}");
  CHECK_FALSE(resultAs<AcquireSlotResponse>(acquire("d2"))->acquired());
  BuildSlots s = slots(e, "ws2");
  CHECK(ids(s.active()) == std::vector<std::string>{"d1"});
  CHECK(ids(s.production()) == std::vector<std::string>{"d2"});

  auto release = [&](const std::string& d) {
    auto r = resultAs<ReleaseSlotResponse>(
        e.call(invocation(kServiceName, "Release", "ws2", releaseOf(d)), 10s));
    CHECK_THAT(r, IsOk());
    return r.ok() ? *r : ReleaseSlotResponse();
  };
  auto first = release("d1");
  CHECK(first.released());
  CHECK(ids(first.promoted()) == std::vector<std::string>{"d2"});
  auto again = release("d1");
  CHECK_FALSE(again.released());
  CHECK(again.promoted().empty());
  CHECK(ids(slots(e, "ws2").active()) == std::vector<std::string>{"d2"});

  auto bad = e.call({kServiceName, "AcquireOrWait", "ws2", "{}"}, 10s);
  CHECK(absl::IsInvalidArgument(bad.status()));
  CHECK(workflow::isTerminal(bad.status()));
  CHECK_THAT(workflow::messageOf(bad.status()), Catch::Contains("deployment_id: required"));
  bad = e.call({kServiceName, "AcquireOrWait", "ws2", R"({"deployment_id":"d"})"}, 10s);
  CHECK_THAT(workflow::messageOf(bad.status()), Catch::Contains("awakeable_id: required"));
  bad = e.call({kServiceName, "AcquireOrWait", "ws2", "not json"}, 10s);
  CHECK_THAT(workflow::messageOf(bad.status()),
             Catch::StartsWith("input: not a valid krane.services.v1.AcquireSlotRequest"));
  bad = e.call({kServiceName, "AcquireOrWait", "ws2",
                R"({"deployment_id":"d","awakeable_id":"a","is_production":"yes"})"},
               10s);
  CHECK(absl::IsInvalidArgument(bad.status()));
  CHECK_THAT(workflow::messageOf(bad.status()), Catch::Contains("is_production"));
  bad = e.call({kServiceName, "Release", "ws2", R"({"deployment_id":""})"}, 10s);
  CHECK_THAT(workflow::messageOf(bad.status()), Catch::Contains("deployment_id: required"));
  // Nothing of the refused calls reached the state.
  s = slots(e, "ws2");
  CHECK(ids(s.active()) == std::vector<std::string>{"d2"});
  CHECK(s.production().empty());
  CHECK(s.preview().empty());
}

// State written by the first version (three JSON arrays) is read, and replaced by one message at
// the next change.
TEST_CASE_METHOD(BuildSlotTest, "state of the first version is read and migrated", "[build-slot]") {
  setQuota("ws1", 2);
  auto put = [&](const std::string& name, const std::string& value) {
    REQUIRE_THAT(
        (*pool_->acquire())
            ->exec("INSERT INTO workflow_state (service, object_key, name, value, updated_at)"
                   " VALUES (?, 'ws1', ?, ?, 1)",
                   {kServiceName, name, db::Blob{value}}),
        IsOk());
  };
  put("active_slots", R"(["old-1","old-2"])");
  put("prod_wait_list", R"([{"deployment_id":"old-3","awakeable_id":"prm_x_1"}])");
  put("preview_wait_list", "[]");
  Engine& e = start();
  BuildSlots s = slots(e, "ws1");
  CHECK(ids(s.active()) == std::vector<std::string>{"old-1", "old-2"});
  CHECK(ids(s.production()) == std::vector<std::string>{"old-3"});
  REQUIRE(s.production(0).awakeable_id() == "prm_x_1");

  auto released = resultAs<ReleaseSlotResponse>(
      e.call(invocation(kServiceName, "Release", "ws1", releaseOf("old-1")), 10s));
  REQUIRE_THAT(released, IsOk());
  CHECK(ids(released->promoted()) == std::vector<std::string>{"old-3"});
  CHECK(ids(slots(e, "ws1").active()) == std::vector<std::string>{"old-2", "old-3"});
  CHECK(scalar("SELECT COUNT(*) FROM workflow_state WHERE object_key = 'ws1'"
               " AND name IN ('active_slots', 'prod_wait_list', 'preview_wait_list')") == 0);
  CHECK(scalar("SELECT COUNT(*) FROM workflow_state WHERE object_key = 'ws1' AND name = 'slots'") ==
        1);
}

}  // namespace
}  // namespace krane::services::buildslot
