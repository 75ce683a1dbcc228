// Pods as instances: what the deployment plugin reports on the Kubernetes runtime. Pods become
// the process runtime's InstanceStatus, so both runtimes report through deploymentReport().
//
//   pod                                                        instance
//   Succeeded / Failed (terminal)                              left out
//   being deleted (deletionTimestamp)                          terminating (left out)
//   a container waiting in CrashLoopBackOff                    failed: "CrashLoopBackOff: exit
//                                                              code 1, 5 restarts: <message>"
//   a container waiting in ErrImagePull, ImagePullBackOff,     failed: "<reason>: <message>"
//   InvalidImageName, CreateContainerConfigError,
//   CreateContainerError, RunContainerError
//   Running with condition Ready=True                          running
//   anything else                                              pending, with the waiting reason
//                                                              or why it is not scheduled
// The address is "<podIP>:<the container's port>" (the pod IP alone without a port; empty
// before the pod has an IP).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "plugins/runtime/process/process_runtime.h"

namespace krane::deployment {

// nullopt for a terminal pod.
std::optional<runtime::InstanceStatus> podInstance(const nlohmann::json& pod);

// The instances of `pods` (of one deployment), ordered by pod name.
runtime::WorkloadStatus podsStatus(const std::string& workload_id,
                                   const std::vector<nlohmann::json>& pods);

}  // namespace krane::deployment
