// The rolling-update evaluator (controlplane/strategy/rolling.h): seed 002's cycle-by-cycle table
// for desired 3, surge 1, unavailable 1, the other shapes of spec, scaling during a rollout, the
// spec checks, and a property test over random specs and random instance transitions.
#include "controlplane/strategy/rolling.h"

#include <random>

#include <catch2/catch.hpp>

#include "common/strings.h"

namespace krane::strategy {
namespace {

using S = InstanceState;

// A region's instances, changed the way the coordinator and the runtime change them.
struct World {
  std::vector<Instance> instances;
  int next = 0;

  explicit World(uint32_t old_healthy) {
    for (uint32_t i = 0; i < old_healthy; ++i) {
      instances.push_back({strCat("old-", i), false, S::kHealthy});
    }
  }
  // Applies an evaluation: new instances start provisioning, drained ones go away.
  void apply(const Evaluation& e) {
    for (uint32_t i = 0; i < e.to_create; ++i) {
      instances.push_back({strCat("new-", next++), true, S::kProvisioning});
    }
    std::erase_if(instances, [&](const Instance& i) {
      return std::find(e.drain_ids.begin(), e.drain_ids.end(), i.id) != e.drain_ids.end();
    });
  }
  void allProvisioningBecome(S state) {
    for (auto& i : instances) {
      if (i.state == S::kProvisioning) i.state = state;
    }
  }
  uint32_t count(bool is_new, S state) const {
    uint32_t n = 0;
    for (const auto& i : instances) n += i.is_new == is_new && i.state == state ? 1 : 0;
    return n;
  }
};

// One row of the seed's table: what the cycle sees, and what it decides.
struct Cycle {
  uint32_t old_healthy, new_healthy, new_provisioning;
  Result result;
  uint32_t create, drain;
};

TEST_CASE("seed 002's table: desired 3, surge 1, unavailable 1, cycle by cycle", "[strategy]") {
  const ResolvedSpec spec{1, 1};
  World w(3);
  const std::vector<Cycle> table = {
      {3, 0, 0, Result::kProgressing, 1, 1},   // cycle 0
      {2, 0, 1, Result::kProvisioning, 0, 0},  // cycle 1
      {2, 1, 0, Result::kProgressing, 1, 1},   // cycle 2
      {1, 1, 1, Result::kProvisioning, 0, 0},  // cycle 3
      {1, 2, 0, Result::kProgressing, 1, 1},   // cycle 4
      {0, 2, 1, Result::kProvisioning, 0, 0},  // cycle 5
      {0, 3, 0, Result::kCompleted, 0, 0},     // cycle 6
  };
  for (size_t cycle = 0; cycle < table.size(); ++cycle) {
    INFO("cycle " << cycle);
    const Cycle& row = table[cycle];
    CHECK(w.count(false, S::kHealthy) == row.old_healthy);
    CHECK(w.count(true, S::kHealthy) == row.new_healthy);
    CHECK(w.count(true, S::kProvisioning) == row.new_provisioning);
    const Evaluation e = evaluate(w.instances, 3, spec);
    CHECK(e.result == row.result);
    CHECK(e.to_create == row.create);
    CHECK(e.drain_ids.size() == row.drain);
    CHECK(e.max_total == 4u);
    CHECK(e.min_available == 2u);
    if (row.result == Result::kProvisioning) {
      w.allProvisioningBecome(S::kHealthy);  // the runtime brings them up between cycles
    } else {
      w.apply(e);
    }
  }
}

// Runs a rollout to completion with instances that come up between cycles; checks the bounds
// after every cycle. Returns the cycles it took.
int rollOut(uint32_t desired, ResolvedSpec spec, uint32_t* lowest_healthy = nullptr) {
  World w(desired);
  uint32_t lowest = desired;
  for (int cycle = 0; cycle < 100; ++cycle) {
    const Evaluation e = evaluate(w.instances, desired, spec);
    if (e.result == Result::kCompleted) {
      if (lowest_healthy) *lowest_healthy = lowest;
      return cycle;
    }
    if (e.result == Result::kProvisioning) {
      w.allProvisioningBecome(S::kHealthy);
    } else {
      w.apply(e);
    }
    const Counts c = classify(w.instances);
    CHECK(c.total_active() <= desired + spec.max_surge);
    lowest = std::min(lowest, c.old_active + c.new_healthy);
    CHECK(c.old_active + c.new_healthy >=
          std::min(desired - std::min(desired, spec.max_unavailable), desired));
  }
  FAIL("the rollout did not complete in 100 cycles");
  return -1;
}

TEST_CASE("other shapes of spec keep their bounds and complete", "[strategy]") {
  uint32_t lowest = 0;
  SECTION("surge 0, unavailable 1: drain first, never above desired") {
    CHECK(rollOut(3, {0, 1}, &lowest) > 0);
    CHECK(lowest == 2u);
    World w(3);
    const Evaluation first = evaluate(w.instances, 3, {0, 1});
    CHECK(first.to_create == 0u);
    CHECK(first.drain_ids == std::vector<std::string>{"old-0"});
  }
  SECTION("surge 2, unavailable 0: create first, never below desired") {
    CHECK(rollOut(3, {2, 0}, &lowest) > 0);
    CHECK(lowest == 3u);
    World w(3);
    const Evaluation first = evaluate(w.instances, 3, {2, 0});
    CHECK(first.to_create == 2u);
    CHECK(first.drain_ids.empty());
  }
  SECTION("desired 1, surge 1, unavailable 0: the old one stays until the new one is healthy") {
    World w(1);
    Evaluation e = evaluate(w.instances, 1, {1, 0});
    CHECK(e.to_create == 1u);
    CHECK(e.drain_ids.empty());
    w.apply(e);
    w.allProvisioningBecome(S::kHealthy);
    e = evaluate(w.instances, 1, {1, 0});
    CHECK(e.drain_ids == std::vector<std::string>{"old-0"});
    w.apply(e);
    CHECK(evaluate(w.instances, 1, {1, 0}).result == Result::kCompleted);
    CHECK(rollOut(1, {1, 0}, &lowest) > 0);
    CHECK(lowest == 1u);
  }
  SECTION("desired 1, surge 0, unavailable 1: the spec allows the gap, the old one goes first") {
    World w(1);
    const Evaluation e = evaluate(w.instances, 1, {0, 1});
    CHECK(e.to_create == 0u);
    CHECK(e.drain_ids == std::vector<std::string>{"old-0"});
    CHECK(rollOut(1, {0, 1}) > 0);
  }
  SECTION("the zero-downtime guard: unavailable 2 of 3, the last old one waits for a new one") {
    World w(3);
    const Evaluation e = evaluate(w.instances, 3, {1, 2});
    CHECK(e.to_create == 1u);
    CHECK(e.drain_ids.size() == 2u);  // can_terminate 3 - 1 = 2, and one old stays
  }
}

TEST_CASE("scaling during a rollout completes at the new size", "[strategy]") {
  const ResolvedSpec spec{1, 0};
  World w(3);
  w.apply(evaluate(w.instances, 3, spec));
  w.allProvisioningBecome(S::kHealthy);
  w.apply(evaluate(w.instances, 3, spec));
  uint32_t desired = 5;  // scaled up mid-rollout
  for (int cycle = 0; cycle < 50; ++cycle) {
    const Evaluation e = evaluate(w.instances, desired, spec);
    if (e.result == Result::kCompleted) break;
    if (e.result == Result::kProvisioning) {
      w.allProvisioningBecome(S::kHealthy);
    } else {
      w.apply(e);
    }
    CHECK(classify(w.instances).total_active() <= desired + 1);
  }
  const Counts c = classify(w.instances);
  CHECK(c.old_active == 0u);
  CHECK(c.new_healthy == 5u);
  CHECK(evaluate(w.instances, 5, spec).result == Result::kCompleted);
}

TEST_CASE("failed new instances are replaced and never counted as capacity", "[strategy]") {
  const ResolvedSpec spec{1, 0};
  World w(2);
  w.apply(evaluate(w.instances, 2, spec));
  w.allProvisioningBecome(S::kFailed);
  const Evaluation e = evaluate(w.instances, 2, spec);
  CHECK(e.counts.new_failed == 1u);
  CHECK(e.to_create == 1u);    // a replacement, within the surge
  CHECK(e.drain_ids.empty());  // no new one is healthy: the old ones all stay
}

TEST_CASE("specs are checked naming the field, percentages resolve as Kubernetes does",
          "[strategy]") {
  CHECK(checkSpec({{1, false}, {0, false}}).ok());
  auto both_zero = checkSpec({{0, false}, {0, false}}, "strategy.");
  CHECK(both_zero.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(both_zero.message()).find("strategy.max_surge, strategy.max_unavailable") !=
        std::string::npos);
  auto over = checkSpec({{101, true}, {0, false}});
  CHECK(std::string(over.message()) == "max_surge: at most 100%, got 101%");
  CHECK(checkSpec({{0, false}, {100, true}}).ok());

  const auto r = resolve({{25, true}, {25, true}}, 10);
  CHECK(r.max_surge == 3u);        // 2.5 rounds up
  CHECK(r.max_unavailable == 2u);  // 2.5 rounds down
  const auto tiny = resolve({{0, true}, {10, true}}, 3);
  CHECK(tiny.max_surge == 0u);
  CHECK(tiny.max_unavailable == 1u);  // both 0 after rounding: 1, so it can move
}

// Random specs and random instance transitions: the total never exceeds max_total, the healthy
// count never drops below min_available (it starts at desired), and every rollout without
// failures completes; with failures it either completes or is still bounded when time runs out.
TEST_CASE("property: bounds hold and rollouts end under random transitions", "[strategy]") {
  std::mt19937 rng(20261125);
  int completed = 0;
  for (int run = 0; run < 2000; ++run) {
    const uint32_t desired = 1 + rng() % 10;
    ResolvedSpec spec{static_cast<uint32_t>(rng() % 4), static_cast<uint32_t>(rng() % 4)};
    if (spec.max_surge == 0 && spec.max_unavailable == 0) spec.max_surge = 1;
    const bool failures = rng() % 3 == 0;
    const uint32_t min_available = desired - std::min(desired, spec.max_unavailable);
    World w(desired);
    bool done = false;
    for (int cycle = 0; cycle < 400 && !done; ++cycle) {
      const Evaluation e = evaluate(w.instances, desired, spec);
      if (e.result == Result::kCompleted) {
        done = true;
        break;
      }
      w.apply(e);
      const Counts c = classify(w.instances);
      INFO("run " << run << " desired " << desired << " surge " << spec.max_surge << " unavailable "
                  << spec.max_unavailable << " cycle " << cycle);
      REQUIRE(c.total_active() <= desired + spec.max_surge);
      REQUIRE(c.old_active + c.new_healthy >= min_available);
      // The runtime moves some instances on.
      for (auto& i : w.instances) {
        if (!i.is_new || i.state != S::kProvisioning || rng() % 2) continue;
        i.state = failures && rng() % 5 == 0 ? S::kFailed : S::kHealthy;
      }
      // Failed ones are cleaned up now and then.
      if (rng() % 4 == 0) {
        std::erase_if(w.instances, [](const Instance& i) { return i.state == S::kFailed; });
      }
    }
    if (!failures) {
      INFO("run " << run << " desired " << desired << " surge " << spec.max_surge << " unavailable "
                  << spec.max_unavailable);
      CHECK(done);
    }
    completed += done ? 1 : 0;
  }
  CHECK(completed > 1500);
}

}  // namespace
}  // namespace krane::strategy
