// DeployService: one deployment from queued to ready, as a durable workflow (seed 001). A virtual
// object keyed by deployment id; each step is journaled, and recorded in deployment_steps (start,
// end, error) for `kranectl` to follow:
//
//   queued      self-skip when a newer commit of the branch is queued or active; acquire a build
//               slot (BuildSlotService, production first)
//   starting    the deployment leaves the queue (only from pending / awaiting_approval: a
//               superseded one stops here)
//   building    the builder turns the request into an image; then the build slot is released
//   deploying   one deployment_topology row per region of the environment, and the
//               environment's sentinel and CiliumNetworkPolicy in each region that has none
//               (environment_resources.h), through the feed writer: state rows and change
//               records in one transaction, with the step's journal entry
//   waiting     until the readiness gate (readiness.h) says enough regions run their minimum
//               replicas, or the environment's deploy timeout passes; and until each sentinel
//               the deploying step created converged (SentinelService.Deploy, started right
//               after the write, so both converge in parallel; a sentinel that does not
//               converge within its timeout fails the deploy)
//   network     RoutingService.AssignRoutes
//   finalizing  RoutingService.SwapLiveDeployment (production environments); the routing service
//               then schedules the previous live deployment's stop (DeploymentService)
//   ready
//
// The build slot is released once the build is done (it caps builds, not rollouts), and by the
// compensations on every failure path before that. On failure or cancel the compensations run last
// in, first out: the topology rows are removed, the slot released, the open step stamped with the
// error and the deployment marked failed (cancelled, for a cancel) if it is still active, never
// over superseded or ready. Retries: the deploy preset (30 s to 5 min, 10 attempts).
//
// Handlers (typed, messages of proto/krane/services/v1/deploy.proto):
//   Deploy(DeployRequest)                             -> DeployResult                 exclusive
//   NotifyInstancesReady(NotifyInstancesReadyRequest) -> NotifyInstancesReadyResponse shared
//
// When failing regions (crash loops, images that cannot be fetched) make readiness unreachable,
// the gate rejects the wait and the deploy fails at once with their reasons.
#pragma once

#include <memory>
#include <vector>

#include "controlplane/db/pool.h"
#include "controlplane/feed/writer.h"
#include "controlplane/services/builder/builder.h"
#include "controlplane/services/deploy/environment_resources.h"
#include "controlplane/services/routing/routing.h"
#include "controlplane/services/sentinel/sentinel.h"
#include "controlplane/workflow/service.h"
#include "krane/services/v1/deploy.pb.h"

namespace krane::services::deploy {

inline constexpr char kServiceName[] = "DeployService";
// The state key holding the awakeable a waiting deploy waits on.
inline constexpr char kReadyAwakeableState[] = "instances_ready_awakeable";
// A rolling deploy between two cycles: the awakeable that a report of its instances resolves, so
// the next cycle runs at once instead of at its tick.
inline constexpr char kRollAwakeableState[] = "roll_awakeable";

using DeployRequest = services::v1::DeployRequest;
using DeployResult = services::v1::DeployResult;
using NotifyInstancesReadyRequest = services::v1::NotifyInstancesReadyRequest;
using NotifyInstancesReadyResponse = services::v1::NotifyInstancesReadyResponse;

struct DeployDependencies {
  std::shared_ptr<db::Pool> pool;
  std::shared_ptr<feed::Writer> writer;
  std::shared_ptr<builder::PrebuiltBuilder> prebuilt;
  std::shared_ptr<builder::CommandBuilder> command;
  EnvironmentResourceOptions environment = {};
  sentinel::SentinelOptions sentinel = {};
  // A rolling deploy gives up (rolls back) once this many failed new instances per desired
  // replica were seen, summed over its cycles; 0: only its timeout ends it.
  uint32_t rolling_give_up_per_replica = 3;
};

workflow::ServiceDefinition deployService(DeployDependencies deps);

// DeployService and every service it calls (BuildSlotService, RoutingService, SentinelService
// and the DeploymentService that a swap schedules on), for one engine to register.
std::vector<workflow::ServiceDefinition> deployServices(DeployDependencies deps,
                                                        routing::RoutingOptions routing = {});

// Ends the open step of deployment `id` with `error` (first write wins) and moves it to `status`
// unless it finished already (ready, failed, superseded, cancelled keep theirs).
absl::Status markFinished(db::Connection& conn, const std::string& id, const std::string& status,
                          const std::string& error);

}  // namespace krane::services::deploy
