// The hub and the tailer on a real MariaDB: a subscriber is given the position it must read up
// to itself, and then receives every batch after it, with nothing in between; even when it joins
// at the moment the tailer moves an unwatched region's position forward.
#include "controlplane/feed/hub.h"

#include <atomic>
#include <random>
#include <thread>

#include <catch2/catch.hpp>
#include <google/protobuf/util/message_differencer.h>

#include "common/strings.h"
#include "controlplane/db/migrate.h"
#include "controlplane/feed/change_reader.h"
#include "controlplane/feed/encoded_event.h"
#include "controlplane/feed/tables.h"
#include "controlplane/feed/tailer.h"
#include "controlplane/feed/writer.h"
#include "tests/support/mariadb.h"
#include "tests/support/matchers.h"

namespace krane::feed {
namespace {

using namespace std::chrono_literals;

// Records the (after, through] ranges it is handed.
class Recorder : public Subscriber {
 public:
  void deliver(const std::shared_ptr<const EventBatch>& batch) override {
    std::lock_guard lock(mutex_);
    ranges_.emplace_back(batch->after, batch->through);
  }
  void expire(const std::string&) override {
    std::lock_guard lock(mutex_);
    expired_ = true;
  }
  std::vector<std::pair<uint64_t, uint64_t>> ranges() {
    std::lock_guard lock(mutex_);
    return ranges_;
  }
  bool expired() {
    std::lock_guard lock(mutex_);
    return expired_;
  }

 private:
  std::mutex mutex_;
  std::vector<std::pair<uint64_t, uint64_t>> ranges_;
  bool expired_ = false;
};

class HubTest : public krane::testing::MigratedDbTest {
 protected:
  HubTest() : MigratedDbTest(8) {
    REQUIRE_THAT(
        (*pool_->acquire())
            ->exec("INSERT INTO regions (id, display_name, created_at) VALUES ('eu-1', 'eu-1', 1)"),
        IsOk());
    writer_ = std::make_shared<Writer>(pool_, tables_);
  }

  Resource bucket(int n) {
    Resource r;
    r.set_type("example.krane.dev/bucket");
    r.set_id(strCat("b", n % 50));
    r.set_region("eu-1");
    r.mutable_generic()->set_spec(strCat("spec ", n));
    r.mutable_generic()->set_content_type("text/plain");
    return r;
  }

  std::shared_ptr<const ResourceTables> tables_ = std::make_shared<ResourceTables>();
  std::shared_ptr<Writer> writer_;
};

// A subscriber reads (cursor, position] from the database and relies on the hub for everything
// after `position`: the first batch it gets must start at or before it, and each next batch where
// the previous one ended. Subscribers come and go in a tight loop while writers commit and the
// tailer polls without pause, so some join while the region has nobody watching it: exactly when
// the tailer moves the position of an unwatched region.
TEST_CASE_METHOD(HubTest, "subscribers joining while writers commit never start past a gap",
                 "[feed][hub]") {
  auto hub = std::make_shared<Hub>();
  Tailer tailer(pool_, tables_, hub);
  std::atomic<bool> stop{false};
  std::atomic<int> commits{0};
  std::thread writer([&] {
    for (int n = 0; !stop; ++n) {
      if (writer_->put(bucket(n)).ok()) ++commits;
    }
  });
  std::thread tailing([&] {
    while (!stop) (void)tailer.pollOnce();
  });

  std::mt19937 rng(7);
  int checked = 0;
  std::vector<std::string> gaps;
  const auto deadline = std::chrono::steady_clock::now() + 25s;
  for (int i = 0; i < 3000 && std::chrono::steady_clock::now() < deadline; ++i) {
    auto recorder = std::make_shared<Recorder>();
    const uint64_t position = hub->subscribe("eu-1", recorder);
    // Until it has seen a batch that ends past its position (one or two commits away).
    const auto until = std::chrono::steady_clock::now() + 2s;
    while (std::chrono::steady_clock::now() < until) {
      auto ranges = recorder->ranges();
      if (!ranges.empty() && ranges.back().second > position) break;
      std::this_thread::sleep_for(100us);
    }
    hub->unsubscribe("eu-1", recorder.get());
    REQUIRE_FALSE(recorder->expired());
    uint64_t at = position;
    for (const auto& [after, through] : recorder->ranges()) {
      if (through <= at) continue;  // at or below the position: read from the database
      if (after > at) {
        gaps.push_back(strCat("subscriber ", i, " at ", at, " got (", after, ", ", through, "]"));
      }
      at = through;
    }
    if (at > position) ++checked;
    // Leave the region unwatched for a moment, so that the tailer skips it now and then.
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 400));
  }
  stop = true;
  writer.join();
  tailing.join();
  INFO(commits.load() << " commits, " << checked << " subscribers checked");
  CHECK(checked > 100);
  CHECK(gaps == std::vector<std::string>{});
}

// Keeps every batch it is handed.
class Keeper : public Subscriber {
 public:
  void deliver(const std::shared_ptr<const EventBatch>& batch) override {
    std::lock_guard lock(mutex_);
    batches_.push_back(batch);
  }
  void expire(const std::string&) override {}
  std::vector<std::shared_ptr<const EventBatch>> batches() {
    std::lock_guard lock(mutex_);
    return batches_;
  }

 private:
  std::mutex mutex_;
  std::vector<std::shared_ptr<const EventBatch>> batches_;
};

// What the streams write is the tailer's one encoding of each change: it must decode to the
// event, and the event must be the resource exactly as the database holds it.
TEST_CASE_METHOD(HubTest, "published changes are encoded once, as the database holds them",
                 "[feed][hub]") {
  auto hub = std::make_shared<Hub>();
  Tailer tailer(pool_, tables_, hub);
  auto keeper = std::make_shared<Keeper>();
  (void)hub->subscribe("eu-1", keeper);
  for (int n = 0; n < 120; ++n) REQUIRE_THAT(writer_->put(bucket(n)), IsOk());
  for (int n = 0; n < 10; ++n) {
    REQUIRE_THAT(writer_->remove(ResourceKey{"example.krane.dev/bucket", strCat("b", n), "eu-1"}),
                 IsOk());
  }
  REQUIRE_THAT(tailer.pollOnce(), IsOk());
  auto conn = pool_->acquire();
  REQUIRE_THAT(conn, IsOk());
  uint64_t next = 1;
  size_t deletes = 0;
  for (const auto& batch : keeper->batches()) {
    for (const auto& event : batch->events) {
      REQUIRE(event.version == next++);
      cluster::v1::WatchEvent decoded;
      REQUIRE(decoded.ParseFromArray(event.wire.begin(), static_cast<int>(event.wire.size())));
      CHECK(google::protobuf::util::MessageDifferencer::Equals(decoded, *event.event));
      const auto& r = decoded.change().resource();
      const ResourceKey key{r.type(), r.id(), r.region()};
      auto stored = tables_->forType(key.type).load(**conn, key);
      REQUIRE_THAT(stored, IsOk());
      auto expected = makeChangeEvent(event.version, key, *stored);
      INFO("version " << event.version);
      CHECK(google::protobuf::util::MessageDifferencer::Equals(decoded, *expected));
      if (decoded.change().op() == cluster::v1::CHANGE_OP_DELETE) ++deletes;
    }
  }
  CHECK(next == 131);
  // Every change of the ten removed buckets (the first changes included) reads as a delete now.
  CHECK(deletes >= 10);
}

}  // namespace
}  // namespace krane::feed
