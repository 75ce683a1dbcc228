// The journal cache of a replica, and the journal writer that groups concurrent writes.
#include <atomic>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

#include <catch2/catch.hpp>

#include "controlplane/workflow/engine.h"
#include "controlplane/workflow/finish_writer.h"
#include "controlplane/workflow/group_commit.h"
#include "controlplane/workflow/journal_cache.h"
#include "controlplane/workflow/journal_writer.h"
#include "controlplane/workflow/operations.h"
#include "tests/controlplane/workflow/fixture.h"
#include "tests/support/matchers.h"
#include "tests/support/wait.h"

namespace krane::workflow {
namespace {

using krane::testing::eventually;
using namespace std::chrono_literals;

std::vector<JournalEntry> entries(int n, const std::string& payload = "p") {
  std::vector<JournalEntry> out;
  for (int i = 0; i < n; ++i) out.push_back(JournalEntry{i, "run", "step", true, payload});
  return out;
}

TEST_CASE("the journal cache serves a journal only to the next claim", "[journal-cache]") {
  JournalCache cache(1 << 20);
  cache.put("inv_a", 5, entries(3));
  auto next = cache.take("inv_a", 6);
  REQUIRE(next.has_value());
  CHECK(next->size() == 3u);
  INFO("taken: the execution owns it now");
  CHECK_FALSE(cache.take("inv_a", 6).has_value());

  INFO("a claim in between (someone else held the invocation): dropped, not served");
  cache.put("inv_a", 5, entries(3));
  CHECK_FALSE(cache.take("inv_a", 7).has_value());
  CHECK_FALSE(cache.take("inv_a", 6).has_value());
  CHECK(cache.size() == 0u);
  CHECK(cache.bytes() == 0u);

  INFO("storing again replaces");
  cache.put("inv_b", 1, entries(1));
  cache.put("inv_b", 3, entries(2));
  CHECK_FALSE(cache.take("inv_b", 2).has_value());
  cache.put("inv_b", 3, entries(2));
  CHECK(cache.take("inv_b", 4)->size() == 2u);
}

TEST_CASE("the journal cache keeps within its bytes, the oldest going first", "[journal-cache]") {
  const std::string big(10000, 'x');
  JournalCache cache(25000);
  cache.put("inv_1", 1, entries(1, big));
  cache.put("inv_2", 1, entries(1, big));
  CHECK(cache.size() == 2u);
  cache.put("inv_3", 1, entries(1, big));
  CHECK(cache.size() == 2u);
  CHECK(cache.bytes() <= 25000u);
  CHECK_FALSE(cache.take("inv_1", 2).has_value());
  CHECK(cache.take("inv_2", 2).has_value());
  CHECK(cache.take("inv_3", 2).has_value());
  INFO("larger than the whole cache: not kept");
  cache.put("inv_4", 1, entries(3, big));
  CHECK(cache.size() == 0u);
}

// Run steps around two awakeables; the test resolves them, and can move the invocation from one
// replica to another while it is suspended.
class RelayTest : public WorkflowTest {
 protected:
  std::function<void(Engine&)> define() {
    return [this](Engine& e) {
      REQUIRE_THAT(e.registerService(ServiceDefinition::service("Relay").handler(
                       "go",
                       [this](Context& ctx, const std::string&) -> absl::StatusOr<std::string> {
                         std::string out;
                         for (int i = 0; i < 3; ++i) {
                           auto step =
                               ctx.run(strCat("step", i), [&, i]() -> absl::StatusOr<std::string> {
                                 ++runs[i];
                                 return std::to_string(i);
                               });
                           if (!step.ok()) return step.status();
                           out += *step;
                           if (i == 2) break;
                           Awakeable w = ctx.awakeable();
                           auto published = ctx.runVoid(strCat("publish", i), [&] {
                             std::lock_guard lock(mutex);
                             awakeables[i] = w.id;
                             return absl::OkStatus();
                           });
                           if (!published.ok()) return published;
                           auto got = ctx.await(w.future);
                           if (!got.ok()) return got.status();
                           out += *got;
                         }
                         return out;
                       })),
                   IsOk());
    };
  }

  std::string awakeable(int i) {
    std::string id;
    REQUIRE(eventually([&] {
      std::lock_guard lock(mutex);
      id = awakeables[i];
      return !id.empty();
    }));
    return id;
  }

  std::atomic<int> runs[3] = {};
  std::mutex mutex;
  std::string awakeables[2];
};

TEST_CASE_METHOD(RelayTest, "a resumed invocation takes its journal from the cache",
                 "[journal-cache]") {
  EngineOptions options = fastOptions();
  Engine& a = engine(define(), options);
  auto id = a.send({"Relay", "go"});
  REQUIRE_THAT(id, IsOk());
  // Each resolved once suspended: one resolved earlier wakes the execution before it suspends,
  // which then goes on with the journal it has.
  for (int i = 0; i < 2; ++i) {
    const std::string w = awakeable(i);
    REQUIRE(eventually([&] { return statusOf(*id) == "suspended"; }));
    REQUIRE_THAT(a.resolveAwakeable(w, i == 0 ? "x" : "y"), IsOk());
  }
  auto result = a.awaitResult(*id, 20s);
  REQUIRE_THAT(result, IsOk());
  CHECK(*result == "0x1y2");
  for (int i = 0; i < 3; ++i) CHECK(runs[i].load() == 1);
  INFO("both resumptions replayed from memory; the first execution had nothing to read");
  CHECK(a.stats().journal_cache_hits.load() == 2u);
  CHECK(a.stats().journal_reads.load() == 0u);
}

TEST_CASE_METHOD(RelayTest,
                 "a replica does not replay a cached journal after another replica went on with"
                 " the invocation",
                 "[journal-cache]") {
  EngineOptions options_a = fastOptions();
  options_a.worker_id = "a";
  Engine& a = engine(define(), options_a);
  auto id = a.send({"Relay", "go"});
  REQUIRE_THAT(id, IsOk());
  const std::string first = awakeable(0);
  REQUIRE(eventually([&] { return statusOf(*id) == "suspended"; }));
  // Replica a keeps the journal up to the first awakeable, and stops.
  a.stop();

  EngineOptions options_b = fastOptions();
  options_b.worker_id = "b";
  Engine& b = engine(define(), options_b);
  REQUIRE_THAT(b.resolveAwakeable(first, "x"), IsOk());
  const std::string second = awakeable(1);
  REQUIRE(eventually([&] { return statusOf(*id) == "suspended"; }));
  CHECK(runs[1].load() == 1);
  CHECK(b.stats().journal_reads.load() == 1u);
  b.stop();

  // Back on replica a, whose cached journal lacks what b journaled (step1, the second
  // awakeable): replaying it would run step1 again and clash with b's entries.
  a.start();
  REQUIRE_THAT(a.resolveAwakeable(second, "y"), IsOk());
  auto result = a.awaitResult(*id, 20s);
  REQUIRE_THAT(result, IsOk());
  CHECK(*result == "0x1y2");
  for (int i = 0; i < 3; ++i) CHECK(runs[i].load() == 1);
  CHECK(a.stats().journal_cache_hits.load() == 0u);
  CHECK(a.stats().journal_reads.load() == 1u);
  auto detail = showInvocation(*pool_, *id);
  REQUIRE_THAT(detail, IsOk());
  std::vector<std::string> kinds;
  for (const auto& j : detail->journal) kinds.push_back(j.kind);
  CHECK(kinds == std::vector<std::string>{"run", "awakeable", "run", "await", "run", "awakeable",
                                          "run", "await", "run"});
  CHECK(detail->claims == 3);
}

// The journal and finish writers on their own, without an engine running the invocations.
class WriterTest : public WorkflowTest {
 protected:
  // Invocations of a service no engine runs, ready and with lease token 0 (as sent).
  std::vector<std::string> idleInvocations(int n) {
    Engine idle(pool_, fastOptions());
    REQUIRE_THAT(idle.registerService(ServiceDefinition::service("Idle").handler(
                     "h", [](Context&, const std::string&) { return std::string(); })),
                 IsOk());
    std::vector<std::string> ids;
    for (int i = 0; i < n; ++i) {
      auto id = idle.send({"Idle", "h"});
      REQUIRE_THAT(id, IsOk());
      ids.push_back(*id);
    }
    return ids;
  }

  // A transaction holding every invocation row: writes wait for it to commit.
  db::PooledConnection holdInvocationRows() {
    auto blocker = pool_->acquire();
    REQUIRE_THAT(blocker, IsOk());
    REQUIRE_THAT((*blocker)->execText("START TRANSACTION"), IsOk());
    REQUIRE_THAT((*blocker)->query("SELECT id FROM workflow_invocations FOR UPDATE"), IsOk());
    return *std::move(blocker);
  }

  // Starts write(0) .. write(n - 1) on threads of their own, one per writer place, and returns
  // once each of them waits for the rows holdInvocationRows() holds: writes started after these
  // line up behind them, and go in one batch once the rows are free.
  void occupyWriters(int n, const std::function<void(int)>& write,
                     std::vector<std::thread>& threads) {
    for (int i = 0; i < n; ++i) threads.emplace_back([write, i] { write(i); });
    int64_t lock_waits = 0;
    CHECK(eventually(
        [&] {
          lock_waits = lockWaits();
          return lock_waits == n;
        },
        10s));
    INFO("transactions waiting for a lock: " << lock_waits);
  }

  // Runs write(0) .. write(n - 1) on threads of their own while every place of `writer` is
  // taken by a write of one entry waiting for the invocation rows (to ids[n] onwards), so that
  // they line up and go in together once the rows are free. Returns their results, then the
  // occupying writes' ones.
  std::vector<absl::Status> writeQueued(JournalWriter& writer, const std::vector<std::string>& ids,
                                        int n, const std::function<absl::Status(int)>& write) {
    static const JournalEntry decoy{0, "run", "decoy", true, std::string("d")};
    auto blocker = holdInvocationRows();
    std::vector<absl::Status> results(n + JournalWriter::kWriters);
    std::vector<std::thread> threads;
    occupyWriters(
        static_cast<int>(JournalWriter::kWriters),
        [&](int i) { results[n + i] = writer.write(ids[n + i], 0, {&decoy}); }, threads);
    for (int i = 0; i < n; ++i) threads.emplace_back([&, i] { results[i] = write(i); });
    std::this_thread::sleep_for(300ms);
    CHECK_THAT(blocker->execText("COMMIT"), IsOk());
    for (auto& t : threads) t.join();
    return results;
  }
};

TEST_CASE_METHOD(WriterTest, "concurrent journal writes are grouped and each one fenced",
                 "[journal-writer]") {
  constexpr int kWrites = 32;
  const auto ids = idleInvocations(kWrites);
  // Hold every invocation row, so the first writers wait and the others queue behind them.
  auto blocker = holdInvocationRows();

  JournalWriter writer(*pool_);
  std::vector<absl::Status> results(kWrites);
  std::vector<std::thread> threads;
  const std::vector<JournalEntry> two = entries(2);
  for (int i = 0; i < kWrites; ++i) {
    threads.emplace_back([&, i] {
      // Every third one with a lease token that is no longer current; some with two entries.
      const int64_t token = i % 3 == 0 ? 7 : 0;
      std::vector<const JournalEntry*> mine{&two[0]};
      if (i % 2 == 0) mine.push_back(&two[1]);
      results[i] = writer.write(ids[i], token, mine);
    });
  }
  std::this_thread::sleep_for(500ms);
  REQUIRE_THAT(blocker->execText("COMMIT"), IsOk());
  for (auto& t : threads) t.join();

  int64_t expected_rows = 0;
  for (int i = 0; i < kWrites; ++i) {
    INFO("write " << i);
    if (i % 3 == 0) {
      CHECK(absl::IsAborted(results[i]));
      CHECK(messageOf(results[i]) == "fenced");
      CHECK(scalar("SELECT COUNT(*) FROM workflow_journal WHERE invocation_id = ?", {ids[i]}) == 0);
    } else {
      CHECK_THAT(results[i], IsOk());
      const int n = i % 2 == 0 ? 2 : 1;
      expected_rows += n;
      CHECK(scalar("SELECT COUNT(*) FROM workflow_journal WHERE invocation_id = ?", {ids[i]}) == n);
    }
  }
  CHECK(scalar("SELECT COUNT(*) FROM workflow_journal") == expected_rows);
  INFO("statements: " << writer.statements());
  CHECK(writer.statements() < static_cast<uint64_t>(kWrites) / 2);
}

TEST_CASE_METHOD(WriterTest, "entries written in one statement keep each invocation's own values",
                 "[journal-writer]") {
  constexpr int kWrites = 12;
  constexpr int kDecoys = static_cast<int>(JournalWriter::kWriters);
  const auto ids = idleInvocations(kWrites + kDecoys);
  // Every column differs from one invocation to the next: a value given to the wrong row, or a
  // NULL where a value belongs, shows.
  std::vector<JournalEntry> mine;
  for (int i = 0; i < kWrites; ++i) {
    JournalEntry e{i + 3, i % 2 == 0 ? "run" : "await", "step-" + std::to_string(i), i % 3 != 0};
    if (i % 4 != 1) e.payload = std::string("payload-") + std::to_string(i) + std::string(1, '\0');
    if (i == 2) *e.payload += std::string("\xff\xfe") + std::string(100 << 10, 'x');
    if (i % 3 == 0) e.error = absl::FailedPreconditionError("error-" + std::to_string(i));
    e.duration_ms = 100 + i;
    mine.push_back(e);
  }
  JournalWriter writer(*pool_);
  const auto results = writeQueued(writer, ids, kWrites, [&](int i) {
    // The last one's lease moved on.
    return writer.write(ids[i], i == kWrites - 1 ? 9 : 0, {&mine[i]});
  });
  INFO("statements: " << writer.statements());
  CHECK(writer.statements() <= static_cast<uint64_t>(kDecoys) + 2);  // the twelve in one or two
  for (int i = kWrites; i < kWrites + kDecoys; ++i) CHECK_THAT(results[i], IsOk());

  auto conn = pool_->acquire();
  REQUIRE_THAT(conn, IsOk());
  for (int i = 0; i < kWrites; ++i) {
    INFO("write " << i);
    auto rows = (*conn)->query(
        "SELECT seq, kind, name, ok, payload, error_code, error_message, duration_ms"
        " FROM workflow_journal WHERE invocation_id = ?",
        {ids[i]});
    REQUIRE_THAT(rows, IsOk());
    if (i == kWrites - 1) {
      CHECK(messageOf(results[i]) == "fenced");
      CHECK(rows->rows.empty());
      continue;
    }
    CHECK_THAT(results[i], IsOk());
    REQUIRE(rows->rows.size() == 1u);
    const db::Row& r = rows->rows[0];
    const JournalEntry& e = mine[i];
    CHECK(r.i64("seq") == e.seq);
    CHECK(r.str("kind") == e.kind);
    CHECK(r.str("name") == e.name);
    CHECK(r.i64("ok") == (e.ok ? 1 : 0));
    CHECK(r.optStr("payload") == e.payload);
    CHECK(r.optI64("error_code") ==
          (e.error.ok() ? std::nullopt
                        : std::optional<int64_t>(static_cast<int64_t>(e.error.code()))));
    CHECK(
        r.optStr("error_message") ==
        (e.error.ok() ? std::nullopt : std::optional<std::string>(std::string(e.error.message()))));
    CHECK(r.i64("duration_ms") == e.duration_ms);
  }
}

TEST_CASE_METHOD(WriterTest,
                 "a journal entry the server refuses fails alone, not the entries grouped with it",
                 "[journal-writer]") {
  // Writes of one entry share a statement, writes of two a transaction. One of each repeats a
  // sequence number its invocation's journal already has.
  constexpr int kSingles = 6;
  constexpr int kDoubles = 4;
  constexpr int kWrites = kSingles + kDoubles;
  constexpr int kDecoys = static_cast<int>(JournalWriter::kWriters);
  constexpr int kRepeatedSingle = 2;
  constexpr int kRepeatedDouble = kSingles + 1;
  const auto ids = idleInvocations(kWrites + kDecoys);
  for (int i : {kRepeatedSingle, kRepeatedDouble}) {
    auto conn = pool_->acquire();
    REQUIRE_THAT(conn, IsOk());
    REQUIRE_THAT((*conn)->exec("INSERT INTO workflow_journal (invocation_id, seq, kind, name, ok,"
                               " created_at) VALUES (?, 1, 'run', 'earlier', TRUE, 0)",
                               {ids[i]}),
                 IsOk());
  }
  const std::vector<JournalEntry> two = entries(2);  // seq 0 and 1
  std::vector<std::vector<const JournalEntry*>> mine(kWrites);
  for (int i = 0; i < kSingles; ++i) mine[i] = {&two[i == kRepeatedSingle ? 1 : 0]};
  for (int i = kSingles; i < kWrites; ++i) mine[i] = {&two[0], &two[1]};

  JournalWriter writer(*pool_);
  const auto results =
      writeQueued(writer, ids, kWrites, [&](int i) { return writer.write(ids[i], 0, mine[i]); });

  for (int i = kWrites; i < kWrites + kDecoys; ++i) CHECK_THAT(results[i], IsOk());
  for (int i = 0; i < kWrites; ++i) {
    INFO("write " << i);
    const int64_t rows =
        scalar("SELECT COUNT(*) FROM workflow_journal WHERE invocation_id = ?", {ids[i]});
    if (i == kRepeatedSingle || i == kRepeatedDouble) {
      CHECK(absl::IsAlreadyExists(results[i]));
      // The entry there is kept, and nothing of the refused write is in, not even the first
      // entry of the two.
      CHECK(rows == 1);
      CHECK(scalar("SELECT COUNT(*) FROM workflow_journal WHERE invocation_id = ? AND name ="
                   " 'earlier'",
                   {ids[i]}) == 1);
    } else {
      CHECK_THAT(results[i], IsOk());
      CHECK(rows == static_cast<int64_t>(mine[i].size()));
    }
  }
  // Each group was tried, failed, and went again one write at a time: a statement for each
  // write, and one more for each group that failed.
  INFO("statements: " << writer.statements());
  CHECK(writer.statements() > static_cast<uint64_t>(kDecoys + kWrites));
}

TEST_CASE("a batch whose write throws ends, and later ones are written", "[group-commit]") {
  struct Request {
    int value;
    bool written = false;
  };
  std::atomic<bool> fail{true};
  std::vector<int> written;
  std::mutex written_mutex;
  GroupCommit<Request> group(
      1, 100, [](const Request&) { return size_t{1}; },
      [&](const std::vector<Request*>& batch) {
        if (fail.exchange(false)) throw std::runtime_error("write failed");
        std::lock_guard lock(written_mutex);
        for (Request* r : batch) {
          r->written = true;
          written.push_back(r->value);
        }
      });
  Request first{1};
  CHECK_THROWS_WITH(group.submit(first), "write failed");
  CHECK_FALSE(first.written);
  INFO("the writer's place is free again: the next submits are written, not left waiting");
  std::vector<Request> more;
  for (int i = 0; i < 8; ++i) more.push_back(Request{10 + i});
  std::vector<std::thread> threads;
  for (Request& r : more) threads.emplace_back([&] { group.submit(r); });
  for (auto& t : threads) t.join();
  for (const Request& r : more) CHECK(r.written);
  CHECK(written.size() == more.size());
}

TEST_CASE("callers that wait are each woken for their own request, and none is left behind",
          "[group-commit]") {
  // Waiting callers sleep on their own condition variables: a finished batch wakes its callers
  // and the first of the queue. A wake-up lost there leaves a caller asleep for good (the
  // futures below time out); batches must still start on both writers' places.
  struct Request {
    int value;
    int written = 0;
  };
  constexpr size_t kWriters = 2;
  constexpr size_t kMaxWeight = 3;
  std::mutex m;
  size_t writing = 0, most_writing = 0, largest = 0, batches = 0;
  GroupCommit<Request> group(
      kWriters, kMaxWeight, [](const Request&) { return size_t{1}; },
      [&](const std::vector<Request*>& batch) {
        {
          std::lock_guard lock(m);
          most_writing = std::max(most_writing, ++writing);
          largest = std::max(largest, batch.size());
          ++batches;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(300));
        std::lock_guard lock(m);
        for (Request* r : batch) ++r->written;
        --writing;
      });
  constexpr int kThreads = 24;
  constexpr int kEach = 40;
  std::vector<std::vector<Request>> requests(kThreads);
  std::vector<std::future<void>> callers;
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kEach; ++i) requests[t].push_back(Request{t * kEach + i});
    callers.push_back(std::async(std::launch::async, [&, t] {
      for (Request& r : requests[t]) group.submit(r);
    }));
  }
  for (auto& c : callers) {
    REQUIRE(c.wait_for(std::chrono::seconds(60)) == std::future_status::ready);
  }
  for (const auto& rs : requests) {
    for (const Request& r : rs) {
      INFO("request " << r.value);
      CHECK(r.written == 1);
    }
  }
  CHECK(most_writing == kWriters);
  CHECK(largest <= kMaxWeight);
  INFO(batches << " batches");
  CHECK(batches < size_t{kThreads * kEach});  // requests were grouped
}

// Bytes that are not text: a value converted in the statement would show.
std::string outputOf(int i) { return "output-" + std::to_string(i) + std::string("\0\xff\xfe", 3); }

FinishWriter::Request finishing(const std::string& id, int64_t token, int i) {
  FinishWriter::Request r;
  r.invocation_id = id;
  r.token = token;
  if (i % 3 == 0) {
    r.status = "failed";
    r.error_code = static_cast<int64_t>(absl::StatusCode::kFailedPrecondition);
    r.error_message = "error-" + std::to_string(i);
  } else {
    r.status = i % 3 == 1 ? "succeeded" : "cancelled";
    if (i % 3 == 1) r.output = db::Blob{outputOf(i)};
  }
  r.attempts = 10 + i;
  return r;
}

TEST_CASE_METHOD(WriterTest,
                 "finishes of several invocations share a statement and keep their own values",
                 "[finish-writer]") {
  constexpr int kFinishes = 7;
  const auto ids = idleInvocations(kFinishes);
  // The last one was taken over meanwhile: another worker's claim added one to the token, as
  // this writer's finish would have. The one before it was killed (which adds one as well, and
  // ends the invocation with no lease owner).
  exec(
      "UPDATE workflow_invocations SET status = 'running', lease_owner = 'other',"
      " lease_token = 1 WHERE id = ?",
      {ids.back()});
  exec(
      "UPDATE workflow_invocations SET status = 'killed', lease_token = 1, finished_at = 5"
      " WHERE id = ?",
      {ids[kFinishes - 2]});
  std::vector<FinishWriter::Request> requests;
  for (int i = 0; i < kFinishes; ++i) requests.push_back(finishing(ids[i], 0, i));
  std::vector<FinishWriter::Request*> batch;
  for (auto& r : requests) batch.push_back(&r);
  FinishWriter writer(*pool_);
  writer.write(batch);
  CHECK(writer.statements() == 1);

  for (int i = 0; i < kFinishes; ++i) {
    INFO("finish " << i);
    const FinishWriter::Request& r = requests[i];
    REQUIRE_THAT(r.result, IsOk());
    auto row = (*pool_->acquire())
                   ->query(
                       "SELECT status, output, error_code, error_message, attempts,"
                       " lease_token, lease_owner, due_at, finished_at"
                       " FROM workflow_invocations WHERE id = ?",
                       {ids[i]});
    REQUIRE_THAT(row, IsOk());
    const db::Row& got = row->rows[0];
    if (i == kFinishes - 1) {
      CHECK_FALSE(*r.result);  // fenced: the takeover's row is left as it was
      CHECK(got.str("status") == "running");
      CHECK(got.i64("lease_token") == 1);
      CHECK(got.optStr("lease_owner") == "other");
      continue;
    }
    if (i == kFinishes - 2) {
      CHECK_FALSE(*r.result);  // fenced: the kill stands
      CHECK(got.str("status") == "killed");
      CHECK(got.optI64("finished_at") == 5);
      continue;
    }
    CHECK(*r.result);
    CHECK(got.str("status") == r.status);
    CHECK(got.optStr("output") ==
          (i % 3 == 1 ? std::optional<std::string>(outputOf(i)) : std::nullopt));
    CHECK(got.optI64("error_code") ==
          (i % 3 == 0
               ? std::optional<int64_t>(static_cast<int64_t>(absl::StatusCode::kFailedPrecondition))
               : std::nullopt));
    CHECK(got.optStr("error_message") ==
          (i % 3 == 0 ? std::optional<std::string>("error-" + std::to_string(i)) : std::nullopt));
    CHECK(got.i64("attempts") == 10 + i);
    CHECK(got.i64("lease_token") == 1);
    CHECK_FALSE(got.optStr("lease_owner").has_value());
    CHECK_FALSE(got.optI64("due_at").has_value());
    CHECK(got.optI64("finished_at").has_value());
  }
}

TEST_CASE_METHOD(WriterTest, "a finish the server refuses fails alone, not its batch",
                 "[finish-writer]") {
  const auto ids = idleInvocations(4);
  std::vector<FinishWriter::Request> requests;
  for (int i = 0; i < 4; ++i) requests.push_back(finishing(ids[i], 0, i));
  requests[2].status = "finished";  // not a status the table has: the statement is refused
  std::vector<FinishWriter::Request*> batch;
  for (auto& r : requests) batch.push_back(&r);
  FinishWriter writer(*pool_);
  writer.write(batch);
  CHECK(writer.statements() == 5);  // the batch, then each alone
  for (int i = 0; i < 4; ++i) {
    INFO("finish " << i);
    if (i == 2) {
      CHECK_FALSE(requests[i].result.ok());
      CHECK(scalar("SELECT status = 'ready' FROM workflow_invocations WHERE id = ?", {ids[i]}) ==
            1);
    } else {
      REQUIRE_THAT(requests[i].result, IsOk());
      CHECK(*requests[i].result);
      CHECK(scalar("SELECT finished_at IS NOT NULL FROM workflow_invocations WHERE id = ?",
                   {ids[i]}) == 1);
    }
  }
}

TEST_CASE_METHOD(
    WriterTest, "finishes of a batch that cannot be read back are unknown, neither done nor fenced",
    "[finish-writer]") {
  // The writer's database user may change invocations but read only their ids and tokens (what
  // the fenced statement reads): the statement goes in, the read-back that tells the finished
  // rows from the fenced ones is refused.
  auto limited =
      limitedPool("noreadback", {{"workflow_invocations", "SELECT (id, lease_token), UPDATE"}});
  {
    auto conn = limited->acquire();
    REQUIRE_THAT(conn, IsOk());
    CHECK_FALSE((*conn)->query("SELECT status FROM workflow_invocations LIMIT 1").ok());
  }
  const auto ids = idleInvocations(3);
  // Taken over: the batch changes fewer rows than it holds, so the writer reads them back.
  exec(
      "UPDATE workflow_invocations SET status = 'running', lease_owner = 'other',"
      " lease_token = 1 WHERE id = ?",
      {ids[2]});
  std::vector<FinishWriter::Request> requests;
  for (int i = 0; i < 3; ++i) requests.push_back(finishing(ids[i], 0, i));
  std::vector<FinishWriter::Request*> batch;
  for (auto& r : requests) batch.push_back(&r);
  FinishWriter writer(*limited);
  writer.write(batch);
  CHECK(writer.statements() == 1);
  for (int i = 0; i < 3; ++i) {
    INFO("finish " << i << ": " << requests[i].result.status());
    // Neither "finished" (its caller would take a fenced finish for done) nor "fenced" (it would
    // leave a finished invocation for its lease to expire): an error that says it is unknown.
    CHECK(absl::IsUnavailable(requests[i].result.status()));
    CHECK_THAT(messageOf(requests[i].result.status()),
               Catch::Contains("may or may not have been finished"));
  }
  INFO("what the statement did stands: the two current invocations ended, the other did not");
  CHECK(scalar("SELECT COUNT(*) FROM workflow_invocations WHERE id IN (?, ?) AND lease_token = 1"
               " AND finished_at IS NOT NULL",
               {ids[0], ids[1]}) == 2);
  CHECK(statusOf(ids[2]) == "running");
}

TEST_CASE_METHOD(WriterTest, "one invocation finished twice in a batch takes the current one's",
                 "[finish-writer]") {
  const auto ids = idleInvocations(2);
  // A stale execution (token 7 is not the row's) and the current one, in one batch.
  FinishWriter::Request stale = finishing(ids[0], 7, 0);
  FinishWriter::Request current = finishing(ids[0], 0, 1);
  FinishWriter::Request other = finishing(ids[1], 0, 2);
  FinishWriter writer(*pool_);
  writer.write({&stale, &other, &current});
  REQUIRE_THAT(stale.result, IsOk());
  REQUIRE_THAT(current.result, IsOk());
  REQUIRE_THAT(other.result, IsOk());
  CHECK_FALSE(*stale.result);
  CHECK(*current.result);
  CHECK(*other.result);
  CHECK(scalar("SELECT attempts FROM workflow_invocations WHERE id = ?", {ids[0]}) == 11);
  CHECK(scalar("SELECT status = 'succeeded' FROM workflow_invocations WHERE id = ?", {ids[0]}) ==
        1);
  CHECK(scalar("SELECT status = 'cancelled' FROM workflow_invocations WHERE id = ?", {ids[1]}) ==
        1);
}

TEST_CASE_METHOD(WriterTest, "finishes that arrive together go in one statement",
                 "[finish-writer]") {
  constexpr int kFinishes = 12;
  constexpr int kDecoys = static_cast<int>(FinishWriter::kWriters);
  const auto ids = idleInvocations(kFinishes + kDecoys);
  auto blocker = holdInvocationRows();
  FinishWriter writer(*pool_);
  std::vector<FinishWriter::Request> requests;
  for (int i = 0; i < kFinishes + kDecoys; ++i) requests.push_back(finishing(ids[i], 0, i));
  std::vector<std::thread> threads;
  occupyWriters(
      kDecoys, [&](int i) { writer.finish(requests[kFinishes + i]); }, threads);
  for (int i = 0; i < kFinishes; ++i) {
    threads.emplace_back([&, i] { writer.finish(requests[i]); });
  }
  std::this_thread::sleep_for(300ms);
  REQUIRE_THAT(blocker->execText("COMMIT"), IsOk());
  for (auto& t : threads) t.join();
  INFO("statements: " << writer.statements());
  CHECK(writer.statements() <= static_cast<uint64_t>(kDecoys) + 2);
  for (auto& r : requests) {
    REQUIRE_THAT(r.result, IsOk());
    CHECK(*r.result);
  }
  CHECK(scalar("SELECT COUNT(*) FROM workflow_invocations WHERE finished_at IS NOT NULL") ==
        kFinishes + kDecoys);
}

}  // namespace
}  // namespace krane::workflow
