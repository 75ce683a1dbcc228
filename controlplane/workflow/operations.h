// Operator functions over the workflow tables: list, show, cancel, kill, resume, the watchdog of
// keys held too long, and retention cleanup. They need only the database (no registered
// services), so the command line can use them; engines pick the changes up on their next poll.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "controlplane/db/pool.h"
#include "controlplane/workflow/store.h"

namespace krane::workflow {

// The statuses of an invocation that ended: a SQL list for IN (...), and a test.
using store::isFinalStatus;
using store::kFinalStatuses;

struct InvocationFilter {
  std::string service;  // empty: any
  std::string key;      // empty: any (only with service)
  std::string status;   // empty: any
  size_t limit = 100;
};

struct InvocationSummary {
  std::string id;
  std::string service;
  std::string handler;
  std::string key;
  std::string status;
  int attempts = 0;
  int64_t created_at = 0;
  std::optional<int64_t> finished_at;
  std::string last_error;
};

struct JournalRecord {
  int seq = 0;
  std::string kind;
  std::string name;
  bool ok = true;
  std::optional<std::string> payload;
  std::string error;
  int64_t duration_ms = 0;
  int64_t created_at = 0;
};

struct InvocationDetail {
  InvocationSummary summary;
  std::string input;
  std::optional<std::string> output;
  std::string error;  // final error, empty when none
  std::optional<std::string> parent_id;
  std::optional<std::string> idempotency_key;
  std::optional<std::string> lease_owner;
  int claims = 0;
  bool cancel_requested = false;
  std::vector<JournalRecord> journal;
};

struct HeldKey {
  std::string service;
  std::string key;
  std::string holder;
  std::string holder_handler;
  std::string holder_status;
  int64_t held_ms = 0;
  int64_t queued = 0;  // invocations waiting for the key
};

// Newest first. INVALID_ARGUMENT for an unknown status.
absl::StatusOr<std::vector<InvocationSummary>> listInvocations(db::Pool& pool,
                                                               const InvocationFilter& filter);
// NOT_FOUND for an unknown id.
// Input, output and journal payloads come back with secrets redacted (redactSecrets).
absl::StatusOr<InvocationDetail> showInvocation(db::Pool& pool, const std::string& id);

// A JSON payload with the value of every secret field replaced by "[redacted]": keys ending in
// `webhook_url`, `password`, `token` or `secret` (a Slack webhook URL carries its credential in
// the path). Anything that is not JSON, or has no such field, comes back unchanged.
std::string redactSecrets(const std::string& payload);

// A queued or delayed invocation is cancelled at once. A started one is told: its handler sees
// CANCELLED at its next suspension point (await, select, sleep, run) and its compensations run.
// FAILED_PRECONDITION for a finished invocation. The invocations it called, and theirs, are
// cancelled with it; `cancelled`, when given, gets the ids of all of them (the first is `id`).
absl::Status cancelInvocation(db::Pool& pool, const std::string& id,
                              std::vector<std::string>* cancelled = nullptr);
// The same in the caller's transaction: a caller that decides from rows of its own whether the
// cancel may happen locks them and cancels in one transaction. Engine::notify() after the commit
// starts a cancelled queued invocation's compensations at once.
absl::Status cancelInvocationIn(db::Connection& conn, const std::string& id,
                                std::vector<std::string>* cancelled = nullptr);
// Ends an invocation at once, without compensations; its worker is fenced out.
absl::Status killInvocation(db::Pool& pool, const std::string& id);
// Restarts a paused invocation with a fresh count of attempts.
absl::Status resumeInvocation(db::Pool& pool, const std::string& id);
// Settles an awakeable (NOT_FOUND for an unknown id, OK when already settled).
absl::Status settleAwakeable(db::Pool& pool, const std::string& id,
                             const absl::StatusOr<std::string>& outcome);

// Keys held by one exclusive invocation for longer than `threshold`, longest first.
absl::StatusOr<std::vector<HeldKey>> keysHeldLongerThan(db::Pool& pool,
                                                        std::chrono::milliseconds threshold);

// A virtual object's state value as last committed (nullopt when unset), read outside any
// handler: for components that react to what a workflow waits for (the deploy readiness gate).
absl::StatusOr<std::optional<std::string>> readState(db::Pool& pool, std::string_view service,
                                                     std::string_view key, std::string_view name);
// Several of its values in one query: name -> value, for the names that are set.
absl::StatusOr<std::map<std::string, std::string>> readStates(
    db::Pool& pool, std::string_view service, std::string_view key,
    const std::vector<std::string_view>& names);

struct CleanupResult {
  uint64_t invocations = 0;
  uint64_t journal_entries = 0;
  uint64_t promises = 0;
};
// Deletes invocations finished before now - retention, with their journals and promises, in
// batches. Their idempotency keys are forgotten with them.
absl::StatusOr<CleanupResult> cleanupFinished(db::Pool& pool, std::chrono::milliseconds retention,
                                              size_t batch = 1000);

}  // namespace krane::workflow
