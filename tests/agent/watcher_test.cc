// The agent's watcher against a real krane-ctrl on a real MariaDB.
#include "agent/watcher.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <map>
#include <thread>

#include <catch2/catch.hpp>

#include "agent/watermark.h"
#include "common/clock.h"
#include "common/strings.h"
#include "controlplane/feed/cleanup.h"
#include "controlplane/feed/tables.h"
#include "tests/support/control_plane.h"
#include "tests/support/matchers.h"
#include "tests/support/wait.h"

namespace krane::agent {
namespace {

using krane::testing::TestControlPlane;
using namespace std::chrono_literals;

cluster::v1::Resource bucket(const std::string& id, const std::string& spec) {
  cluster::v1::Resource r;
  r.set_type("example.krane.dev/bucket");
  r.set_id(id);
  r.set_region("eu-1");
  r.mutable_generic()->set_spec(spec);
  return r;
}

// Applies at once and acknowledges, like a trivially fast plugin, keeping a view of the state.
class RecordingSink : public ChangeSink {
 public:
  void syncBegin(uint64_t) override {
    std::lock_guard lock(mutex_);
    ++syncs;
    seen.clear();
    watermark.syncBegin();
  }
  void change(const cluster::v1::Change& c, bool in_sync) override {
    std::lock_guard lock(mutex_);
    if (in_sync) {
      watermark.syncReceived();
    } else {
      watermark.received(c.version());
    }
    if (c.op() == cluster::v1::CHANGE_OP_APPLY) {
      seen[c.resource().id()] = c.resource().generic().spec();
    } else {
      seen.erase(c.resource().id());
    }
    if (in_sync) {
      watermark.syncAcknowledged();
    } else {
      watermark.acknowledged(c.version());
    }
  }
  bool syncEnd(uint64_t version, uint64_t) override {
    watermark.syncEnd(version);
    return true;
  }
  void bookmark(uint64_t version) override { watermark.bookmark(version); }

  bool waitFor(uint64_t version, std::chrono::seconds timeout = std::chrono::seconds(30)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (watermark.watermark() < version) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return true;
  }
  std::map<std::string, std::string> view() {
    std::lock_guard lock(mutex_);
    return seen;
  }
  int syncCount() {
    std::lock_guard lock(mutex_);
    return syncs;
  }

  WatermarkTracker watermark;

 private:
  std::mutex mutex_;
  std::map<std::string, std::string> seen;
  int syncs = 0;
};

// Applies a full sync's resources at once and hands live changes to live(), which acknowledges
// them (or not) as the test needs; the watermark follows.
class LiveSink : public ChangeSink {
 public:
  void syncBegin(uint64_t) override { watermark.syncBegin(); }
  void change(const cluster::v1::Change& c, bool in_sync) override {
    if (in_sync) {
      watermark.syncReceived();
      watermark.syncAcknowledged();
      return;
    }
    watermark.received(c.version());
    live(c);
  }
  bool syncEnd(uint64_t version, uint64_t) override {
    watermark.syncEnd(version);
    return true;
  }
  void bookmark(uint64_t version) override { watermark.bookmark(version); }

  WatermarkTracker watermark;

 protected:
  virtual void live(const cluster::v1::Change& c) = 0;
};

// Acknowledges each change 20 ms after it arrived, on a thread of its own, as the agent's
// dispatcher does through its plugins; counts the deliveries of each version.
class DeferredSink : public LiveSink {
 public:
  DeferredSink() : worker_([this] { run(); }) {}
  ~DeferredSink() override {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    worker_.join();
  }
  // Versions delivered more than once.
  size_t redelivered() {
    std::lock_guard lock(mutex_);
    size_t n = 0;
    for (const auto& [version, times] : deliveries_) n += times > 1 ? 1 : 0;
    return n;
  }

 private:
  void live(const cluster::v1::Change& c) override {
    std::lock_guard lock(mutex_);
    ++deliveries_[c.version()];
    queue_.emplace_back(c.version(), std::chrono::steady_clock::now() + 20ms);
    wake_.notify_all();
  }
  void run() {
    std::unique_lock lock(mutex_);
    while (!stopping_) {
      if (queue_.empty()) {
        wake_.wait(lock);
        continue;
      }
      const auto [version, due] = queue_.front();
      if (std::chrono::steady_clock::now() < due) {
        wake_.wait_until(lock, due);
        continue;
      }
      queue_.pop_front();
      lock.unlock();
      watermark.acknowledged(version);
      lock.lock();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::pair<uint64_t, std::chrono::steady_clock::time_point>> queue_;
  std::map<uint64_t, int> deliveries_;
  bool stopping_ = false;
  std::thread worker_;
};

// A RecordingSink that, while closed, holds the first change of a full sync until opened: a
// sync that a test cuts off midway.
class GatedSink : public RecordingSink {
 public:
  void change(const cluster::v1::Change& c, bool in_sync) override {
    {
      std::unique_lock lock(gate_mutex_);
      if (in_sync && closed_) {
        holding_ = true;
        opened_.wait(lock, [&] { return !closed_; });
      }
    }
    RecordingSink::change(c, in_sync);
  }
  void close() {
    std::lock_guard lock(gate_mutex_);
    closed_ = true;
  }
  void open() {
    {
      std::lock_guard lock(gate_mutex_);
      closed_ = false;
    }
    opened_.notify_all();
  }
  bool holding() {
    std::lock_guard lock(gate_mutex_);
    return holding_;
  }

 private:
  std::mutex gate_mutex_;
  std::condition_variable opened_;
  bool closed_ = false;
  bool holding_ = false;
};

// Applies at once, except the live changes of the resource "stuck", which it never acknowledges
// (a change retried for long holds the cursor); records when each resource's last change came.
class StuckSink : public LiveSink {
 public:
  // When a live change of `id` came; the epoch if none did.
  std::chrono::steady_clock::time_point arrived(const std::string& id) {
    std::lock_guard lock(mutex_);
    auto it = arrived_.find(id);
    return it == arrived_.end() ? std::chrono::steady_clock::time_point{} : it->second;
  }

 private:
  void live(const cluster::v1::Change& c) override {
    {
      std::lock_guard lock(mutex_);
      arrived_[c.resource().id()] = std::chrono::steady_clock::now();
    }
    if (c.resource().id() != "stuck") watermark.acknowledged(c.version());
  }

  std::mutex mutex_;
  std::map<std::string, std::chrono::steady_clock::time_point> arrived_;
};

WatcherOptions options(TestControlPlane& cp) {
  WatcherOptions o;
  o.region = "eu-1";
  o.agent_id = "test";
  o.token = cp.agentToken("eu-1");
  o.reconnect = {std::chrono::milliseconds(50), 2.0, std::chrono::milliseconds(200), 0.5};
  return o;
}

TEST_CASE("syncs then follows and resumes after a control plane restart without resync",
          "[watcher]") {
  TestControlPlane cp;
  cp.startReplica([](ctrl::CtrlConfig& c) { c.listen = "127.0.0.1:0"; });
  for (int i = 0; i < 5; ++i)
    REQUIRE_THAT(cp.replica(0).writer().put(bucket(strCat("b", i), "1")), IsOk());
  // A fixed port, so that the restarted control plane is found at the same address.
  const int port = cp.replica(0).grpcPort();
  RecordingSink sink;
  Watcher watcher(cp.channel(0), options(cp), sink, [&] { return sink.watermark.watermark(); });
  watcher.start();
  REQUIRE(sink.waitFor(5));
  CHECK(sink.syncCount() == 1);
  REQUIRE_THAT(cp.replica(0).writer().put(bucket("b0", "2")), IsOk());
  REQUIRE(sink.waitFor(6));

  cp.stopReplica(0);
  auto& second =
      cp.startReplica([&](ctrl::CtrlConfig& c) { c.listen = strCat("127.0.0.1:", port); });
  for (int i = 5; i < 10; ++i)
    REQUIRE_THAT(second.writer().put(bucket(strCat("b", i), "1")), IsOk());
  REQUIRE(sink.waitFor(11));
  INFO("resumed from the watermark, no full sync");
  CHECK(sink.syncCount() == 1);
  CHECK(watcher.stats().connects >= 2u);
  CHECK(sink.view().size() == 10u);
  CHECK(sink.view().at("b0") == "2");
  watcher.stop();
}

TEST_CASE("a full sync cut off midway starts over instead of holding the cursor", "[watcher]") {
  TestControlPlane cp;
  cp.startReplica([](ctrl::CtrlConfig& c) { c.listen = "127.0.0.1:0"; });
  // 1000 resources of 2 KB, one transaction: a sync larger than the stream's flow-control
  // window (64 KB, not grown: no BDP probes), so that krane-ctrl has not sent its end when the
  // sink stops reading.
  REQUIRE_THAT(cp.replica(0).writer().transact(
                   "test",
                   [](feed::WriteTx& tx) -> absl::Status {
                     for (int i = 0; i < 1000; ++i) {
                       if (auto st = tx.put(bucket(strCat("b", i), std::string(2048, 'x')));
                           !st.ok())
                         return st;
                     }
                     return absl::OkStatus();
                   }),
               IsOk());
  const int port = cp.replica(0).grpcPort();
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 64 * 1024);
  GatedSink sink;
  Watcher watcher(grpc::CreateCustomChannel(strCat("127.0.0.1:", port),
                                            grpc::InsecureChannelCredentials(), args),
                  options(cp), sink, [&] { return sink.watermark.watermark(); });
  watcher.start();
  REQUIRE(sink.waitFor(1000));
  // A full sync (asked for, as after an expired cursor) is held at its first resource while
  // krane-ctrl goes away: the stream ends within the sync.
  sink.close();
  watcher.requestResync();
  REQUIRE(testing::eventually([&] { return sink.holding(); }));
  cp.stopReplica(0);
  sink.open();
  auto& second =
      cp.startReplica([&](ctrl::CtrlConfig& c) { c.listen = strCat("127.0.0.1:", port); });
  REQUIRE_THAT(second.writer().put(bucket("b1000", "1")), IsOk());
  INFO("the cursor moves on: the full sync was done again, not resumed from the cursor");
  REQUIRE(sink.waitFor(1001));
  CHECK(sink.syncCount() == 3);
  CHECK(sink.view().size() == 1001u);
  watcher.stop();
}

TEST_CASE("a preferred channel takes the stream over from the cursor; one that fails is left",
          "[watcher]") {
  TestControlPlane cp;
  auto& server = cp.startReplica([](ctrl::CtrlConfig& c) { c.feed.watch_listen = "127.0.0.1:0"; });
  for (int i = 0; i < 5; ++i)
    REQUIRE_THAT(server.writer().put(bucket(strCat("b", i), "1")), IsOk());
  RecordingSink sink;
  WatcherOptions o = options(cp);
  o.fallback_for = std::chrono::seconds(1);
  Watcher watcher(cp.channel(), o, sink, [&] { return sink.watermark.watermark(); });
  watcher.start();
  REQUIRE(sink.waitFor(5));

  // The open stream (on the gRPC port) ends, and the next, on the listener, resumes.
  const std::string listener = strCat("127.0.0.1:", server.watchPort());
  watcher.preferChannel(grpc::CreateChannel(listener, grpc::InsecureChannelCredentials()),
                        listener);
  REQUIRE(krane::testing::eventually([&] {
    return server.metricsText().find("krane_feed_watch_listener_calls 1") != std::string::npos;
  }));
  CHECK(watcher.stats().watching == listener);
  REQUIRE_THAT(server.writer().put(bucket("b0", "2")), IsOk());
  REQUIRE(sink.waitFor(6));
  CHECK(sink.syncCount() == 1);
  CHECK(sink.view().at("b0") == "2");

  // Nothing listens there: after preferred_failures refusals, back to the first channel.
  watcher.preferChannel(grpc::CreateChannel("127.0.0.1:1", grpc::InsecureChannelCredentials()),
                        "127.0.0.1:1");
  REQUIRE(krane::testing::eventually([&] { return watcher.stats().fallbacks == 1u; }));
  REQUIRE_THAT(server.writer().put(bucket("b1", "2")), IsOk());
  REQUIRE(sink.waitFor(7));
  CHECK(watcher.stats().watching.empty());
  CHECK(sink.syncCount() == 1);
  CHECK(sink.view().at("b1") == "2");
  // After fallback_for, the stream there ends (at its next bookmark) and the preferred channel
  // is tried again.
  REQUIRE(krane::testing::eventually([&] { return watcher.stats().fallbacks == 2u; }));
  REQUIRE_THAT(server.writer().put(bucket("b2", "2")), IsOk());
  REQUIRE(sink.waitFor(8));
  CHECK(sink.syncCount() == 1);
  watcher.stop();
}

TEST_CASE("a busy stream moves to a preferred channel with nothing delivered twice", "[watcher]") {
  TestControlPlane cp;
  auto& server = cp.startReplica([](ctrl::CtrlConfig& c) { c.feed.watch_listen = "127.0.0.1:0"; });
  REQUIRE_THAT(server.writer().put(bucket("b0", "0")), IsOk());
  DeferredSink sink;
  Watcher watcher(cp.channel(), options(cp), sink, [&] { return sink.watermark.watermark(); });
  watcher.start();
  REQUIRE(krane::testing::eventually([&] { return sink.watermark.watermark() >= 1; }));
  // A change every 10 ms, each applied 20 ms after it arrived: the stream is never idle, and
  // something it delivered is nearly always still being applied.
  std::atomic<bool> writing{true};
  std::atomic<int> written{1};
  std::thread writer([&] {
    while (writing) {
      if (server.writer().put(bucket("b0", strCat(written.load()))).ok()) ++written;
      std::this_thread::sleep_for(10ms);
    }
  });
  std::this_thread::sleep_for(200ms);
  const std::string listener = strCat("127.0.0.1:", server.watchPort());
  watcher.preferChannel(grpc::CreateChannel(listener, grpc::InsecureChannelCredentials()),
                        listener);
  const bool moved = krane::testing::eventually(
      [&] {
        return server.metricsText().find("krane_feed_watch_listener_calls 1") != std::string::npos;
      },
      3s);
  writing = false;
  writer.join();
  CHECK(moved);
  REQUIRE(krane::testing::eventually(
      [&] { return sink.watermark.watermark() >= static_cast<uint64_t>(written.load()); }));
  CHECK(sink.redelivered() == 0u);
  watcher.stop();
}

TEST_CASE("a change held for long does not slow the stream while another channel is wanted",
          "[watcher]") {
  TestControlPlane cp;
  cp.startReplica();
  REQUIRE_THAT(cp.replica(0).writer().put(bucket("stuck", "1")), IsOk());
  StuckSink sink;
  Watcher watcher(cp.channel(0), options(cp), sink, [&] { return sink.watermark.watermark(); });
  watcher.start();
  REQUIRE(testing::eventually([&] { return sink.watermark.watermark() == 1; }));
  // A live change the sink never acknowledges: the cursor stays at 1 from here on.
  REQUIRE_THAT(cp.replica(0).writer().put(bucket("stuck", "2")), IsOk());
  REQUIRE(testing::eventually(
      [&] { return sink.arrived("stuck") != std::chrono::steady_clock::time_point{}; }));
  // Another channel is wanted. The stream never catches up, so it stays where it is, and it
  // must keep reading as fast as changes come (it waited up to a second at every message).
  watcher.preferChannel(grpc::CreateChannel("127.0.0.1:1", grpc::InsecureChannelCredentials()),
                        "127.0.0.1:1");
  std::vector<double> lags_ms;
  for (int i = 0; i < 20; ++i) {
    const std::string id = strCat("b", i);
    const auto written = std::chrono::steady_clock::now();
    REQUIRE_THAT(cp.replica(0).writer().put(bucket(id, "1")), IsOk());
    REQUIRE(testing::eventually(
        [&] { return sink.arrived(id) != std::chrono::steady_clock::time_point{}; }, 10s));
    lags_ms.push_back(
        std::chrono::duration<double, std::milli>(sink.arrived(id) - written).count());
  }
  std::sort(lags_ms.begin(), lags_ms.end());
  CAPTURE(lags_ms);
  CHECK(lags_ms[10] < 300);
  CHECK(watcher.stats().connects == 1u);
  CHECK(sink.watermark.watermark() == 1u);
  watcher.stop();
}

TEST_CASE("with krane-ctrl down, a preferred channel is not given up", "[watcher]") {
  TestControlPlane cp;
  auto& server = cp.startReplica([](ctrl::CtrlConfig& c) { c.feed.watch_listen = "127.0.0.1:0"; });
  REQUIRE_THAT(server.writer().put(bucket("b0", "1")), IsOk());
  const std::string listener = strCat("127.0.0.1:", server.watchPort());
  RecordingSink sink;
  auto first = cp.channel();
  Watcher watcher(first, options(cp), sink, [&] { return sink.watermark.watermark(); });
  watcher.preferChannel(grpc::CreateChannel(listener, grpc::InsecureChannelCredentials()),
                        listener);
  watcher.start();
  REQUIRE(sink.waitFor(1));
  CHECK(watcher.stats().watching == listener);
  // The first channel is connected, as an agent's is by its heartbeats.
  REQUIRE(first->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(5)));
  // Both ports refuse for a while: many failed streams, no fallback.
  const uint64_t connects = watcher.stats().connects;
  cp.stopReplica(0);
  REQUIRE(krane::testing::eventually([&] { return watcher.stats().connects >= connects + 5; }));
  CHECK(watcher.stats().fallbacks == 0u);
  CHECK(watcher.stats().watching == listener);
  watcher.stop();
}

TEST_CASE("resyncs at once when the cursor expired", "[watcher]") {
  TestControlPlane cp;
  auto& server = cp.startReplica();
  for (int i = 0; i < 10; ++i)
    REQUIRE_THAT(server.writer().put(bucket(strCat("b", i), "1")), IsOk());
  feed::Cleanup cleanup(cp.pool(), std::make_shared<feed::ResourceTables>(), {});
  REQUIRE_THAT(cleanup.runOnce(std::chrono::system_clock::now() + std::chrono::hours(24 * 8)),
               IsOk());
  RecordingSink sink;
  Watcher watcher(cp.channel(), options(cp), sink, [] { return uint64_t{3}; });  // an old cursor
  watcher.start();
  REQUIRE(sink.waitFor(10));
  CHECK(watcher.stats().cursor_expired == 1u);
  CHECK(sink.syncCount() == 1);
  CHECK(sink.view().size() == 10u);
  watcher.stop();
}

TEST_CASE("resyncs periodically", "[watcher]") {
  TestControlPlane cp;
  auto& server = cp.startReplica();
  REQUIRE_THAT(server.writer().put(bucket("b", "1")), IsOk());
  RecordingSink sink;
  auto o = options(cp);
  o.resync_interval = std::chrono::seconds(1);
  Watcher watcher(cp.channel(), o, sink, [&] { return sink.watermark.watermark(); });
  watcher.start();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (sink.syncCount() < 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  CHECK(sink.syncCount() >= 2);
  watcher.stop();
}

// The interval counts from the end of the last full sync, saved in the cursor store: a restart
// (a new Watcher) or a reconnect does not push it back.
TEST_CASE("the periodic resync falls due on time across restarts", "[watcher]") {
  TestControlPlane cp;
  auto& server = cp.startReplica();
  REQUIRE_THAT(server.writer().put(bucket("b", "1")), IsOk());
  auto o = options(cp);
  o.resync_interval = std::chrono::seconds(60);
  {
    INFO("overdue when the agent starts: a full sync at once, though it has a cursor");
    RecordingSink sink;
    o.last_full_sync_unix_ms = unixMillis() - 61000;
    Watcher watcher(cp.channel(), o, sink, [] { return uint64_t{1}; });
    watcher.start();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (sink.syncCount() < 1 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    CHECK(sink.syncCount() == 1);
    watcher.stop();
  }
  {
    INFO("due 1.5 s after the start: it resumes, then syncs once due");
    RecordingSink sink;
    o.last_full_sync_unix_ms = unixMillis() - 58500;
    Watcher watcher(cp.channel(), o, sink, [] { return uint64_t{1}; });
    watcher.start();
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    CHECK(sink.syncCount() == 0);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (sink.syncCount() < 1 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    CHECK(sink.syncCount() == 1);
    watcher.stop();
  }
}

// The agent keeps the feed's epoch with its cursor: a full sync tells it; a cursor of another
// epoch (the database was restored) makes it start over with a full sync.
TEST_CASE("the feed's epoch is kept with the cursor and a changed one resyncs", "[watcher]") {
  TestControlPlane cp;
  auto& server = cp.startReplica();
  REQUIRE_THAT(server.writer().put(bucket("b", "1")), IsOk());
  auto rows = (*cp.pool()->acquire())->query("SELECT epoch FROM feed_epoch WHERE id = 1");
  REQUIRE_THAT(rows, IsOk());
  const uint64_t epoch = rows->rows[0].u64(0);
  std::mutex mutex;
  std::vector<uint64_t> told;
  auto o = options(cp);
  o.on_epoch = [&](uint64_t e) {
    std::lock_guard lock(mutex);
    told.push_back(e);
  };
  o.epoch = epoch + 1;  // the cursor of another epoch
  RecordingSink sink;
  Watcher watcher(cp.channel(), o, sink, [] { return uint64_t{1}; });
  watcher.start();
  REQUIRE(sink.waitFor(1));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (sink.syncCount() < 1 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CHECK(watcher.stats().cursor_expired == 1u);
  CHECK(sink.syncCount() == 1);
  watcher.stop();
  std::lock_guard lock(mutex);
  CHECK(told == std::vector<uint64_t>{epoch});
}

TEST_CASE("a bad token keeps retrying and says why", "[watcher]") {
  TestControlPlane cp;
  cp.startReplica();
  RecordingSink sink;
  auto o = options(cp);
  o.token = "krane_agent_wrong";
  Watcher watcher(cp.channel(), o, sink, [] { return uint64_t{0}; });
  watcher.start();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  CHECK(watcher.stats().connects >= 2u);
  CHECK_THAT(watcher.stats().last_error, Catch::Contains("unknown or revoked agent token"));
  CHECK(sink.syncCount() == 0);
  watcher.stop();
}

}  // namespace
}  // namespace krane::agent
