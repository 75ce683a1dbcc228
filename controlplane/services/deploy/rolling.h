// The rolling strategy of a deploy (seed 002): instead of starting the new deployment in full and
// swapping, the deploy moves each region's replicas from the live deployment to the new one in
// steps bounded by the environment's max_surge / max_unavailable, as journaled steps of its own
// invocation (no thread of its own):
//
//   each cycle (one second apart, a durable timer):
//     observe     both topologies' replicas and the instances the agents reported (a step)
//     evaluate    the rolling-update evaluator per region (controlplane/strategy)
//     apply       new replicas up by to_create, old ones down by the drained count, through the
//                 feed writer on the step's transaction (exactly once)
//   until every region completed (no old replica left, the new ones healthy).
//
// Each cycle's phase per region (provisioning, progressing, completed; rolling_back) goes to the
// deployment's history (deployment_phases) in the cycle's apply step; a phase equal to the
// region's latest record only adds an attempt. While it rolls, the app's deploying revision
// (apps.deploying_deployment_id) names the new deployment: the swap that completes the roll makes
// it current and clears it in one transaction, a rollback clears it.
//
// Replicas asked for but not reported yet count as starting (new) or still serving (old), so a
// cycle never acts twice on the same change. A timeout (the environment's
// deploy_timeout_seconds) or new instances that keep failing (the give-up cap: failed new
// instances seen, sampled at most once a second, reach deploy.rolling_give_up_per_replica (3) ×
// the desired replicas; 0 waits for the timeout) rolls back,
// capacity-aware: the same evaluator with the roles reversed scales the old deployment back up
// within the surge first and drains the new one, never below min_available. The deploy then fails
// with the reason; the old deployment stays live.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "controlplane/services/deploy/deploy.h"
#include "controlplane/workflow/service.h"

namespace krane::services::deploy {

// Runs the roll of deployment `id` (whose topologies were written with 0 replicas) from
// info.live_deployment_id(). OK once every region completed; a terminal error after a rollback.
// `rolling_back` records that phase (the deploy's `rolling_back` step) before it starts.
absl::Status rollOut(workflow::Context& ctx, const DeployDependencies& deps,
                     const services::v1::DeploymentInfo& info, const std::string& id,
                     const std::function<absl::Status()>& rolling_back);

}  // namespace krane::services::deploy
