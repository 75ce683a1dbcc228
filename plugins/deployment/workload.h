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
#include "krane/cluster/v1/cluster.pb.h"
#include "krane/cluster/v1/state.pb.h"
#include "plugins/deployment/signals.h"
#include "plugins/runtime/process/process_runtime.h"

namespace krane::deployment {

// The runtime's workload id of a deployment.
std::string workloadId(const std::string& deployment_id);

// INVALID_ARGUMENT naming the field for a value that cannot work (an unknown shutdown signal).
absl::StatusOr<runtime::WorkloadSpec> toWorkload(const cluster::v1::DeploymentTopology& topology,
                                                 const std::string& deployment_id);

// The report of a deployment's instances, from either runtime (the Kubernetes runtime maps pods
// to the same InstanceStatus): terminating instances are left out; failed ones carry the
// reason and the last line of their output. With `applied_revision`, each instance says whether
// it runs that revision (`current`): the revision the plugin applied, not the status' own, so a
// status read just before a new spec was applied never counts old instances as current.
cluster::v1::ReportDeploymentStatusRequest deploymentReport(
    const runtime::WorkloadStatus& status, const std::string& deployment_id,
    const std::string& region, uint64_t applied_version, const std::string& applied_revision = "");

// Fields the process runtime has no use for, with the reason (field name -> reason).
extern const std::vector<std::pair<std::string, std::string>> kNotOnProcessRuntime;

}  // namespace krane::deployment
