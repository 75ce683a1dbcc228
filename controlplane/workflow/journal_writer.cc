#include "controlplane/workflow/journal_writer.h"

#include <algorithm>
#include <set>
#include <string_view>

#include "common/clock.h"
#include "common/status.h"
#include "common/strings.h"
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

}  // namespace

JournalWriter::JournalWriter(db::Pool& pool)
    : pool_(pool),
      group_(kWriters, kMaxBatchBytes, &JournalWriter::weight,
             [this](const std::vector<Request*>& batch) { writeBatch(batch); }) {}

size_t JournalWriter::weight(const Request& request) {
  size_t total = 0;
  for (const JournalEntry* e : *request.entries) {
    const size_t bytes =
        e->name.size() + (e->payload ? e->payload->size() : 0) + e->error.message().size() + 64;
    total += std::max(bytes, kMaxBatchBytes / kMaxEntries);
  }
  return total;
}

absl::Status JournalWriter::write(const std::string& invocation_id, int64_t token,
                                  const std::vector<const JournalEntry*>& entries) {
  if (entries.empty()) return absl::OkStatus();
  Request request{&invocation_id, token, &entries};
  group_.submit(request);
  return request.result;
}

void JournalWriter::writeBatch(const std::vector<Request*>& batch) {
  // Requests of one entry each, of different invocations, share one statement; the others (a
  // request of several entries) share a transaction.
  std::vector<Request*> singles;
  std::vector<Request*> others;
  std::set<std::string_view> ids;
  for (Request* r : batch) {
    if (r->entries->size() == 1 && ids.insert(*r->invocation_id).second) {
      singles.push_back(r);
    } else {
      others.push_back(r);
    }
  }
  if (singles.size() == 1) singles[0]->result = writeOne(*singles[0]);
  if (singles.size() > 1 && !writeSingles(singles).ok()) {
    // One request's failure (a duplicate entry, say) must not fail the others: each alone.
    for (Request* r : singles) r->result = writeOne(*r);
  }
  if (others.size() == 1 && others[0]->entries->size() == 1) {
    others[0]->result = writeOne(*others[0]);
  } else if (!others.empty()) {
    absl::Status status = writeGroup(others);
    if (!status.ok() && others.size() > 1) {
      for (Request* r : others) writeBatch({r});
    } else if (!status.ok()) {
      others[0]->result = status;
    }
  }
}

absl::Status JournalWriter::writeSingles(const std::vector<Request*>& batch) {
  db::Params params;
  const int64_t now = unixMillis();
  std::vector<db::Params> rows;
  rows.reserve(batch.size());
  for (const Request* r : batch) {
    db::Params row;
    appendRow(&row, *r->invocation_id, *r->entries->front(), now);
    rows.push_back(std::move(row));
  }
  // The statement for a power of two of rows: a few statement texts, each prepared once per
  // connection, rather than one per group size. The padding's values match no id; its fence
  // pairs repeat the first entry's, which reads nothing more (a locking read of an id that does
  // not exist would lock the gap where it would be, and hold up the inserts of new invocations
  // there until the commit).
  const size_t n = db::paddedListSize(batch.size(), 2);
  // appendRow's order: id, seq, kind, name, ok, payload, error_code, error_message,
  // duration_ms, created_at. Columns 1 to 8 are chosen by id.
  for (size_t column = 1; column <= 8; ++column) {
    for (size_t i = 0; i < n; ++i) {
      if (i < batch.size()) {
        params.emplace_back(*batch[i]->invocation_id);
        params.push_back(std::move(rows[i][column]));
      } else {
        params.emplace_back("");
        params.emplace_back();
      }
    }
  }
  params.emplace_back(now);
  for (size_t i = 0; i < n; ++i) {
    const Request& fenced = *batch[i < batch.size() ? i : 0];
    params.emplace_back(*fenced.invocation_id);
    params.emplace_back(fenced.token);
  }
  // Built once per padded size (7 KiB at 64 rows).
  std::string built;
  const std::string& sql =
      statements::groupText<statements::fencedJournalInsertGroup, kMaxEntries>(n, &built);
  auto inserted = pool_.execAlone(sql, params);
  counts_.add(1, inserted.ok() ? *inserted : 0);
  if (!inserted.ok()) return inserted.status();
  for (Request* r : batch) r->result = absl::OkStatus();
  if (*inserted == batch.size()) return absl::OkStatus();
  // Some were fenced. A token only grows, so one that is still the request's was current when
  // the statement read it, and its entry is in; the others were left out.
  db::Params batch_ids;
  for (const Request* r : batch) batch_ids.emplace_back(*r->invocation_id);
  db::Params id_params;
  const std::string in = db::appendInList(id_params, batch_ids);
  absl::StatusOr<db::ResultSet> tokens = [&]() -> absl::StatusOr<db::ResultSet> {
    KRANE_ASSIGN_OR_RETURN(auto conn, pool_.acquire());
    return conn->query(
        strCat("SELECT id, lease_token FROM workflow_invocations WHERE id IN (", in, ")"),
        id_params);
  }();
  if (!tokens.ok()) {
    // Which ones are in is unknown: the executions read their journals again (as after a lost
    // commit answer) rather than stop as fenced and leave their invocations until their leases
    // expire.
    for (Request* r : batch) {
      r->result = absl::UnavailableError(
          strCat("journal entries may or may not have been written: ", tokens.status().message()));
    }
    return absl::OkStatus();
  }
  for (Request* r : batch) {
    bool current = false;
    for (const db::Row& row : tokens->rows) {
      current =
          current || (row.str("id") == *r->invocation_id && row.i64("lease_token") == r->token);
    }
    if (!current) r->result = absl::AbortedError("fenced");
  }
  return absl::OkStatus();
}

absl::Status JournalWriter::writeOne(const Request& request) {
  const JournalEntry& e = *request.entries->front();
  db::Params params;
  appendRow(&params, *request.invocation_id, e, unixMillis());
  params.emplace_back(*request.invocation_id);
  params.emplace_back(request.token);
  // The locking read of the invocation row is the fence check: nothing is inserted unless the
  // lease token is still current, and a takeover waits for this statement to commit.
  auto inserted = pool_.execAlone(statements::kFencedJournalInsert, params);
  counts_.add(1, 1);
  if (!inserted.ok()) return inserted.status();
  if (*inserted == 0) return absl::AbortedError("fenced");
  return absl::OkStatus();
}

absl::Status JournalWriter::writeGroup(const std::vector<Request*>& batch) {
  db::Params batch_ids;
  for (const Request* r : batch) batch_ids.emplace_back(*r->invocation_id);
  db::Params ids;
  const std::string in = db::appendInList(ids, batch_ids);
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
  counts_.add(1, rows);
  if (!status.ok()) return status;
  for (size_t i = 0; i < batch.size(); ++i) {
    batch[i]->result = current[i] ? absl::OkStatus() : absl::AbortedError("fenced");
  }
  return absl::OkStatus();
}

}  // namespace krane::workflow
