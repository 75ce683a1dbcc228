// RoutingService: every routing change of an environment goes through it (seed 001), so
// concurrent deploys, promotes and rollbacks of one environment can never race on
// apps.current_deployment_id or on where a hostname points. A virtual object keyed by
// environment id; each handler is one transaction on the engine's database (runTx), done
// exactly once.
//
// Handlers (typed, messages of proto/krane/services/v1/routing.proto), all exclusive:
//   AssignRoutes(AssignRoutesRequest)   -> AssignRoutesResponse
//       a ready deployment (or one in its deploy's network or finalizing step) takes the
//       environment's 'environment' routes and its branch's 'branch' routes
//   SwapLiveDeployment(SwapLiveRequest) -> SwapLiveResponse
//       a ready deployment of a production environment (for reason DEPLOY, also one in its
//       network or finalizing step) becomes the app's live one and takes the 'live' routes; a
//       deploy (reason DEPLOY) of a rolled-back app does not go live; a promote clears the
//       rolled-back flag, a rollback sets it
//   Rollback(RollbackRequest)           -> SwapLiveResponse
//       the newest ready deployment created before the live one goes live (reason ROLLBACK)
//
// A swap (deploy, promote, rollback) also sets live_deployment_id on every sentinel of the
// environment, through the feed writer in the same transaction, so agents learn where the
// environment's traffic goes with the same commit that moved the routes.
//
// After a swap, the deployment that was live is stopped `previous_stop_delay` later
// (DeploymentService.Schedule, STOPPED): until then a rollback finds it running. A promote or
// rollback also schedules the deployment that goes live to run at once, which replaces a stop
// still pending for it and starts it again if it was stopped (its routes move at once; its
// instances take their start-up time).
//
// Errors (terminal): INVALID_ARGUMENT naming a missing field or reason; NOT_FOUND for a
// deployment that is not one of this environment; FAILED_PRECONDITION for a deployment that is
// not ready, a preview environment (it has no live deployment), or a rollback with nothing to
// roll back to.
#pragma once

#include <chrono>
#include <memory>

#include "controlplane/feed/writer.h"
#include "controlplane/workflow/service.h"
#include "krane/services/v1/routing.pb.h"

namespace krane::services::routing {

inline constexpr char kServiceName[] = "RoutingService";

using AssignRoutesRequest = services::v1::AssignRoutesRequest;
using AssignRoutesResponse = services::v1::AssignRoutesResponse;
using SwapLiveRequest = services::v1::SwapLiveRequest;
using SwapLiveResponse = services::v1::SwapLiveResponse;
using RollbackRequest = services::v1::RollbackRequest;

struct RoutingOptions {
  // 0: the previous live deployment keeps running.
  std::chrono::milliseconds previous_stop_delay = std::chrono::minutes(30);
  // Writes the environment's sentinels (their live_deployment_id) in the swap's transaction.
  // Null: sentinels are not told (only tests of the routes themselves run without one).
  std::shared_ptr<feed::Writer> writer = nullptr;
};

workflow::ServiceDefinition routingService(RoutingOptions options = {});

// Sets rolling_deployment_id ("" clears it) on every sentinel of the environment, through the
// feed writer on `conn` (a step's journal transaction): during a rolling deploy the sentinels
// route to the ready instances of both the live and the new deployment. The swap clears it.
absl::StatusOr<std::vector<feed::WriteResult>> setSentinelsRolling(
    feed::Writer& writer, db::Connection& conn, const std::string& environment_id,
    const std::string& deployment_id);

}  // namespace krane::services::routing
