#include "controlplane/workflow/store.h"

#include <random>

#include <openssl/sha.h>

#include "common/status.h"
#include "common/strings.h"
#include "controlplane/workflow/service.h"

namespace krane::workflow::store {

namespace {

struct KeyLock {
  std::optional<std::string> holder;
  int64_t seq = 0;  // this arrival's place in the key's queue
};

// Bumps the key's arrival counter and returns the holder. The upsert takes the row's exclusive
// lock at once (no shared-to-exclusive upgrade), so concurrent arrivals queue on it.
absl::StatusOr<KeyLock> lockKey(db::Connection& conn, std::string_view service,
                                std::string_view key) {
  KRANE_RETURN_IF_ERROR(conn.exec("INSERT INTO workflow_keys (service, object_key, next_seq)"
                                  " VALUES (?, ?, 1) ON DUPLICATE KEY UPDATE"
                                  " next_seq = next_seq + 1",
                                  {service, key})
                            .status());
  KRANE_ASSIGN_OR_RETURN(auto rows, conn.query("SELECT holder, next_seq FROM workflow_keys"
                                               " WHERE service = ? AND object_key = ?",
                                               {service, key}));
  const db::Row& row = rows.rows.at(0);
  return KeyLock{row.optStr("holder"), row.i64("next_seq")};
}

absl::Status takeKey(db::Connection& conn, std::string_view service, std::string_view key,
                     std::string_view id, int64_t now) {
  return conn
      .exec(
          "UPDATE workflow_keys SET holder = ?, held_since = ? WHERE service = ? AND"
          " object_key = ?",
          {id, now, service, key})
      .status();
}

}  // namespace

namespace {

constexpr std::string_view kInsertInvocations =
    "INSERT INTO workflow_invocations (id, service, handler, object_key, exclusive, status, input,"
    " idempotency_hash, idempotency_key, parent_id, completion_promise, key_seq, due_at,"
    " cancel_requested, created_at, updated_at) VALUES ";
constexpr std::string_view kInvocationRow = "(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)";

void appendInvocationRow(db::Params* params, const NewInvocation& inv, std::string status,
                         db::Value key_seq, db::Value due_at, int64_t now) {
  params->insert(params->end(),
                 {inv.id, inv.service, inv.handler, inv.key, inv.exclusive, std::move(status),
                  db::Blob{inv.input}, inv.idempotency_hash, inv.idempotency_key, inv.parent_id,
                  inv.completion_promise, std::move(key_seq), std::move(due_at),
                  inv.cancel_requested, now, now});
}

}  // namespace

absl::Status insertInvocation(db::Connection& conn, const NewInvocation& inv, int64_t now) {
  if (!needsKey(inv)) return insertInvocations(conn, {&inv}, now);
  // The key row first, like every other transaction that touches both.
  KRANE_ASSIGN_OR_RETURN(KeyLock lock, lockKey(conn, inv.service, inv.key));
  std::string status = "ready";
  db::Value due_at = now;
  if (!lock.holder) {
    KRANE_RETURN_IF_ERROR(takeKey(conn, inv.service, inv.key, inv.id, now));
  } else {
    status = "queued";
    due_at = db::Value();
  }
  db::Params params;
  appendInvocationRow(&params, inv, std::move(status), lock.seq, std::move(due_at), now);
  return conn.exec(strCat(kInsertInvocations, kInvocationRow), params).status();
}

absl::Status insertInvocations(db::Connection& conn, const std::vector<const NewInvocation*>& invs,
                               int64_t now) {
  std::string sql(kInsertInvocations);
  db::Params params;
  for (const NewInvocation* inv : invs) {
    if (needsKey(*inv)) {
      return absl::InternalError(strCat("invocation ", inv->id, " needs its key: insert it alone"));
    }
    strAppend(&sql, params.empty() ? "" : ",", kInvocationRow);
    if (inv->delay_ms > 0) {
      appendInvocationRow(&params, *inv, "scheduled", db::Value(), now + inv->delay_ms, now);
    } else {
      appendInvocationRow(&params, *inv, "ready", db::Value(), now, now);
    }
  }
  if (invs.empty()) return absl::OkStatus();
  return conn.exec(sql, params).status();
}

absl::StatusOr<bool> admitToKey(db::Connection& conn, std::string_view id, std::string_view service,
                                std::string_view key, int64_t now) {
  KRANE_ASSIGN_OR_RETURN(KeyLock lock, lockKey(conn, service, key));
  if (lock.holder && *lock.holder == id) return true;
  if (!lock.holder) {
    KRANE_RETURN_IF_ERROR(takeKey(conn, service, key, id, now));
    KRANE_RETURN_IF_ERROR(conn.exec("UPDATE workflow_invocations SET status = 'ready', key_seq = ?,"
                                    " due_at = ?, updated_at = ? WHERE id = ?",
                                    {lock.seq, now, now, id})
                              .status());
    return true;
  }
  KRANE_RETURN_IF_ERROR(conn.exec("UPDATE workflow_invocations SET status = 'queued', key_seq = ?,"
                                  " due_at = NULL, updated_at = ? WHERE id = ?",
                                  {lock.seq, now, id})
                            .status());
  return false;
}

absl::StatusOr<std::optional<std::string>> releaseKey(db::Connection& conn,
                                                      std::string_view service,
                                                      std::string_view key, std::string_view id,
                                                      int64_t now) {
  KRANE_ASSIGN_OR_RETURN(auto rows, conn.query("SELECT holder FROM workflow_keys"
                                               " WHERE service = ? AND object_key = ? FOR UPDATE",
                                               {service, key}));
  if (rows.empty() || rows.rows[0].isNull("holder") || rows.rows[0].str("holder") != id) {
    return std::optional<std::string>();
  }
  KRANE_ASSIGN_OR_RETURN(auto next,
                         conn.query("SELECT id FROM workflow_invocations WHERE service = ? AND"
                                    " object_key = ? AND status = 'queued' ORDER BY key_seq LIMIT 1"
                                    " FOR UPDATE",
                                    {service, key}));
  if (next.empty()) {
    KRANE_RETURN_IF_ERROR(conn.exec("UPDATE workflow_keys SET holder = NULL, held_since = NULL"
                                    " WHERE service = ? AND object_key = ?",
                                    {service, key})
                              .status());
    return std::optional<std::string>();
  }
  std::string next_id = next.rows[0].str("id");
  KRANE_RETURN_IF_ERROR(conn.exec("UPDATE workflow_keys SET holder = ?, held_since = ?"
                                  " WHERE service = ? AND object_key = ?",
                                  {next_id, now, service, key})
                            .status());
  KRANE_RETURN_IF_ERROR(conn.exec("UPDATE workflow_invocations SET status = 'ready', due_at = ?,"
                                  " updated_at = ? WHERE id = ?",
                                  {now, now, next_id})
                            .status());
  return std::optional<std::string>(std::move(next_id));
}

absl::StatusOr<bool> settlePromise(db::Connection& conn, std::string_view promise_id,
                                   const absl::StatusOr<std::string>& outcome, int64_t now) {
  db::Value payload;
  if (outcome.ok()) payload = db::Blob{*outcome};
  // The promise and its owner in one statement, so that it is atomic without a transaction.
  // The owner: one suspended in awaitAll() on more than this one pending promise only counts
  // down; otherwise it is woken as wake() does. MySQL leaves the order of a multi-table
  // UPDATE's assignments unspecified; MariaDB either applies them left to right (the row updated
  // on the fly) or evaluates them all from the old row (through a temporary table). The
  // assignments below give the same row either way: each condition reads only columns assigned
  // after it, except waiting_for's, which reads status, and a status that changed makes it NULL,
  // as the old status would.
  KRANE_ASSIGN_OR_RETURN(
      uint64_t changed,
      conn.exec("UPDATE workflow_promises p JOIN workflow_invocations i ON i.id = p.invocation_id"
                " SET p.state = ?, p.payload = ?, p.error_code = ?, p.error_message = ?,"
                " p.settled_at = ?,"
                " i.wake_seq = IF(i.status = 'suspended' AND i.waiting_for > 1, i.wake_seq,"
                " i.wake_seq + 1),"
                " i.due_at = IF(i.status = 'suspended' AND COALESCE(i.waiting_for, 0) <= 1, ?,"
                " i.due_at),"
                " i.status = IF(i.status = 'suspended' AND COALESCE(i.waiting_for, 0) <= 1,"
                " 'ready', i.status),"
                " i.waiting_for = IF(i.status = 'suspended' AND i.waiting_for > 1,"
                " i.waiting_for - 1, NULL),"
                " i.updated_at = ? WHERE p.id = ? AND p.state = 'pending'",
                {outcome.ok() ? "resolved" : "rejected", payload, errorCode(outcome.status()),
                 errorMessage(outcome.status()), now, now, now, promise_id}));
  if (changed > 0) return true;
  KRANE_ASSIGN_OR_RETURN(auto rows, conn.query("SELECT invocation_id FROM workflow_promises"
                                               " WHERE id = ?",
                                               {promise_id}));
  if (rows.empty()) {
    return absl::NotFoundError(strCat("no awakeable or promise with id '", promise_id, "'"));
  }
  return false;
}

absl::Status wake(db::Connection& conn, std::string_view invocation_id, int64_t now) {
  // Assignments apply left to right: due_at must read the old status.
  return conn
      .exec(
          "UPDATE workflow_invocations SET due_at = IF(status = 'suspended', ?, due_at),"
          " status = IF(status = 'suspended', 'ready', status), wake_seq = wake_seq + 1,"
          " waiting_for = NULL, updated_at = ? WHERE id = ?",
          {now, now, invocation_id})
      .status();
}

absl::Status finish(db::Connection& conn, std::string_view invocation_id,
                    std::string_view final_status, const absl::StatusOr<std::string>& outcome,
                    int64_t now) {
  KRANE_ASSIGN_OR_RETURN(
      auto rows, conn.query("SELECT service, object_key, exclusive, completion_promise, status"
                            " FROM workflow_invocations WHERE id = ? FOR UPDATE",
                            {invocation_id}));
  if (rows.empty()) return absl::NotFoundError(strCat("no invocation '", invocation_id, "'"));
  const db::Row& row = rows.rows[0];
  db::Value output;
  if (outcome.ok()) output = db::Blob{*outcome};
  KRANE_RETURN_IF_ERROR(
      conn.exec("UPDATE workflow_invocations SET status = ?, output = ?, error_code = ?,"
                " error_message = ?, due_at = NULL, lease_owner = NULL, lease_expires_at = NULL,"
                " lease_token = lease_token + 1, finished_at = ?, updated_at = ? WHERE id = ?",
                {final_status, output, errorCode(outcome.status()), errorMessage(outcome.status()),
                 now, now, invocation_id})
          .status());
  if (!row.isNull("completion_promise")) {
    // Gone when the caller finished first (a kill does not reach its children, nor a failure
    // its calls) and was cleaned up: nobody waits for the result any more.
    const auto settled = settlePromise(conn, row.str("completion_promise"), outcome, now);
    if (!settled.ok() && !absl::IsNotFound(settled.status())) return settled.status();
  }
  if (row.i64("exclusive") != 0) {
    KRANE_RETURN_IF_ERROR(
        releaseKey(conn, row.str("service"), row.str("object_key"), invocation_id, now).status());
  }
  return absl::OkStatus();
}

db::Value errorCode(const absl::Status& status) {
  if (status.ok()) return db::Value();
  return static_cast<int64_t>(status.code());
}

db::Value errorMessage(const absl::Status& status) {
  if (status.ok()) return db::Value();
  // A TEXT column of utf8mb4 in strict mode: at most 65,535 bytes, and UTF-8 only (a build's
  // output in a message may be neither); refused, the statement would fail at every attempt.
  return clampUtf8(toStd(status.message()), std::string::npos, 65535);
}

absl::Status statusFrom(const db::Row& row, std::string_view code_col, std::string_view msg_col) {
  if (row.isNull(code_col)) return absl::OkStatus();
  const auto code = static_cast<absl::StatusCode>(row.i64(code_col));
  return terminalError(code, row.isNull(msg_col) ? std::string() : row.str(msg_col));
}

std::string sha256Hex(std::string_view data) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), digest);
  std::string out;
  for (unsigned char c : digest) strAppend(&out, fmt::format("{:02x}", c));
  return out;
}

}  // namespace krane::workflow::store
