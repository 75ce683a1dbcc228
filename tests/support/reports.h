// What an agent reports, for tests and benchmarks that stand in for agents.
#pragma once

#include <string>

#include "krane/cluster/v1/cluster.pb.h"

namespace krane::testing {

// `running` instances of the deployment up in the region (ids "<deployment>-<region>-<i>"),
// or, with a failure reason, one failed instance.
inline cluster::v1::ReportDeploymentStatusRequest instancesReport(
    const std::string& deployment, const std::string& region, int running = 1,
    const std::string& failure_reason = "") {
  cluster::v1::ReportDeploymentStatusRequest r;
  r.set_deployment_id(deployment);
  r.set_region(region);
  auto* set = r.mutable_instances();
  for (int i = 0; i < (failure_reason.empty() ? running : 1); ++i) {
    auto* inst = set->add_instances();
    inst->set_id(deployment + "-" + region + "-" + std::to_string(i));
    inst->set_address("127.0.0.1:" + std::to_string(9000 + i));
    if (failure_reason.empty()) {
      inst->set_status(cluster::v1::INSTANCE_STATUS_RUNNING);
    } else {
      inst->set_status(cluster::v1::INSTANCE_STATUS_FAILED);
      inst->set_failure_reason(failure_reason);
    }
  }
  return r;
}

}  // namespace krane::testing
