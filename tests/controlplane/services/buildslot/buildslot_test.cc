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
#include <nlohmann/json.hpp>

#include "controlplane/workflow/engine.h"
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
using workflow::ServiceDefinition;
using namespace std::chrono_literals;

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

  // A deploy-like workflow keyed by deployment id; input {"workspace", "production"}.
  Engine& start() {
    return engine([&](Engine& e) {
      REQUIRE_THAT(e.registerService(buildSlotService(pool_)), IsOk());
      REQUIRE_THAT(e.registerService(ServiceDefinition::virtualObject("Build").exclusive(
                       "run",
                       [&](Context& ctx, const std::string& input) -> absl::StatusOr<std::string> {
                         const auto in = nlohmann::json::parse(input);
                         const std::string ws = in["workspace"];
                         const std::string me = ctx.key();
                         Awakeable slot = ctx.awakeable();
                         ctx.compensate("release slot", [ws, me](Context& ctx) {
                           ctx.send(kServiceName, "Release", ws, encodeRelease(me));
                           return absl::OkStatus();
                         });
                         auto acquired = ctx.await(
                             ctx.call(kServiceName, "AcquireOrWait", ws,
                                      encodeAcquire({me, slot.id, in["production"].get<bool>()})));
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
                         ctx.send(kServiceName, "Release", ws, encodeRelease(me));
                         return std::string("built");
                       })),
                   IsOk());
    });
  }

  // Safe on any thread (no assertion here): the caller checks the result.
  static absl::StatusOr<std::string> send(Engine& e, const std::string& id, const std::string& ws,
                                          bool production) {
    return e.send(
        {"Build", "run", id, nlohmann::json{{"workspace", ws}, {"production", production}}.dump()});
  }
  std::string deploy(Engine& e, const std::string& id, const std::string& ws, bool production) {
    auto r = send(e, id, ws, production);
    CHECK_THAT(r, IsOk());
    return r.ok() ? *r : "";
  }

  Slots slots(Engine& e, const std::string& ws) {
    auto r = e.call({kServiceName, "Slots", ws, "{}"}, 10s);
    CHECK_THAT(r, IsOk());
    return *decodeSlots(*r);
  }
  static std::vector<std::string> ids(const std::vector<Waiter>& ws) {
    std::vector<std::string> out;
    for (const auto& w : ws) out.push_back(w.deployment_id);
    return out;
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
    Slots s = slots(e, "ws1");
    return s.active.empty() && s.production.empty() && s.preview.empty();
  }));
}

TEST_CASE_METHOD(BuildSlotTest, "production waiters are promoted before preview ones",
                 "[build-slot]") {
  setQuota("ws1", 1);
  Engine& e = start();
  {
    std::lock_guard lock(mu_);
    closed_.insert("holder");
  }
  const std::string holder = deploy(e, "holder", "ws1", false);
  REQUIRE(eventually([&] { return slots(e, "ws1").active.size() == 1; }));
  std::vector<std::string> invs;
  invs.push_back(deploy(e, "p1", "ws1", false));
  REQUIRE(eventually([&] { return slots(e, "ws1").preview.size() == 1; }));
  invs.push_back(deploy(e, "p2", "ws1", false));
  REQUIRE(eventually([&] { return slots(e, "ws1").preview.size() == 2; }));
  invs.push_back(deploy(e, "x1", "ws1", true));
  REQUIRE(eventually([&] { return slots(e, "ws1").production.size() == 1; }));
  Slots s = slots(e, "ws1");
  CHECK(s.active == std::vector<std::string>{"holder"});
  CHECK(ids(s.preview) == std::vector<std::string>{"p1", "p2"});
  CHECK(ids(s.production) == std::vector<std::string>{"x1"});
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
  {
    std::lock_guard lock(mu_);
    closed_.insert("holder");
  }
  const std::string holder = deploy(e, "holder", "ws1", true);
  REQUIRE(eventually([&] { return slots(e, "ws1").active.size() == 1; }));
  const std::string waiter = deploy(e, "w", "ws1", false);
  REQUIRE(eventually([&] { return slots(e, "ws1").preview.size() == 1; }));
  // Cancelling the waiting deploy runs its compensation: Release of a deployment still waiting.
  REQUIRE_THAT(e.cancel(waiter), IsOk());
  CHECK(absl::IsCancelled(e.awaitResult(waiter, 20s).status()));
  REQUIRE(eventually([&] { return slots(e, "ws1").preview.empty(); }));
  {
    std::lock_guard lock(mu_);
    closed_.clear();
  }
  REQUIRE_THAT(e.awaitResult(holder, 20s), IsOk());
  REQUIRE(eventually([&] { return slots(e, "ws1").active.empty(); }));
  std::lock_guard lock(mu_);
  INFO("the cancelled waiter was never promoted");
  CHECK(order_ == std::vector<std::string>{"holder"});
}

TEST_CASE_METHOD(BuildSlotTest, "handlers are idempotent and refuse bad input", "[build-slot]") {
  // ws2 has no quota row: the default cap of 1 applies.
  Engine& e = start();
  auto acquire = [&](const std::string& d) {
    return e.call(
        {kServiceName, "AcquireOrWait", "ws2", encodeAcquire({d, "prm_unknown_" + d, true})}, 10s);
  };
  CHECK(*acquire("d1") == R"({"acquired":true})");
  CHECK(*acquire("d1") == R"({"acquired":true})");
  CHECK(*acquire("d2") == R"({"acquired":false})");
  CHECK(*acquire("d2") == R"({"acquired":false})");
  Slots s = slots(e, "ws2");
  CHECK(s.active == std::vector<std::string>{"d1"});
  CHECK(ids(s.production) == std::vector<std::string>{"d2"});

  auto release = [&](const std::string& d) {
    return nlohmann::json::parse(*e.call({kServiceName, "Release", "ws2", encodeRelease(d)}, 10s));
  };
  auto first = release("d1");
  CHECK(first["released"].get<bool>());
  CHECK(first["promoted"] == "d2");
  auto again = release("d1");
  CHECK_FALSE(again["released"].get<bool>());
  CHECK(again["promoted"].is_null());
  CHECK(slots(e, "ws2").active == std::vector<std::string>{"d2"});

  auto bad = e.call({kServiceName, "AcquireOrWait", "ws2", "{}"}, 10s);
  CHECK(absl::IsInvalidArgument(bad.status()));
  CHECK_THAT(workflow::messageOf(bad.status()), Catch::Contains("deployment_id: required"));
  bad = e.call({kServiceName, "AcquireOrWait", "ws2", "not json"}, 10s);
  CHECK_THAT(workflow::messageOf(bad.status()), Catch::Contains("input is not a JSON object"));
  bad = e.call({kServiceName, "AcquireOrWait", "ws2",
                R"({"deployment_id":"d","awakeable_id":"a","is_production":"yes"})"},
               10s);
  CHECK_THAT(workflow::messageOf(bad.status()),
             Catch::Contains("is_production: must be true or false"));
  bad = e.call({kServiceName, "Release", "ws2", R"({"deployment_id":""})"}, 10s);
  CHECK_THAT(workflow::messageOf(bad.status()), Catch::Contains("deployment_id: required"));
}

}  // namespace
}  // namespace krane::services::buildslot
