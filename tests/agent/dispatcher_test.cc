#include "agent/dispatcher.h"

#include <random>
#include <thread>

#include <catch2/catch.hpp>

#include "agent/memory_ledger.h"
#include "common/strings.h"
#include "tests/support/wait.h"

namespace krane::agent {
namespace {

cluster::v1::Change change(const std::string& type, const std::string& id, uint64_t version,
                           cluster::v1::ChangeOp op = cluster::v1::CHANGE_OP_APPLY) {
  cluster::v1::Change c;
  c.set_op(op);
  c.set_version(version);
  auto* r = c.mutable_resource();
  r->set_type(type);
  r->set_id(id);
  r->set_region("eu-1");
  r->set_version(version);
  return c;
}

class FakePlugin : public PluginEndpoint {
 public:
  explicit FakePlugin(std::vector<std::string> types) : types_(std::move(types)) {}
  std::string name() const override { return "fake"; }
  std::vector<std::string> resourceTypes() const override { return types_; }
  absl::Status handle(const cluster::v1::Change& c) override {
    const int now = ++concurrent;
    int seen = max_concurrent.load();
    while (now > seen && !max_concurrent.compare_exchange_weak(seen, now)) {
    }
    if (delay.count() > 0) std::this_thread::sleep_for(delay * (c.version() % 3));
    --concurrent;
    std::lock_guard lock(mutex);
    const std::string& id = c.resource().id();
    if (id.rfind("invalid", 0) == 0) {
      ++invalid_attempts;
      return absl::InvalidArgumentError("spec.port: must be between 1 and 65535");
    }
    // Unavailable below version 100, as if the cluster were down for it.
    if (id.rfind("poison", 0) == 0 && c.version() < 100) {
      ++poison_attempts;
      return absl::UnavailableError("the cluster is unreachable");
    }
    // Unavailable for its first `flaky_failures` attempts.
    if (id.rfind("flaky", 0) == 0 && flaky_attempts++ < flaky_failures) {
      return absl::DeadlineExceededError("the API server did not answer in time");
    }
    order[c.resource().id()].push_back(c.version());
    return absl::OkStatus();
  }
  absl::Status syncBegin(uint64_t) override { return absl::OkStatus(); }
  absl::Status syncEnd(uint64_t, const std::string& region,
                       const std::map<std::string, std::set<std::string>>& ids) override {
    std::lock_guard lock(mutex);
    gc_ids = ids;
    gc_region = region;
    return absl::OkStatus();
  }

  std::chrono::milliseconds delay{0};
  std::atomic<int> concurrent{0};
  std::atomic<int> max_concurrent{0};
  std::mutex mutex;
  std::map<std::string, std::vector<uint64_t>> order;
  std::map<std::string, std::set<std::string>> gc_ids;
  std::string gc_region;
  int poison_attempts = 0;
  int invalid_attempts = 0;
  int flaky_attempts = 0;
  int flaky_failures = 0;

 private:
  std::vector<std::string> types_;
};

struct Fixture {
  explicit Fixture(DispatcherOptions options = {}) {
    plugin = std::make_shared<FakePlugin>(std::vector<std::string>{"bucket"});
    options.region = "eu-1";
    options.retry = {std::chrono::milliseconds(1), 2.0, std::chrono::milliseconds(5), 0.5};
    dispatcher = std::make_unique<Dispatcher>(
        std::vector<std::shared_ptr<PluginEndpoint>>{plugin}, ledger, watermark,
        [this](const cluster::v1::Change& c, const absl::Status& s, int attempts) {
          std::lock_guard lock(mutex);
          reports.push_back(
              strCat(c.resource().id(), " attempts=", attempts, " ", toStd(s.message())));
        },
        options);
  }
  std::shared_ptr<FakePlugin> plugin;
  MemoryLedger ledger;
  WatermarkTracker watermark;
  std::mutex mutex;
  std::vector<std::string> reports;
  std::unique_ptr<Dispatcher> dispatcher;

  // Waits (up to 10 s) until changes were retried `n` times in all.
  void waitRetried(uint64_t n) {
    REQUIRE(krane::testing::eventually([&] { return dispatcher->stats().retried >= n; },
                                       std::chrono::seconds(10)));
  }
};

TEST_CASE("one resource in order different resources in parallel", "[dispatcher]") {
  Fixture f({.workers_per_plugin = 4});
  f.plugin->delay = std::chrono::milliseconds(1);
  std::mt19937 rng(3);
  std::map<std::string, std::vector<uint64_t>> expected;
  for (uint64_t v = 1; v <= 400; ++v) {
    const std::string id = strCat("r", rng() % 8);
    expected[id].push_back(v);
    f.dispatcher->change(change("bucket", id, v), false);
  }
  f.dispatcher->drain();
  CHECK(f.plugin->order == expected);
  CHECK(f.plugin->max_concurrent.load() > 1);
  CHECK(f.watermark.watermark() == 400u);
  CHECK(f.dispatcher->stats().applied == 400u);
}

TEST_CASE("an older version after a newer one is ignored", "[dispatcher]") {
  Fixture f;
  f.dispatcher->change(change("bucket", "a", 10), false);
  f.dispatcher->drain();
  f.dispatcher->change(change("bucket", "a", 7), false);  // late, older
  f.dispatcher->drain();
  CHECK(f.plugin->order["a"] == std::vector<uint64_t>{10});
  CHECK(f.dispatcher->stats().skipped_stale == 1u);
  CHECK(f.watermark.watermark() == 10u);  // the late 7 does not move it back
}

TEST_CASE("a change the plugin refuses as invalid is parked and reported while others flow",
          "[dispatcher]") {
  Fixture f({.workers_per_plugin = 2, .max_attempts = 3});
  f.dispatcher->change(change("bucket", "good-1", 1), false);
  f.dispatcher->change(change("bucket", "invalid-1", 2), false);
  f.dispatcher->change(change("bucket", "good-2", 3), false);
  f.dispatcher->drain();
  CHECK(f.plugin->invalid_attempts == 3);
  CHECK(f.plugin->order.size() == 2u);
  REQUIRE(f.reports.size() == 1u);
  CHECK_THAT(f.reports[0], Catch::Contains("invalid-1 attempts=3 spec.port: must be"));
  CHECK_THAT(f.ledger.parked()[MemoryLedger::key("bucket", "invalid-1")],
             Catch::Contains("2: spec.port: must be"));
  CHECK(f.watermark.watermark() == 3u);  // parked, so it does not hold the cursor back
  CHECK(f.dispatcher->stats().parked == 1u);
}

// Seed 004's promise: the cursor only passes changes that were applied. A transient error is
// never parked, however many attempts it takes (here 20, four times the attempts an invalid
// change gets), and the watermark waits for it.
TEST_CASE("a transient failure is retried until applied and holds the cursor", "[dispatcher]") {
  Fixture f({.workers_per_plugin = 2, .max_attempts = 5});
  f.plugin->flaky_failures = 20;
  f.dispatcher->change(change("bucket", "flaky-1", 1), false);
  f.dispatcher->change(change("bucket", "good-1", 2), false);
  // While it is being retried: the other resource flowed, the cursor did not pass it.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    {
      std::lock_guard lock(f.plugin->mutex);
      if (f.plugin->flaky_attempts > 6 && f.plugin->order["good-1"].size() == 1) break;
    }
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  CHECK(f.watermark.watermark() == 0u);
  CHECK(f.dispatcher->stats().retrying == 1u);
  f.dispatcher->drain();
  CHECK(f.plugin->flaky_attempts == 21);
  CHECK(f.plugin->order["flaky-1"] == std::vector<uint64_t>{1});
  CHECK(f.watermark.watermark() == 2u);
  CHECK(f.reports.empty());
  CHECK(f.ledger.parked().empty());
  CHECK(f.dispatcher->stats().parked == 0u);
  CHECK(f.dispatcher->stats().retrying == 0u);
}

TEST_CASE("a newer change replaces one still being retried", "[dispatcher]") {
  Fixture f({.workers_per_plugin = 2});
  f.dispatcher->change(change("bucket", "poison-1", 2), false);  // unreachable below 100
  f.waitRetried(3);
  CHECK(f.watermark.watermark() == 0u);
  f.dispatcher->change(change("bucket", "poison-1", 100), false);
  f.dispatcher->drain();
  CHECK(f.plugin->order["poison-1"] == std::vector<uint64_t>{100});
  CHECK(f.watermark.watermark() == 100u);
  CHECK(f.dispatcher->stats().superseded == 1u);
  CHECK(f.ledger.parked().empty());
}

// A stream that breaks and resumes from the watermark delivers again the change still being
// retried. The copy is not newer: it must not replace the change being retried, nor let the
// watermark pass it (a restart would then never deliver it again).
TEST_CASE("the same change delivered again does not replace the one being retried",
          "[dispatcher]") {
  Fixture f({.workers_per_plugin = 2});
  f.dispatcher->change(change("bucket", "poison-1", 2), false);  // unreachable below 100
  f.waitRetried(3);
  f.dispatcher->change(change("bucket", "poison-1", 2), false);  // delivered again
  f.waitRetried(f.dispatcher->stats().retried + 5);
  CHECK(f.dispatcher->stats().superseded == 0u);
  CHECK(f.watermark.watermark() == 0u);
  // A newer change does replace it, and the watermark then passes both copies.
  f.dispatcher->change(change("bucket", "poison-1", 100), false);
  f.dispatcher->drain();
  CHECK(f.plugin->order["poison-1"] == std::vector<uint64_t>{100});
  CHECK(f.watermark.watermark() == 100u);
  CHECK(f.ledger.parked().empty());
}

TEST_CASE("a retrying change holds back only itself and is not acknowledged on stop",
          "[dispatcher]") {
  Fixture f({.workers_per_plugin = 2});
  f.dispatcher->change(change("bucket", "good-1", 1), false);
  f.dispatcher->change(change("bucket", "poison-1", 2), false);
  f.dispatcher->change(change("bucket", "good-2", 3), false);
  f.dispatcher->change(change("bucket", "good-1", 4), false);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    {
      std::lock_guard lock(f.plugin->mutex);
      if (f.plugin->order["good-1"].size() == 2 && f.plugin->order["good-2"].size() == 1 &&
          f.plugin->poison_attempts > 3)
        break;
    }
    INFO("others did not flow");
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  INFO("held at the change still being retried");
  CHECK(f.watermark.watermark() == 1u);
  // Stopping while it is retried must not count it as done.
  f.dispatcher.reset();
  CHECK(f.watermark.watermark() == 1u);
  CHECK(f.reports.empty());
}

// A full sync ends (garbage collection, the sync's version as watermark) only once every synced
// resource was applied. Stopping while one is still being retried must neither hang nor end the
// sync as if it had been applied.
TEST_CASE("stopping while a synced change is retried neither hangs nor ends the sync",
          "[dispatcher]") {
  Fixture f({.workers_per_plugin = 2});
  f.dispatcher->syncBegin(10);
  f.dispatcher->change(change("bucket", "good-1", 3), true);
  f.dispatcher->change(change("bucket", "poison-1", 7), true);
  std::thread sync_end(
      [&] { (void)f.dispatcher->syncEnd(10, 2); });  // waits for the synced changes
  f.waitRetried(3);
  f.dispatcher->stop(std::chrono::milliseconds(50));
  sync_end.join();
  CHECK(f.watermark.watermark() == 0u);
  std::lock_guard lock(f.plugin->mutex);
  INFO("no garbage collection after a sync that was not applied in full");
  CHECK(f.plugin->gc_ids.empty());
}

// A demoted leader stops the dispatcher: once stop() returns, no plugin call is under way and
// none starts, and what was queued stays unacknowledged (the next leader applies it).
TEST_CASE("once stopped no change reaches the plugin and queued ones stay unacknowledged",
          "[dispatcher]") {
  Fixture f({.workers_per_plugin = 2, .batch = 1});
  f.plugin->delay = std::chrono::milliseconds(20);  // 0, 20 or 40 ms a call
  for (uint64_t v = 1; v <= 60; ++v)
    f.dispatcher->change(change("bucket", strCat("b", v), v), false);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  auto applied = [&] {
    std::lock_guard lock(f.plugin->mutex);
    size_t n = 0;
    for (const auto& [id, versions] : f.plugin->order) n += versions.size();
    return n;
  };
  while (applied() < 5) {
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  f.dispatcher->stop(std::chrono::milliseconds(0));
  INFO("no plugin call outlives stop()");
  CHECK(f.plugin->concurrent.load() == 0);
  const size_t at_stop = applied();
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  INFO("nothing is handed to the plugin after stop()");
  CHECK(applied() == at_stop);
  CHECK(at_stop < 60u);
  INFO("the watermark stays below the first change not applied");
  CHECK(f.watermark.watermark() <= at_stop);
  f.dispatcher.reset();
  CHECK(applied() == at_stop);
}

TEST_CASE("a change no plugin owns is parked and reported not skipped", "[dispatcher]") {
  Fixture f;
  f.dispatcher->change(change("unknown.example/thing", "x", 1), false);
  f.dispatcher->drain();
  REQUIRE(f.reports.size() == 1u);
  CHECK_THAT(f.reports[0],
             Catch::Contains("no loaded plugin owns resource type \"unknown.example/thing\""));
  CHECK(f.ledger.parked().count(MemoryLedger::key("unknown.example/thing", "x")) == 1u);
  CHECK(f.dispatcher->stats().unowned == 1u);
}

TEST_CASE("after a sync each plugin learns what the sync contained", "[dispatcher]") {
  Fixture f;
  f.dispatcher->syncBegin(5);
  f.dispatcher->change(change("bucket", "a", 2), true);
  f.dispatcher->change(change("bucket", "b", 5), true);
  CHECK(f.dispatcher->syncEnd(5, 2));
  CHECK(f.plugin->gc_ids["bucket"] == std::set<std::string>{"a", "b"});
  CHECK(f.plugin->gc_region == "eu-1");
  CHECK(f.watermark.watermark() == 5u);
}

// The server says how many resources it sent; a sync that brought another number (lost on the
// way, or a bug) must not delete anything the plugin manages, nor claim its version.
TEST_CASE("a sync whose count does not match deletes nothing", "[dispatcher]") {
  Fixture f;
  f.dispatcher->syncBegin(5);
  f.dispatcher->change(change("bucket", "a", 2), true);
  f.dispatcher->change(change("bucket", "b", 5), true);
  CHECK_FALSE(f.dispatcher->syncEnd(5, 3));
  INFO("no garbage collection ran");
  CHECK(f.plugin->gc_ids.empty());
  CHECK(f.watermark.watermark() == 0u);
  CHECK(f.dispatcher->stats().syncs_refused == 1u);
  // The next, complete sync is taken.
  f.dispatcher->syncBegin(6);
  f.dispatcher->change(change("bucket", "a", 2), true);
  CHECK(f.dispatcher->syncEnd(6, 1));
  CHECK(f.plugin->gc_ids["bucket"] == std::set<std::string>{"a"});
  CHECK(f.watermark.watermark() == 6u);
}

TEST_CASE("a delete forgets the resource so it can come back", "[dispatcher]") {
  Fixture f;
  f.dispatcher->change(change("bucket", "a", 1), false);
  f.dispatcher->change(change("bucket", "a", 2, cluster::v1::CHANGE_OP_DELETE), false);
  f.dispatcher->drain();
  CHECK(f.ledger.applied().count(MemoryLedger::key("bucket", "a")) == 0u);
  f.dispatcher->change(change("bucket", "a", 3), false);
  f.dispatcher->drain();
  CHECK(f.plugin->order["a"] == std::vector<uint64_t>{1, 2, 3});
}

TEST_CASE("a full sync replaces the ledger even with lower versions", "[dispatcher]") {
  // The control plane's database was restored from a backup: the region's versions went back.
  // The full sync that follows must be the truth, or later changes would be skipped as stale.
  Fixture f;
  f.dispatcher->change(change("bucket", "a", 40), false);
  f.dispatcher->change(change("bucket", "gone", 41), false);
  f.dispatcher->drain();
  f.dispatcher->syncBegin(12);
  f.dispatcher->change(change("bucket", "a", 10), true);
  REQUIRE(f.dispatcher->syncEnd(12, 1));
  CHECK(f.ledger.appliedVersion("bucket", "a") == 10u);
  INFO("not in the snapshot");
  CHECK(f.ledger.appliedVersion("bucket", "gone") == std::nullopt);
  CHECK(f.watermark.watermark() == 12u);
  // Versions 13.. are new writes after the restore: applied, not skipped as older than 40.
  f.dispatcher->change(change("bucket", "a", 13), false);
  f.dispatcher->change(change("bucket", "gone", 14), false);
  f.dispatcher->drain();
  CHECK(f.plugin->order["a"] == std::vector<uint64_t>{40, 10, 13});
  CHECK(f.plugin->order["gone"] == std::vector<uint64_t>{41, 14});
  CHECK(f.dispatcher->stats().skipped_stale == 0u);
}

}  // namespace
}  // namespace krane::agent
