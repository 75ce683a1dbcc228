// Where a policy object goes on each runtime. The plugin (plugin.cc) validates, reports and
// garbage-collects; a PolicyStore only holds objects.
//
// Thread-safety: apply, list and erase may be called concurrently for different policy ids.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace krane::cilium {

// One object the runtime holds for a policy.
struct HeldPolicy {
  std::string id;  // the resource id (annotation krane.dev/policy.id); empty when unknown
  std::string ns;
  std::string name;
  // Label krane.dev/region of the object; empty when it has none (objects applied before the
  // label existed, the process runtime's records).
  std::string region;
};

class PolicyStore {
 public:
  virtual ~PolicyStore() = default;

  // Makes the runtime hold `object` (from policyObject) for policy `id`, replacing what it held
  // for the id before (under another name too). Returns the message of the READY report.
  // INVALID_ARGUMENT when the runtime refuses the object itself; other codes say to retry.
  virtual absl::StatusOr<std::string> apply(const std::string& id, const nlohmann::json& object,
                                            uint64_t version) = 0;
  // What the runtime holds for policy `id`, or for every policy when `id` is empty.
  virtual absl::StatusOr<std::vector<HeldPolicy>> list(const std::string& id) = 0;
  // Removes one held object; OK when it is already gone.
  virtual absl::Status erase(const HeldPolicy& held) = 0;
};

// Records policies as files under `state_dir` (one JSON file per policy); nothing enforces them.
absl::StatusOr<std::unique_ptr<PolicyStore>> makeProcessStore(const std::string& state_dir);

}  // namespace krane::cilium
