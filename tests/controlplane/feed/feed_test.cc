// The change feed end to end: a real krane-ctrl (in this process) on a real MariaDB, agents
// watching over gRPC on loopback.
#include <httplib.h>

#include <map>
#include <random>
#include <set>
#include <thread>

#include <catch2/catch.hpp>

#include "common/clock.h"
#include "common/status.h"
#include "common/strings.h"
#include "controlplane/api/auth.h"
#include "controlplane/feed/cleanup.h"
#include "controlplane/feed/encoded_event.h"
#include "controlplane/feed/tables.h"
#include "controlplane/feed/writer.h"
#include "tests/support/control_plane.h"
#include "tests/support/mariadb.h"
#include "tests/support/matchers.h"
#include "tests/support/resources.h"
#include "tests/support/tcp_relay.h"
#include "tests/support/threads.h"
#include "tests/support/wait.h"

namespace krane {
namespace {

using cluster::v1::WatchEvent;
using krane::testing::eventually;
using krane::testing::kOperatorToken;
using krane::testing::TestControlPlane;
using krane::testing::WatchRecorder;

constexpr const char* kType = "example.krane.dev/bucket";

cluster::v1::Resource bucket(const std::string& id, const std::string& region,
                             const std::string& spec) {
  cluster::v1::Resource r;
  r.set_type(kType);
  r.set_id(id);
  r.set_region(region);
  r.mutable_generic()->set_spec(spec);
  r.mutable_generic()->set_content_type("text/plain");
  return r;
}

// Reads through transact(), which replaces a connection a server restart killed.
std::vector<db::Row> rowsOf(TestControlPlane& cp, const std::string& sql,
                            const db::Params& params) {
  std::vector<db::Row> rows;
  auto status = cp.pool()->transact("test-read", [&](db::Connection& conn) -> absl::Status {
    auto result = conn.query(sql, params);
    if (!result.ok()) return result.status();
    rows = std::move(result->rows);
    return absl::OkStatus();
  });
  CHECK_THAT(status, IsOk());
  return rows;
}

uint64_t headVersion(TestControlPlane& cp, const std::string& region) {
  auto rows = rowsOf(cp, "SELECT version FROM region_versions WHERE region_id = ?", {region});
  return rows.empty() ? 0 : rows[0].u64(0);
}

// What an agent would hold after applying the events: key -> spec, for live resources.
std::map<std::string, std::string> materialize(const std::vector<WatchEvent>& events) {
  std::map<std::string, std::string> view;
  for (const auto& e : events) {
    if (e.has_sync_begin()) view.clear();
    if (!e.has_change()) continue;
    const auto& r = e.change().resource();
    const std::string key = strCat(r.type(), "/", r.id());
    if (e.change().op() == cluster::v1::CHANGE_OP_APPLY) {
      view[key] = r.generic().spec();
    } else {
      view.erase(key);
    }
  }
  return view;
}

std::map<std::string, std::string> databaseView(TestControlPlane& cp, const std::string& region) {
  std::map<std::string, std::string> view;
  for (const auto& row :
       rowsOf(cp, "SELECT type, id, spec FROM resources WHERE region_id = ? AND deleted_at IS NULL",
              {region})) {
    view[strCat(row.str(0), "/", row.str(1))] = row.str(2);
  }
  return view;
}

// A Watch of `region` from an agent that reads nothing until the test does: the transport window
// fills after a few events, and the server's writes to it wait.
struct StuckWatch {
  std::unique_ptr<grpc::ClientContext> context;
  std::unique_ptr<grpc::ClientReader<WatchEvent>> reader;
  grpc::ClientReader<WatchEvent>* operator->() const { return reader.get(); }
};

StuckWatch stuckWatch(TestControlPlane& cp, cluster::v1::ClusterService::Stub& stub,
                      const std::string& region = "eu-1") {
  StuckWatch s;
  s.context = TestControlPlane::withToken(cp.agentToken(region), std::chrono::seconds(120));
  cluster::v1::WatchRequest request;
  request.set_region(region);
  s.reader = stub.Watch(s.context.get(), request);
  return s;
}

// The heart of the feed: with concurrent writers whose commit order differs from the order they
// took their row locks and ids, some rolling back, every committed change reaches every watcher
// in order, with no resync.
TEST_CASE("every committed change is delivered in order without resync", "[feed]") {
  TestControlPlane cp;
  auto& server = cp.startReplica([](ctrl::CtrlConfig& c) { c.database.max_connections = 40; });
  const std::string token = cp.agentToken("eu-1");
  // Both watchers finish their (empty) full sync first, so that every version reaches them as a
  // live change; a sync during writes is covered by AFullSyncDuringWritesConvergesToTheDatabase.
  WatchRecorder live(cp.watchChannel(), token, "eu-1", 0);
  WatchRecorder filtered(cp.watchChannel(), token, "eu-1", 0, {kType});
  for (WatchRecorder* watcher : {&live, &filtered}) {
    REQUIRE(watcher->waitFor([](const auto& ev) {
      return std::any_of(ev.begin(), ev.end(),
                         [](const WatchEvent& e) { return e.has_sync_end(); });
    }));
  }

  constexpr int kWriters = 16;
  constexpr int kPerWriter = 250;
  std::mutex committed_mutex;
  std::map<uint64_t, std::string> committed;  // version -> spec written
  std::atomic<int> rolled_back{0};
  std::vector<std::thread> writers;
  krane::testing::ThreadFailures failures;
  for (int w = 0; w < kWriters; ++w) {
    writers.emplace_back([&, w] {
      std::mt19937 rng(w);
      for (int i = 0; i < kPerWriter; ++i) {
        const std::string id = strCat("b", rng() % 40);  // shared keys: writers collide
        const bool rollback = rng() % 10 == 0;
        const std::string spec = strCat(rollback ? "ROLLBACK-" : "w", w, "-", i);
        const int delay_us = static_cast<int>(rng() % 3000);
        auto result = server.writer().transact("test", [&](feed::WriteTx& tx) -> absl::Status {
          if (auto st = tx.put(bucket(id, "eu-1", spec)); !st.ok()) return st;
          // Hold the transaction open a random while, so commits interleave.
          std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
          if (rollback) return absl::AbortedError("test rollback");
          return absl::OkStatus();
        });
        if (rollback) {
          ++rolled_back;
          continue;
        }
        if (!failures.expectOk(result, strCat("writer ", w, " commit ", i))) return;
        std::lock_guard lock(committed_mutex);
        committed[result->at(0).version] = spec;
      }
    });
  }
  for (auto& t : writers) t.join();
  REQUIRE(failures.all() == std::vector<std::string>{});
  const uint64_t head = headVersion(cp, "eu-1");
  REQUIRE(head == committed.size());
  REQUIRE(rolled_back.load() > 0);
  INFO("live watcher stopped at " << live.lastVersion());
  REQUIRE(live.waitForVersion(head, std::chrono::seconds(60)));
  REQUIRE(filtered.waitForVersion(head, std::chrono::seconds(60)));

  for (WatchRecorder* watcher : {&live, &filtered}) {
    INFO((watcher == &live ? "unfiltered watcher" : "filtered watcher"));
    const auto events = watcher->events();
    std::vector<uint64_t> versions;
    std::map<std::string, uint64_t> last_resource_version;
    int syncs = 0;
    for (const auto& e : events) {
      INFO("no resync may happen");
      REQUIRE_FALSE(e.has_cursor_expired());
      if (e.has_sync_begin()) ++syncs;
      if (!e.has_change() || syncs > 1) continue;
      versions.push_back(e.change().version());
      const auto& r = e.change().resource();
      INFO("a rolled-back write was streamed");
      CHECK_THAT(r.generic().spec(), !Catch::Contains("ROLLBACK"));
      // Per resource, states only move forward.
      uint64_t& last = last_resource_version[r.id()];
      INFO(r.id());
      CHECK(r.version() >= last);
      last = r.version();
    }
    CHECK(syncs == 1);
    // Every committed version, each exactly once, in order.
    REQUIRE(versions.size() == committed.size());
    for (size_t i = 0; i < versions.size(); ++i) {
      INFO("gap or reorder at " << i);
      REQUIRE(versions[i] == (i + 1));
    }
    CHECK(materialize(events) == databaseView(cp, "eu-1"));
  }
}

TEST_CASE("a full sync during writes converges to the database", "[feed]") {
  TestControlPlane cp;
  auto& server = cp.startReplica();
  for (int i = 0; i < 300; ++i)
    REQUIRE_THAT(server.writer().put(bucket(strCat("pre", i), "eu-1", "0")), IsOk());
  std::atomic<bool> stop{false};
  krane::testing::ThreadFailures failures;
  std::thread writer([&] {
    for (int i = 0; !stop; ++i) {
      auto r =
          (i % 7 == 3)
              ? server.writer().remove({kType, strCat("pre", i % 300), "eu-1"}).status()
              : server.writer().put(bucket(strCat("pre", i % 300), "eu-1", strCat(i))).status();
      if (!absl::IsNotFound(r)) failures.expectOk(r, strCat("write ", i));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  WatchRecorder agent(cp.watchChannel(), cp.agentToken("eu-1"), "eu-1", 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  stop = true;
  writer.join();
  CHECK(failures.all() == std::vector<std::string>{});
  const uint64_t head = headVersion(cp, "eu-1");
  REQUIRE(agent.waitForVersion(head));
  const auto events = agent.events();
  REQUIRE(events.front().has_sync_begin());
  CHECK(materialize(events) == databaseView(cp, "eu-1"));
  // SyncEnd says how many resources the sync carried.
  uint64_t synced = 0;
  for (const auto& e : events) {
    if (e.has_sync_end()) {
      CHECK(e.sync_end().resource_count() == synced);
      break;
    }
    if (e.has_change()) ++synced;
  }
  CHECK(synced > 0u);
}

TEST_CASE("a resuming agent gets exactly what it missed", "[feed]") {
  TestControlPlane cp;
  auto& server = cp.startReplica();
  for (int i = 0; i < 10; ++i)
    REQUIRE_THAT(server.writer().put(bucket(strCat("r", i), "eu-1", "x")), IsOk());
  WatchRecorder agent(cp.watchChannel(), cp.agentToken("eu-1"), "eu-1", 4);
  REQUIRE(agent.waitForVersion(10));
  std::vector<uint64_t> versions;
  for (const auto& e : agent.events()) {
    CHECK_FALSE(e.has_sync_begin());
    if (e.has_change()) versions.push_back(e.change().version());
  }
  CHECK(versions == std::vector<uint64_t>{5, 6, 7, 8, 9, 10});
}

TEST_CASE("cursor older than the pruned range expires", "[feed]") {
  TestControlPlane cp;
  auto& server = cp.startReplica();
  for (int i = 0; i < 25; ++i)
    REQUIRE_THAT(server.writer().put(bucket(strCat("r", i % 5), "eu-1", strCat(i))), IsOk());
  feed::Cleanup cleanup(
      cp.pool(), std::make_shared<feed::ResourceTables>(),
      feed::CleanupOptions{std::chrono::seconds(60), std::chrono::seconds(60), 10});
  auto result = cleanup.runOnce(std::chrono::system_clock::now() + std::chrono::hours(1));
  REQUIRE_THAT(result, IsOk());
  CHECK(result->changes_deleted == 25u);  // in batches of 10
  WatchRecorder stale(cp.watchChannel(), cp.agentToken("eu-1"), "eu-1", 3);
  REQUIRE(stale.waitFor([](const auto& ev) { return !ev.empty(); }));
  REQUIRE(stale.events()[0].has_cursor_expired());
  CHECK(stale.events()[0].cursor_expired().reason() == cluster::v1::CURSOR_EXPIRED_REASON_PRUNED);
  REQUIRE(stale.waitFinished(std::chrono::seconds(5)));
  // A full sync still works and has all current state.
  WatchRecorder fresh(cp.watchChannel(), cp.agentToken("eu-1"), "eu-1", 0);
  REQUIRE(fresh.waitForVersion(25));
  CHECK(materialize(fresh.events()) == databaseView(cp, "eu-1"));
  // New changes after the pruned range still stream to an agent that is current.
  WatchRecorder current(cp.watchChannel(), cp.agentToken("eu-1"), "eu-1", 25);
  REQUIRE_THAT(server.writer().put(bucket("new", "eu-1", "n")), IsOk());
  REQUIRE(current.waitForVersion(26));
}

// Cleanup deletes up to 10,000 change rows at a time; it must not hold the region's version
// counter (which every writer of the region updates) meanwhile. Here its DELETE is made to wait
// on a row lock the test holds: a writer of the region still commits.
TEST_CASE("cleanup deleting change rows does not block the region's writers", "[feed]") {
  TestControlPlane cp;
  auto& server = cp.startReplica();
  for (int i = 0; i < 30; ++i)
    REQUIRE_THAT(server.writer().put(bucket(strCat("r", i % 5), "eu-1", strCat(i))), IsOk());
  // Pools of their own: the test's lock, and the cleanup, each hold a session throughout.
  auto locker_pool = db::Pool::create(cp.dsn(), {.max_connections = 1});
  auto cleanup_pool = db::Pool::create(cp.dsn(), {.max_connections = 2});
  REQUIRE_THAT(locker_pool, IsOk());
  REQUIRE_THAT(cleanup_pool, IsOk());
  auto locker = (*locker_pool)->acquire();
  REQUIRE_THAT(locker, IsOk());
  REQUIRE_THAT((*locker)->exec("START TRANSACTION"), IsOk());
  REQUIRE_THAT((*locker)->query("SELECT version FROM resource_changes WHERE region_id = 'eu-1'"
                                " AND version = 20 FOR UPDATE"),
               IsOk());
  feed::Cleanup cleanup(
      *cleanup_pool, std::make_shared<feed::ResourceTables>(),
      feed::CleanupOptions{std::chrono::seconds(60), std::chrono::seconds(60), 10000});
  absl::StatusOr<feed::CleanupResult> result = absl::UnknownError("not run");
  std::thread cleaning(
      [&] { result = cleanup.runOnce(std::chrono::system_clock::now() + std::chrono::hours(1)); });
  // Until the cleanup's DELETE waits for the test's lock.
  auto waiting = [&] {
    return !rowsOf(cp,
                   "SELECT 1 FROM information_schema.processlist"
                   " WHERE info LIKE 'DELETE FROM resource_changes%'",
                   {})
                .empty();
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!waiting() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CHECK(waiting());
  std::atomic<bool> committed{false};
  std::thread writing([&] { committed = server.writer().put(bucket("during", "eu-1", "x")).ok(); });
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!committed && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  INFO("a writer of the region committed while the cleanup's delete waited");
  CHECK(committed.load());
  REQUIRE_THAT((*locker)->exec("ROLLBACK"), IsOk());
  writing.join();
  cleaning.join();
  REQUIRE_THAT(result, IsOk());
  CHECK(result->changes_deleted == 30u);
  CHECK(headVersion(cp, "eu-1") == 31u);
}

// The operators' Watch is served from the hub like the agents' streams: 40 watchers cost the
// database nothing more than none (the old one polled every 200 ms per watcher, on a thread of
// its own), and each one gets every change, filtered, in order.
TEST_CASE("operator watches are served from the hub", "[feed]") {
  TestControlPlane cp;
  auto& server = cp.startReplica();
  auto selects = [&] {
    auto rows = rowsOf(cp, "SHOW GLOBAL STATUS LIKE 'Com_select'", {});
    return rows.empty() ? uint64_t{0} : static_cast<uint64_t>(std::stoull(rows[0].str(1)));
  };
  auto idleSelects = [&] {
    const uint64_t before = selects();
    std::this_thread::sleep_for(std::chrono::seconds(2));
    return selects() - before;
  };
  const uint64_t without = idleSelects();

  struct Watcher {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReader<krane::api::v1::ResourceChange>> reader;
  };
  auto resources = cp.resources();
  std::vector<std::unique_ptr<Watcher>> watchers;
  for (int i = 0; i < 40; ++i) {
    auto w = std::make_unique<Watcher>();
    w->context.AddMetadata("authorization", strCat("Bearer ", kOperatorToken));
    krane::api::v1::WatchResourcesRequest request;
    if (i % 2 == 1) request.set_type("other.example/kind");  // odd ones see nothing below
    w->reader = resources->Watch(&w->context, request);
    krane::api::v1::ResourceChange hello;
    REQUIRE(w->reader->Read(&hello));
    CHECK(hello.op() == "watching");
    watchers.push_back(std::move(w));
  }
  const uint64_t with = idleSelects();
  INFO("selects in 2 s: " << without << " without watchers, " << with << " with 40");
  CHECK(with < without + 40);

  for (int i = 0; i < 3; ++i)
    REQUIRE_THAT(server.writer().put(bucket(strCat("w", i), "eu-1", "x")), IsOk());
  REQUIRE_THAT(server.writer().remove({kType, "w1", "eu-1"}), IsOk());
  for (size_t i = 0; i < watchers.size(); i += 2) {
    INFO("watcher " << i);
    std::vector<std::string> seen;
    for (int k = 0; k < 4; ++k) {
      krane::api::v1::ResourceChange change;
      REQUIRE(watchers[i]->reader->Read(&change));
      CHECK(change.region() == "eu-1");
      CHECK(change.type() == kType);
      CHECK(change.committed_ms() > 0);
      seen.push_back(strCat(change.id(), " ", change.op(), " ", change.version()));
    }
    CHECK(seen ==
          std::vector<std::string>{"w0 apply 1", "w1 apply 2", "w2 apply 3", "w1 delete 4"});
  }
  for (auto& w : watchers) w->context.TryCancel();
  for (auto& w : watchers) (void)w->reader->Finish();

  // Bad requests are refused naming the field, with no stream kept.
  grpc::ClientContext bad;
  bad.AddMetadata("authorization", strCat("Bearer ", kOperatorToken));
  krane::api::v1::WatchResourcesRequest request;
  request.set_region("no such region!");
  auto reader = resources->Watch(&bad, request);
  krane::api::v1::ResourceChange nothing;
  CHECK_FALSE(reader->Read(&nothing));
  const grpc::Status refused = reader->Finish();
  CHECK(refused.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK_THAT(refused.error_message(), Catch::StartsWith("region"));
}

// The feed's epoch: a database restored from a backup makes versions mean something else. A
// cursor of another epoch is told to resync; and an agent of the current epoch that is ahead of
// its region (a restore nobody announced) makes krane-ctrl start a new epoch, so that agents
// whose cursors are not ahead resync too instead of skipping the versions written again.
TEST_CASE("cursors of another epoch of the feed are told to resync", "[feed]") {
  TestControlPlane cp;
  auto& server = cp.startReplica();
  for (int i = 0; i < 10; ++i)
    REQUIRE_THAT(server.writer().put(bucket(strCat("r", i), "eu-1", "x")), IsOk());
  auto cluster = cp.watchStub();
  // The first event of a stream opened at (version, epoch).
  auto open = [&](uint64_t version, uint64_t epoch, bool until_sync_end = false) {
    grpc::ClientContext context;
    context.AddMetadata("authorization", strCat("Bearer ", cp.agentToken("eu-1")));
    cluster::v1::WatchRequest request;
    request.set_region("eu-1");
    request.set_version(version);
    request.set_epoch(epoch);
    auto reader = cluster->Watch(&context, request);
    WatchEvent event;
    while (reader->Read(&event)) {
      if (!until_sync_end || event.has_sync_end() || event.has_cursor_expired()) break;
    }
    context.TryCancel();
    (void)reader->Finish();
    return event;
  };
  auto epochNow = [&] {
    return rowsOf(cp, "SELECT epoch FROM feed_epoch WHERE id = 1", {})[0].u64(0);
  };
  const WatchEvent synced = open(0, 0, /*until_sync_end=*/true);
  REQUIRE(synced.has_sync_end());
  const uint64_t epoch = synced.sync_end().epoch();
  CHECK(epoch != 0u);
  CHECK(epoch == epochNow());

  INFO("another epoch's cursor");
  const WatchEvent other = open(5, epoch + 1);
  REQUIRE(other.has_cursor_expired());
  CHECK(other.cursor_expired().reason() == cluster::v1::CURSOR_EXPIRED_REASON_EPOCH_CHANGED);
  INFO("a cursor of this epoch, or of none known, resumes");
  CHECK_FALSE(open(5, epoch).has_cursor_expired());
  CHECK_FALSE(open(5, 0).has_cursor_expired());

  // A restore nobody announced: the region is back at version 6.
  REQUIRE_THAT(cp.pool()->transact(
                   "restore",
                   [](db::Connection& conn) -> absl::Status {
                     KRANE_RETURN_IF_ERROR(
                         conn.exec("DELETE FROM resource_changes WHERE version > 6").status());
                     return conn
                         .exec(
                             "UPDATE region_versions SET version = 6"
                             " WHERE region_id = 'eu-1'")
                         .status();
                   }),
               IsOk());
  const WatchEvent ahead = open(10, epoch);
  REQUIRE(ahead.has_cursor_expired());
  CHECK(ahead.cursor_expired().reason() == cluster::v1::CURSOR_EXPIRED_REASON_FUTURE_VERSION);
  CHECK(epochNow() != epoch);
  INFO("an agent at version 4 of the old epoch would skip versions 5 and 6 written again");
  const WatchEvent behind = open(4, epoch);
  REQUIRE(behind.has_cursor_expired());
  CHECK(behind.cursor_expired().reason() == cluster::v1::CURSOR_EXPIRED_REASON_EPOCH_CHANGED);
}

TEST_CASE("a future cursor is refused explicitly", "[feed]") {
  TestControlPlane cp;
  cp.startReplica();
  WatchRecorder agent(cp.watchChannel(), cp.agentToken("eu-1"), "eu-1", 99);
  REQUIRE(agent.waitFor([](const auto& ev) { return !ev.empty(); }));
  CHECK(agent.events()[0].cursor_expired().reason() ==
        cluster::v1::CURSOR_EXPIRED_REASON_FUTURE_VERSION);
}

// A stream checks that each batch starts where it is; one that does not (versions it would never
// get) ends the stream with a resync, never a silent gap.
TEST_CASE("a batch that does not start at the stream's position ends it with a resync", "[feed]") {
  TestControlPlane cp;
  auto& server = cp.startReplica();
  REQUIRE_THAT(server.writer().put(bucket("b1", "eu-1", "one")), IsOk());
  WatchRecorder agent(cp.watchChannel(), cp.agentToken("eu-1"), "eu-1", 0);
  REQUIRE(agent.waitForVersion(1));
  REQUIRE(agent.waitFor([](const auto& ev) {
    return std::any_of(ev.begin(), ev.end(), [](const WatchEvent& e) { return e.has_sync_end(); });
  }));
  auto gapped = std::make_shared<feed::EventBatch>();
  gapped->region = "eu-1";
  gapped->after = 5;  // the stream is at 1: versions 2 to 5 would be lost
  gapped->through = 6;
  server.hub().publish(gapped);
  REQUIRE(
      agent.waitFor([](const auto& ev) { return !ev.empty() && ev.back().has_cursor_expired(); }));
  const auto expired = agent.events().back().cursor_expired();
  CHECK(expired.reason() == cluster::v1::CURSOR_EXPIRED_REASON_RESYNC_REQUIRED);
  CHECK_THAT(expired.message(), Catch::Contains("missed versions 2 to 5"));
  for (const auto& e : agent.events()) {
    INFO("nothing of the gapped batch was streamed");
    CHECK_FALSE((e.has_change() && e.change().version() > 1));
  }
}

// A token revoked elsewhere (`krane-ctrl token revoke` writes the row from its own process) ends
// the streams open with it on every replica within seconds, and they cannot reopen.
TEST_CASE("revoking an agent token ends its open streams", "[feed]") {
  TestControlPlane cp;
  cp.startReplica();
  cp.startReplica();
  const std::string token = cp.agentToken("eu-1");
  auto created = api::AgentTokens(cp.pool()).create("eu-1", "another agent");
  REQUIRE_THAT(created, IsOk());
  const std::string other = created->secret;
  WatchRecorder first(cp.watchChannel(0), token, "eu-1", 0);
  WatchRecorder second(cp.watchChannel(1), token, "eu-1", 0);
  WatchRecorder unaffected(cp.watchChannel(0), other, "eu-1", 0);
  for (WatchRecorder* w : {&first, &second, &unaffected}) {
    REQUIRE(w->waitFor([](const auto& ev) {
      return std::any_of(ev.begin(), ev.end(),
                         [](const WatchEvent& e) { return e.has_sync_end(); });
    }));
  }
  REQUIRE(rowsOf(cp, "SELECT id FROM agent_tokens WHERE region_id = 'eu-1'", {}).size() == 2u);
  auto status = cp.pool()->transact("revoke", [&](db::Connection& conn) -> absl::Status {
    return conn
        .exec("UPDATE agent_tokens SET revoked_at = ? WHERE token_hash = ?",
              {unixMillis(), api::sha256(token)})
        .status();
  });
  REQUIRE_THAT(status, IsOk());
  for (WatchRecorder* w : {&first, &second}) {
    REQUIRE(w->waitFinished(std::chrono::seconds(10)));
    CHECK(w->status().error_code() == grpc::StatusCode::UNAUTHENTICATED);
    CHECK_THAT(w->status().error_message(), Catch::Contains("revoked"));
  }
  CHECK_FALSE(unaffected.finished());
  WatchRecorder again(cp.watchChannel(1), token, "eu-1", 0);
  REQUIRE(again.waitFinished(std::chrono::seconds(10)));
  CHECK(again.status().error_code() == grpc::StatusCode::UNAUTHENTICATED);
}

TEST_CASE("krane-ctrl ends the Watch of an agent that vanished", "[feed]") {
  TestControlPlane cp;
  // Pinging every second of silence, on the transport this build of the test watches on.
  auto& server = cp.startReplica([&](ctrl::CtrlConfig& c) {
    c.feed.keepalive = std::chrono::seconds(1);
    c.feed.keepalive_timeout = std::chrono::seconds(1);
  });
  krane::testing::TcpRelay relay(strCat(
      "127.0.0.1:", TestControlPlane::watchListener() ? server.watchPort() : server.grpcPort()));
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  WatchRecorder agent(
      grpc::CreateCustomChannel(relay.address(), grpc::InsecureChannelCredentials(), args),
      cp.agentToken("eu-1"), "eu-1", 0);
  REQUIRE(agent.waitFor([](const auto& ev) {
    return std::any_of(ev.begin(), ev.end(), [](const WatchEvent& e) { return e.has_sync_end(); });
  }));
  // Pinged through three quiet seconds, and answered: the stream stays.
  std::this_thread::sleep_for(std::chrono::seconds(3));
  CHECK_THAT(server.metricsText(), Catch::Contains("\nkrane_feed_streams 1\n"));
  CHECK_FALSE(agent.finished());
  // The agent's host vanishes (no FIN, no RST): the stream ends, and with it what it held.
  relay.blackHole();
  CHECK(eventually(
      [&] { return server.metricsText().find("\nkrane_feed_streams 0\n") != std::string::npos; },
      std::chrono::seconds(10)));
}

TEST_CASE("two replicas each deliver every change", "[feed]") {
  TestControlPlane cp;
  auto& a = cp.startReplica();
  auto& b = cp.startReplica();
  WatchRecorder on_a(cp.watchChannel(0), cp.agentToken("eu-1"), "eu-1", 0);
  WatchRecorder on_b(cp.watchChannel(1), cp.agentToken("eu-1"), "eu-1", 0);
  REQUIRE(on_b.waitFor([](const auto& ev) { return !ev.empty(); }));
  for (int i = 0; i < 50; ++i) {
    REQUIRE_THAT(((i % 2) ? a : b).writer().put(bucket(strCat("r", i), "eu-1", "x")), IsOk());
  }
  REQUIRE(on_a.waitForVersion(50));
  REQUIRE(on_b.waitForVersion(50));
  CHECK(materialize(on_a.events()) == materialize(on_b.events()));
  CHECK(materialize(on_b.events()).size() == 50u);
}

TEST_CASE("with peer hints, a replica reads another's commits at once, not at its next poll",
          "[feed][hints]") {
  TestControlPlane cp;
  // Polls 30 s apart: only a hint can bring a commit of the other replica within seconds.
  auto hinted = [](ctrl::CtrlConfig& c) {
    c.feed.poll_interval = std::chrono::milliseconds(30000);
    c.feed.peer_hints.listen = "127.0.0.1:0";
  };
  auto& a = cp.startReplica(hinted);
  cp.startReplica(hinted);
  WatchRecorder on_b(cp.watchChannel(1), cp.agentToken("eu-1"), "eu-1", 0);
  REQUIRE(on_b.waitFor([](const auto& ev) { return !ev.empty(); }));
  auto hasChange = [&](uint64_t version) {
    return [version](const std::vector<cluster::v1::WatchEvent>& events) {
      for (const auto& e : events) {
        if (e.has_change() && e.change().version() == version) return true;
      }
      return false;
    };
  };
  // The first hints on a new connection can be lost (ZeroMQ's subscription reaches the
  // publisher just after the connect); later commits hint again.
  uint64_t version = 0;
  bool first_seen = false;
  for (int i = 0; i < 40 && !first_seen; ++i) {
    REQUIRE_THAT(a.writer().put(bucket(strCat("r", version), "eu-1", "x")), IsOk());
    ++version;
    first_seen = on_b.waitFor(hasChange(version), std::chrono::milliseconds(250));
  }
  REQUIRE(first_seen);
  // From then on every commit on A reaches B's stream within seconds.
  for (int i = 0; i < 10; ++i) {
    REQUIRE_THAT(a.writer().put(bucket(strCat("r", version), "eu-1", "y")), IsOk());
    ++version;
    INFO("change " << version);
    REQUIRE(on_b.waitFor(hasChange(version), std::chrono::seconds(5)));
  }
  const std::string metrics = cp.replica(1).metricsText();
  CHECK(metrics.find("krane_feed_peers 1") != std::string::npos);
  CHECK(metrics.find("krane_feed_peers_connected 1") != std::string::npos);
}

TEST_CASE("an agent resumes after the control plane restarts and misses nothing", "[feed]") {
  TestControlPlane cp;
  auto& first = cp.startReplica();
  for (int i = 0; i < 20; ++i)
    REQUIRE_THAT(first.writer().put(bucket(strCat("r", i), "eu-1", "1")), IsOk());
  uint64_t resume_from = 0;
  std::vector<WatchEvent> seen;
  {
    WatchRecorder agent(cp.watchChannel(0), cp.agentToken("eu-1"), "eu-1", 0);
    REQUIRE(agent.waitForVersion(20));
    cp.stopReplica(0);
    REQUIRE(agent.waitFinished(std::chrono::seconds(10)));
    resume_from = agent.lastVersion();
    seen = agent.events();
  }
  auto& second = cp.startReplica();
  // Changes while the agent was away, and after.
  for (int i = 0; i < 20; ++i)
    REQUIRE_THAT(second.writer().put(bucket(strCat("r", i), "eu-1", "2")), IsOk());
  WatchRecorder agent(cp.watchChannel(1), cp.agentToken("eu-1"), "eu-1", resume_from);
  for (int i = 20; i < 30; ++i)
    REQUIRE_THAT(second.writer().put(bucket(strCat("r", i), "eu-1", "3")), IsOk());
  REQUIRE(agent.waitForVersion(50));
  auto after = agent.events();
  seen.insert(seen.end(), after.begin(), after.end());
  CHECK(materialize(seen) == databaseView(cp, "eu-1"));
  std::set<uint64_t> versions;
  for (const auto& e : after) {
    CHECK_FALSE(e.has_sync_begin());
    if (e.has_change()) versions.insert(e.change().version());
  }
  CHECK(versions.size() == 30u);
  CHECK(*versions.begin() == (resume_from + 1));
}

TEST_CASE("filtered and idle streams advance on bookmarks", "[feed]") {
  TestControlPlane cp;
  auto& server = cp.startReplica();
  WatchRecorder other_type(cp.watchChannel(), cp.agentToken("eu-1"), "eu-1", 0, {"sentinel"});
  for (int i = 0; i < 5; ++i)
    REQUIRE_THAT(server.writer().put(bucket(strCat("r", i), "eu-1", "x")), IsOk());
  // It gets none of the buckets, but learns that version 5 is behind it.
  REQUIRE(other_type.waitForVersion(5));
  for (const auto& e : other_type.events()) CHECK_FALSE(e.has_change());
  const size_t before = other_type.events().size();
  INFO("an idle stream gets periodic bookmarks");
  REQUIRE(other_type.waitFor([&](const auto& ev) { return ev.size() > before; },
                             std::chrono::seconds(5)));
}

TEST_CASE("a slow agent is told to resync and others are unaffected", "[feed]") {
  TestControlPlane cp;
  auto& server = cp.startReplica([](ctrl::CtrlConfig& c) { c.feed.stream_max_queued = 200; });
  // A client that opens a stream and never reads: the transport window fills, the queue grows.
  auto stub = cp.watchStub();
  auto stuck = stuckWatch(cp, *stub);
  WatchRecorder healthy(cp.watchChannel(), cp.agentToken("eu-1"), "eu-1", 0);
  const std::string big(32 * 1024, 'x');
  for (int i = 0; i < 400; ++i)
    REQUIRE_THAT(server.writer().put(bucket(strCat("r", i % 50), "eu-1", big)), IsOk());
  REQUIRE(healthy.waitForVersion(400, std::chrono::seconds(60)));
  CHECK(materialize(healthy.events()) == databaseView(cp, "eu-1"));
  // The stuck stream ends with an explicit resync request once read.
  WatchEvent event;
  bool told = false;
  while (stuck->Read(&event)) {
    if (event.has_cursor_expired()) {
      told = event.cursor_expired().reason() == cluster::v1::CURSOR_EXPIRED_REASON_RESYNC_REQUIRED;
    }
  }
  CHECK(told);
  CHECK_THAT(stuck->Finish(), IsOk());
}

// A stream cut for lag keeps its call open for feed.sync_stall_ms from the cut, whatever the age
// of the write in flight, so that an agent that reads again in that time still gets its resync
// request; only then is the call reset.
TEST_CASE("a stream cut for lag waits for its agent before the call is reset", "[feed]") {
  TestControlPlane cp;
  auto& server = cp.startReplica([](ctrl::CtrlConfig& c) {
    c.feed.stream_max_queued = 200;
    c.feed.sync_stall = std::chrono::milliseconds(2000);
  });
  auto stub = cp.watchStub(0, /*small_window=*/true);
  auto stuck = stuckWatch(cp, *stub);
  const std::string big(32 * 1024, 'x');
  auto metric = [&](const std::string& line) {
    return server.metricsText().find(line + "\n") != std::string::npos;
  };
  REQUIRE(eventually([&] { return metric("krane_feed_streams 1"); }, std::chrono::seconds(10)));
  // A write fills the window and stays in flight; it is older than feed.sync_stall_ms when the
  // queue behind it passes feed.stream_max_queued.
  for (int i = 0; i < 50; ++i)
    REQUIRE_THAT(server.writer().put(bucket(strCat("r", i), "eu-1", big)), IsOk());
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  for (int i = 0; i < 300; ++i)
    REQUIRE_THAT(server.writer().put(bucket(strCat("r", i % 50), "eu-1", big)), IsOk());
  REQUIRE(
      eventually([&] { return metric("krane_feed_resyncs_total 1"); }, std::chrono::seconds(30)));
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  INFO("the agent reads again within feed.sync_stall_ms of the cut: its call is still there");
  CHECK(metric("krane_feed_calls_reset_total 0"));
  WatchEvent event;
  bool told = false;
  while (stuck->Read(&event)) {
    if (event.has_cursor_expired()) told = true;
  }
  CHECK(told);
  CHECK_THAT(stuck->Finish(), IsOk());
}

// Several slow agents among fast ones: each slow one is told to resync once its queue passes
// feed.stream_max_queued, the fast ones get everything, and what the streams hold queued (the
// gauge of queued events) stays within streams x max_queued throughout, then drains to zero.
TEST_CASE("slow streams among fast ones are told to resync and queues stay bounded", "[feed]") {
  constexpr int64_t kMaxQueued = 200;
  TestControlPlane cp;
  auto& server =
      cp.startReplica([](ctrl::CtrlConfig& c) { c.feed.stream_max_queued = kMaxQueued; });
  const std::string token = cp.agentToken("eu-1");
  auto stub = cp.watchStub();
  std::vector<StuckWatch> stuck;
  for (int i = 0; i < 3; ++i) stuck.push_back(stuckWatch(cp, *stub));
  std::vector<std::unique_ptr<WatchRecorder>> fast;
  for (int i = 0; i < 3; ++i) {
    fast.push_back(std::make_unique<WatchRecorder>(cp.watchChannel(), token, "eu-1", 0));
  }
  const auto& counters = server.watch().counters;
  std::atomic<bool> stop{false};
  std::atomic<int64_t> peak{0};
  std::thread sampler([&] {
    while (!stop) {
      peak = std::max(peak.load(), counters.queued_events.load());
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  const std::string big(32 * 1024, 'x');
  for (int i = 0; i < 400; ++i) {
    REQUIRE_THAT(server.writer().put(bucket(strCat("r", i % 50), "eu-1", big)), IsOk());
  }
  for (auto& f : fast) {
    REQUIRE(f->waitForVersion(400, std::chrono::seconds(60)));
    CHECK(materialize(f->events()) == databaseView(cp, "eu-1"));
  }
  for (auto& reader : stuck) {
    WatchEvent event;
    bool told = false;
    while (reader->Read(&event)) {
      if (event.has_cursor_expired()) {
        told =
            event.cursor_expired().reason() == cluster::v1::CURSOR_EXPIRED_REASON_RESYNC_REQUIRED;
      }
    }
    CHECK(told);
    CHECK_THAT(reader->Finish(), IsOk());
  }
  stop = true;
  sampler.join();
  INFO("peak queued events " << peak.load());
  CHECK(peak.load() > kMaxQueued);  // the slow streams did fill their queues
  CHECK(peak.load() <= 6 * (kMaxQueued + 2));
  CHECK(eventually([&] { return counters.queued_events.load() == 0; }));
}

// Changes published together are queued together and leave in one flush: every message but
// the last goes with the buffer hint. The agent gets all of them, in order, as single events.
// 300 changes committed together are queued on a stream at once: an agent that accepts batches
// gets them in one message (a batch framed around the shared bytes), one that does not gets 300
// messages in one flush; either way in order, and the view equals the database.
TEST_CASE("changes queued together reach a stream in order in one flush", "[feed]") {
  const bool batches = GENERATE(true, false);
  CAPTURE(batches);
  TestControlPlane cp;
  auto& server = cp.startReplica();
  WatchRecorder watcher(cp.watchChannel(), cp.agentToken("eu-1"), "eu-1", 0, {}, batches);
  REQUIRE(watcher.waitFor([](const auto& ev) {
    return std::any_of(ev.begin(), ev.end(), [](const WatchEvent& e) { return e.has_sync_end(); });
  }));
  const auto& counters = server.watch().counters;
  const uint64_t flushes_before = counters.flushes.load();
  const uint64_t sent_before = counters.events_sent.load();
  const size_t messages_before = watcher.messages();
  constexpr int kChanges = 300;
  auto written = server.writer().transact("test", [&](feed::WriteTx& tx) -> absl::Status {
    for (int i = 0; i < kChanges; ++i) {
      if (auto st = tx.put(bucket(strCat("k", i), "eu-1", strCat("v", i))); !st.ok()) return st;
    }
    return absl::OkStatus();
  });
  REQUIRE_THAT(written, IsOk());
  REQUIRE(written->size() == kChanges);
  const uint64_t last = written->back().version;
  REQUIRE(watcher.waitForVersion(last));
  std::vector<uint64_t> versions;
  for (const auto& e : watcher.events()) {
    CHECK_FALSE(e.has_batch());  // never a batch inside a batch
    if (e.has_change()) versions.push_back(e.change().version());
  }
  REQUIRE(versions.size() == kChanges);
  for (int i = 0; i < kChanges; ++i) CHECK(versions[i] == last - kChanges + 1 + i);
  CHECK(materialize(watcher.events()) == databaseView(cp, "eu-1"));
  const uint64_t sent = counters.events_sent.load() - sent_before;
  const uint64_t flushes = counters.flushes.load() - flushes_before;
  const size_t messages = watcher.messages() - messages_before;
  INFO(sent << " events written in " << flushes << " flushes, " << messages << " messages");
  CHECK(sent >= kChanges);
  CHECK(flushes <= 3);  // the batch, and perhaps a bookmark on either side
  if (batches) {
    CHECK(messages <= 3);
    CHECK(watcher.batches() >= 1);
  } else {
    CHECK(messages >= kChanges);
    CHECK(watcher.batches() == 0);
  }
}

// A backlog larger than a batch leaves in several messages, none above feed's batch limit
// (1 MiB), and a change that is larger than the limit by itself travels alone; the agent gets
// every change in order either way.
TEST_CASE("a backlog larger than a batch is split, and a change above the limit goes alone",
          "[feed]") {
  constexpr size_t kLimit = 1 << 20;
  TestControlPlane cp;
  auto& server = cp.startReplica();
  const uint64_t head = headVersion(cp, "eu-1");
  WatchRecorder watcher(cp.watchChannel(), cp.agentToken("eu-1"), "eu-1", head);
  REQUIRE(watcher.waitForVersion(head));
  // Queued together: 2.5 MiB, one change of them the largest spec a resource may have.
  auto written = server.writer().transact("test", [&](feed::WriteTx& tx) -> absl::Status {
    for (int i = 0; i < 5; ++i) {
      if (auto st = tx.put(bucket(strCat("k", i), "eu-1", std::string(300 * 1024, 'a' + i)));
          !st.ok()) {
        return st;
      }
    }
    return tx.put(bucket("huge", "eu-1", std::string(kLimit, 'h')));
  });
  REQUIRE_THAT(written, IsOk());
  REQUIRE(watcher.waitForVersion(written->back().version));
  std::vector<uint64_t> versions;
  for (const auto& e : watcher.events()) {
    if (e.has_change()) versions.push_back(e.change().version());
  }
  std::vector<uint64_t> expected;
  for (const auto& w : *written) expected.push_back(w.version);
  CHECK(versions == expected);
  CHECK(materialize(watcher.events()) == databaseView(cp, "eu-1"));
  CHECK(watcher.batches() >= 1);
  CHECK(watcher.largestBatchBytes() <= kLimit + feed::kBatchFramingPerEvent);
}

// Nothing an agent is owed waits in the transport for a later write: with bookmarks a long way
// off, a full sync queued before the stream's first write (which carries the response headers)
// and the changes of a busy stream, whose rounds overlap, all arrive. A round that ended on a
// write with gRPC's buffer hint would hold its messages back until the next bookmark.
TEST_CASE("every write round reaches the agent without waiting for a later write", "[feed]") {
  const bool batches = GENERATE(true, false);
  CAPTURE(batches);
  TestControlPlane cp;
  auto& server = cp.startReplica(
      [](ctrl::CtrlConfig& c) { c.feed.bookmark_interval = std::chrono::minutes(10); });
  for (int i = 0; i < 20; ++i)
    REQUIRE_THAT(server.writer().put(bucket(strCat("r", i), "eu-1", "x")), IsOk());
  const uint64_t head = headVersion(cp, "eu-1");
  WatchRecorder watcher(cp.watchChannel(), cp.agentToken("eu-1"), "eu-1", 0, {}, batches);
  REQUIRE(watcher.waitForVersion(head, std::chrono::seconds(20)));

  uint64_t last = 0;
  std::thread writer([&] {
    for (int i = 0; i < 300; ++i) {
      auto put = server.writer().put(bucket(strCat("busy", i % 7), "eu-1", strCat("v", i)));
      if (put.ok()) last = put->version;
    }
  });
  writer.join();
  REQUIRE(last > head);
  REQUIRE(watcher.waitForVersion(last, std::chrono::seconds(20)));
  CHECK(materialize(watcher.events()) == databaseView(cp, "eu-1"));
}

// Full syncs to agents that do not read hold a snapshot each (at most feed.sync_snapshots) but
// no set-up thread: with one thread and three such syncs, another agent is still set up, and
// every sync completes, page by page, once its agent reads.
TEST_CASE("full syncs waiting for slow agents hold no set-up thread", "[feed]") {
  TestControlPlane cp;
  auto& server = cp.startReplica([](ctrl::CtrlConfig& c) {
    c.feed.sync_workers = 1;
    c.feed.sync_snapshots = 2;
    c.feed.sync_high_water = 8;
    c.feed.sync_batch = 7;  // pages end inside both tables
  });
  const std::string big(32 * 1024, 'x');
  for (int i = 0; i < 200; ++i)
    REQUIRE_THAT(server.writer().put(bucket(strCat("r", i), "eu-1", big)), IsOk());
  for (int i = 0; i < 10; ++i) {
    REQUIRE_THAT(server.writer().put(krane::testing::topologyResource(strCat("d", i), "eu-1")),
                 IsOk());
  }
  const uint64_t head = headVersion(cp, "eu-1");

  // Three agents ask for a full sync and read nothing: the transport window fills after a few
  // events, and each sync pauses at the high-water mark.
  auto stub = cp.watchStub();
  std::vector<StuckWatch> stuck;
  for (int i = 0; i < 3; ++i) stuck.push_back(stuckWatch(cp, *stub));
  // Two hold a snapshot; the third waits in line.
  REQUIRE(eventually(
      [&] {
        return server.metricsText().find("krane_feed_full_syncs_waiting 1\n") != std::string::npos;
      },
      std::chrono::seconds(30)));

  // The single set-up thread is free: an agent resuming at the head is set up and goes live.
  WatchRecorder resuming(cp.watchChannel(), cp.agentToken("eu-1"), "eu-1", head);
  REQUIRE_THAT(server.writer().put(bucket("late", "eu-1", "v")), IsOk());
  REQUIRE(resuming.waitForVersion(head + 1, std::chrono::seconds(30)));

  // Each stuck agent now reads: its sync completes (the third once a slot is free), with the
  // count its SyncEnd announces, and its view converges to the database.
  auto expected = databaseView(cp, "eu-1");
  REQUIRE(expected.size() == 201);
  for (int i = 0; i < 10; ++i) expected[strCat("deployment_topology/d", i)] = "";
  for (auto& s : stuck) {
    std::vector<WatchEvent> events;
    WatchEvent event;
    uint64_t reached = 0;
    uint64_t changes_in_sync = 0;
    bool in_sync = false;
    bool synced = false;
    while ((!synced || reached < head + 1) && s.reader->Read(&event)) {
      REQUIRE_FALSE(event.has_cursor_expired());
      if (event.has_sync_begin()) in_sync = true;
      if (event.has_change()) {
        if (in_sync) ++changes_in_sync;
        reached = std::max(reached, event.change().version());
      }
      if (event.has_bookmark()) reached = std::max(reached, event.bookmark().version());
      if (event.has_sync_end()) {
        in_sync = false;
        synced = true;
        CHECK(event.sync_end().resource_count() == changes_in_sync);
        reached = std::max(reached, event.sync_end().version());
      }
      events.push_back(event);
    }
    CHECK(synced);
    CHECK(reached >= head + 1);
    CHECK(materialize(events) == expected);  // topologies materialize with an empty spec
    s.context->TryCancel();
  }
  CHECK(server.metricsText().find("krane_feed_full_syncs_waiting 0\n") != std::string::npos);
}

// An agent that is alive (its HTTP/2 stack answers pings) but reads nothing would hold its full
// sync's snapshot for good, and with it the only snapshot slot: stalled for feed.sync_stall_ms
// while another agent waits for the slot, it is ended, and the agent in line gets its sync.
TEST_CASE("a full sync to an agent that reads nothing gives back its snapshot", "[feed]") {
  TestControlPlane cp;
  auto& server = cp.startReplica([](ctrl::CtrlConfig& c) {
    c.feed.sync_snapshots = 1;
    c.feed.sync_high_water = 8;
    c.feed.sync_batch = 7;
    c.feed.sync_stall = std::chrono::milliseconds(1500);
  });
  const std::string big(32 * 1024, 'x');
  for (int i = 0; i < 200; ++i)
    REQUIRE_THAT(server.writer().put(bucket(strCat("r", i), "eu-1", big)), IsOk());
  auto stub = cp.watchStub(0, /*small_window=*/true);
  auto stuck = stuckWatch(cp, *stub);
  REQUIRE(eventually(
      [&] {
        return server.metricsText().find("krane_feed_full_syncs_total 1\n") != std::string::npos;
      },
      std::chrono::seconds(30)));
  INFO("alone, it keeps its slot past feed.sync_stall_ms: it may be slow, and holds up nobody");
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  CHECK(server.metricsText().find("krane_feed_setups_stalled_total 0\n") != std::string::npos);
  // It holds the one slot: a second full sync waits in line (for as long as one tick: the
  // stuck sync has stalled for longer than feed.sync_stall_ms already).
  WatchRecorder waiting(cp.watchChannel(), cp.agentToken("eu-1"), "eu-1", 0);
  INFO("the stuck sync is ended and the one in line completes");
  CHECK(waiting.waitForVersion(headVersion(cp, "eu-1"), std::chrono::seconds(30)));
  CHECK(server.metricsText().find("krane_feed_setups_stalled_total 1\n") != std::string::npos);
  CHECK(server.metricsText().find("krane_feed_full_syncs_waiting 0\n") != std::string::npos);
  INFO(
      "its status waits for the write in flight for feed.sync_stall_ms more; still taking"
      " nothing, the call is reset and the stream gone, message and all");
  CHECK(eventually(
      [&] {
        const std::string m = server.metricsText();
        return m.find("krane_feed_calls_reset_total 1\n") != std::string::npos &&
               m.find("krane_feed_streams 1\n") != std::string::npos;
      },
      std::chrono::seconds(30)));
  INFO("the stuck agent, reading at last, finds its stream reset");
  WatchEvent event;
  while (stuck->Read(&event)) {
  }
  const grpc::Status status = stuck->Finish();
  CHECK(status.error_code() == grpc::StatusCode::CANCELLED);
}

TEST_CASE("authentication and authorization", "[feed]") {
  TestControlPlane cp;
  cp.startReplica();
  auto expectRefused = [&](const std::string& token, const std::string& region,
                           grpc::StatusCode code, const std::string& message) {
    WatchRecorder w(cp.watchChannel(), token, region, 0);
    REQUIRE(w.waitFinished(std::chrono::seconds(10)));
    INFO(w.status().error_message());
    CHECK(w.status().error_code() == code);
    CHECK_THAT(w.status().error_message(), Catch::Contains(message));
    CHECK(w.events().empty());
  };
  expectRefused("", "eu-1", grpc::StatusCode::UNAUTHENTICATED, "missing agent token");
  expectRefused("krane_agent_made_up", "eu-1", grpc::StatusCode::UNAUTHENTICATED,
                "unknown or revoked");
  expectRefused(cp.agentToken("us-1"), "eu-1", grpc::StatusCode::PERMISSION_DENIED,
                "for region \"us-1\", not \"eu-1\"");
  expectRefused(kOperatorToken, "eu-1", grpc::StatusCode::UNAUTHENTICATED, "unknown or revoked");

  // A revoked token stops working.
  api::AgentTokens tokens(cp.pool());
  auto created = tokens.create("eu-1", "to revoke");
  REQUIRE_THAT(created, IsOk());
  REQUIRE_THAT(tokens.revoke(created->token.id), IsOk());
  expectRefused(created->secret, "eu-1", grpc::StatusCode::UNAUTHENTICATED, "unknown or revoked");

  // Reports too are checked per region.
  auto stub = cp.cluster();
  cluster::v1::ReportResourceStatusRequest report;
  report.set_type(kType);
  report.set_id("x");
  report.set_region("eu-1");
  report.set_phase(cluster::v1::RESOURCE_PHASE_READY);
  cluster::v1::ReportResourceStatusResponse ignored;
  CHECK(stub->ReportResourceStatus(TestControlPlane::withToken(cp.agentToken("us-1")).get(), report,
                                   &ignored)
            .error_code() == grpc::StatusCode::PERMISSION_DENIED);
  CHECK(stub->ReportResourceStatus(TestControlPlane::withToken("").get(), report, &ignored)
            .error_code() == grpc::StatusCode::UNAUTHENTICATED);

  // The public API wants an operator token; an agent token is not one.
  auto api = cp.resources();
  krane::api::v1::ListResourcesRequest list;
  krane::api::v1::ListResourcesResponse listed;
  CHECK(api->List(TestControlPlane::withToken("").get(), list, &listed).error_code() ==
        grpc::StatusCode::UNAUTHENTICATED);
  CHECK(api->List(TestControlPlane::withToken(cp.agentToken("eu-1")).get(), list, &listed)
            .error_code() == grpc::StatusCode::UNAUTHENTICATED);
  CHECK_THAT(api->List(TestControlPlane::withToken(kOperatorToken).get(), list, &listed), IsOk());
}

TEST_CASE("resource api validates and round trips", "[feed]") {
  TestControlPlane cp;
  cp.startReplica();
  auto api = cp.resources();
  auto call = [&](auto method, const auto& request, auto* response) {
    return (api.get()->*method)(TestControlPlane::withToken(kOperatorToken).get(), request,
                                response);
  };
  krane::api::v1::PutResourceRequest put;
  krane::api::v1::PutResourceResponse put_response;
  *put.mutable_resource() = bucket("b1", "eu-1", "hello");
  REQUIRE_THAT(call(&krane::api::v1::ResourceService::Stub::Put, put, &put_response), IsOk());
  CHECK(put_response.created());
  CHECK(put_response.version() == 1u);

  krane::api::v1::GetResourceRequest get;
  get.set_type(kType);
  get.set_id("b1");
  get.set_region("eu-1");
  krane::api::v1::GetResourceResponse got;
  REQUIRE_THAT(call(&krane::api::v1::ResourceService::Stub::Get, get, &got), IsOk());
  CHECK(got.resource().generic().spec() == "hello");

  auto expectInvalid = [&](cluster::v1::Resource r, grpc::StatusCode code,
                           const std::string& needle) {
    krane::api::v1::PutResourceRequest bad;
    *bad.mutable_resource() = std::move(r);
    krane::api::v1::PutResourceResponse ignored;
    auto status = call(&krane::api::v1::ResourceService::Stub::Put, bad, &ignored);
    INFO(status.error_message());
    CHECK(status.error_code() == code);
    CHECK_THAT(status.error_message(), Catch::Contains(needle));
  };
  expectInvalid(bucket("", "eu-1", "x"), grpc::StatusCode::INVALID_ARGUMENT,
                "resource.id: required");
  expectInvalid(bucket("b2", "", "x"), grpc::StatusCode::INVALID_ARGUMENT,
                "resource.region: required");
  expectInvalid(bucket("b2", "nowhere", "x"), grpc::StatusCode::NOT_FOUND,
                "region \"nowhere\" is not registered");
  auto wrong_kind = bucket("b2", "eu-1", "x");
  wrong_kind.set_type("sentinel");
  expectInvalid(wrong_kind, grpc::StatusCode::INVALID_ARGUMENT, "sentinel");

  get.set_id("missing");
  CHECK(call(&krane::api::v1::ResourceService::Stub::Get, get, &got).error_code() ==
        grpc::StatusCode::NOT_FOUND);

  for (int i = 0; i < 7; ++i) {
    *put.mutable_resource() = bucket(strCat("p", i), i % 2 ? "eu-1" : "us-1", "x");
    REQUIRE_THAT(call(&krane::api::v1::ResourceService::Stub::Put, put, &put_response), IsOk());
  }
  // Paging returns every resource once, in (type, region, id) order.
  krane::api::v1::ListResourcesRequest list;
  list.set_page_size(3);
  std::vector<std::string> ids;
  for (int pages = 0; pages < 10; ++pages) {
    krane::api::v1::ListResourcesResponse page;
    REQUIRE_THAT(call(&krane::api::v1::ResourceService::Stub::List, list, &page), IsOk());
    for (const auto& r : page.resources()) ids.push_back(strCat(r.region(), "/", r.id()));
    if (page.next_page_token().empty()) break;
    list.set_page_token(page.next_page_token());
  }
  CHECK(ids == std::vector<std::string>{"eu-1/b1", "eu-1/p1", "eu-1/p3", "eu-1/p5", "us-1/p0",
                                        "us-1/p2", "us-1/p4", "us-1/p6"});
  list.set_page_token("garbage");
  krane::api::v1::ListResourcesResponse page;
  CHECK(call(&krane::api::v1::ResourceService::Stub::List, list, &page).error_code() ==
        grpc::StatusCode::INVALID_ARGUMENT);

  krane::api::v1::DeleteResourceRequest del;
  del.set_type(kType);
  del.set_id("b1");
  del.set_region("eu-1");
  krane::api::v1::DeleteResourceResponse deleted;
  REQUIRE_THAT(call(&krane::api::v1::ResourceService::Stub::Delete, del, &deleted), IsOk());
  CHECK(call(&krane::api::v1::ResourceService::Stub::Delete, del, &deleted).error_code() ==
        grpc::StatusCode::NOT_FOUND);
}

TEST_CASE("heartbeats make each agents lag visible", "[feed]") {
  TestControlPlane cp;
  auto& server = cp.startReplica();
  for (int i = 0; i < 7; ++i)
    REQUIRE_THAT(server.writer().put(bucket(strCat("r", i), "eu-1", "x")), IsOk());
  auto cluster = cp.cluster();
  cluster::v1::HeartbeatRequest beat;
  beat.set_agent_id("agent-a");
  beat.set_region("eu-1");
  beat.set_build_version("1.2.3");
  beat.set_applied_version(4);
  beat.set_is_leader(true);
  cluster::v1::HeartbeatResponse answer;
  REQUIRE_THAT(
      cluster->Heartbeat(TestControlPlane::withToken(cp.agentToken("eu-1")).get(), beat, &answer),
      IsOk());
  CHECK(answer.latest_version() == 7u);

  auto agents = cp.agents();
  krane::api::v1::ListAgentsRequest request;
  krane::api::v1::ListAgentsResponse response;
  REQUIRE_THAT(
      agents->ListAgents(TestControlPlane::withToken(kOperatorToken).get(), request, &response),
      IsOk());
  REQUIRE(response.agents_size() == 1);
  CHECK(response.agents(0).agent_id() == "agent-a");
  CHECK(response.agents(0).lag() == 3u);
  CHECK(response.agents(0).is_leader());
  CHECK(
      agents
          ->ListAgents(TestControlPlane::withToken(cp.agentToken("eu-1")).get(), request, &response)
          .error_code() == grpc::StatusCode::UNAUTHENTICATED);
}

// An agent that is gone (a replaced node) can be forgotten; one that still sends heartbeats is
// refused by name, since it would only come back, unless forced.
TEST_CASE("agents that are gone can be removed", "[feed]") {
  TestControlPlane cp;
  cp.startReplica();
  auto cluster = cp.cluster();
  for (const char* id : {"agent-old", "agent-new"}) {
    cluster::v1::HeartbeatRequest beat;
    beat.set_agent_id(id);
    beat.set_region("eu-1");
    beat.set_build_version("1.2.3");
    cluster::v1::HeartbeatResponse answer;
    REQUIRE_THAT(
        cluster->Heartbeat(TestControlPlane::withToken(cp.agentToken("eu-1")).get(), beat, &answer),
        IsOk());
  }
  auto agents = cp.agents();
  auto remove = [&](const std::string& id, bool force = false) {
    krane::api::v1::RemoveAgentRequest request;
    request.set_region("eu-1");
    request.set_agent_id(id);
    request.set_force(force);
    krane::api::v1::RemoveAgentResponse response;
    return agents->RemoveAgent(TestControlPlane::withToken(kOperatorToken).get(), request,
                               &response);
  };
  auto listed = [&] {
    krane::api::v1::ListAgentsResponse response;
    CHECK_THAT(agents->ListAgents(TestControlPlane::withToken(kOperatorToken).get(), {}, &response),
               IsOk());
    std::set<std::string> ids;
    for (const auto& a : response.agents()) ids.insert(a.agent_id());
    return ids;
  };
  INFO("alive: refused, naming it");
  auto alive = remove("agent-old");
  CHECK(alive.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
  CHECK_THAT(alive.error_message(), Catch::Contains("agent-old") && Catch::Contains("heartbeat"));
  CHECK(listed() == std::set<std::string>{"agent-new", "agent-old"});

  REQUIRE_THAT(cp.pool()->transact("age",
                                   [](db::Connection& conn) {
                                     return conn
                                         .exec(
                                             "UPDATE agents SET last_seen_at = last_seen_at - "
                                             "120000 WHERE agent_id = 'agent-old'")
                                         .status();
                                   }),
               IsOk());
  CHECK(remove("agent-old").ok());
  CHECK(listed() == std::set<std::string>{"agent-new"});
  CHECK(remove("agent-old").error_code() == grpc::StatusCode::NOT_FOUND);
  CHECK(remove("agent-new", /*force=*/true).ok());
  CHECK(listed().empty());
  CHECK(remove("").error_code() == grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_CASE("core resource types travel whole through the api and the stream", "[feed]") {
  TestControlPlane cp;
  cp.startReplica();
  WatchRecorder agent(cp.watchChannel(), cp.agentToken("eu-1"), "eu-1", 0);
  auto api = cp.resources();
  std::vector<cluster::v1::Resource> sent(3);
  auto& topology = sent[0];
  topology.set_type("deployment_topology");
  topology.set_id("dep_1");
  topology.set_region("eu-1");
  auto* t = topology.mutable_deployment_topology();
  t->set_workspace_id("ws_1");
  t->set_project_id("proj_1");
  t->set_app_id("app_1");
  t->set_environment_id("env_1");
  t->set_image("registry.example.com/app:v1");
  t->add_command("/app/server");
  t->add_args("--port=8080");
  auto* env = t->add_env();
  env->set_name("MODE");
  env->set_value("production");
  t->set_port(8080);
  t->mutable_healthcheck()->mutable_readiness()->set_path("/ready");
  t->set_cpu_millicores(500);
  t->set_memory_mib(256);
  t->set_replicas(3);
  t->set_shutdown_signal("SIGINT");
  auto& sentinel = sent[1];
  sentinel.set_type("sentinel");
  sentinel.set_id("sen_1");
  sentinel.set_region("eu-1");
  auto* s = sentinel.mutable_sentinel();
  s->set_workspace_id("ws_1");
  s->set_project_id("proj_1");
  s->set_app_id("app_1");
  s->set_environment_id("env_1");
  s->set_image("registry.example.com/sentinel:v7");
  s->set_replicas(2);
  s->set_cpu_millicores(250);
  s->set_memory_mib(128);
  auto& policy = sent[2];
  policy.set_type("cilium_network_policy");
  policy.set_id("cnp_1");
  policy.set_region("eu-1");
  auto* p = policy.mutable_cilium_network_policy();
  p->set_workspace_id("ws_1");
  p->set_project_id("proj_1");
  p->set_environment_id("env_1");
  p->set_policy_json(R"({"endpointSelector":{"matchLabels":{"app":"x"}}})");
  for (const auto& resource : sent) {
    krane::api::v1::PutResourceRequest put;
    *put.mutable_resource() = resource;
    krane::api::v1::PutResourceResponse response;
    auto status = api->Put(TestControlPlane::withToken(kOperatorToken).get(), put, &response);
    INFO(resource.type() << ": " << status.error_message());
    REQUIRE_THAT(status, IsOk());
  }
  REQUIRE(agent.waitForVersion(3));
  std::map<std::string, cluster::v1::Resource> received;
  for (const auto& e : agent.events()) {
    if (e.has_change()) received[e.change().resource().type()] = e.change().resource();
  }
  REQUIRE(received.size() == 3u);
  CHECK(received["deployment_topology"].deployment_topology().command(0) == "/app/server");
  CHECK(received["deployment_topology"].deployment_topology().env(0).value() == "production");
  CHECK(received["deployment_topology"].deployment_topology().healthcheck().readiness().path() ==
        "/ready");
  CHECK(received["deployment_topology"].deployment_topology().shutdown_signal() == "SIGINT");
  CHECK(received["sentinel"].sentinel().image() == "registry.example.com/sentinel:v7");
  CHECK_THAT(received["cilium_network_policy"].cilium_network_policy().policy_json(),
             Catch::Contains("endpointSelector"));

  // A topology with a bad field is refused naming it, and nothing is streamed for it.
  krane::api::v1::PutResourceRequest bad;
  *bad.mutable_resource() = topology;
  bad.mutable_resource()->mutable_deployment_topology()->set_port(70000);
  krane::api::v1::PutResourceResponse ignored;
  auto refused = api->Put(TestControlPlane::withToken(kOperatorToken).get(), bad, &ignored);
  CHECK(refused.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK_THAT(refused.error_message(), Catch::Contains("deployment_topology.port"));
}

TEST_CASE("watch requests are validated", "[feed]") {
  TestControlPlane cp;
  cp.startReplica();
  WatchRecorder bad_type(cp.watchChannel(), cp.agentToken("eu-1"), "eu-1", 0,
                         {"no spaces allowed"});
  REQUIRE(bad_type.waitFinished(std::chrono::seconds(10)));
  CHECK(bad_type.status().error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK_THAT(bad_type.status().error_message(), Catch::Contains("resource_types[0]"));
}

TEST_CASE("a database outage fails writes clearly and the feed recovers", "[feed]") {
  TestControlPlane cp;
  auto& server = cp.startReplica();
  WatchRecorder agent(cp.watchChannel(), cp.agentToken("eu-1"), "eu-1", 0);
  REQUIRE_THAT(server.writer().put(bucket("before", "eu-1", "1")), IsOk());
  REQUIRE(agent.waitForVersion(1));

  auto& db = krane::testing::ScratchMariaDb::instance();
  db.stop();
  auto api = cp.resources();
  krane::api::v1::PutResourceRequest put;
  *put.mutable_resource() = bucket("during", "eu-1", "2");
  krane::api::v1::PutResourceResponse ignored;
  auto refused = api->Put(TestControlPlane::withToken(kOperatorToken).get(), put, &ignored);
  INFO(refused.error_message());
  CHECK(refused.error_code() == grpc::StatusCode::UNAVAILABLE);
  CHECK_THAT(refused.error_message(), Catch::Contains("cannot connect to MySQL"));
  httplib::Client http("127.0.0.1", server.httpPort());
  auto ready = http.Get("/readyz");
  REQUIRE(ready);
  CHECK(ready->status == 503);

  db.start();
  // Nothing half-written: the refused put left no trace, and the feed goes on where it was.
  REQUIRE_THAT(server.writer().put(bucket("after", "eu-1", "3")), IsOk());
  INFO("the connected agent gets changes made after the outage");
  REQUIRE(agent.waitForVersion(2));
  CHECK(materialize(agent.events()) == databaseView(cp, "eu-1"));
  CHECK(databaseView(cp, "eu-1").count(strCat(kType, "/during")) == 0u);
  CHECK(http.Get("/readyz")->status == 200);
}

TEST_CASE("metrics and health endpoints", "[feed]") {
  TestControlPlane cp;
  auto& server = cp.startReplica();
  WatchRecorder agent(cp.watchChannel(), cp.agentToken("eu-1"), "eu-1", 0);
  REQUIRE_THAT(server.writer().put(bucket("m", "eu-1", "x")), IsOk());
  REQUIRE(agent.waitForVersion(1));
  httplib::Client http("127.0.0.1", server.httpPort());
  auto health = http.Get("/healthz");
  REQUIRE(health);
  CHECK(health->status == 200);
  auto ready = http.Get("/readyz");
  REQUIRE(ready);
  CHECK(ready->status == 200);
  auto metrics = http.Get("/metrics");
  REQUIRE(metrics);
  CHECK_THAT(metrics->body, Catch::Contains("krane_feed_streams 1"));
  CHECK_THAT(metrics->body, Catch::Contains("krane_feed_events_sent_total"));
  CHECK_THAT(metrics->body, Catch::Contains("krane_feed_batches_total"));
  CHECK_THAT(metrics->body, Catch::Contains("krane_feed_full_syncs_total 1"));
  if (TestControlPlane::watchListener()) {
    // The stream is on the watch listener, not on the gRPC port.
    CHECK_THAT(metrics->body, Catch::Contains("krane_feed_watch_listener_connections 1"));
    CHECK_THAT(metrics->body, Catch::Contains("krane_feed_watch_listener_calls 1"));
  } else {
    CHECK_THAT(metrics->body, !Catch::Contains("krane_feed_watch_listener"));
  }
}

}  // namespace
}  // namespace krane
