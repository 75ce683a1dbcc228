#include "controlplane/workflow/journal_writer.h"

#include <thread>

#include "common/backoff.h"
#include "common/clock.h"
#include "common/status.h"
#include "common/strings.h"
#include "controlplane/db/errors.h"
#include "controlplane/workflow/statements.h"
#include "controlplane/workflow/store.h"

namespace krane::workflow {
namespace {

void appendRow(db::Params* params, const std::string& id, const JournalEntry& e, int64_t now) {
  db::Value payload;
  if (e.payload) payload = db::Blob{*e.payload};
  params->emplace_back(id);
  params->emplace_back(e.seq);
  params->emplace_back(e.kind);
  params->emplace_back(e.name);  // clamped when the entry was made (kJournalNameChars)
  params->emplace_back(e.ok);
  params->push_back(std::move(payload));
  params->push_back(store::errorCode(e.error));
  params->push_back(store::errorMessage(e.error));
  params->emplace_back(e.duration_ms);
  params->emplace_back(now);
}

// Runs `statement` (one that commits by itself) again after a deadlock or a lock wait timeout, as
// Pool::transact does for a transaction.
template <typename F>
auto retryConflicts(F statement) -> decltype(statement()) {
  const db::TxOptions retry;
  Backoff backoff(retry.backoff);
  for (int attempt = 1;; ++attempt) {
    auto result = statement();
    if (result.ok() || !db::isTransactionConflict(result.status()) ||
        attempt >= retry.max_attempts) {
      return result;
    }
    std::this_thread::sleep_for(backoff.next());
  }
}

}  // namespace

absl::Status JournalWriter::write(const std::string& invocation_id, int64_t token,
                                  const std::vector<const JournalEntry*>& entries) {
  if (entries.empty()) return absl::OkStatus();
  Request request{&invocation_id, token, &entries};
  std::unique_lock lock(mutex_);
  queue_.push_back(&request);
  while (!request.done) {
    if (writing_ >= kWriters || queue_.empty()) {
      written_.wait(lock);
      continue;
    }
    ++writing_;
    std::vector<Request*> batch;
    size_t n = 0;
    while (!queue_.empty() &&
           (batch.empty() || n + queue_.front()->entries->size() <= kMaxEntries)) {
      n += queue_.front()->entries->size();
      batch.push_back(queue_.front());
      queue_.pop_front();
    }
    lock.unlock();
    writeBatch(batch);
    lock.lock();
    for (Request* r : batch) r->done = true;
    --writing_;
    written_.notify_all();
  }
  return request.result;
}

void JournalWriter::writeBatch(const std::vector<Request*>& batch) {
  bool single_entries = true;
  for (const Request* r : batch) single_entries = single_entries && r->entries->size() == 1;
  // Up to three single entries cost fewer round trips as statements of their own than as the
  // four of a transaction.
  if (single_entries && batch.size() < 4) {
    for (Request* r : batch) r->result = writeOne(*r);
    return;
  }
  absl::Status status = writeGroup(batch);
  if (!status.ok() && batch.size() > 1) {
    // One request's failure (a duplicate entry, say) must not fail the others: each alone.
    for (Request* r : batch) writeBatch({r});
  } else if (!status.ok()) {
    batch[0]->result = status;
  }
}

absl::Status JournalWriter::writeOne(const Request& request) {
  const JournalEntry& e = *request.entries->front();
  db::Params params;
  appendRow(&params, *request.invocation_id, e, unixMillis());
  params.emplace_back(*request.invocation_id);
  params.emplace_back(request.token);
  // The locking read of the invocation row is the fence check: nothing is inserted unless the
  // lease token is still current, and a takeover waits for this statement to commit.
  auto inserted = retryConflicts([&]() -> absl::StatusOr<uint64_t> {
    KRANE_ASSIGN_OR_RETURN(auto conn, pool_.acquire());
    return conn->exec(statements::kFencedJournalInsert, params);
  });
  count(1, 1);
  if (!inserted.ok()) return inserted.status();
  if (*inserted == 0) return absl::AbortedError("fenced");
  return absl::OkStatus();
}

absl::Status JournalWriter::writeGroup(const std::vector<Request*>& batch) {
  std::string in = "?";
  db::Params ids;
  for (size_t i = 0; i < batch.size(); ++i) {
    if (i > 0) in += ",?";
    ids.emplace_back(*batch[i]->invocation_id);
  }
  const std::string lock_sql =
      strCat("SELECT id, lease_token FROM workflow_invocations WHERE id IN (", in, ") FOR UPDATE");
  std::vector<bool> current(batch.size());
  size_t rows = 0;
  absl::Status status = pool_.transact("workflow journal", [&](db::Connection& conn) {
    KRANE_ASSIGN_OR_RETURN(auto tokens, conn.query(lock_sql, ids));
    rows = 0;
    db::Params params;
    const int64_t now = unixMillis();
    for (size_t i = 0; i < batch.size(); ++i) {
      current[i] = false;
      for (const db::Row& row : tokens.rows) {
        if (row.str("id") == *batch[i]->invocation_id &&
            row.i64("lease_token") == batch[i]->token) {
          current[i] = true;
        }
      }
      if (!current[i]) continue;
      for (const JournalEntry* e : *batch[i]->entries) {
        appendRow(&params, *batch[i]->invocation_id, *e, now);
        ++rows;
      }
    }
    if (rows == 0) return absl::OkStatus();
    std::string sql =
        strCat("INSERT INTO workflow_journal (", statements::kJournalColumns, ") VALUES ");
    for (size_t i = 0; i < rows; ++i) strAppend(&sql, i == 0 ? "" : ",", "(?,?,?,?,?,?,?,?,?,?)");
    return conn.exec(sql, params).status();
  });
  count(1, rows);
  if (!status.ok()) return status;
  for (size_t i = 0; i < batch.size(); ++i) {
    batch[i]->result = current[i] ? absl::OkStatus() : absl::AbortedError("fenced");
  }
  return absl::OkStatus();
}

void JournalWriter::count(uint64_t statements, uint64_t entries) {
  std::lock_guard lock(mutex_);
  statements_ += statements;
  entries_ += entries;
}

uint64_t JournalWriter::statements() const {
  std::lock_guard lock(mutex_);
  return statements_;
}

uint64_t JournalWriter::entries() const {
  std::lock_guard lock(mutex_);
  return entries_;
}

}  // namespace krane::workflow
