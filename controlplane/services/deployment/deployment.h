// DeploymentService: delayed desired-state transitions of one deployment (seed 001), for example
// "stop the previous live deployment 30 minutes after the swap". A virtual object keyed by
// deployment id, so the transitions of one deployment serialize; its state holds the nonce of
// the latest Schedule, and a delayed Apply whose nonce is no longer the latest does nothing.
//
// Handlers (typed, messages of proto/krane/services/v1/deployment.proto):
//   Schedule(ScheduleDesiredStateRequest) -> ScheduleDesiredStateResponse   exclusive
//   Apply(ApplyDesiredStateRequest)       -> ApplyDesiredStateResponse      exclusive
//
// Apply writes the desired status of every live deployment_topology row of the deployment
// through the feed writer, on its step's journal transaction: state rows, change records and the
// step's result commit together, exactly once. A region that has it already gets no change.
#pragma once

#include <memory>

#include "controlplane/feed/writer.h"
#include "controlplane/workflow/service.h"
#include "krane/services/v1/deployment.pb.h"

namespace krane::services::deployment {

inline constexpr char kServiceName[] = "DeploymentService";

using ScheduleDesiredStateRequest = services::v1::ScheduleDesiredStateRequest;
using ScheduleDesiredStateResponse = services::v1::ScheduleDesiredStateResponse;
using ApplyDesiredStateRequest = services::v1::ApplyDesiredStateRequest;
using ApplyDesiredStateResponse = services::v1::ApplyDesiredStateResponse;

workflow::ServiceDefinition deploymentService(std::shared_ptr<feed::Writer> writer);

}  // namespace krane::services::deployment
