// The SQL of the workflow tables, shared by the engine, the handler context and the operations.
// Every function runs inside a transaction the caller owns (a Connection between START
// TRANSACTION and COMMIT) and takes the rows it changes with locking reads.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "controlplane/db/connection.h"

namespace krane::workflow::store {

inline constexpr std::string_view kFinalStatuses = "'succeeded','failed','cancelled','killed'";
// Whether an invocation in `status` ended (one of kFinalStatuses).
inline bool isFinalStatus(std::string_view status) {
  return status == "succeeded" || status == "failed" || status == "cancelled" || status == "killed";
}

struct NewInvocation {
  std::string id;
  std::string service;
  std::string handler;
  std::string key;
  bool exclusive = false;
  std::string input;
  std::optional<std::string> idempotency_key;
  std::optional<std::string> idempotency_hash;
  std::optional<std::string> parent_id;
  std::optional<std::string> completion_promise;
  int64_t delay_ms = 0;
  // Created already cancelled: called by an invocation whose cancel came after its call tree
  // was walked (ContextImpl::call).
  bool cancel_requested = false;
};

// Inserts an invocation and admits it: ready at once, queued behind its key's holder, or
// scheduled when delayed. ALREADY_EXISTS when its idempotency hash is taken.
absl::Status insertInvocation(db::Connection& conn, const NewInvocation& inv, int64_t now);

// Whether inserting `inv` takes its key's row: an exclusive handler's invocation that is due at
// once. Such an insert needs a transaction.
inline bool needsKey(const NewInvocation& inv) { return inv.exclusive && inv.delay_ms <= 0; }

// Inserts invocations that do not need their key (needsKey), all in one statement: ready, or
// scheduled when delayed. On an error (one of them has an idempotency hash that is taken, say)
// none is inserted.
absl::Status insertInvocations(db::Connection& conn, const std::vector<const NewInvocation*>& invs,
                               int64_t now);

// Admission of an exclusive invocation to its key. Returns true when it now holds the key (and is
// ready), false when it was queued.
absl::StatusOr<bool> admitToKey(db::Connection& conn, std::string_view id, std::string_view service,
                                std::string_view key, int64_t now);

// Gives up the key `id` holds (if it holds it) to the next queued invocation of that key.
// Returns the invocation that got it, if any.
absl::StatusOr<std::optional<std::string>> releaseKey(db::Connection& conn,
                                                      std::string_view service,
                                                      std::string_view key, std::string_view id,
                                                      int64_t now);

// Settles a pending promise (first settle wins) and wakes its owner, unless the owner is
// suspended in awaitAll() with other promises still pending (then it counts down waiting_for).
// NOT_FOUND for an unknown id. Returns false when it was already settled.
absl::StatusOr<bool> settlePromise(db::Connection& conn, std::string_view promise_id,
                                   const absl::StatusOr<std::string>& outcome, int64_t now);

// Tells an invocation something it waits on may have happened: a suspended one becomes ready,
// and a running one will not suspend on what it read before.
absl::Status wake(db::Connection& conn, std::string_view invocation_id, int64_t now);

// Moves a (non-final) invocation to a final status: records the result, settles the promise of
// its caller, gives up its key. `final_status` is succeeded, failed, cancelled or killed.
absl::Status finish(db::Connection& conn, std::string_view invocation_id,
                    std::string_view final_status, const absl::StatusOr<std::string>& outcome,
                    int64_t now);

// Error code and message columns of a status (NULLs for OK).
db::Value errorCode(const absl::Status& status);
db::Value errorMessage(const absl::Status& status);
// Rebuilds a status from those columns; the terminal mark is restored for non-OK codes.
absl::Status statusFrom(const db::Row& row, std::string_view code_col, std::string_view msg_col);

std::string sha256Hex(std::string_view data);

}  // namespace krane::workflow::store
