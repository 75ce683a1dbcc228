// A deployment topology as a workload of the process runtime.
//
// Every field of DeploymentTopology reaches the workload or is named in kNotOnProcessRuntime
// with the reason it cannot (tests/plugins/deployment_fields_test.cc fails for a field that is
// neither). On this runtime each instance listens on its own port, given as PORT: the topology's
// `port` is what the app listens on in a cluster, and is passed as KRANE_APP_PORT for reference.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "krane/cluster/v1/state.pb.h"
#include "plugins/runtime/process/process_runtime.h"

namespace krane::deployment {

// The runtime's workload id of a deployment.
std::string workloadId(const std::string& deployment_id);

// INVALID_ARGUMENT naming the field for a value that cannot work (an unknown shutdown signal).
absl::StatusOr<runtime::WorkloadSpec> toWorkload(const cluster::v1::DeploymentTopology& topology,
                                                 const std::string& deployment_id);

// "SIGTERM", "TERM" or "" (SIGTERM) -> the signal number.
absl::StatusOr<int> signalNumber(const std::string& name);

// Fields the process runtime has no use for, with the reason (field name -> reason).
extern const std::vector<std::pair<std::string, std::string>> kNotOnProcessRuntime;

}  // namespace krane::deployment
