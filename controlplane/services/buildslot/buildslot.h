// BuildSlotService: caps how many deployments of a workspace build at once, with production
// deployments served before preview ones. A virtual object keyed by workspace id, so Acquire and
// Release never race. State: `active_slots` (deployment ids holding a slot), `prod_wait_list` and
// `preview_wait_list` (FIFO of {deployment_id, awakeable_id}).
//
// A deploy workflow creates an awakeable, calls AcquireOrWait with it and waits on it; the
// awakeable is resolved when the deployment holds a slot (at once, or when a Release promotes
// it). It calls Release on success, and from its compensation stack on failure or cancellation.
// Both handlers are idempotent. The cap is quotas.max_concurrent_builds (1 without a row).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "controlplane/db/pool.h"
#include "controlplane/workflow/service.h"

namespace krane::services::buildslot {

inline constexpr char kServiceName[] = "BuildSlotService";
inline constexpr int kDefaultMaxConcurrentBuilds = 1;

// Inputs and outputs of the handlers (JSON on the wire).
struct AcquireRequest {
  std::string deployment_id;
  std::string awakeable_id;
  bool is_production = false;
};
struct Waiter {
  std::string deployment_id;
  std::string awakeable_id;
};
struct Slots {
  std::vector<std::string> active;
  std::vector<Waiter> production;
  std::vector<Waiter> preview;
};

std::string encodeAcquire(const AcquireRequest& request);
// INVALID_ARGUMENT (terminal) naming the missing or malformed field.
absl::StatusOr<AcquireRequest> decodeAcquire(const std::string& input);
std::string encodeRelease(const std::string& deployment_id);
absl::StatusOr<Slots> decodeSlots(const std::string& json);

// Handlers:
//   AcquireOrWait(AcquireRequest) -> {"acquired": bool}   exclusive
//   Release({"deployment_id"})    -> {"released": bool, "promoted": id|null, "removed_waiter":
//   bool}
//                                                          exclusive
//   Slots({})                     -> Slots as JSON        shared (reads state)
workflow::ServiceDefinition buildSlotService(const std::shared_ptr<db::Pool>& pool);

}  // namespace krane::services::buildslot
