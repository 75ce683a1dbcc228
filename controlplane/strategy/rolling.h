// The rolling-update evaluator (seed 002): one cycle of moving a region's replicas from the live
// revision (old) to the deploying one (new) within `max_surge` and `max_unavailable`. A pure
// function: it reads the instances it is given and says what to do; the coordinator (the deploy
// workflow) applies that through the change feed and calls it again when instances change.
//
//   instances ──classify──▶ old_active, new_provisioning, new_healthy, new_unhealthy, new_failed
//   any new provisioning                          → kProvisioning (wait, no change)
//   no old active and new healthy ≥ desired        → kCompleted (swap the revisions)
//   otherwise, with max_total = desired + surge and min_available = desired − unavailable:
//     to_create = min(max(0, max_total − total_active), max(0, desired − new_healthy))
//     drain     = min(max(0, new_healthy + old_active − min_available), old_active) old ones,
//                 never the last old one before a new one is healthy (when unavailable < desired)
//   something to create or drain                  → kProgressing, else kProvisioning
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "krane/cluster/v1/state.pb.h"

namespace krane::strategy {

enum class InstanceState {
  kProvisioning,  // starting, not ready yet
  kHealthy,       // ready (for at least min_ready_seconds)
  kUnhealthy,     // running but not ready, or degraded
  kFailed,        // exited, crash loop, image cannot be fetched
  kTerminating,   // being drained
};

struct Instance {
  std::string id;
  bool is_new = false;  // of the deploying revision
  InstanceState state = InstanceState::kProvisioning;
};

// An integer or a percentage of the desired replicas, as Kubernetes' IntOrString.
struct IntOrPercent {
  uint32_t value = 0;
  bool percent = false;
};

struct RollingSpec {
  IntOrPercent max_surge{1, false};
  IntOrPercent max_unavailable{0, false};
};

// The spec in replicas for `desired`: a surge percentage rounds up, an unavailable one down
// (as Kubernetes does); if both come to 0, unavailable becomes 1 so the rollout can move.
struct ResolvedSpec {
  uint32_t max_surge = 1;
  uint32_t max_unavailable = 0;
};

// INVALID_ARGUMENT naming the field ("max_surge: at most 100%"): a percentage over 100, or both
// zero (the seed's deadlock guard). `prefix` is prepended to the field names.
absl::Status checkSpec(const RollingSpec& spec, std::string_view prefix = "");
ResolvedSpec resolve(const RollingSpec& spec, uint32_t desired);

// The spec a deployment resource carries (krane.cluster.v1.RollingUpdate); unset fields mean
// surge 1, unavailable 0.
RollingSpec specOf(const cluster::v1::RollingUpdate& update);
// checkSpec, and min_ready_seconds at most 3600, progress_deadline_seconds (when set) at most
// 86400 and above min_ready_seconds; fields named under `prefix`
// ("deployment_topology.rolling_update.").
absl::Status checkRollingUpdate(const cluster::v1::RollingUpdate& update, std::string_view prefix);

struct Counts {
  uint32_t old_active = 0;
  uint32_t new_provisioning = 0;
  uint32_t new_healthy = 0;
  uint32_t new_unhealthy = 0;
  uint32_t new_failed = 0;
  uint32_t total_active() const {
    return old_active + new_provisioning + new_healthy + new_unhealthy;
  }
};
Counts classify(const std::vector<Instance>& instances);

enum class Result {
  kProvisioning,  // wait: new instances are starting, or nothing may change now
  kProgressing,   // create and/or drain, then evaluate again
  kCompleted,     // no old instance left and enough new ones healthy
};
std::string_view resultName(Result result);

struct Evaluation {
  Result result = Result::kProvisioning;
  uint32_t to_create = 0;
  std::vector<std::string> drain_ids;  // old instances to drain, least useful first
  Counts counts;
  uint32_t max_total = 0;
  uint32_t min_available = 0;
};

Evaluation evaluate(const std::vector<Instance>& instances, uint32_t desired,
                    const ResolvedSpec& spec);

}  // namespace krane::strategy
