// The workflow engine against a real MariaDB: journaled steps and replay, keyed exclusive and
// shared handlers, awakeables, timers, calls, retries, compensations, cancellation,
// idempotency, fencing and bad input.
#include "controlplane/workflow/engine.h"

#include <atomic>
#include <mutex>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/clock.h"
#include "controlplane/workflow/maintenance.h"
#include "controlplane/workflow/operations.h"
#include "tests/controlplane/workflow/fixture.h"
#include "tests/support/wait.h"

namespace krane::workflow {
namespace {

using krane::testing::eventually;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

TEST_F(WorkflowTest, RunStepsAreJournaledAndNotRepeatedAfterASuspension) {
  std::atomic<int> step1{0}, step2{0};
  std::mutex mu;
  std::string awakeable_id;
  Engine& e = engine([&](Engine& e) {
    ASSERT_TRUE(e
                    .registerService(ServiceDefinition::service("Steps").handler(
                        "go",
                        [&](Context& ctx, const std::string& input) -> absl::StatusOr<std::string> {
                          auto a = ctx.run("one", [&]() -> absl::StatusOr<std::string> {
                            ++step1;
                            return "A" + input;
                          });
                          if (!a.ok()) return a.status();
                          Awakeable w = ctx.awakeable();
                          ctx.runVoid("publish",
                                      [&] {
                                        std::lock_guard lock(mu);
                                        awakeable_id = w.id;
                                        return absl::OkStatus();
                                      })
                              .IgnoreError();
                          auto got = ctx.await(w.future);
                          if (!got.ok()) return got.status();
                          auto b = ctx.run("two", [&]() -> absl::StatusOr<std::string> {
                            ++step2;
                            return *a + *got;
                          });
                          return b;
                        }))
                    .ok());
  });
  auto id = e.send({"Steps", "go", "", "x"});
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_TRUE(eventually([&] { return statusOf(*id) == "suspended"; }));
  std::string awk;
  {
    std::lock_guard lock(mu);
    awk = awakeable_id;
  }
  ASSERT_FALSE(awk.empty());
  ASSERT_TRUE(e.resolveAwakeable(awk, "B").ok());
  auto result = e.awaitResult(*id, 20s);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(*result, "AxB");
  EXPECT_EQ(step1.load(), 1) << "replay returned the journaled result";
  EXPECT_EQ(step2.load(), 1);
  auto detail = showInvocation(*pool_, *id);
  ASSERT_TRUE(detail.ok());
  std::vector<std::string> kinds;
  for (const auto& j : detail->journal) kinds.push_back(j.kind);
  EXPECT_THAT(kinds, ElementsAre("run", "awakeable", "run", "await", "run"));
  EXPECT_EQ(detail->summary.status, "succeeded");
  // Resolving again is harmless; an unknown awakeable is NOT_FOUND.
  EXPECT_TRUE(e.resolveAwakeable(awk, "C").ok());
  EXPECT_TRUE(absl::IsNotFound(e.resolveAwakeable("prm_nope_1", "x")));
}

TEST_F(WorkflowTest, BadInputIsRefusedNamingTheField) {
  Engine& e = engine([&](Engine& e) {
    ASSERT_TRUE(e
                    .registerService(ServiceDefinition::virtualObject("Obj").exclusive(
                        "h", [](Context&,
                                const std::string&) { return absl::StatusOr<std::string>("ok"); }))
                    .ok());
    ASSERT_TRUE(
        e.registerService(ServiceDefinition::service("Plain").handler("h", [](Context& ctx,
                                                                              const std::string&) {
           // Calls a service nobody registered.
           return ctx.await(ctx.call("Nope", "h", "", ""));
         })).ok());
    EXPECT_TRUE(absl::IsAlreadyExists(e.registerService(ServiceDefinition::service("Plain"))));
    EXPECT_TRUE(absl::IsInvalidArgument(e.registerService(ServiceDefinition::service("bad name"))));
  });
  auto s = e.send({"Nope", "h", "", ""});
  EXPECT_TRUE(absl::IsNotFound(s.status()));
  EXPECT_THAT(messageOf(s.status()), HasSubstr("service: unknown service 'Nope'"));
  s = e.send({"Obj", "nope", "k", ""});
  EXPECT_THAT(messageOf(s.status()), HasSubstr("handler: service 'Obj' has no handler 'nope'"));
  s = e.send({"Obj", "h", "", ""});
  EXPECT_TRUE(absl::IsInvalidArgument(s.status()));
  EXPECT_THAT(messageOf(s.status()), HasSubstr("key:"));
  s = e.send({"Plain", "h", "k", ""});
  EXPECT_THAT(messageOf(s.status()), HasSubstr("key:"));
  s = e.send({"Obj", "h", "k", std::string(2 << 20, 'x')});
  EXPECT_TRUE(absl::IsInvalidArgument(s.status()));
  EXPECT_THAT(messageOf(s.status()), HasSubstr("input: 2097152 bytes, more than the limit"));
  EXPECT_EQ(scalar("SELECT COUNT(*) FROM workflow_invocations"), 0);

  // A call to an unknown service from a handler is a terminal error the handler sees.
  auto r = e.call({"Plain", "h", "", ""}, 20s);
  EXPECT_TRUE(absl::IsNotFound(r.status())) << r.status();
  EXPECT_THAT(messageOf(r.status()), HasSubstr("call Nope.h: service: unknown service 'Nope'"));
  EXPECT_TRUE(isTerminal(r.status()));
}

TEST_F(WorkflowTest, HundredConcurrentCallsOnOneKeyRunOneAtATimeInArrivalOrder) {
  std::atomic<int> inside{0}, max_inside{0};
  std::mutex mu;
  std::vector<std::string> order;
  Engine& e = engine([&](Engine& e) {
    ASSERT_TRUE(
        e.registerService(ServiceDefinition::virtualObject("Counter").exclusive(
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
                              }))
            .ok());
  });
  std::vector<std::thread> callers;
  std::vector<absl::StatusOr<std::string>> results(100, std::string());
  for (int i = 0; i < 100; ++i) {
    callers.emplace_back([&, i] { results[i] = e.call({"Counter", "add", "k1", ""}, 120s); });
  }
  for (auto& t : callers) t.join();
  std::set<std::string> seen;
  for (const auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status();
    seen.insert(*r);
  }
  EXPECT_EQ(seen.size(), 100u) << "every call saw a distinct count: no lost update";
  EXPECT_EQ(max_inside.load(), 1) << "never two at once on one key";
  // Arrival order is the key queue's order (key_seq): execution followed it.
  std::vector<std::string> arrival;
  auto rows = (*pool_->acquire())
                  ->query(
                      "SELECT id FROM workflow_invocations WHERE service = 'Counter'"
                      " ORDER BY key_seq");
  for (const auto& r : rows->rows) arrival.push_back(r.str(0));
  EXPECT_EQ(order, arrival);
  EXPECT_EQ(scalar("SELECT COUNT(*) FROM workflow_keys WHERE holder IS NOT NULL"), 0);
}

TEST_F(WorkflowTest, SequentialSendsOnOneKeyRunInSendOrderAndOtherKeysRunInParallel) {
  std::mutex mu;
  std::vector<std::string> order;
  Engine& e = engine([&](Engine& e) {
    ASSERT_TRUE(e.registerService(ServiceDefinition::virtualObject("Log").exclusive(
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
                                      }))
                    .ok());
  });
  std::vector<std::string> ids;
  for (int i = 0; i < 20; ++i) {
    ids.push_back(*e.send({"Log", "append", "a", std::to_string(i)}));
    ids.push_back(*e.send({"Log", "append", "b", std::to_string(i)}));
  }
  for (const auto& id : ids) ASSERT_TRUE(e.awaitResult(id, 30s).ok());
  std::vector<std::string> a, b;
  for (const auto& s : order) (s[0] == 'a' ? a : b).push_back(s.substr(2));
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(a[i], std::to_string(i));
    EXPECT_EQ(b[i], std::to_string(i));
  }
}

// The exclusive handler keeps its key while suspended; a shared handler of the same key runs
// meanwhile and reads the state; another exclusive one waits.
TEST_F(WorkflowTest, SharedHandlerRunsWhileAnExclusiveOneIsSuspended) {
  Engine& e = engine([&](Engine& e) {
    ASSERT_TRUE(
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
                         }))
            .ok());
  });
  auto deploy = e.send({"Deploy", "deploy", "d1", ""});
  ASSERT_TRUE(deploy.ok());
  ASSERT_TRUE(eventually([&] { return statusOf(*deploy) == "suspended"; }));
  auto other = e.send({"Deploy", "other", "d1", ""});
  ASSERT_TRUE(other.ok());
  auto notified = e.call({"Deploy", "notify", "d1", ""}, 20s);
  ASSERT_TRUE(notified.ok()) << notified.status();
  EXPECT_THAT(*notified, HasSubstr("waiting|prm_"));
  EXPECT_EQ(statusOf(*other), "queued") << "the suspended exclusive invocation keeps its key";
  auto write = e.call({"Deploy", "write", "d1", ""}, 20s);
  EXPECT_TRUE(absl::IsFailedPrecondition(write.status()));
  EXPECT_THAT(messageOf(write.status()), HasSubstr("can only be written by an exclusive handler"));

  const std::string awk = notified->substr(notified->find('|') + 1);
  ASSERT_TRUE(e.resolveAwakeable(awk, "v1").ok());
  EXPECT_EQ(*e.awaitResult(*deploy, 20s), "deployed:v1");
  EXPECT_EQ(*e.awaitResult(*other, 20s), "done");
}

TEST_F(WorkflowTest, AwakeableResolvedBeforeTheHandlerWaits) {
  std::atomic<bool> release{false};
  std::mutex mu;
  std::string id_seen;
  Engine& e = engine([&](Engine& e) {
    ASSERT_TRUE(
        e.registerService(ServiceDefinition::service("Early").handler(
                              "h",
                              [&](Context& ctx, const std::string&) -> absl::StatusOr<std::string> {
                                Awakeable w = ctx.awakeable();
                                ctx.runVoid("hand out",
                                            [&] {
                                              std::lock_guard lock(mu);
                                              id_seen = w.id;
                                              return absl::OkStatus();
                                            })
                                    .IgnoreError();
                                // Still running (not suspended) when it is resolved.
                                ctx.runVoid("wait",
                                            [&] {
                                              while (!release.load())
                                                std::this_thread::sleep_for(2ms);
                                              return absl::OkStatus();
                                            })
                                    .IgnoreError();
                                return ctx.await(w.future);
                              }))
            .ok());
  });
  auto id = e.send({"Early", "h", "", ""});
  ASSERT_TRUE(eventually([&] {
    std::lock_guard lock(mu);
    return !id_seen.empty();
  }));
  std::string awk;
  {
    std::lock_guard lock(mu);
    awk = id_seen;
  }
  ASSERT_TRUE(e.resolveAwakeable(awk, "early").ok());
  release = true;
  auto r = e.awaitResult(*id, 20s);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, "early");
  EXPECT_EQ(e.stats().suspensions.load(), 0u) << "it never had to suspend";
}

class SelectTest : public WorkflowTest {
 protected:
  Engine& start() {
    return engine([&](Engine& e) {
      ASSERT_TRUE(
          e
              .registerService(ServiceDefinition::service("Race").handler(
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
                    Selected s = ctx.select({w.future, t});
                    if (!s.result.ok()) return s.result.status();
                    return s.index == 0 ? "awakeable:" + *s.result : std::string("timeout");
                  }))
              .ok());
    });
  }
  std::string awakeable() {
    std::lock_guard lock(mu_);
    return awakeable_;
  }
  std::mutex mu_;
  std::string awakeable_;
};

TEST_F(SelectTest, TimerFiresFirst) {
  Engine& e = start();
  auto id = e.send({"Race", "h", "", "300"});
  ASSERT_TRUE(eventually([&] { return statusOf(*id) == "suspended"; }));
  auto r = e.awaitResult(*id, 20s);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, "timeout");
  // Resolving the awakeable afterwards changes nothing.
  ASSERT_TRUE(e.resolveAwakeable(awakeable(), "late").ok());
  EXPECT_EQ(*e.awaitResult(*id, 1s), "timeout");
}

TEST_F(SelectTest, AwakeableFirst) {
  Engine& e = start();
  auto id = e.send({"Race", "h", "", "600000"});
  ASSERT_TRUE(eventually([&] { return statusOf(*id) == "suspended"; }));
  ASSERT_TRUE(e.resolveAwakeable(awakeable(), "v").ok());
  auto r = e.awaitResult(*id, 20s);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, "awakeable:v");
}

TEST_F(WorkflowTest, DurableSleepSuspendsWithoutAThread) {
  Engine& e = engine([&](Engine& e) {
    ASSERT_TRUE(
        e.registerService(ServiceDefinition::service("Sleeper").handler(
                              "h",
                              [](Context& ctx, const std::string&) -> absl::StatusOr<std::string> {
                                auto s = ctx.sleep(400ms);
                                if (!s.ok()) return s;
                                return std::string("woke");
                              }))
            .ok());
  });
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::string> ids;
  // More sleepers than threads: suspended invocations hold none.
  for (int i = 0; i < 40; ++i) ids.push_back(*e.send({"Sleeper", "h", "", ""}));
  ASSERT_TRUE(eventually([&] {
    return scalar("SELECT COUNT(*) FROM workflow_invocations WHERE status = 'suspended'") +
               scalar("SELECT COUNT(*) FROM workflow_invocations WHERE status = 'succeeded'") ==
           40;
  }));
  for (const auto& id : ids) EXPECT_EQ(*e.awaitResult(id, 20s), "woke");
  EXPECT_GE(std::chrono::steady_clock::now() - start, 400ms);
}

TEST_F(WorkflowTest, CallsSendsDelayedSendsAndFanOut) {
  std::atomic<int64_t> delayed_ran_at{0};
  Engine& e = engine([&](Engine& e) {
    ASSERT_TRUE(e.registerService(ServiceDefinition::service("Math").handler(
                                      "square",
                                      [](Context&, const std::string& in) {
                                        const int n = std::stoi(in);
                                        return absl::StatusOr<std::string>(std::to_string(n * n));
                                      }))
                    .ok());
    ASSERT_TRUE(
        e.registerService(ServiceDefinition::service("Later").handler("h", [&](Context& ctx,
                                                                               const std::string&) {
           delayed_ran_at = unixMillis();
           return absl::StatusOr<std::string>("");
         })).ok());
    ASSERT_TRUE(
        e.registerService(ServiceDefinition::service("Sum").handler(
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
                              }))
            .ok());
  });
  const int64_t started = unixMillis();
  auto r = e.call({"Sum", "h", "", ""}, 20s);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, "55");
  ASSERT_TRUE(eventually([&] { return delayed_ran_at.load() != 0; }));
  EXPECT_GE(delayed_ran_at.load() - started, 450);
  EXPECT_EQ(scalar("SELECT COUNT(*) FROM workflow_invocations WHERE parent_id IS NOT NULL"), 6);
}

TEST_F(WorkflowTest, IdempotencyKeysMakeOneInvocation) {
  std::atomic<int> runs{0};
  Engine& e = engine([&](Engine& e) {
    ASSERT_TRUE(e.registerService(ServiceDefinition::virtualObject("Pay").exclusive(
                                      "charge",
                                      [&](Context& ctx, const std::string& in) {
                                        return ctx.run("charge",
                                                       [&]() -> absl::StatusOr<std::string> {
                                                         ++runs;
                                                         return "charged " + in;
                                                       });
                                      }))
                    .ok());
  });
  auto a = e.send({"Pay", "charge", "acct", "10", "req-1"});
  auto b = e.send({"Pay", "charge", "acct", "10", "req-1"});
  auto c = e.send({"Pay", "charge", "acct", "10", "req-2"});
  auto d = e.send({"Pay", "charge", "other", "10", "req-1"});
  ASSERT_TRUE(a.ok() && b.ok() && c.ok() && d.ok());
  EXPECT_EQ(*a, *b);
  EXPECT_NE(*a, *c);
  EXPECT_NE(*a, *d);
  // Concurrent duplicates too.
  std::vector<std::thread> ts;
  std::vector<std::string> ids(10);
  for (int i = 0; i < 10; ++i) {
    ts.emplace_back([&, i] { ids[i] = *e.send({"Pay", "charge", "acct", "10", "req-3"}); });
  }
  for (auto& t : ts) t.join();
  for (const auto& id : ids) EXPECT_EQ(id, ids[0]);
  for (const auto& id : {*a, *c, *d, ids[0]}) ASSERT_TRUE(e.awaitResult(id, 20s).ok());
  EXPECT_EQ(runs.load(), 4);
  auto again = e.call({"Pay", "charge", "acct", "10", "req-1"}, 5s);
  EXPECT_EQ(*again, "charged 10");
  EXPECT_EQ(runs.load(), 4);
}

// Retries back off by the policy, then the compensations run newest first and the invocation
// fails with a clear error.
TEST_F(WorkflowTest, RetriesEndInFailureWithCompensationsInReverseOrder) {
  std::mutex mu;
  std::vector<std::string> log;
  std::vector<int64_t> attempt_times;
  Engine& e = engine([&](Engine& e) {
    RetryPolicy p;
    p.initial_interval = 100ms;
    p.factor = 2.0;
    p.max_interval = 300ms;
    p.max_attempts = 4;
    ASSERT_TRUE(
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
                 .retry(p))
            .ok());
  });
  auto id = e.send({"Flaky", "h", "", ""});
  auto r = e.awaitResult(*id, 30s);
  EXPECT_FALSE(r.ok());
  EXPECT_TRUE(isTerminal(r.status()));
  EXPECT_THAT(messageOf(r.status()), HasSubstr("gave up after 4 attempts: run 'd': depot is down"));
  std::lock_guard lock(mu);
  EXPECT_THAT(log, ElementsAre("do a", "do b", "do c", "undo c", "undo b", "undo a"));
  ASSERT_EQ(attempt_times.size(), 4u);
  // 100, 200, 300 (capped) ms between attempts, with some slack for polling.
  EXPECT_GE(attempt_times[1] - attempt_times[0], 100);
  EXPECT_GE(attempt_times[2] - attempt_times[1], 200);
  EXPECT_GE(attempt_times[3] - attempt_times[2], 300);
  EXPECT_EQ(statusOf(*id), "failed");
  auto detail = showInvocation(*pool_, *id);
  EXPECT_EQ(detail->summary.attempts, 4);
  EXPECT_EQ(detail->journal.back().name, "compensate a");
}

TEST_F(WorkflowTest, TerminalErrorsAreNotRetriedAndPausedInvocationsResume) {
  std::atomic<int> terminal_runs{0}, flaky_runs{0};
  std::atomic<bool> healthy{false};
  Engine& e = engine([&](Engine& e) {
    RetryPolicy p;
    p.initial_interval = 20ms;
    p.max_attempts = 3;
    p.on_exhausted = OnExhausted::kPause;
    ASSERT_TRUE(e.registerService(
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
                         .retry(p))
                    .ok());
  });
  auto t = e.call({"Ops", "terminal", "k", ""}, 20s);
  EXPECT_TRUE(absl::IsInvalidArgument(t.status()));
  EXPECT_EQ(terminal_runs.load(), 1);

  auto flaky = e.send({"Ops", "flaky", "k", ""});
  ASSERT_TRUE(eventually([&] { return statusOf(*flaky) == "paused"; }));
  EXPECT_EQ(flaky_runs.load(), 3);
  auto next = e.send({"Ops", "next", "k", ""});
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(statusOf(*next), "queued") << "a paused invocation keeps its key";
  auto held = keysHeldLongerThan(*pool_, 50ms);
  ASSERT_TRUE(held.ok());
  ASSERT_EQ(held->size(), 1u);
  EXPECT_EQ((*held)[0].holder, *flaky);
  EXPECT_EQ((*held)[0].holder_status, "paused");
  EXPECT_EQ((*held)[0].queued, 1);

  EXPECT_TRUE(absl::IsFailedPrecondition(e.resume(*next)));
  healthy = true;
  ASSERT_TRUE(e.resume(*flaky).ok());
  EXPECT_EQ(*e.awaitResult(*flaky, 20s), "fine");
  EXPECT_EQ(*e.awaitResult(*next, 20s), "next ran");
}

TEST_F(WorkflowTest, CancelWhileSuspendedRunsCompensationsAndKillDoesNot) {
  std::mutex mu;
  std::vector<std::string> log;
  Engine& e = engine([&](Engine& e) {
    ASSERT_TRUE(
        e.registerService(ServiceDefinition::virtualObject("Job").exclusive(
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
                              }))
            .ok());
  });
  auto a = e.send({"Job", "h", "a", ""});
  auto b = e.send({"Job", "h", "b", ""});
  auto queued = e.send({"Job", "h", "a", ""});
  ASSERT_TRUE(
      eventually([&] { return statusOf(*a) == "suspended" && statusOf(*b) == "suspended"; }));
  ASSERT_TRUE(e.cancel(*queued).ok());
  EXPECT_EQ(statusOf(*queued), "cancelled");
  ASSERT_TRUE(e.cancel(*a).ok());
  auto ra = e.awaitResult(*a, 20s);
  EXPECT_TRUE(absl::IsCancelled(ra.status())) << ra.status();
  EXPECT_EQ(statusOf(*a), "cancelled");
  ASSERT_TRUE(e.kill(*b).ok());
  EXPECT_EQ(statusOf(*b), "killed");
  EXPECT_TRUE(absl::IsAborted(e.awaitResult(*b, 1s).status()));
  EXPECT_TRUE(absl::IsFailedPrecondition(e.cancel(*a)));
  std::this_thread::sleep_for(100ms);
  std::lock_guard lock(mu);
  ASSERT_EQ(log.size(), 3u);
  EXPECT_THAT(std::vector<std::string>(log.begin(), log.begin() + 2),
              ::testing::UnorderedElementsAre("reserve a", "reserve b"));
  EXPECT_EQ(log[2], "release a") << "cancel compensates, kill does not";
  EXPECT_EQ(scalar("SELECT COUNT(*) FROM workflow_keys WHERE holder IS NOT NULL"), 0);
}

// A worker whose lease was taken over (it stalled) cannot commit: its step result is refused,
// the other replica's attempt wins.
TEST_F(WorkflowTest, AFencedWorkerCannotCommit) {
  std::atomic<bool> release_a{false};
  std::atomic<int> ran_in_a{0}, ran_in_b{0};
  auto define = [&](std::atomic<int>& counter, bool block) {
    return [&, block](Engine& e) {
      ASSERT_TRUE(e.registerService(ServiceDefinition::service("Slow").handler(
                                        "h",
                                        [&, block](Context& ctx, const std::string&) {
                                          return ctx.run(
                                              "work", [&, block]() -> absl::StatusOr<std::string> {
                                                ++counter;
                                                while (block && !release_a)
                                                  std::this_thread::sleep_for(5ms);
                                                return std::string(block ? "from a" : "from b");
                                              });
                                        }))
                      .ok());
    };
  };
  EngineOptions stalled = fastOptions();
  stalled.lease = 300ms;
  stalled.renew_leases = false;
  stalled.worker_id = "a";
  stalled.threads = 1;  // its one thread is stuck: it cannot claim the invocation again
  Engine& a = engine(define(ran_in_a, true), stalled);
  auto id = a.send({"Slow", "h", "", ""});
  ASSERT_TRUE(eventually([&] { return ran_in_a.load() == 1; }));
  EngineOptions healthy = fastOptions();
  healthy.worker_id = "b";
  Engine& b = engine(define(ran_in_b, false), healthy);
  auto r = b.awaitResult(*id, 20s);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, "from b");
  release_a = true;
  ASSERT_TRUE(eventually([&] { return a.stats().fenced.load() == 1; }));
  EXPECT_EQ(*b.awaitResult(*id, 1s), "from b");
  auto detail = showInvocation(*pool_, *id);
  ASSERT_EQ(detail->journal.size(), 1u);
  EXPECT_EQ(*detail->journal[0].payload, "from b");
  EXPECT_EQ(detail->claims, 2);
}

TEST_F(WorkflowTest, OperationsListShowCleanupAndMetrics) {
  Engine& e = engine([&](Engine& e) {
    ASSERT_TRUE(e.registerService(ServiceDefinition::virtualObject("Ops2").exclusive(
                                      "h",
                                      [](Context& ctx, const std::string& in) {
                                        return ctx.run(
                                            "echo",
                                            [&]() -> absl::StatusOr<std::string> { return in; });
                                      }))
                    .ok());
  });
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) ids.push_back(*e.send({"Ops2", "h", i < 3 ? "x" : "y", "in"}));
  for (const auto& id : ids) ASSERT_TRUE(e.awaitResult(id, 20s).ok());
  InvocationFilter ops2;
  ops2.service = "Ops2";
  auto all = listInvocations(*pool_, ops2);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 5u);
  auto x = listInvocations(*pool_, {"Ops2", "x", "succeeded"});
  EXPECT_EQ(x->size(), 3u);
  auto bad = listInvocations(*pool_, {"Ops2", "", "bogus"});
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status()));
  EXPECT_THAT(messageOf(bad.status()), HasSubstr("status: unknown invocation status 'bogus'"));
  EXPECT_TRUE(absl::IsNotFound(showInvocation(*pool_, "inv_missing").status()));

  auto families = e.metrics();
  bool saw_status = false;
  for (const auto& f : families) {
    if (f.name == "krane_workflow_invocations") {
      for (const auto& m : f.metric) {
        if (m.label.size() == 2 && m.label[1].value == "succeeded") {
          EXPECT_EQ(m.gauge.value, 5);
          saw_status = true;
        }
      }
    }
    if (f.name == "krane_workflow_step_duration_seconds") {
      EXPECT_EQ(f.metric[0].histogram.sample_count, 5u);
    }
  }
  EXPECT_TRUE(saw_status);

  auto kept = cleanupFinished(*pool_, std::chrono::hours(1));
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(kept->invocations, 0u);
  std::this_thread::sleep_for(20ms);
  auto removed = cleanupFinished(*pool_, 1ms, 2);
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(removed->invocations, 5u);
  EXPECT_EQ(removed->journal_entries, 5u);
  EXPECT_EQ(scalar("SELECT COUNT(*) FROM workflow_invocations"), 0);
  EXPECT_EQ(scalar("SELECT COUNT(*) FROM workflow_journal"), 0);
}

// Handler code that no longer matches its journal is not guessed at: the invocation pauses with
// an error naming the entry, for an operator to resume (after a fix) or kill.
TEST_F(WorkflowTest, AJournalThatNoLongerMatchesTheCodePausesTheInvocation) {
  std::atomic<bool> changed{false};
  std::mutex mu;
  std::string awk;
  Engine& e = engine([&](Engine& e) {
    ASSERT_TRUE(
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
                          }))
            .ok());
  });
  auto id = e.send({"Versioned", "h", "", ""});
  ASSERT_TRUE(eventually([&] { return statusOf(*id) == "suspended"; }));
  changed = true;
  std::string a;
  {
    std::lock_guard lock(mu);
    a = awk;
  }
  ASSERT_TRUE(e.resolveAwakeable(a, "x").ok());
  ASSERT_TRUE(eventually([&] { return statusOf(*id) == "paused"; }));
  auto detail = showInvocation(*pool_, *id);
  EXPECT_THAT(detail->summary.last_error,
              HasSubstr("journal mismatch at entry 0: the journal has run 'original' but the "
                        "handler asked for run 'renamed'"));
  changed = false;
  ASSERT_TRUE(e.resume(*id).ok());
  EXPECT_EQ(*e.awaitResult(*id, 20s), "x");
}

TEST_F(WorkflowTest, KillFencesOutARunningWorker) {
  std::atomic<bool> go{false};
  std::atomic<int> second_step{0};
  Engine& e = engine([&](Engine& e) {
    ASSERT_TRUE(
        e.registerService(ServiceDefinition::service("Busy").handler(
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
                              }))
            .ok());
  });
  auto id = e.send({"Busy", "h", "", ""});
  ASSERT_TRUE(eventually([&] { return statusOf(*id) == "running"; }));
  ASSERT_TRUE(e.kill(*id).ok());
  go = true;
  ASSERT_TRUE(eventually([&] { return e.stats().fenced.load() == 1; }));
  EXPECT_EQ(statusOf(*id), "killed");
  EXPECT_EQ(second_step.load(), 0);
  EXPECT_EQ(scalar("SELECT COUNT(*) FROM workflow_journal WHERE invocation_id = ?", {*id}), 0);
  EXPECT_TRUE(absl::IsFailedPrecondition(e.kill(*id)));
  EXPECT_TRUE(absl::IsNotFound(e.kill("inv_nope")));
}

TEST_F(WorkflowTest, WatchdogReportsKeysHeldTooLongAndRetentionDeletesFinishedWork) {
  Engine& e = engine([&](Engine& e) {
    ASSERT_TRUE(e.registerService(ServiceDefinition::virtualObject("Stuck")
                                      .exclusive("wait",
                                                 [](Context& ctx, const std::string&) {
                                                   return ctx.await(ctx.awakeable().future);
                                                 })
                                      .exclusive("quick",
                                                 [](Context&, const std::string&) {
                                                   return absl::StatusOr<std::string>("ok");
                                                 }))
                    .ok());
  });
  auto stuck = e.send({"Stuck", "wait", "k", ""});
  ASSERT_TRUE(eventually([&] { return statusOf(*stuck) == "suspended"; }));
  auto queued = e.send({"Stuck", "quick", "k", ""});
  auto done = e.call({"Stuck", "quick", "other", ""}, 20s);
  ASSERT_TRUE(done.ok());
  std::this_thread::sleep_for(150ms);

  std::vector<HeldKey> reported;
  MaintenanceOptions options;
  options.watchdog_threshold = 100ms;
  options.retention = 50ms;
  options.on_stuck_key = [&](const HeldKey& k) { reported.push_back(k); };
  Maintenance maintenance(pool_, options);
  auto report = maintenance.runOnce();
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_EQ(report->stuck.size(), 1u);
  EXPECT_EQ(report->stuck[0].service, "Stuck");
  EXPECT_EQ(report->stuck[0].key, "k");
  EXPECT_EQ(report->stuck[0].holder, *stuck);
  EXPECT_EQ(report->stuck[0].holder_handler, "wait");
  EXPECT_EQ(report->stuck[0].holder_status, "suspended");
  EXPECT_EQ(report->stuck[0].queued, 1);
  EXPECT_GE(report->stuck[0].held_ms, 100);
  EXPECT_EQ(reported.size(), 1u);
  EXPECT_EQ(report->cleaned.invocations, 1u) << "only the finished invocation";
  EXPECT_EQ(statusOf(*stuck), "suspended");
  bool saw = false;
  for (const auto& f : maintenance.metrics()) {
    if (f.name == "krane_workflow_keys_held_too_long") {
      EXPECT_EQ(f.metric[0].gauge.value, 1);
      saw = true;
    }
  }
  EXPECT_TRUE(saw);
  // The operator acts on the report: killing the holder hands the key on.
  ASSERT_TRUE(e.kill(*stuck).ok());
  EXPECT_EQ(*e.awaitResult(*queued, 20s), "ok");
  report = maintenance.runOnce();
  EXPECT_TRUE(report->stuck.empty());
}

TEST(RetryPolicyTest, DeployPresetMatchesTheSeed) {
  RetryPolicy p = RetryPolicy::deployPreset();
  EXPECT_EQ(p.max_attempts, 10);
  EXPECT_EQ(p.delayAfter(1), 30s);
  EXPECT_EQ(p.delayAfter(2), 60s);
  EXPECT_EQ(p.delayAfter(3), 120s);
  EXPECT_EQ(p.delayAfter(4), 240s);
  EXPECT_EQ(p.delayAfter(5), 300s);
  EXPECT_EQ(p.delayAfter(9), 300s);
  EXPECT_EQ(p.on_exhausted, OnExhausted::kFail);
}

}  // namespace
}  // namespace krane::workflow
