// Commit deduplication of deployments (seed 001): when a deployment of an app, environment and
// branch is created, older siblings still queued are superseded; and a deploy workflow checks
// at its start whether a newer sibling has made it pointless (self-skip), in case the cancel did
// not reach it.
//
// "Queued" is pending or awaiting_approval. A deployment that holds a build slot (starting and
// later) is committed and is never superseded: the deploy workflow moves a deployment out of the
// queue only with a conditional update (`WHERE status IN ('pending', 'awaiting_approval')`), so
// it either starts or is superseded, never both. Deployments without a branch have no siblings.
//
// Older and newer are by creation time, then id. Thread-safety: free functions, any thread.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "controlplane/db/connection.h"
#include "controlplane/db/pool.h"

namespace krane::services::dedup {

// What open steps of a superseded deployment are stamped with.
inline constexpr char kSupersededMessage[] = "Superseded by newer commit";

struct Superseded {
  std::string deployment_id;
  // Its deploy workflow, if it had started one; cancelled (its compensations release what it
  // holds). Empty when there was none.
  std::string invocation_id;
  // Set when cancelling the invocation failed (it is then left to self-skip).
  std::string cancel_error;
};

// Supersedes the queued siblings older than `deployment_id`: one SELECT ... FOR UPDATE, one
// batched UPDATE stamping their open steps (first write wins: only steps with ended_at NULL),
// one batched UPDATE of their status, in one transaction; then one cancel per sibling with an
// invocation. NOT_FOUND for an unknown deployment.
absl::StatusOr<std::vector<Superseded>> cancelOlderSiblings(db::Pool& pool,
                                                            const std::string& deployment_id);

// Whether a newer sibling is pending, awaiting approval, active or ready: then this deployment
// should skip itself. NOT_FOUND for an unknown deployment.
absl::StatusOr<bool> hasNewerActiveDeployment(db::Connection& conn,
                                              const std::string& deployment_id);

}  // namespace krane::services::dedup
