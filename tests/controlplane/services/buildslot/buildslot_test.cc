// BuildSlotService on the workflow engine and a real MariaDB, driven by a deploy-like workflow:
// the cap holds under 50 concurrent acquirers, production waiters are promoted before preview
// ones, a waiter cancelled before it got a slot leaves the wait list, and both handlers are
// idempotent.
#include "controlplane/services/buildslot/buildslot.h"

#include <atomic>
#include <map>
#include <mutex>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "controlplane/workflow/engine.h"
#include "tests/controlplane/workflow/fixture.h"
#include "tests/support/wait.h"

namespace krane::services::buildslot {
namespace {

using krane::testing::eventually;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using workflow::Awakeable;
using workflow::Context;
using workflow::Engine;
using workflow::ServiceDefinition;
using namespace std::chrono_literals;

class BuildSlotTest : public workflow::WorkflowTest {
 protected:
  void SetUp() override {
    WorkflowTest::SetUp();
    for (const char* ws : {"ws1", "ws2"}) {
      ASSERT_TRUE((*pool_->acquire())
                      ->exec("INSERT INTO workspaces (id, name, slug, created_at) VALUES (?,?,?,1)",
                             {ws, ws, ws})
                      .ok());
    }
  }
  void setQuota(const std::string& ws, int n) {
    ASSERT_TRUE((*pool_->acquire())
                    ->exec("INSERT INTO quotas (workspace_id, max_concurrent_builds, created_at)"
                           " VALUES (?, ?, 1)",
                           {ws, n})
                    .ok());
  }

  // A deploy-like workflow keyed by deployment id; input {"workspace", "production"}.
  Engine& start() {
    return engine([&](Engine& e) {
      ASSERT_TRUE(e.registerService(buildSlotService(pool_)).ok());
      ASSERT_TRUE(
          e
              .registerService(ServiceDefinition::virtualObject("Build").exclusive(
                  "run",
                  [&](Context& ctx, const std::string& input) -> absl::StatusOr<std::string> {
                    const auto in = nlohmann::json::parse(input);
                    const std::string ws = in["workspace"];
                    const std::string me = ctx.key();
                    Awakeable slot = ctx.awakeable();
                    ctx.compensate("release slot", [&ctx, ws, me] {
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
                  }))
              .ok());
    });
  }

  std::string deploy(Engine& e, const std::string& id, const std::string& ws, bool production) {
    auto r = e.send(
        {"Build", "run", id, nlohmann::json{{"workspace", ws}, {"production", production}}.dump()});
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : "";
  }

  Slots slots(Engine& e, const std::string& ws) {
    auto r = e.call({kServiceName, "Slots", ws, "{}"}, 10s);
    EXPECT_TRUE(r.ok()) << r.status();
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

TEST_F(BuildSlotTest, CapIsRespectedUnderFiftyConcurrentAcquirers) {
  setQuota("ws1", 3);
  Engine& e = start();
  std::vector<std::thread> ts;
  std::vector<std::string> invocations(50);
  for (int i = 0; i < 50; ++i) {
    ts.emplace_back(
        [&, i] { invocations[i] = deploy(e, "d" + std::to_string(i), "ws1", i % 2 == 0); });
  }
  for (auto& t : ts) t.join();
  for (const auto& id : invocations) {
    auto r = e.awaitResult(id, 120s);
    ASSERT_TRUE(r.ok()) << r.status();
  }
  EXPECT_LE(max_building_.load(), 3);
  EXPECT_GE(max_building_.load(), 2) << "slots were used in parallel";
  EXPECT_EQ(order_.size(), 50u);
  ASSERT_TRUE(eventually([&] {
    Slots s = slots(e, "ws1");
    return s.active.empty() && s.production.empty() && s.preview.empty();
  }));
}

TEST_F(BuildSlotTest, ProductionWaitersArePromotedBeforePreviewOnes) {
  setQuota("ws1", 1);
  Engine& e = start();
  {
    std::lock_guard lock(mu_);
    closed_.insert("holder");
  }
  const std::string holder = deploy(e, "holder", "ws1", false);
  ASSERT_TRUE(eventually([&] { return slots(e, "ws1").active.size() == 1; }));
  std::vector<std::string> invs;
  invs.push_back(deploy(e, "p1", "ws1", false));
  ASSERT_TRUE(eventually([&] { return slots(e, "ws1").preview.size() == 1; }));
  invs.push_back(deploy(e, "p2", "ws1", false));
  ASSERT_TRUE(eventually([&] { return slots(e, "ws1").preview.size() == 2; }));
  invs.push_back(deploy(e, "x1", "ws1", true));
  ASSERT_TRUE(eventually([&] { return slots(e, "ws1").production.size() == 1; }));
  Slots s = slots(e, "ws1");
  EXPECT_THAT(s.active, ElementsAre("holder"));
  EXPECT_THAT(ids(s.preview), ElementsAre("p1", "p2"));
  EXPECT_THAT(ids(s.production), ElementsAre("x1"));
  {
    std::lock_guard lock(mu_);
    closed_.clear();
  }
  ASSERT_TRUE(e.awaitResult(holder, 30s).ok());
  for (const auto& id : invs) ASSERT_TRUE(e.awaitResult(id, 30s).ok());
  std::lock_guard lock(mu_);
  EXPECT_THAT(order_, ElementsAre("holder", "x1", "p1", "p2"));
}

TEST_F(BuildSlotTest, ReleaseOfAWaiterThatNeverGotASlot) {
  setQuota("ws1", 1);
  Engine& e = start();
  {
    std::lock_guard lock(mu_);
    closed_.insert("holder");
  }
  const std::string holder = deploy(e, "holder", "ws1", true);
  ASSERT_TRUE(eventually([&] { return slots(e, "ws1").active.size() == 1; }));
  const std::string waiter = deploy(e, "w", "ws1", false);
  ASSERT_TRUE(eventually([&] { return slots(e, "ws1").preview.size() == 1; }));
  // Cancelling the waiting deploy runs its compensation: Release of a deployment still waiting.
  ASSERT_TRUE(e.cancel(waiter).ok());
  EXPECT_TRUE(absl::IsCancelled(e.awaitResult(waiter, 20s).status()));
  ASSERT_TRUE(eventually([&] { return slots(e, "ws1").preview.empty(); }));
  {
    std::lock_guard lock(mu_);
    closed_.clear();
  }
  ASSERT_TRUE(e.awaitResult(holder, 20s).ok());
  ASSERT_TRUE(eventually([&] { return slots(e, "ws1").active.empty(); }));
  std::lock_guard lock(mu_);
  EXPECT_THAT(order_, ElementsAre("holder")) << "the cancelled waiter was never promoted";
}

TEST_F(BuildSlotTest, HandlersAreIdempotentAndRefuseBadInput) {
  // ws2 has no quota row: the default cap of 1 applies.
  Engine& e = start();
  auto acquire = [&](const std::string& d) {
    return e.call(
        {kServiceName, "AcquireOrWait", "ws2", encodeAcquire({d, "prm_unknown_" + d, true})}, 10s);
  };
  EXPECT_EQ(*acquire("d1"), R"({"acquired":true})");
  EXPECT_EQ(*acquire("d1"), R"({"acquired":true})");
  EXPECT_EQ(*acquire("d2"), R"({"acquired":false})");
  EXPECT_EQ(*acquire("d2"), R"({"acquired":false})");
  Slots s = slots(e, "ws2");
  EXPECT_THAT(s.active, ElementsAre("d1"));
  EXPECT_THAT(ids(s.production), ElementsAre("d2"));

  auto release = [&](const std::string& d) {
    return nlohmann::json::parse(*e.call({kServiceName, "Release", "ws2", encodeRelease(d)}, 10s));
  };
  auto first = release("d1");
  EXPECT_TRUE(first["released"].get<bool>());
  EXPECT_EQ(first["promoted"], "d2");
  auto again = release("d1");
  EXPECT_FALSE(again["released"].get<bool>());
  EXPECT_TRUE(again["promoted"].is_null());
  EXPECT_THAT(slots(e, "ws2").active, ElementsAre("d2"));

  auto bad = e.call({kServiceName, "AcquireOrWait", "ws2", "{}"}, 10s);
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status()));
  EXPECT_THAT(workflow::messageOf(bad.status()), HasSubstr("deployment_id: required"));
  bad = e.call({kServiceName, "AcquireOrWait", "ws2", "not json"}, 10s);
  EXPECT_THAT(workflow::messageOf(bad.status()), HasSubstr("input is not a JSON object"));
  bad = e.call({kServiceName, "AcquireOrWait", "ws2",
                R"({"deployment_id":"d","awakeable_id":"a","is_production":"yes"})"},
               10s);
  EXPECT_THAT(workflow::messageOf(bad.status()), HasSubstr("is_production: must be true or false"));
  bad = e.call({kServiceName, "Release", "ws2", R"({"deployment_id":""})"}, 10s);
  EXPECT_THAT(workflow::messageOf(bad.status()), HasSubstr("deployment_id: required"));
}

}  // namespace
}  // namespace krane::services::buildslot
