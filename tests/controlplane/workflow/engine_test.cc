// The workflow engine against a real MariaDB: journaled steps and replay, keyed exclusive and
// shared handlers, awakeables, timers, calls, retries, compensations, cancellation,
// idempotency, fencing and bad input.
#include "controlplane/workflow/engine.h"

#include <atomic>
#include <mutex>
#include <set>
#include <thread>

#include <catch2/catch.hpp>

#include "common/clock.h"
#include "common/host_port.h"
#include "common/status.h"
#include "common/strings.h"
#include "controlplane/workflow/maintenance.h"
#include "controlplane/workflow/operations.h"
#include "tests/controlplane/workflow/fixture.h"
#include "tests/support/matchers.h"
#include "tests/support/tcp_relay.h"
#include "tests/support/threads.h"
#include "tests/support/wait.h"

namespace krane::workflow {
namespace {

using krane::testing::eventually;
using namespace std::chrono_literals;

TEST_CASE_METHOD(WorkflowTest, "run steps are journaled and not repeated after a suspension",
                 "[workflow]") {
  std::atomic<int> step1{0}, step2{0};
  Handout handout;
  Engine& e = engine([&](Engine& e) {
    REQUIRE_THAT(e.registerService(ServiceDefinition::service("Steps").handler(
                     "go",
                     [&](Context& ctx, const std::string& input) -> absl::StatusOr<std::string> {
                       auto a = ctx.run("one", [&]() -> absl::StatusOr<std::string> {
                         ++step1;
                         return "A" + input;
                       });
                       if (!a.ok()) return a.status();
                       Awakeable w = ctx.awakeable();
                       handout.give(ctx, w);
                       auto got = ctx.await(w.future);
                       if (!got.ok()) return got.status();
                       auto b = ctx.run("two", [&]() -> absl::StatusOr<std::string> {
                         ++step2;
                         return *a + *got;
                       });
                       return b;
                     })),
                 IsOk());
  });
  auto id = e.send({"Steps", "go", "", "x"});
  REQUIRE_THAT(id, IsOk());
  REQUIRE(eventually([&] { return statusOf(*id) == "suspended"; }));
  const std::string awk = handout.id();
  REQUIRE_FALSE(awk.empty());
  REQUIRE_THAT(e.resolveAwakeable(awk, "B"), IsOk());
  auto result = e.awaitResult(*id, 20s);
  REQUIRE_THAT(result, IsOk());
  CHECK(*result == "AxB");
  INFO("replay returned the journaled result");
  CHECK(step1.load() == 1);
  CHECK(step2.load() == 1);
  auto detail = showInvocation(*pool_, *id);
  REQUIRE_THAT(detail, IsOk());
  std::vector<std::string> kinds;
  for (const auto& j : detail->journal) kinds.push_back(j.kind);
  CHECK(kinds == std::vector<std::string>{"run", "awakeable", "run", "await", "run"});
  CHECK(detail->summary.status == "succeeded");
  // Resolving again is harmless; an unknown awakeable is NOT_FOUND.
  CHECK_THAT(e.resolveAwakeable(awk, "C"), IsOk());
  CHECK(absl::IsNotFound(e.resolveAwakeable("prm_nope_1", "x")));
}

TEST_CASE_METHOD(WorkflowTest, "bad input is refused naming the field", "[workflow]") {
  Engine& e = engine([&](Engine& e) {
    REQUIRE_THAT(
        e.registerService(ServiceDefinition::virtualObject("Obj").exclusive(
            "h", [](Context&, const std::string&) { return absl::StatusOr<std::string>("ok"); })),
        IsOk());
    REQUIRE_THAT(e.registerService(ServiceDefinition::service("Plain").handler(
                     "h",
                     [](Context& ctx, const std::string&) {
                       // Calls a service nobody registered.
                       return ctx.await(ctx.call("Nope", "h", "", ""));
                     })),
                 IsOk());
    CHECK(absl::IsAlreadyExists(e.registerService(ServiceDefinition::service("Plain"))));
    CHECK(absl::IsInvalidArgument(e.registerService(ServiceDefinition::service("bad name"))));
  });
  auto s = e.send({"Nope", "h", "", ""});
  CHECK(absl::IsNotFound(s.status()));
  CHECK_THAT(messageOf(s.status()), Catch::Contains("service: unknown service 'Nope'"));
  s = e.send({"Obj", "nope", "k", ""});
  CHECK_THAT(messageOf(s.status()),
             Catch::Contains("handler: service 'Obj' has no handler 'nope'"));
  s = e.send({"Obj", "h", "", ""});
  CHECK(absl::IsInvalidArgument(s.status()));
  CHECK_THAT(messageOf(s.status()), Catch::Contains("key:"));
  s = e.send({"Plain", "h", "k", ""});
  CHECK_THAT(messageOf(s.status()), Catch::Contains("key:"));
  s = e.send({"Obj", "h", "k", std::string(2 << 20, 'x')});
  CHECK(absl::IsInvalidArgument(s.status()));
  CHECK_THAT(messageOf(s.status()), Catch::Contains("input: 2097152 bytes, more than the limit"));
  CHECK(scalar("SELECT COUNT(*) FROM workflow_invocations") == 0);

  // A call to an unknown service from a handler is a terminal error the handler sees.
  auto r = e.call({"Plain", "h", "", ""}, 20s);
  INFO(r.status());
  CHECK(absl::IsNotFound(r.status()));
  CHECK_THAT(messageOf(r.status()),
             Catch::Contains("call Nope.h: service: unknown service 'Nope'"));
  CHECK(isTerminal(r.status()));
}

TEST_CASE_METHOD(WorkflowTest,
                 "hundred concurrent calls on one key run one at a time in arrival order",
                 "[workflow]") {
  std::atomic<int> inside{0}, max_inside{0};
  std::mutex mu;
  std::vector<std::string> order;
  Engine& e = engine([&](Engine& e) {
    REQUIRE_THAT(e.registerService(ServiceDefinition::virtualObject("Counter").exclusive(
                     "add",
                     [&](Context& ctx, const std::string&) -> absl::StatusOr<std::string> {
                       const int now = ++inside;
                       int prev = max_inside.load();
                       while (now > prev && !max_inside.compare_exchange_weak(prev, now)) {
                       }
                       auto v = ctx.get("count");
                       const int n = v ? std::stoi(*v) + 1 : 1;
                       ctx.set("count", std::to_string(n));
                       ctx.runVoid("record",
                                   [&] {
                                     std::lock_guard lock(mu);
                                     order.push_back(ctx.invocationId());
                                     std::this_thread::sleep_for(1ms);
                                     return absl::OkStatus();
                                   })
                           .IgnoreError();
                       --inside;
                       return std::to_string(n);
                     })),
                 IsOk());
  });
  std::vector<std::thread> callers;
  std::vector<absl::StatusOr<std::string>> results(100, std::string());
  for (int i = 0; i < 100; ++i) {
    callers.emplace_back([&, i] { results[i] = e.call({"Counter", "add", "k1", ""}, 120s); });
  }
  for (auto& t : callers) t.join();
  std::set<std::string> seen;
  for (const auto& r : results) {
    REQUIRE_THAT(r, IsOk());
    seen.insert(*r);
  }
  INFO("every call saw a distinct count: no lost update");
  CHECK(seen.size() == 100u);
  INFO("never two at once on one key");
  CHECK(max_inside.load() == 1);
  // Arrival order is the key queue's order (key_seq): execution followed it.
  std::vector<std::string> arrival;
  auto rows = (*pool_->acquire())
                  ->query(
                      "SELECT id FROM workflow_invocations WHERE service = 'Counter'"
                      " ORDER BY key_seq");
  for (const auto& r : rows->rows) arrival.push_back(r.str(0));
  CHECK(order == arrival);
  CHECK(scalar("SELECT COUNT(*) FROM workflow_keys WHERE holder IS NOT NULL") == 0);
}

TEST_CASE_METHOD(WorkflowTest,
                 "sequential sends on one key run in send order and other keys run in parallel",
                 "[workflow]") {
  std::mutex mu;
  std::vector<std::string> order;
  Engine& e = engine([&](Engine& e) {
    REQUIRE_THAT(e.registerService(ServiceDefinition::virtualObject("Log").exclusive(
                     "append",
                     [&](Context& ctx, const std::string& input) {
                       ctx.runVoid("append",
                                   [&] {
                                     std::lock_guard lock(mu);
                                     order.push_back(ctx.key() + ":" + input);
                                     return absl::OkStatus();
                                   })
                           .IgnoreError();
                       return absl::StatusOr<std::string>(input);
                     })),
                 IsOk());
  });
  std::vector<std::string> ids;
  for (int i = 0; i < 20; ++i) {
    ids.push_back(*e.send({"Log", "append", "a", std::to_string(i)}));
    ids.push_back(*e.send({"Log", "append", "b", std::to_string(i)}));
  }
  for (const auto& id : ids) REQUIRE_THAT(e.awaitResult(id, 30s), IsOk());
  std::vector<std::string> a, b;
  for (const auto& s : order) (s[0] == 'a' ? a : b).push_back(s.substr(2));
  for (int i = 0; i < 20; ++i) {
    CHECK(a[i] == std::to_string(i));
    CHECK(b[i] == std::to_string(i));
  }
}

// The exclusive handler keeps its key while suspended; a shared handler of the same key runs
// meanwhile and reads the state; another exclusive one waits.
TEST_CASE_METHOD(WorkflowTest, "shared handler runs while an exclusive one is suspended",
                 "[workflow]") {
  Engine& e = engine([&](Engine& e) {
    REQUIRE_THAT(
        e.registerService(
            ServiceDefinition::virtualObject("Deploy")
                .exclusive("deploy",
                           [](Context& ctx, const std::string&) -> absl::StatusOr<std::string> {
                             Awakeable w = ctx.awakeable();
                             ctx.set("awakeable", w.id);
                             ctx.set("phase", "waiting");
                             auto r = ctx.await(w.future);
                             if (!r.ok()) return r.status();
                             ctx.set("phase", "done");
                             ctx.clear("awakeable");
                             return "deployed:" + *r;
                           })
                .exclusive("other",
                           [](Context& ctx, const std::string&) -> absl::StatusOr<std::string> {
                             return ctx.get("phase").value_or("none");
                           })
                .shared("notify",
                        [](Context& ctx, const std::string& input) -> absl::StatusOr<std::string> {
                          auto id = ctx.get("awakeable");
                          if (!id)
                            return terminalError(absl::StatusCode::kFailedPrecondition,
                                                 "no waiter");
                          return ctx.get("phase").value_or("") + "|" + *id;
                        })
                .shared("write",
                        [](Context& ctx, const std::string&) -> absl::StatusOr<std::string> {
                          ctx.set("phase", "x");
                          return std::string("unreachable");
                        })),
        IsOk());
  });
  auto deploy = e.send({"Deploy", "deploy", "d1", ""});
  REQUIRE_THAT(deploy, IsOk());
  REQUIRE(eventually([&] { return statusOf(*deploy) == "suspended"; }));
  auto other = e.send({"Deploy", "other", "d1", ""});
  REQUIRE_THAT(other, IsOk());
  auto notified = e.call({"Deploy", "notify", "d1", ""}, 20s);
  REQUIRE_THAT(notified, IsOk());
  CHECK_THAT(*notified, Catch::Contains("waiting|prm_"));
  INFO("the suspended exclusive invocation keeps its key");
  CHECK(statusOf(*other) == "queued");
  auto write = e.call({"Deploy", "write", "d1", ""}, 20s);
  CHECK(absl::IsFailedPrecondition(write.status()));
  CHECK_THAT(messageOf(write.status()),
             Catch::Contains("can only be written by an exclusive handler"));

  const std::string awk = notified->substr(notified->find('|') + 1);
  REQUIRE_THAT(e.resolveAwakeable(awk, "v1"), IsOk());
  CHECK(*e.awaitResult(*deploy, 20s) == "deployed:v1");
  CHECK(*e.awaitResult(*other, 20s) == "done");
}

TEST_CASE_METHOD(WorkflowTest, "awakeable resolved before the handler waits", "[workflow]") {
  std::atomic<bool> release{false};
  Handout handout;
  Engine& e = engine([&](Engine& e) {
    REQUIRE_THAT(e.registerService(ServiceDefinition::service("Early").handler(
                     "h",
                     [&](Context& ctx, const std::string&) -> absl::StatusOr<std::string> {
                       Awakeable w = ctx.awakeable();
                       handout.give(ctx, w, "hand out");
                       // Still running (not suspended) when it is resolved.
                       ctx.runVoid("wait",
                                   [&] {
                                     while (!release.load()) std::this_thread::sleep_for(2ms);
                                     return absl::OkStatus();
                                   })
                           .IgnoreError();
                       return ctx.await(w.future);
                     })),
                 IsOk());
  });
  auto id = e.send({"Early", "h", "", ""});
  REQUIRE(eventually([&] { return !handout.id().empty(); }));
  const std::string awk = handout.id();
  REQUIRE_THAT(e.resolveAwakeable(awk, "early"), IsOk());
  release = true;
  auto r = e.awaitResult(*id, 20s);
  REQUIRE_THAT(r, IsOk());
  CHECK(*r == "early");
  INFO("it never had to suspend");
  CHECK(e.stats().suspensions.load() == 0u);
}

class SelectTest : public WorkflowTest {
 protected:
  Engine& start() {
    return engine([&](Engine& e) {
      REQUIRE_THAT(e.registerService(ServiceDefinition::service("Race").handler(
                       "h",
                       [&](Context& ctx, const std::string& input) -> absl::StatusOr<std::string> {
                         Awakeable w = ctx.awakeable();
                         ctx.runVoid("hand out",
                                     [&] {
                                       std::lock_guard lock(mu_);
                                       awakeable_ = w.id;
                                       return absl::OkStatus();
                                     })
                             .IgnoreError();
                         Future t = ctx.timer(std::chrono::milliseconds(std::stoi(input)));
                         auto s = ctx.select({w.future, t});
                         if (!s.ok()) return s.status();
                         if (!s->result.ok()) return s->result.status();
                         return s->index == 0 ? "awakeable:" + *s->result : std::string("timeout");
                       })),
                   IsOk());
    });
  }
  std::string awakeable() {
    std::lock_guard lock(mu_);
    return awakeable_;
  }
  std::mutex mu_;
  std::string awakeable_;
};

TEST_CASE_METHOD(SelectTest, "timer fires first", "[select]") {
  Engine& e = start();
  auto id = e.send({"Race", "h", "", "300"});
  REQUIRE(eventually([&] { return statusOf(*id) == "suspended"; }));
  auto r = e.awaitResult(*id, 20s);
  REQUIRE_THAT(r, IsOk());
  CHECK(*r == "timeout");
  // Resolving the awakeable afterwards changes nothing.
  REQUIRE_THAT(e.resolveAwakeable(awakeable(), "late"), IsOk());
  CHECK(*e.awaitResult(*id, 1s) == "timeout");
}

TEST_CASE_METHOD(SelectTest, "awakeable first", "[select]") {
  Engine& e = start();
  auto id = e.send({"Race", "h", "", "600000"});
  REQUIRE(eventually([&] { return statusOf(*id) == "suspended"; }));
  REQUIRE_THAT(e.resolveAwakeable(awakeable(), "v"), IsOk());
  auto r = e.awaitResult(*id, 20s);
  REQUIRE_THAT(r, IsOk());
  CHECK(*r == "awakeable:v");
}

// A cancel reaches a select as CANCELLED, not as an index: code that reads "not the timer" as
// success cannot turn a cancel into a finished deploy.
TEST_CASE_METHOD(SelectTest, "a cancel during a select is the cancellation, not an index",
                 "[select]") {
  Engine& e = start();
  auto id = e.send({"Race", "h", "", "600000"});
  REQUIRE(eventually([&] { return statusOf(*id) == "suspended"; }));
  REQUIRE_THAT(e.cancel(*id), IsOk());
  auto r = e.awaitResult(*id, 20s);
  CHECK_THAT(r, IsError(absl::StatusCode::kCancelled));
  CHECK(statusOf(*id) == "cancelled");
  auto rows = (*pool_->acquire())
                  ->query(
                      "SELECT name, ok FROM workflow_journal WHERE invocation_id = ?"
                      " AND kind = 'select'",
                      {*id});
  REQUIRE_THAT(rows, IsOk());
  REQUIRE(rows->rows.size() == 1u);
  CHECK(rows->rows[0].str("name") == "cancelled");
  CHECK(rows->rows[0].i64("ok") == 0);
}

TEST_CASE_METHOD(WorkflowTest, "durable sleep suspends without a thread", "[workflow]") {
  Engine& e = engine([&](Engine& e) {
    REQUIRE_THAT(e.registerService(ServiceDefinition::service("Sleeper").handler(
                     "h",
                     [](Context& ctx, const std::string&) -> absl::StatusOr<std::string> {
                       auto s = ctx.sleep(400ms);
                       if (!s.ok()) return s;
                       return std::string("woke");
                     })),
                 IsOk());
  });
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::string> ids;
  // More sleepers than threads: suspended invocations hold none.
  for (int i = 0; i < 40; ++i) ids.push_back(*e.send({"Sleeper", "h", "", ""}));
  REQUIRE(eventually([&] {
    return scalar("SELECT COUNT(*) FROM workflow_invocations WHERE status = 'suspended'") +
               scalar("SELECT COUNT(*) FROM workflow_invocations WHERE status = 'succeeded'") ==
           40;
  }));
  for (const auto& id : ids) CHECK(*e.awaitResult(id, 20s) == "woke");
  CHECK((std::chrono::steady_clock::now() - start) >= 400ms);
}

TEST_CASE_METHOD(WorkflowTest, "calls sends delayed sends and fan out", "[workflow]") {
  std::atomic<int64_t> delayed_ran_at{0};
  Engine& e = engine([&](Engine& e) {
    REQUIRE_THAT(e.registerService(ServiceDefinition::service("Math").handler(
                     "square",
                     [](Context&, const std::string& in) {
                       const int n = std::stoi(in);
                       return absl::StatusOr<std::string>(std::to_string(n * n));
                     })),
                 IsOk());
    REQUIRE_THAT(e.registerService(ServiceDefinition::service("Later").handler(
                     "h",
                     [&](Context& ctx, const std::string&) {
                       delayed_ran_at = unixMillis();
                       return absl::StatusOr<std::string>("");
                     })),
                 IsOk());
    REQUIRE_THAT(e.registerService(ServiceDefinition::service("Sum").handler(
                     "h",
                     [](Context& ctx, const std::string&) -> absl::StatusOr<std::string> {
                       std::vector<Future> fs;
                       for (int i = 1; i <= 5; ++i) {
                         fs.push_back(ctx.call("Math", "square", "", std::to_string(i)));
                       }
                       ctx.send("Later", "h", "", "", 500ms);
                       int sum = 0;
                       for (const Future& f : fs) {
                         auto r = ctx.await(f);
                         if (!r.ok()) return r.status();
                         sum += std::stoi(*r);
                       }
                       return std::to_string(sum);
                     })),
                 IsOk());
  });
  const int64_t started = unixMillis();
  auto r = e.call({"Sum", "h", "", ""}, 20s);
  REQUIRE_THAT(r, IsOk());
  CHECK(*r == "55");
  REQUIRE(eventually([&] { return delayed_ran_at.load() != 0; }));
  CHECK((delayed_ran_at.load() - started) >= 450);
  CHECK(scalar("SELECT COUNT(*) FROM workflow_invocations WHERE parent_id IS NOT NULL") == 6);
}

// A kill does not reach the children, and a finished caller is cleaned up after the retention:
// a child that outlives both has no one to tell its result, and must still end (and free its
// key), or be killed.
TEST_CASE_METHOD(WorkflowTest, "a child whose caller was killed and cleaned up still finishes",
                 "[workflow]") {
  Handout handout;
  Engine& e = engine([&](Engine& e) {
    REQUIRE_THAT(e.registerService(waitService(handout)), IsOk());
    REQUIRE_THAT(e.registerService(ServiceDefinition::service("Parent").handler(
                     "h",
                     [](Context& ctx, const std::string&) -> absl::StatusOr<std::string> {
                       return ctx.await(ctx.call("Wait", "go", "", ""));
                     })),
                 IsOk());
  });
  auto parent = e.send({"Parent", "h", "", ""});
  REQUIRE_THAT(parent, IsOk());
  REQUIRE(eventually([&] { return !handout.id().empty(); }));
  REQUIRE_THAT(e.kill(*parent), IsOk());
  REQUIRE(eventually([&] { return statusOf(*parent) == "killed"; }));
  std::this_thread::sleep_for(5ms);
  REQUIRE_THAT(cleanupFinished(*pool_, 0ms), IsOk());
  REQUIRE(statusOf(*parent) == "<none>");
  auto children =
      (*pool_->acquire())->query("SELECT id FROM workflow_invocations WHERE service = 'Wait'", {});
  REQUIRE_THAT(children, IsOk());
  REQUIRE(children->rows.size() == 1u);
  const std::string child = children->rows[0].str(0);
  REQUIRE_THAT(e.resolveAwakeable(handout.id(), "late"), IsOk());
  CHECK(eventually([&] { return statusOf(child) == "succeeded"; }, 10s));
}

TEST_CASE_METHOD(WorkflowTest, "stopping while a step runs renews its lease at the usual pace",
                 "[workflow]") {
  std::atomic<bool> started{false};
  Engine& e = engine([&](Engine& e) {
    REQUIRE_THAT(e.registerService(ServiceDefinition::service("Slow").handler(
                     "h",
                     [&](Context& ctx, const std::string&) -> absl::StatusOr<std::string> {
                       return ctx.run("slow", [&]() -> absl::StatusOr<std::string> {
                         started = true;
                         std::this_thread::sleep_for(2s);
                         return std::string("ok");
                       });
                     })),
                 IsOk());
  });
  REQUIRE_THAT(e.send({"Slow", "h", "", ""}), IsOk());
  REQUIRE(eventually([&] { return started.load(); }));
  auto updates = [&] {
    auto rows = (*pool_->acquire())->query("SHOW GLOBAL STATUS LIKE 'Com_update'", {});
    REQUIRE_THAT(rows, IsOk());
    return std::stoll(rows->rows[0].str(1));
  };
  const int64_t before = updates();
  e.stop();  // lets the step finish
  // A renewal every lease / 3 (1 s), the journal and the finish: a handful, not a loop.
  CHECK(updates() - before < 50);
}

// A cancel goes down the call tree as it stands when it commits. The caller's handler notices it
// only later: a child it calls in between is cancelled too, and its transactional steps make
// no effects any more.
TEST_CASE_METHOD(WorkflowTest, "a cancel reaches the children called after it", "[workflow]") {
  std::atomic<bool> in_a{false}, release{false};
  std::atomic<int> b_runs{0};
  Engine& e = engine([&](Engine& e) {
    REQUIRE_THAT(e.registerService(ServiceDefinition::service("Child").handler(
                     "h",
                     [](Context& ctx, const std::string&) -> absl::StatusOr<std::string> {
                       auto slept = ctx.await(ctx.timer(std::chrono::hours(1)));
                       if (!slept.ok()) return slept.status();
                       return std::string("slept");
                     })),
                 IsOk());
    REQUIRE_THAT(e.registerService(ServiceDefinition::service("Parent").handler(
                     "h",
                     [&](Context& ctx, const std::string&) -> absl::StatusOr<std::string> {
                       auto a = ctx.run("a", [&]() -> absl::StatusOr<std::string> {
                         in_a = true;
                         while (!release) std::this_thread::sleep_for(5ms);
                         return std::string("a");
                       });
                       if (!a.ok()) return a.status();
                       Future child = ctx.call("Child", "h", "", "");
                       auto b = ctx.runTx("b", [&](db::Connection&) -> absl::StatusOr<std::string> {
                         ++b_runs;
                         return std::string("b");
                       });
                       if (!b.ok()) return b.status();
                       return ctx.await(child);
                     })),
                 IsOk());
  });
  auto parent = e.send({"Parent", "h", "", ""});
  REQUIRE_THAT(parent, IsOk());
  REQUIRE(eventually([&] { return in_a.load(); }));
  REQUIRE_THAT(e.cancel(*parent), IsOk());
  release = true;
  REQUIRE(eventually([&] { return statusOf(*parent) == "cancelled"; }, 20s));
  CHECK(b_runs.load() == 0);
  auto children =
      (*pool_->acquire())->query("SELECT id FROM workflow_invocations WHERE service = 'Child'", {});
  REQUIRE_THAT(children, IsOk());
  REQUIRE(children->rows.size() == 1u);
  const std::string child = children->rows[0].str(0);
  CHECK(eventually([&] { return statusOf(child) == "cancelled"; }, 10s));
}

// What a compensation calls is part of running the cancel, not something the cancel stops.
TEST_CASE_METHOD(WorkflowTest, "a cancelled invocation's compensations call children that run",
                 "[workflow]") {
  Handout handout;
  Engine& e = engine([&](Engine& e) {
    REQUIRE_THAT(e.registerService(ServiceDefinition::service("Undo").handler(
                     "h",
                     [](Context& ctx, const std::string&) -> absl::StatusOr<std::string> {
                       return ctx.run("undo", [] { return absl::StatusOr<std::string>("undone"); });
                     })),
                 IsOk());
    REQUIRE_THAT(e.registerService(ServiceDefinition::service("Parent").handler(
                     "h",
                     [&](Context& ctx, const std::string&) -> absl::StatusOr<std::string> {
                       ctx.compensate("undo", [](Context& ctx) {
                         return ctx.await(ctx.call("Undo", "h", "", "")).status();
                       });
                       Awakeable a = ctx.awakeable();
                       handout.give(ctx, a);
                       return ctx.await(a.future);
                     })),
                 IsOk());
  });
  auto parent = e.send({"Parent", "h", "", ""});
  REQUIRE_THAT(parent, IsOk());
  REQUIRE(eventually([&] { return !handout.id().empty(); }));
  REQUIRE_THAT(e.cancel(*parent), IsOk());
  REQUIRE(eventually([&] { return statusOf(*parent) == "cancelled"; }, 20s));
  auto undo = (*pool_->acquire())
                  ->query("SELECT status FROM workflow_invocations WHERE service = 'Undo'", {});
  REQUIRE_THAT(undo, IsOk());
  REQUIRE(undo->rows.size() == 1u);
  CHECK(undo->rows[0].str(0) == "succeeded");
}

TEST_CASE_METHOD(WorkflowTest, "idempotency keys make one invocation", "[workflow]") {
  std::atomic<int> runs{0};
  Engine& e = engine([&](Engine& e) {
    REQUIRE_THAT(e.registerService(ServiceDefinition::virtualObject("Pay").exclusive(
                     "charge",
                     [&](Context& ctx, const std::string& in) {
                       return ctx.run("charge", [&]() -> absl::StatusOr<std::string> {
                         ++runs;
                         return "charged " + in;
                       });
                     })),
                 IsOk());
  });
  auto a = e.send({"Pay", "charge", "acct", "10", "req-1"});
  auto b = e.send({"Pay", "charge", "acct", "10", "req-1"});
  auto c = e.send({"Pay", "charge", "acct", "10", "req-2"});
  auto d = e.send({"Pay", "charge", "other", "10", "req-1"});
  REQUIRE((a.ok() && b.ok() && c.ok() && d.ok()));
  CHECK(*a == *b);
  CHECK(*a != *c);
  CHECK(*a != *d);
  // Concurrent duplicates too.
  std::vector<std::thread> ts;
  std::vector<std::string> ids(10);
  krane::testing::ThreadFailures failures;
  for (int i = 0; i < 10; ++i) {
    ts.emplace_back([&, i] {
      auto id = e.send({"Pay", "charge", "acct", "10", "req-3"});
      if (failures.expectOk(id, "send")) ids[i] = *id;
    });
  }
  for (auto& t : ts) t.join();
  CHECK(failures.all() == std::vector<std::string>{});
  for (const auto& id : ids) CHECK(id == ids[0]);
  for (const auto& id : {*a, *c, *d, ids[0]}) REQUIRE_THAT(e.awaitResult(id, 20s), IsOk());
  CHECK(runs.load() == 4);
  auto again = e.call({"Pay", "charge", "acct", "10", "req-1"}, 5s);
  CHECK(*again == "charged 10");
  CHECK(runs.load() == 4);
}

// Sends of invocations without an idempotency key that need no key's row share an INSERT when
// they come at the same moment; a send with an idempotency key goes alone, so that one waiting
// for another transaction's uncommitted invocation of its key holds up no other send.
TEST_CASE_METHOD(WorkflowTest, "sends at the same moment share an insert", "[workflow]") {
  Engine idle(pool_, fastOptions());
  REQUIRE_THAT(idle.registerService(ServiceDefinition::service("Idle").handler(
                   "h", [](Context&, const std::string&) { return std::string(); })),
               IsOk());
  constexpr int kWriters = static_cast<int>(Engine::kSendWriters);
  auto inserting = [&] {
    return scalar(
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST"
        " WHERE INFO LIKE 'INSERT INTO workflow_invocations%'");
  };
  auto sendInto = [&](std::string* out, InvokeRequest request) {
    auto id = idle.send(request);
    *out = id.ok() ? *id : id.status().ToString();
  };

  // While the table is locked, one send per writer waits in its INSERT, and the sends after
  // them line up behind, to be written together once the lock is gone.
  auto holder = pool_->acquire();
  REQUIRE_THAT(holder, IsOk());
  REQUIRE_THAT((*holder)->execText("LOCK TABLES workflow_invocations READ"), IsOk());
  const uint64_t before = idle.stats().send_statements.load();
  constexpr int kSends = 16;
  std::vector<std::string> ids(kWriters + kSends);
  std::vector<std::thread> threads;
  for (int i = 0; i < kWriters; ++i) {
    threads.emplace_back(sendInto, &ids[i], InvokeRequest{"Idle", "h", "", std::to_string(i)});
  }
  CHECK(eventually([&] { return inserting() == kWriters; }, 10s));
  for (int i = kWriters; i < kWriters + kSends; ++i) {
    threads.emplace_back(sendInto, &ids[i], InvokeRequest{"Idle", "h", "", std::to_string(i)});
  }
  std::this_thread::sleep_for(300ms);  // they line up; a send that comes later goes alone
  REQUIRE_THAT((*holder)->execText("UNLOCK TABLES"), IsOk());
  for (auto& t : threads) t.join();
  threads.clear();
  const uint64_t statements = idle.stats().send_statements.load() - before;
  INFO("INSERTs for " << ids.size() << " sends: " << statements);
  CHECK(statements <= Engine::kSendWriters + 2);
  for (size_t i = 0; i < ids.size(); ++i) {
    INFO("send " << i << ": " << ids[i]);
    CHECK(scalar("SELECT COUNT(*) FROM workflow_invocations WHERE id = ? AND input = ?"
                 " AND status = 'ready'",
                 {ids[i], db::Blob{std::to_string(i)}}) == 1);
  }

  // A transaction holds an uncommitted invocation of idempotency key `held`: sends of that key
  // wait for it, one more than there are writers, and a send without a key still goes through.
  // Their wait (InnoDB's duplicate check) also locks the gap before the key's hash in the index,
  // where rows without a key (NULL) end when `held` has the smallest hash: a row with a smaller
  // one keeps that gap off them, as the many keyed rows of a real table do.
  exec("UPDATE workflow_invocations SET idempotency_hash = '' WHERE id = ?", {ids[0]});
  REQUIRE_THAT((*holder)->execText("START TRANSACTION"), IsOk());
  auto first = idle.sendIn(**holder, {"Idle", "h", "", "", "held"});
  REQUIRE_THAT(first, IsOk());
  std::vector<std::string> keyed(kWriters + 1);
  for (auto& k : keyed)
    threads.emplace_back(sendInto, &k, InvokeRequest{"Idle", "h", "", "", "held"});
  CHECK(eventually([&] { return inserting() == kWriters + 1; }, 10s));
  std::string plain;
  std::atomic<bool> plain_sent{false};
  std::thread alone([&] {
    sendInto(&plain, {"Idle", "h", "", "plain"});
    plain_sent = true;
  });
  const bool went_through = eventually([&] { return plain_sent.load(); }, 10s);
  REQUIRE_THAT((*holder)->execText("COMMIT"), IsOk());
  alone.join();
  for (auto& t : threads) t.join();
  CHECK(went_through);
  CHECK(scalar("SELECT COUNT(*) FROM workflow_invocations WHERE id = ? AND input = 'plain'",
               {plain}) == 1);
  for (const std::string& k : keyed) CHECK(k == *first);
  CHECK(scalar("SELECT COUNT(*) FROM workflow_invocations") == kWriters + kSends + 2);
}

// A send whose INSERT the server rolled back for a lock wait timeout (or a deadlock) goes again:
// nothing of it was written. Played by a transaction that locks the whole empty table's gap for
// longer than the server's lock wait timeout (1 s here), then commits.
TEST_CASE_METHOD(WorkflowTest, "a send rolled back by a lock wait timeout goes again",
                 "[workflow]") {
  const int64_t timeout = scalar("SELECT @@GLOBAL.innodb_lock_wait_timeout");
  exec("SET GLOBAL innodb_lock_wait_timeout = 1");
  struct Restore {
    std::shared_ptr<db::Pool> pool;
    int64_t timeout;
    ~Restore() {
      if (auto conn = pool->acquire(); conn.ok()) {
        (void)(*conn)->execText(strCat("SET GLOBAL innodb_lock_wait_timeout = ", timeout));
      }
    }
  } restore{pool_, timeout};
  // Its connections are opened after the change, so they have the short timeout.
  auto pool = db::Pool::create(dsn_, {.max_connections = 4});
  REQUIRE_THAT(pool, IsOk());
  Engine idle(*pool, fastOptions());
  REQUIRE_THAT(idle.registerService(ServiceDefinition::service("Idle").handler(
                   "h", [](Context&, const std::string&) { return std::string(); })),
               IsOk());
  auto holder = pool_->acquire();
  REQUIRE_THAT(holder, IsOk());
  REQUIRE_THAT((*holder)->execText("START TRANSACTION"), IsOk());
  REQUIRE_THAT((*holder)->query("SELECT id FROM workflow_invocations WHERE id = 'none' FOR UPDATE"),
               IsOk());
  // Grouped with others' (no key), or alone (an idempotency key): both go again.
  std::string key;
  SECTION("without a key") {}
  SECTION("with an idempotency key") { key = "once"; }
  absl::StatusOr<std::string> sent;
  std::thread sender([&] { sent = idle.send({"Idle", "h", "", "in", key}); });
  std::this_thread::sleep_for(2500ms);
  CHECK_THAT((*holder)->execText("COMMIT"), IsOk());
  sender.join();
  REQUIRE_THAT(sent, IsOk());
  if (key.empty()) {
    INFO("statements: " << idle.stats().send_statements.load());
    CHECK(idle.stats().send_statements.load() >= 2);
  }
  CHECK(scalar("SELECT COUNT(*) FROM workflow_invocations WHERE id = ?", {*sent}) == 1);
  CHECK(scalar("SELECT COUNT(*) FROM workflow_invocations") == 1);
}

// Sends at the same moment share one INSERT: when it cannot run (no connection to be had), every
// send of the batch fails with the pool's error, and none is reported sent.
TEST_CASE_METHOD(WorkflowTest, "sends whose batch cannot be written all fail, and none is written",
                 "[workflow]") {
  auto pool = db::Pool::create(dsn_, {.max_connections = 1, .acquire_timeout = 300ms});
  REQUIRE_THAT(pool, IsOk());
  Engine idle(*pool, fastOptions());
  REQUIRE_THAT(idle.registerService(ServiceDefinition::service("Idle").handler(
                   "h", [](Context&, const std::string&) { return std::string(); })),
               IsOk());
  std::vector<absl::StatusOr<std::string>> sent(6);
  {
    auto held = (*pool)->acquire();  // the pool's one connection
    REQUIRE_THAT(held, IsOk());
    std::vector<std::thread> senders;
    for (size_t i = 0; i < sent.size(); ++i) {
      senders.emplace_back([&, i] { sent[i] = idle.send({"Idle", "h", "", "in"}); });
    }
    for (auto& t : senders) t.join();
  }
  for (const auto& s : sent) {
    INFO(s.status());
    CHECK(absl::IsResourceExhausted(s.status()));
    CHECK_THAT(std::string(s.status().message()), Catch::Contains("connection pool exhausted"));
  }
  CHECK(scalar("SELECT COUNT(*) FROM workflow_invocations") == 0);
  INFO("with the connection back, a send goes in");
  auto again = idle.send({"Idle", "h", "", "in"});
  REQUIRE_THAT(again, IsOk());
  CHECK(scalar("SELECT COUNT(*) FROM workflow_invocations WHERE id = ?", {*again}) == 1);
}

// A handler of plain `run` steps writes its journal without reading its invocation's row: the
// cancel reaches it through this replica (at once) or the renew loop (within a second).
TEST_CASE_METHOD(WorkflowTest, "a cancel stops a handler of plain steps at its next step",
                 "[workflow]") {
  std::atomic<int> steps{0};
  Engine& e = engine([&](Engine& e) {
    REQUIRE_THAT(e.registerService(ServiceDefinition::service("Caller").handler(
                     "go",
                     [&](Context& ctx, const std::string&) -> absl::StatusOr<std::string> {
                       return ctx.await(ctx.call("Loop", "go", "", ""));
                     })),
                 IsOk());
    REQUIRE_THAT(e.registerService(ServiceDefinition::service("Loop").handler(
                     "go",
                     [&](Context& ctx, const std::string&) -> absl::StatusOr<std::string> {
                       for (int i = 0; i < 400; ++i) {
                         auto r = ctx.run(strCat("step-", i), [&]() -> absl::StatusOr<std::string> {
                           ++steps;
                           std::this_thread::sleep_for(10ms);
                           return std::string("ok");
                         });
                         if (!r.ok()) return r.status();
                       }
                       return std::string("done");
                     })),
                 IsOk());
  });
  auto id = e.send({"Loop", "go"});
  REQUIRE_THAT(id, IsOk());
  REQUIRE(eventually([&] { return steps.load() >= 5; }, 20s));
  int at_cancel = 0;
  int allowed = 0;
  SECTION("cancelled through the replica that runs it") {
    REQUIRE_THAT(e.cancel(*id), IsOk());
    at_cancel = steps.load();
    allowed = 1;  // the step running when the cancel came
  }
  SECTION("cancelled elsewhere") {
    REQUIRE_THAT(cancelInvocation(*pool_, *id), IsOk());
    at_cancel = steps.load();
    // The renew loop looks every second (the lease is 3 s): about 100 steps of 10 ms.
    allowed = 200;
  }
  SECTION("its caller cancelled through the replica that runs it") {
    auto caller = e.send({"Caller", "go"});
    REQUIRE_THAT(caller, IsOk());
    const int before = steps.load();
    REQUIRE(eventually([&] { return steps.load() >= before + 5; }, 20s));
    auto callee = (*pool_->acquire())
                      ->query("SELECT id FROM workflow_invocations WHERE parent_id = ?", {*caller});
    REQUIRE_THAT(callee, IsOk());
    REQUIRE(callee->rows.size() == 1u);
    // The first Loop runs on, uncancelled: only the caller's callee must stop.
    REQUIRE_THAT(e.cancel(*id), IsOk());
    REQUIRE(eventually([&] { return statusOf(*id) == "cancelled"; }, 20s));
    REQUIRE_THAT(e.cancel(*caller), IsOk());
    at_cancel = steps.load();
    allowed = 1;  // the callee's step running when the cancel came
    id = callee->rows[0].str("id");
  }
  auto result = e.awaitResult(*id, 30s);
  CHECK(absl::IsCancelled(result.status()));
  INFO("steps when the cancel committed: " << at_cancel << ", in all: " << steps.load());
  CHECK(steps.load() <= at_cancel + allowed);
}

// sendIn: the invocation is part of the caller's transaction; rolled back, it never existed.
TEST_CASE_METHOD(WorkflowTest, "an invocation sent in a transaction exists with its commit",
                 "[workflow]") {
  std::atomic<int> runs{0};
  Engine& e = engine([&](Engine& e) {
    REQUIRE_THAT(e.registerService(ServiceDefinition::virtualObject("Pay").exclusive(
                     "charge",
                     [&](Context&, const std::string& in) -> absl::StatusOr<std::string> {
                       ++runs;
                       return "charged " + in;
                     })),
                 IsOk());
  });
  exec("CREATE TABLE orders (id VARCHAR(32) PRIMARY KEY, invocation_id VARCHAR(64))");
  auto count = [&](const std::string& what) -> int64_t {
    auto rows = (*pool_->acquire())->query("SELECT COUNT(*) FROM " + what, {});
    return rows.ok() ? rows->rows[0].i64(0) : -1;
  };
  auto order = [&](const std::string& id, bool commit) -> absl::StatusOr<std::string> {
    std::string invocation;
    absl::Status st = pool_->transact("order", [&](db::Connection& conn) -> absl::Status {
      KRANE_ASSIGN_OR_RETURN(invocation, e.sendIn(conn, {"Pay", "charge", "acct", id, id}));
      KRANE_RETURN_IF_ERROR(
          conn.exec("INSERT INTO orders VALUES (?, ?)", {id, invocation}).status());
      if (!commit) return absl::AbortedError("the caller changed its mind");
      return absl::OkStatus();
    });
    if (!st.ok()) return st;
    e.notify();
    return invocation;
  };
  CHECK(absl::IsAborted(order("o1", false).status()));
  CHECK(count("workflow_invocations") == 0);
  CHECK(count("workflow_keys WHERE holder IS NOT NULL") == 0);

  auto sent = order("o2", true);
  REQUIRE_THAT(sent, IsOk());
  CHECK(e.awaitResult(*sent, 20s).value_or("") == "charged o2");
  INFO("the same idempotency key in another transaction finds the invocation");
  std::string again;
  REQUIRE_THAT(
      pool_->transact(
          "again",
          [&](db::Connection& conn) -> absl::Status {
            KRANE_ASSIGN_OR_RETURN(again, e.sendIn(conn, {"Pay", "charge", "acct", "o2", "o2"}));
            return absl::OkStatus();
          }),
      IsOk());
  CHECK(again == *sent);
  CHECK(runs.load() == 1);

  INFO("concurrent senders of one key, each in its own transaction, get one invocation");
  std::vector<std::string> ids(8);
  krane::testing::ThreadFailures failures;
  std::vector<std::thread> senders;
  for (size_t i = 0; i < ids.size(); ++i) {
    senders.emplace_back([&, i] {
      failures.expectOk(
          pool_->transact(
              "concurrent",
              [&](db::Connection& conn) -> absl::Status {
                KRANE_ASSIGN_OR_RETURN(ids[i],
                                       e.sendIn(conn, {"Pay", "charge", "acct", "o4", "o4"}));
                return conn.exec("INSERT INTO orders VALUES (?, ?)", {strCat("o4-", i), ids[i]})
                    .status();
              },
              // Either level: READ COMMITTED takes no gap locks to wait on.
              db::TxOptions{i % 2 == 0 ? db::Isolation::kReadCommitted
                                       : db::Isolation::kRepeatableRead}),
          "send");
    });
  }
  for (auto& t : senders) t.join();
  e.notify();
  CHECK(failures.all() == std::vector<std::string>{});
  for (const auto& id : ids) CHECK(id == ids[0]);
  CHECK(count("orders WHERE id LIKE 'o4-%'") == 8);
  CHECK(e.awaitResult(ids[0], 20s).value_or("") == "charged o4");
  CHECK(runs.load() == 2);
  INFO("and no admission left behind by the repeats: the key is free once it finished");
  CHECK(eventually([&] { return count("workflow_keys WHERE holder IS NOT NULL") == 0; }));

  INFO("outside a transaction it is refused");
  auto conn = pool_->acquire();
  REQUIRE_THAT(conn, IsOk());
  CHECK(
      absl::IsFailedPrecondition(e.sendIn(**conn, {"Pay", "charge", "acct", "o3", "o3"}).status()));
}

// A runTx step whose COMMIT was applied while its answer was lost: the next attempt must find the
// step in the journal (and not run it again), whatever this replica remembered of the attempt.
TEST_CASE_METHOD(WorkflowTest, "a step whose commit answer was lost is not run again",
                 "[workflow]") {
  exec("CREATE TABLE charges (id BIGINT AUTO_INCREMENT PRIMARY KEY, amount BIGINT)");
  krane::testing::TcpRelay relay(strCat(dsn_.host, ":", dsn_.port));
  db::Dsn relayed = dsn_;
  relayed.port = static_cast<unsigned>(portOf(relay.address()));
  auto pool = db::Pool::create(relayed, {.max_connections = 16});
  REQUIRE_THAT(pool, IsOk());
  std::atomic<int> charged{0};
  RetryPolicy quick;
  quick.initial_interval = std::chrono::milliseconds(20);
  quick.max_attempts = 4;
  Engine e(*pool, fastOptions());
  REQUIRE_THAT(
      e.registerService(
          ServiceDefinition::service("Billing")
              .handler("charge",
                       [&](Context& ctx, const std::string& in) -> absl::StatusOr<std::string> {
                         KRANE_RETURN_IF_ERROR(
                             ctx.runTx("charge",
                                       [&](db::Connection& conn) -> absl::StatusOr<std::string> {
                                         ++charged;
                                         KRANE_RETURN_IF_ERROR(conn.execText(
                                             "INSERT INTO charges (amount) VALUES (10)"
                                             " /* the charge */"));
                                         return std::string("charged");
                                       })
                                 .status());
                         return ctx.run("receipt", [] { return absl::StatusOr<std::string>("r"); });
                       })
              .retry(quick)),
      IsOk());
  e.start();
  relay.loseAnswerTo("/* the charge */", "COMMIT");
  auto id = e.send({"Billing", "charge", "", "10"});
  REQUIRE_THAT(id, IsOk());
  auto result = e.awaitResult(*id, 20s);
  e.stop();
  CHECK(relay.answerLost());
  REQUIRE_THAT(result, IsOk());
  CHECK(*result == "r");
  auto charges = (*pool_->acquire())->query("SELECT COUNT(*) FROM charges", {});
  REQUIRE_THAT(charges, IsOk());
  CHECK(charges->rows[0].i64(0) == 1);
  CHECK(charged.load() == 1);
}

// Retries back off by the policy, then the compensations run newest first and the invocation
// fails with a clear error.
TEST_CASE_METHOD(WorkflowTest, "retries end in failure with compensations in reverse order",
                 "[workflow]") {
  std::mutex mu;
  std::vector<std::string> log;
  std::vector<int64_t> attempt_times;
  Engine& e = engine([&](Engine& e) {
    RetryPolicy p;
    p.initial_interval = 100ms;
    p.factor = 2.0;
    p.max_interval = 300ms;
    p.max_attempts = 4;
    REQUIRE_THAT(
        e.registerService(
            ServiceDefinition::service("Flaky")
                .handler("h",
                         [&](Context& ctx, const std::string&) -> absl::StatusOr<std::string> {
                           for (const char* step : {"a", "b", "c"}) {
                             auto s = ctx.runVoid(step, [&, step] {
                               std::lock_guard lock(mu);
                               log.push_back(std::string("do ") + step);
                               return absl::OkStatus();
                             });
                             if (!s.ok()) return s;
                             ctx.compensateRun(step, [&, step] {
                               std::lock_guard lock(mu);
                               log.push_back(std::string("undo ") + step);
                               return absl::OkStatus();
                             });
                           }
                           return ctx.run("d", [&]() -> absl::StatusOr<std::string> {
                             std::lock_guard lock(mu);
                             attempt_times.push_back(unixMillis());
                             return absl::UnavailableError("depot is down");
                           });
                         })
                .retry(p)),
        IsOk());
  });
  auto id = e.send({"Flaky", "h", "", ""});
  auto r = e.awaitResult(*id, 30s);
  CHECK_FALSE(r.ok());
  CHECK(isTerminal(r.status()));
  CHECK_THAT(messageOf(r.status()),
             Catch::Contains("gave up after 4 attempts: run 'd': depot is down"));
  std::lock_guard lock(mu);
  CHECK(log == std::vector<std::string>{"do a", "do b", "do c", "undo c", "undo b", "undo a"});
  REQUIRE(attempt_times.size() == 4u);
  // 100, 200, 300 (capped) ms between attempts, with some slack for polling.
  CHECK((attempt_times[1] - attempt_times[0]) >= 100);
  CHECK((attempt_times[2] - attempt_times[1]) >= 200);
  CHECK((attempt_times[3] - attempt_times[2]) >= 300);
  CHECK(statusOf(*id) == "failed");
  auto detail = showInvocation(*pool_, *id);
  CHECK(detail->summary.attempts == 4);
  CHECK(detail->journal.back().name == "compensate a");
}

TEST_CASE_METHOD(WorkflowTest, "terminal errors are not retried and paused invocations resume",
                 "[workflow]") {
  std::atomic<int> terminal_runs{0}, flaky_runs{0};
  std::atomic<bool> healthy{false};
  Engine& e = engine([&](Engine& e) {
    RetryPolicy p;
    p.initial_interval = 20ms;
    p.max_attempts = 3;
    p.on_exhausted = OnExhausted::kPause;
    REQUIRE_THAT(e.registerService(
                     ServiceDefinition::virtualObject("Ops")
                         .exclusive("terminal",
                                    [&](Context& ctx, const std::string&) {
                                      return ctx.run("bad", [&]() -> absl::StatusOr<std::string> {
                                        ++terminal_runs;
                                        return terminalError(absl::StatusCode::kInvalidArgument,
                                                             "image: not a valid reference");
                                      });
                                    })
                         .exclusive("flaky",
                                    [&](Context& ctx, const std::string&) {
                                      return ctx.run("maybe", [&]() -> absl::StatusOr<std::string> {
                                        ++flaky_runs;
                                        if (!healthy) return absl::UnavailableError("not yet");
                                        return std::string("fine");
                                      });
                                    })
                         .exclusive("next",
                                    [](Context&, const std::string&) {
                                      return absl::StatusOr<std::string>("next ran");
                                    })
                         .retry(p)),
                 IsOk());
  });
  auto t = e.call({"Ops", "terminal", "k", ""}, 20s);
  CHECK(absl::IsInvalidArgument(t.status()));
  CHECK(terminal_runs.load() == 1);

  auto flaky = e.send({"Ops", "flaky", "k", ""});
  REQUIRE(eventually([&] { return statusOf(*flaky) == "paused"; }));
  CHECK(flaky_runs.load() == 3);
  auto next = e.send({"Ops", "next", "k", ""});
  std::this_thread::sleep_for(200ms);
  INFO("a paused invocation keeps its key");
  CHECK(statusOf(*next) == "queued");
  auto held = keysHeldLongerThan(*pool_, 50ms);
  REQUIRE_THAT(held, IsOk());
  REQUIRE(held->size() == 1u);
  CHECK((*held)[0].holder == *flaky);
  CHECK((*held)[0].holder_status == "paused");
  CHECK((*held)[0].queued == 1);

  CHECK(absl::IsFailedPrecondition(e.resume(*next)));
  healthy = true;
  REQUIRE_THAT(e.resume(*flaky), IsOk());
  CHECK(*e.awaitResult(*flaky, 20s) == "fine");
  CHECK(*e.awaitResult(*next, 20s) == "next ran");
}

// A build's output in an error: a character across byte 255, bytes that are not UTF-8. The
// database refuses both in strict mode; stored as they came, the invocation's last commit would
// fail at every attempt and the invocation would never end (nor release what it holds).
TEST_CASE_METHOD(WorkflowTest, "messages and step names that are long or not utf8 are stored",
                 "[workflow]") {
  EngineOptions options = fastOptions();
  options.journal_cache_bytes = 0;  // a replay reads the journal from the database
  std::atomic<int> failing_runs{0};
  const std::string long_name = std::string(300, 'a');
  Engine& e = engine(
      [&](Engine& e) {
        REQUIRE_THAT(
            e.registerService(
                ServiceDefinition::service("Texts")
                    .handler("fail",
                             [&](Context&, const std::string&) -> absl::StatusOr<std::string> {
                               ++failing_runs;
                               return terminalError(absl::StatusCode::kFailedPrecondition,
                                                    std::string(254, 'x') + "\xc3\xa9 and \xff");
                             })
                    .handler("long",
                             [&](Context& ctx, const std::string&) -> absl::StatusOr<std::string> {
                               auto r = ctx.run(long_name,
                                                [] { return absl::StatusOr<std::string>("done"); });
                               if (!r.ok()) return r.status();
                               // Suspends: the next run replays the step from the database.
                               if (auto t = ctx.await(ctx.timer(10ms)); !t.ok()) return t.status();
                               return r;
                             })),
            IsOk());
      },
      options);
  auto failed = e.call({"Texts", "fail", "", ""}, 20s);
  CHECK(absl::IsFailedPrecondition(failed.status()));
  CHECK_THAT(messageOf(failed.status()), Catch::StartsWith(std::string(254, 'x') + "\xc3\xa9"));
  CHECK(failing_runs.load() == 1);
  auto done = e.call({"Texts", "long", "", ""}, 20s);
  REQUIRE_THAT(done, IsOk());
  CHECK(*done == "done");
}

TEST_CASE_METHOD(WorkflowTest, "cancel while suspended runs compensations and kill does not",
                 "[workflow]") {
  std::mutex mu;
  std::vector<std::string> log;
  Engine& e = engine([&](Engine& e) {
    REQUIRE_THAT(e.registerService(ServiceDefinition::virtualObject("Job").exclusive(
                     "h",
                     [&](Context& ctx, const std::string&) -> absl::StatusOr<std::string> {
                       auto s = ctx.runVoid("reserve", [&] {
                         std::lock_guard lock(mu);
                         log.push_back("reserve " + ctx.key());
                         return absl::OkStatus();
                       });
                       if (!s.ok()) return s;
                       ctx.compensateRun("release", [&] {
                         std::lock_guard lock(mu);
                         log.push_back("release " + ctx.key());
                         return absl::OkStatus();
                       });
                       Awakeable w = ctx.awakeable();
                       auto r = ctx.await(w.future);
                       if (!r.ok()) return r.status();
                       return std::string("finished");
                     })),
                 IsOk());
  });
  auto a = e.send({"Job", "h", "a", ""});
  auto b = e.send({"Job", "h", "b", ""});
  auto queued = e.send({"Job", "h", "a", ""});
  REQUIRE(eventually([&] { return statusOf(*a) == "suspended" && statusOf(*b) == "suspended"; }));
  REQUIRE_THAT(e.cancel(*queued), IsOk());
  CHECK(statusOf(*queued) == "cancelled");
  REQUIRE_THAT(e.cancel(*a), IsOk());
  auto ra = e.awaitResult(*a, 20s);
  INFO(ra.status());
  CHECK(absl::IsCancelled(ra.status()));
  CHECK(statusOf(*a) == "cancelled");
  REQUIRE_THAT(e.kill(*b), IsOk());
  CHECK(statusOf(*b) == "killed");
  CHECK(absl::IsAborted(e.awaitResult(*b, 1s).status()));
  CHECK(absl::IsFailedPrecondition(e.cancel(*a)));
  std::this_thread::sleep_for(100ms);
  std::lock_guard lock(mu);
  REQUIRE(log.size() == 3u);
  CHECK_THAT(std::vector<std::string>(log.begin(), log.begin() + 2),
             Catch::UnorderedEquals(std::vector<std::string>{"reserve a", "reserve b"}));
  INFO("cancel compensates, kill does not");
  CHECK(log[2] == "release a");
  CHECK(scalar("SELECT COUNT(*) FROM workflow_keys WHERE holder IS NOT NULL") == 0);
}

// A worker whose lease was taken over (it stalled) cannot commit: its step result is refused,
// the other replica's attempt wins.
TEST_CASE_METHOD(WorkflowTest, "a fenced worker cannot commit", "[workflow]") {
  std::atomic<bool> release_a{false};
  std::atomic<int> ran_in_a{0}, ran_in_b{0};
  auto define = [&](std::atomic<int>& counter, bool block) {
    return [&, block](Engine& e) {
      REQUIRE_THAT(e.registerService(ServiceDefinition::service("Slow").handler(
                       "h",
                       [&, block](Context& ctx, const std::string&) {
                         return ctx.run("work", [&, block]() -> absl::StatusOr<std::string> {
                           ++counter;
                           while (block && !release_a) std::this_thread::sleep_for(5ms);
                           return std::string(block ? "from a" : "from b");
                         });
                       })),
                   IsOk());
    };
  };
  EngineOptions stalled = fastOptions();
  stalled.lease = 300ms;
  stalled.renew_leases = false;
  stalled.worker_id = "a";
  stalled.threads = 1;  // its one thread is stuck: it cannot claim the invocation again
  Engine& a = engine(define(ran_in_a, true), stalled);
  auto id = a.send({"Slow", "h", "", ""});
  REQUIRE(eventually([&] { return ran_in_a.load() == 1; }));
  EngineOptions healthy = fastOptions();
  healthy.worker_id = "b";
  Engine& b = engine(define(ran_in_b, false), healthy);
  auto r = b.awaitResult(*id, 20s);
  REQUIRE_THAT(r, IsOk());
  CHECK(*r == "from b");
  release_a = true;
  REQUIRE(eventually([&] { return a.stats().fenced.load() == 1; }));
  CHECK(*b.awaitResult(*id, 1s) == "from b");
  auto detail = showInvocation(*pool_, *id);
  REQUIRE(detail->journal.size() == 1u);
  CHECK(*detail->journal[0].payload == "from b");
  CHECK(detail->claims == 2);
}

TEST_CASE_METHOD(WorkflowTest,
                 "a settle rolled back by a deadlock is retried and wakes its invocation once",
                 "[workflow]") {
  Handout handout;
  Engine& e =
      engine([&](Engine& e) { REQUIRE_THAT(e.registerService(waitService(handout)), IsOk()); });
  auto id = e.send({"Wait", "go"});
  REQUIRE_THAT(id, IsOk());
  REQUIRE(eventually([&] { return statusOf(*id) == "suspended"; }));
  const std::string awk = handout.id();
  const std::string deadlocks_sql =
      "SELECT CAST(VARIABLE_VALUE AS SIGNED) FROM information_schema.GLOBAL_STATUS"
      " WHERE VARIABLE_NAME = 'INNODB_DEADLOCKS'";
  const std::string wake_seq_sql = "SELECT wake_seq FROM workflow_invocations WHERE id = ?";
  const int64_t deadlocks = scalar(deadlocks_sql);
  const int64_t wake_seq = scalar(wake_seq_sql, {*id});

  // Another transaction that changed many rows (so InnoDB picks the settle as the victim) holds
  // the invocation's row; the settle locks the promise and waits for that row; then the other
  // transaction asks for the promise: a deadlock.
  exec("CREATE TABLE ballast (id INT PRIMARY KEY, v INT NOT NULL)");
  exec("INSERT INTO ballast SELECT seq, 0 FROM seq_1_to_500");
  auto other = pool_->acquire();
  REQUIRE_THAT(other, IsOk());
  REQUIRE_THAT((*other)->execText("START TRANSACTION"), IsOk());
  REQUIRE_THAT((*other)->exec("UPDATE ballast SET v = v + 1"), IsOk());
  REQUIRE_THAT((*other)->exec("UPDATE workflow_invocations SET updated_at = updated_at + 1"
                              " WHERE id = ?",
                              {*id}),
               IsOk());
  absl::Status settled = absl::UnknownError("not run");
  std::thread settler([&] { settled = e.resolveAwakeable(awk, "B"); });
  // CHECK, not REQUIRE: the settler thread must be joined whatever happens.
  CHECK(eventually([&] { return lockWaits() == 1; }));
  INFO("the other transaction is not the victim: its statement waits for the rollback");
  CHECK_THAT(
      (*other)->exec("UPDATE workflow_promises SET created_at = created_at WHERE id = ?", {awk}),
      IsOk());
  REQUIRE_THAT((*other)->execText("COMMIT"), IsOk());
  settler.join();
  CHECK_THAT(settled, IsOk());
  CHECK(scalar(deadlocks_sql) == deadlocks + 1);
  auto result = e.awaitResult(*id, 20s);
  REQUIRE_THAT(result, IsOk());
  CHECK(*result == "B");
  INFO("the rolled-back attempt left no trace: one wake-up, not two");
  CHECK(scalar(wake_seq_sql, {*id}) == wake_seq + 1);
}

TEST_CASE_METHOD(WorkflowTest,
                 "a listing by status alone reads the newest invocations, not the whole table",
                 "[workflow]") {
  // 3,000 finished invocations, one created per millisecond; every 10th of them paused.
  exec(
      "INSERT INTO workflow_invocations (id, service, handler, exclusive, status, input,"
      " created_at, updated_at, finished_at) SELECT CONCAT('inv_', LPAD(seq, 5, '0')), 'Old',"
      " 'h', 0, IF(seq % 10 = 0, 'paused', 'succeeded'), '', 1000 + seq, 1000 + seq,"
      " IF(seq % 10 = 0, NULL, 1000 + seq) FROM seq_1_to_3000");
  // The server updates a table's statistics in the background after a change this large; a
  // table that grew over time has them already.
  REQUIRE_THAT((*pool_->acquire())->query("ANALYZE TABLE workflow_invocations"), IsOk());
  // The listing of `status` (empty: any), at most `limit`: the ids, newest first, once it is
  // checked that it read fewer than 100 rows by scanning the table (the whole of it, for a
  // sort). The counter is the server's: nothing else runs in this test.
  auto listNewest = [&](const std::string& status, size_t limit) {
    auto scanned = [&] {
      auto rows = (*pool_->acquire())->query("SHOW GLOBAL STATUS LIKE 'Handler_read_rnd_next'");
      REQUIRE_THAT(rows, IsOk());
      return std::stoll(rows->rows[0].str(1));
    };
    InvocationFilter filter;
    filter.status = status;
    filter.limit = limit;
    const int64_t before = scanned();
    auto listed = listInvocations(*pool_, filter);
    const int64_t read = scanned() - before;
    REQUIRE_THAT(listed, IsOk());
    INFO("status '" << status << "': rows scanned: " << read);
    CHECK(read < 100);
    std::vector<std::string> ids;
    for (const InvocationSummary& s : *listed) {
      if (!status.empty()) CHECK(s.status == status);
      ids.push_back(s.id);
    }
    return ids;
  };
  CHECK(listNewest("paused", 4) ==
        std::vector<std::string>{"inv_03000", "inv_02990", "inv_02980", "inv_02970"});
  CHECK(listNewest("", 3) == std::vector<std::string>{"inv_03000", "inv_02999", "inv_02998"});
}

TEST_CASE_METHOD(WorkflowTest, "operations list show cleanup and metrics", "[workflow]") {
  Engine& e = engine([&](Engine& e) {
    REQUIRE_THAT(e.registerService(ServiceDefinition::virtualObject("Ops2").exclusive(
                     "h",
                     [](Context& ctx, const std::string& in) {
                       return ctx.run("echo", [&]() -> absl::StatusOr<std::string> { return in; });
                     })),
                 IsOk());
  });
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) ids.push_back(*e.send({"Ops2", "h", i < 3 ? "x" : "y", "in"}));
  for (const auto& id : ids) REQUIRE_THAT(e.awaitResult(id, 20s), IsOk());
  InvocationFilter ops2;
  ops2.service = "Ops2";
  auto all = listInvocations(*pool_, ops2);
  REQUIRE_THAT(all, IsOk());
  CHECK(all->size() == 5u);
  auto x = listInvocations(*pool_, {"Ops2", "x", "succeeded"});
  CHECK(x->size() == 3u);
  auto bad = listInvocations(*pool_, {"Ops2", "", "bogus"});
  CHECK(absl::IsInvalidArgument(bad.status()));
  CHECK_THAT(messageOf(bad.status()), Catch::Contains("status: unknown invocation status 'bogus'"));
  CHECK(absl::IsNotFound(showInvocation(*pool_, "inv_missing").status()));

  auto families = e.metrics();
  bool saw_status = false;
  for (const auto& f : families) {
    if (f.name == "krane_workflow_invocations") {
      for (const auto& m : f.metric) {
        if (m.label.size() == 2 && m.label[1].value == "succeeded") {
          CHECK(m.gauge.value == 5);
          saw_status = true;
        }
      }
    }
    if (f.name == "krane_workflow_step_duration_seconds") {
      CHECK(f.metric[0].histogram.sample_count == 5u);
    }
  }
  CHECK(saw_status);

  auto kept = cleanupFinished(*pool_, std::chrono::hours(1));
  REQUIRE_THAT(kept, IsOk());
  CHECK(kept->invocations == 0u);
  std::this_thread::sleep_for(20ms);
  auto removed = cleanupFinished(*pool_, 1ms, 2);
  REQUIRE_THAT(removed, IsOk());
  CHECK(removed->invocations == 5u);
  CHECK(removed->journal_entries == 5u);
  CHECK(scalar("SELECT COUNT(*) FROM workflow_invocations") == 0);
  CHECK(scalar("SELECT COUNT(*) FROM workflow_journal") == 0);
}

// The reads by status that no index on status serves any more (an invocation's status changes at
// every claim, suspension and wake-up, and each index holding it changed too): retention finds
// the finished invocations by finished_at, and the metrics count on the key queue's index,
// neither reading the table row by row (InnoDB's Handler_read_rnd_next counts such reads).
TEST_CASE_METHOD(WorkflowTest, "retention and metrics read invocations through indexes",
                 "[workflow]") {
  constexpr int kRows = 4000;
  exec(
      strCat("INSERT INTO workflow_invocations (id, service, handler, exclusive, status, input,"
             " created_at, updated_at, finished_at) SELECT CONCAT('inv_', seq), 'Seed', 'h', 0,"
             " IF(seq % 4 = 0, 'succeeded', 'suspended'), '', 1, 1,"
             " IF(seq % 4 = 0, seq, NULL) FROM seq_1_to_",
             kRows));
  exec("ANALYZE TABLE workflow_invocations");
  auto scanned = [&] {
    return scalar(
        "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS"
        " WHERE VARIABLE_NAME = 'HANDLER_READ_RND_NEXT'");
  };
  Engine idle(pool_, fastOptions());

  int64_t before = scanned();
  auto families = idle.metrics();
  int64_t rows_read = scanned() - before;
  INFO("rows read one by one for the metrics: " << rows_read);
  CHECK(rows_read < kRows / 10);
  double suspended = 0;
  for (const auto& f : families) {
    if (f.name != "krane_workflow_invocations") continue;
    for (const auto& m : f.metric) {
      if (m.label[1].value == "suspended") suspended = m.gauge.value;
    }
  }
  CHECK(suspended == kRows - kRows / 4);

  before = scanned();
  auto removed = cleanupFinished(*pool_, 1ms, 100);
  rows_read = scanned() - before;
  REQUIRE_THAT(removed, IsOk());
  INFO("rows read one by one for the retention: " << rows_read);
  CHECK(removed->invocations == static_cast<uint64_t>(kRows / 4));
  CHECK(rows_read < kRows / 10);
  CHECK(scalar("SELECT COUNT(*) FROM workflow_invocations") == kRows - kRows / 4);
}

// Handler code that no longer matches its journal is not guessed at: the invocation pauses with
// an error naming the entry, for an operator to resume (after a fix) or kill.
TEST_CASE_METHOD(WorkflowTest, "a journal that no longer matches the code pauses the invocation",
                 "[workflow]") {
  std::atomic<bool> changed{false};
  std::mutex mu;
  std::string awk;
  Engine& e = engine([&](Engine& e) {
    REQUIRE_THAT(
        e.registerService(
            ServiceDefinition::service("Versioned")
                .handler("h",
                         [&](Context& ctx, const std::string&) -> absl::StatusOr<std::string> {
                           auto s = ctx.runVoid(changed ? "renamed" : "original",
                                                [] { return absl::OkStatus(); });
                           Awakeable w = ctx.awakeable();
                           ctx.runVoid("hand out",
                                       [&] {
                                         std::lock_guard lock(mu);
                                         awk = w.id;
                                         return absl::OkStatus();
                                       })
                               .IgnoreError();
                           return ctx.await(w.future);
                         })),
        IsOk());
  });
  auto id = e.send({"Versioned", "h", "", ""});
  REQUIRE(eventually([&] { return statusOf(*id) == "suspended"; }));
  changed = true;
  std::string a;
  {
    std::lock_guard lock(mu);
    a = awk;
  }
  REQUIRE_THAT(e.resolveAwakeable(a, "x"), IsOk());
  REQUIRE(eventually([&] { return statusOf(*id) == "paused"; }));
  auto detail = showInvocation(*pool_, *id);
  CHECK_THAT(detail->summary.last_error,
             Catch::Contains("journal mismatch at entry 0: the journal has run 'original' but the "
                             "handler asked for run 'renamed'"));
  changed = false;
  REQUIRE_THAT(e.resume(*id), IsOk());
  CHECK(*e.awaitResult(*id, 20s) == "x");
}

TEST_CASE_METHOD(WorkflowTest, "kill fences out a running worker", "[workflow]") {
  std::atomic<bool> go{false};
  std::atomic<int> second_step{0};
  Engine& e = engine([&](Engine& e) {
    REQUIRE_THAT(e.registerService(ServiceDefinition::service("Busy").handler(
                     "h",
                     [&](Context& ctx, const std::string&) -> absl::StatusOr<std::string> {
                       auto s = ctx.runVoid("long", [&] {
                         while (!go) std::this_thread::sleep_for(2ms);
                         return absl::OkStatus();
                       });
                       if (!s.ok()) return s;
                       ctx.runVoid("after",
                                   [&] {
                                     ++second_step;
                                     return absl::OkStatus();
                                   })
                           .IgnoreError();
                       return std::string("done");
                     })),
                 IsOk());
  });
  auto id = e.send({"Busy", "h", "", ""});
  REQUIRE(eventually([&] { return statusOf(*id) == "running"; }));
  REQUIRE_THAT(e.kill(*id), IsOk());
  go = true;
  REQUIRE(eventually([&] { return e.stats().fenced.load() == 1; }));
  CHECK(statusOf(*id) == "killed");
  CHECK(second_step.load() == 0);
  CHECK(scalar("SELECT COUNT(*) FROM workflow_journal WHERE invocation_id = ?", {*id}) == 0);
  CHECK(absl::IsFailedPrecondition(e.kill(*id)));
  CHECK(absl::IsNotFound(e.kill("inv_nope")));
}

TEST_CASE_METHOD(WorkflowTest,
                 "watchdog reports keys held too long and retention deletes finished work",
                 "[workflow]") {
  Engine& e = engine([&](Engine& e) {
    REQUIRE_THAT(e.registerService(ServiceDefinition::virtualObject("Stuck")
                                       .exclusive("wait",
                                                  [](Context& ctx, const std::string&) {
                                                    return ctx.await(ctx.awakeable().future);
                                                  })
                                       .exclusive("quick",
                                                  [](Context&, const std::string&) {
                                                    return absl::StatusOr<std::string>("ok");
                                                  })),
                 IsOk());
  });
  auto stuck = e.send({"Stuck", "wait", "k", ""});
  REQUIRE(eventually([&] { return statusOf(*stuck) == "suspended"; }));
  auto queued = e.send({"Stuck", "quick", "k", ""});
  auto done = e.call({"Stuck", "quick", "other", ""}, 20s);
  REQUIRE_THAT(done, IsOk());
  std::this_thread::sleep_for(150ms);

  std::vector<HeldKey> reported;
  MaintenanceOptions options;
  options.watchdog_threshold = 100ms;
  options.retention = 50ms;
  options.on_stuck_key = [&](const HeldKey& k) { reported.push_back(k); };
  Maintenance maintenance(pool_, options);
  auto report = maintenance.runOnce();
  REQUIRE_THAT(report, IsOk());
  REQUIRE(report->stuck.size() == 1u);
  CHECK(report->stuck[0].service == "Stuck");
  CHECK(report->stuck[0].key == "k");
  CHECK(report->stuck[0].holder == *stuck);
  CHECK(report->stuck[0].holder_handler == "wait");
  CHECK(report->stuck[0].holder_status == "suspended");
  CHECK(report->stuck[0].queued == 1);
  CHECK(report->stuck[0].held_ms >= 100);
  CHECK(reported.size() == 1u);
  INFO("only the finished invocation");
  CHECK(report->cleaned.invocations == 1u);
  CHECK(statusOf(*stuck) == "suspended");
  bool saw = false;
  for (const auto& f : maintenance.metrics()) {
    if (f.name == "krane_workflow_keys_held_too_long") {
      CHECK(f.metric[0].gauge.value == 1);
      saw = true;
    }
  }
  CHECK(saw);
  // The operator acts on the report: killing the holder hands the key on.
  REQUIRE_THAT(e.kill(*stuck), IsOk());
  CHECK(*e.awaitResult(*queued, 20s) == "ok");
  report = maintenance.runOnce();
  CHECK(report->stuck.empty());
}

TEST_CASE("deploy preset matches the seed", "[retry-policy]") {
  RetryPolicy p = RetryPolicy::deployPreset();
  CHECK(p.max_attempts == 10);
  CHECK(p.delayAfter(1) == 30s);
  CHECK(p.delayAfter(2) == 60s);
  CHECK(p.delayAfter(3) == 120s);
  CHECK(p.delayAfter(4) == 240s);
  CHECK(p.delayAfter(5) == 300s);
  CHECK(p.delayAfter(9) == 300s);
  CHECK(p.on_exhausted == OnExhausted::kFail);
}

TEST_CASE_METHOD(WorkflowTest,
                 "a claim whose read of settled promises fails still resumes its invocation",
                 "[workflow]") {
  // A database user that may not read workflow_promises.invocation_id: the claim's read of the
  // settled promises of the invocations it resumes (by invocation) fails with an error that is
  // no transaction conflict. The claim must stand; the await then reads its promise by id.
  auto limited_pool =
      limitedPool("np", {{"workflow_promises",
                          "INSERT, UPDATE, DELETE, SELECT (id, kind, state, payload, error_code,"
                          " error_message, fire_at, settled_at, created_at)"}});
  {
    auto conn = limited_pool->acquire();
    REQUIRE_THAT(conn, IsOk());
    CHECK_THAT((*conn)->query("SELECT id FROM workflow_promises LIMIT 1"), IsOk());
    INFO("the claim's read of settled promises selects invocation_id: refused");
    CHECK_FALSE((*conn)->query("SELECT invocation_id FROM workflow_promises LIMIT 1").ok());
  }

  Handout handout;
  Engine e(limited_pool, fastOptions());
  REQUIRE_THAT(e.registerService(waitService(handout)), IsOk());
  e.start();
  auto id = e.send({"Wait", "go"});
  REQUIRE_THAT(id, IsOk());
  CHECK(eventually([&] { return statusOf(*id) == "suspended"; }));
  const std::string awk = handout.id();
  CHECK_FALSE(awk.empty());
  // Settled with the test's own (unrestricted) connections; the engine claims the invocation.
  CHECK_THAT(settleAwakeable(*pool_, awk, std::string("B")), IsOk());
  auto result = e.awaitResult(*id, 20s);
  e.stop();
  REQUIRE_THAT(result, IsOk());
  CHECK(*result == "B");
  INFO("the second claim is the one that read (and failed to read) the settled promises");
  CHECK(scalar("SELECT claims FROM workflow_invocations WHERE id = ?", {*id}) == 2);
}

}  // namespace
}  // namespace krane::workflow
