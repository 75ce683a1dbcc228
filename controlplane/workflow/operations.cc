#include "controlplane/workflow/operations.h"

#include "common/clock.h"
#include "common/status.h"
#include "common/strings.h"
#include "controlplane/db/errors.h"
#include "controlplane/workflow/service.h"
#include "controlplane/workflow/store.h"
#include "nlohmann/json.hpp"

namespace krane::workflow {
namespace {

constexpr std::string_view kStatuses[] = {"scheduled", "queued", "ready",     "running",
                                          "suspended", "paused", "succeeded", "failed",
                                          "cancelled", "killed"};

bool knownStatus(std::string_view status) {
  for (std::string_view s : kStatuses) {
    if (s == status) return true;
  }
  return false;
}

InvocationSummary summaryOf(const db::Row& r) {
  InvocationSummary s;
  s.id = r.str("id");
  s.service = r.str("service");
  s.handler = r.str("handler");
  s.key = r.str("object_key");
  s.status = r.str("status");
  s.attempts = static_cast<int>(r.i64("attempts"));
  s.created_at = r.i64("created_at");
  s.finished_at = r.optI64("finished_at");
  s.last_error = r.optStr("last_error").value_or("");
  return s;
}

constexpr char kSummaryColumns[] =
    "id, service, handler, object_key, status, attempts, created_at, finished_at, last_error";

// Locks the invocation row and returns its status; NOT_FOUND when it does not exist.
absl::StatusOr<std::string> lockedStatus(db::Connection& conn, const std::string& id) {
  KRANE_ASSIGN_OR_RETURN(auto rows, conn.query("SELECT status FROM workflow_invocations"
                                               " WHERE id = ? FOR UPDATE",
                                               {id}));
  if (rows.empty()) return absl::NotFoundError(strCat("no invocation ", quote(id, 64, '\'')));
  return rows.rows[0].str("status");
}

}  // namespace

absl::StatusOr<std::vector<InvocationSummary>> listInvocations(db::Pool& pool,
                                                               const InvocationFilter& filter) {
  if (!filter.status.empty() && !knownStatus(filter.status)) {
    return absl::InvalidArgumentError(
        strCat("status: unknown invocation status ", quote(filter.status, 64, '\''),
               " (scheduled, queued, ready, running, suspended, paused, succeeded, failed,"
               " cancelled, killed)"));
  }
  if (!filter.key.empty() && filter.service.empty()) {
    return absl::InvalidArgumentError("key: listing by key needs the service too");
  }
  std::string sql = strCat("SELECT ", kSummaryColumns, " FROM workflow_invocations WHERE 1 = 1");
  db::Params params;
  if (!filter.service.empty()) {
    strAppend(&sql, " AND service = ?");
    params.push_back(filter.service);
  }
  if (!filter.key.empty()) {
    strAppend(&sql, " AND object_key = ?");
    params.push_back(filter.key);
  }
  if (!filter.status.empty()) {
    strAppend(&sql, " AND status = ?");
    params.push_back(filter.status);
  }
  // Newest first, along workflow_invocations_created (which holds the id too, in the same
  // direction): the server reads from the newest row on and stops at the limit.
  strAppend(&sql, " ORDER BY created_at DESC, id DESC LIMIT ?");
  params.push_back(static_cast<uint64_t>(filter.limit));
  KRANE_ASSIGN_OR_RETURN(auto conn, pool.acquire());
  KRANE_ASSIGN_OR_RETURN(auto rows, conn->query(sql, params));
  std::vector<InvocationSummary> out;
  for (const db::Row& r : rows.rows) out.push_back(summaryOf(r));
  return out;
}

namespace {

bool secretKey(std::string_view key) {
  for (std::string_view suffix : {"webhook_url", "webhookUrl", "password", "token", "secret"}) {
    if (key.size() >= suffix.size() && key.substr(key.size() - suffix.size()) == suffix) {
      return true;
    }
  }
  return false;
}

// True when something was redacted.
bool redact(nlohmann::json& j) {
  bool changed = false;
  if (j.is_object()) {
    for (auto& [key, value] : j.items()) {
      if (value.is_string() && secretKey(key) && !value.get<std::string>().empty()) {
        value = "[redacted]";
        changed = true;
      } else {
        changed |= redact(value);
      }
    }
  } else if (j.is_array()) {
    for (auto& item : j) changed |= redact(item);
  }
  return changed;
}

}  // namespace

std::string redactSecrets(const std::string& payload) {
  if (payload.find_first_of("{[") == std::string::npos) return payload;
  nlohmann::json j = nlohmann::json::parse(payload, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !redact(j)) return payload;
  return j.dump();
}

absl::StatusOr<InvocationDetail> showInvocation(db::Pool& pool, const std::string& id) {
  KRANE_ASSIGN_OR_RETURN(auto conn, pool.acquire());
  KRANE_ASSIGN_OR_RETURN(
      auto rows,
      conn->query(strCat("SELECT ", kSummaryColumns,
                         ", input, output, error_code, error_message, parent_id, idempotency_key,"
                         " lease_owner, claims, cancel_requested FROM workflow_invocations"
                         " WHERE id = ?"),
                  {id}));
  if (rows.empty()) return absl::NotFoundError(strCat("no invocation ", quote(id, 64, '\'')));
  const db::Row& r = rows.rows[0];
  InvocationDetail d;
  d.summary = summaryOf(r);
  d.input = redactSecrets(r.str("input"));
  d.output = r.optStr("output");
  if (d.output) d.output = redactSecrets(*d.output);
  if (!r.isNull("error_code")) {
    absl::Status error = store::statusFrom(r, "error_code", "error_message");
    d.error = strCat(absl::StatusCodeToString(error.code()), ": ", error.message());
  }
  d.parent_id = r.optStr("parent_id");
  d.idempotency_key = r.optStr("idempotency_key");
  d.lease_owner = r.optStr("lease_owner");
  d.claims = static_cast<int>(r.i64("claims"));
  d.cancel_requested = r.i64("cancel_requested") != 0;
  KRANE_ASSIGN_OR_RETURN(
      auto journal, conn->query("SELECT seq, kind, name, ok, payload, error_code, error_message,"
                                " duration_ms, created_at FROM workflow_journal"
                                " WHERE invocation_id = ? ORDER BY seq",
                                {id}));
  for (const db::Row& j : journal.rows) {
    JournalRecord e;
    e.seq = static_cast<int>(j.i64("seq"));
    e.kind = j.str("kind");
    e.name = j.str("name");
    e.ok = j.i64("ok") != 0;
    e.payload = j.optStr("payload");
    if (e.payload) e.payload = redactSecrets(*e.payload);
    if (!j.isNull("error_code")) {
      absl::Status error = store::statusFrom(j, "error_code", "error_message");
      e.error = strCat(absl::StatusCodeToString(error.code()), ": ", error.message());
    }
    e.duration_ms = j.i64("duration_ms");
    e.created_at = j.i64("created_at");
    d.journal.push_back(std::move(e));
  }
  return d;
}

namespace {

// Cancels one non-final invocation: one that never started finishes at once; any other is
// marked and made runnable now (one waiting to retry sees the cancel now, not at its retry time).
absl::Status requestCancel(db::Connection& conn, const std::string& id, std::string_view status,
                           int64_t now) {
  if (status == "scheduled" || status == "queued") {
    return store::finish(conn, id, "cancelled",
                         absl::CancelledError("invocation cancelled before it started"), now);
  }
  KRANE_RETURN_IF_ERROR(conn.exec("UPDATE workflow_invocations SET cancel_requested = TRUE,"
                                  " due_at = IF(status = 'ready', ?, due_at), updated_at = ?"
                                  " WHERE id = ?",
                                  {now, now, id})
                            .status());
  if (status == "paused") {
    // Give it attempts again so that its compensations can run.
    KRANE_RETURN_IF_ERROR(conn.exec("UPDATE workflow_invocations SET status = 'ready',"
                                    " due_at = ?, attempts = 0, lease_token = lease_token + 1"
                                    " WHERE id = ?",
                                    {now, id})
                              .status());
  }
  return store::wake(conn, id, now);
}

}  // namespace

absl::Status cancelInvocation(db::Pool& pool, const std::string& id,
                              std::vector<std::string>* cancelled) {
  return pool.transact("workflow cancel", [&](db::Connection& conn) {
    if (cancelled != nullptr) cancelled->clear();  // a retried transaction starts over
    return cancelInvocationIn(conn, id, cancelled);
  });
}

absl::Status cancelInvocationIn(db::Connection& conn, const std::string& id,
                                std::vector<std::string>* cancelled) {
  KRANE_ASSIGN_OR_RETURN(std::string status, lockedStatus(conn, id));
  const int64_t now = unixMillis();
  if (isFinalStatus(status)) {
    return absl::FailedPreconditionError(
        strCat("invocation ", quote(id, 64, '\''), " already finished (", status, ")"));
  }
  KRANE_RETURN_IF_ERROR(requestCancel(conn, id, status, now));
  if (cancelled != nullptr) cancelled->push_back(id);
  // The cancel goes down the call tree: every unfinished invocation this one called (not the
  // ones it sent, which live on their own), and the ones they called, level by level.
  std::vector<std::string> level{id};
  while (!level.empty()) {
    const std::string in = db::placeholders(level.size());
    KRANE_ASSIGN_OR_RETURN(
        auto children,
        conn.query(strCat("SELECT id, status FROM workflow_invocations WHERE parent_id IN (", in,
                          ") AND completion_promise IS NOT NULL AND cancel_requested = FALSE"
                          " AND status NOT IN (",
                          store::kFinalStatuses,
                          ")"
                          " FOR UPDATE"),
                   db::Params(level.begin(), level.end())));
    level.clear();
    for (const db::Row& child : children.rows) {
      KRANE_RETURN_IF_ERROR(requestCancel(conn, child.str("id"), child.str("status"), now));
      if (cancelled != nullptr) cancelled->push_back(child.str("id"));
      level.push_back(child.str("id"));
    }
  }
  return absl::OkStatus();
}

absl::Status killInvocation(db::Pool& pool, const std::string& id) {
  return pool.transact("workflow kill", [&](db::Connection& conn) -> absl::Status {
    KRANE_ASSIGN_OR_RETURN(std::string status, lockedStatus(conn, id));
    if (isFinalStatus(status)) {
      return absl::FailedPreconditionError(
          strCat("invocation ", quote(id, 64, '\''), " already finished (", status, ")"));
    }
    return store::finish(
        conn, id, "killed",
        terminalError(absl::StatusCode::kAborted, "invocation killed by an operator"),
        unixMillis());
  });
}

absl::Status resumeInvocation(db::Pool& pool, const std::string& id) {
  return pool.transact("workflow resume", [&](db::Connection& conn) -> absl::Status {
    KRANE_ASSIGN_OR_RETURN(std::string status, lockedStatus(conn, id));
    if (status != "paused") {
      return absl::FailedPreconditionError(strCat("invocation ", quote(id, 64, '\''), " is ",
                                                  status,
                                                  ", not paused: only a paused invocation"
                                                  " can be resumed"));
    }
    const int64_t now = unixMillis();
    return conn
        .exec(
            "UPDATE workflow_invocations SET status = 'ready', due_at = ?, attempts = 0,"
            " lease_token = lease_token + 1, updated_at = ? WHERE id = ?",
            {now, now, id})
        .status();
  });
}

absl::Status settleAwakeable(db::Pool& pool, const std::string& id,
                             const absl::StatusOr<std::string>& outcome) {
  // settlePromise() changes the promise and its owner in one statement, which commits by itself;
  // again after a deadlock or a lock wait timeout.
  return db::retryConflicts([&]() -> absl::Status {
    KRANE_ASSIGN_OR_RETURN(auto conn, pool.acquire());
    return store::settlePromise(*conn, id, outcome, unixMillis()).status();
  });
}

absl::StatusOr<std::vector<HeldKey>> keysHeldLongerThan(db::Pool& pool,
                                                        std::chrono::milliseconds threshold) {
  const int64_t now = unixMillis();
  KRANE_ASSIGN_OR_RETURN(auto conn, pool.acquire());
  KRANE_ASSIGN_OR_RETURN(
      auto rows,
      conn->query("SELECT k.service, k.object_key, k.holder, k.held_since, i.handler, i.status,"
                  " (SELECT COUNT(*) FROM workflow_invocations q WHERE q.service = k.service"
                  " AND q.object_key = k.object_key AND q.status = 'queued') AS queued"
                  " FROM workflow_keys k LEFT JOIN workflow_invocations i ON i.id = k.holder"
                  " WHERE k.holder IS NOT NULL AND k.held_since < ? ORDER BY k.held_since",
                  {now - threshold.count()}));
  std::vector<HeldKey> out;
  for (const db::Row& r : rows.rows) {
    HeldKey k;
    k.service = r.str("service");
    k.key = r.str("object_key");
    k.holder = r.str("holder");
    k.holder_handler = r.optStr("handler").value_or("");
    k.holder_status = r.optStr("status").value_or("");
    k.held_ms = now - r.i64("held_since");
    k.queued = r.i64("queued");
    out.push_back(std::move(k));
  }
  return out;
}

absl::StatusOr<CleanupResult> cleanupFinished(db::Pool& pool, std::chrono::milliseconds retention,
                                              size_t batch) {
  CleanupResult result;
  const int64_t cutoff = unixMillis() - retention.count();
  for (;;) {
    std::vector<std::string> ids;
    uint64_t journal_entries = 0;
    uint64_t promises = 0;
    absl::Status status = pool.transact(
        "workflow cleanup",
        [&](db::Connection& conn) -> absl::Status {
          ids.clear();
          journal_entries = 0;
          promises = 0;
          KRANE_ASSIGN_OR_RETURN(
              auto rows,
              conn.query(strCat("SELECT id FROM workflow_invocations WHERE status IN (",
                                store::kFinalStatuses,
                                ") AND finished_at < ? ORDER BY finished_at LIMIT ? FOR UPDATE"),
                         {cutoff, static_cast<uint64_t>(batch)}));
          for (const db::Row& r : rows.rows) ids.push_back(r.str("id"));
          for (const std::string& id : ids) {
            KRANE_ASSIGN_OR_RETURN(
                uint64_t j,
                conn.exec("DELETE FROM workflow_journal WHERE invocation_id = ?", {id}));
            KRANE_ASSIGN_OR_RETURN(
                uint64_t p,
                conn.exec("DELETE FROM workflow_promises WHERE invocation_id = ?", {id}));
            KRANE_RETURN_IF_ERROR(
                conn.exec("DELETE FROM workflow_invocations WHERE id = ?", {id}).status());
            journal_entries += j;
            promises += p;
          }
          return absl::OkStatus();
        },
        db::TxOptions{db::Isolation::kReadCommitted});
    KRANE_RETURN_IF_ERROR(status);
    result.invocations += ids.size();
    result.journal_entries += journal_entries;
    result.promises += promises;
    if (ids.size() < batch) return result;
  }
}

absl::StatusOr<std::optional<std::string>> readState(db::Pool& pool, std::string_view service,
                                                     std::string_view key, std::string_view name) {
  KRANE_ASSIGN_OR_RETURN(auto values, readStates(pool, service, key, {name}));
  if (values.empty()) return std::optional<std::string>();
  return std::optional<std::string>(std::move(values.begin()->second));
}

absl::StatusOr<std::map<std::string, std::string>> readStates(
    db::Pool& pool, std::string_view service, std::string_view key,
    const std::vector<std::string_view>& names) {
  std::map<std::string, std::string> out;
  if (names.empty()) return out;
  const std::string in = db::placeholders(names.size());
  db::Params params = {service, key};
  for (std::string_view name : names) params.emplace_back(name);
  KRANE_ASSIGN_OR_RETURN(auto conn, pool.acquire());
  KRANE_ASSIGN_OR_RETURN(auto rows,
                         conn->query(strCat("SELECT name, value FROM workflow_state WHERE"
                                            " service = ? AND object_key = ? AND name IN (",
                                            in, ")"),
                                     params));
  for (const db::Row& r : rows.rows) out[r.str("name")] = r.str("value");
  return out;
}

}  // namespace krane::workflow
