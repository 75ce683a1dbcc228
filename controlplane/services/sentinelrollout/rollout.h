// SentinelRolloutService (seed 000, "Fleet-wide image rollouts"): moves every running sentinel
// to a new image in waves. A virtual object keyed by "singleton", so rollout operations
// serialize; the rollout lives in its state under "rollout" (a SentinelRollout message).
//
// Handlers (typed, messages of proto/krane/services/v1/sentinel.proto), all exclusive but Get:
//   Rollout(RolloutStartRequest)       lists the running sentinels in pages, drops those already
//                                      on the image, keeps each one's previous image, splits the
//                                      rest into waves by cumulative percentage (default 1, 5, 25,
//                                      50, 100), stores the rollout and starts it. Refused
//                                      (FAILED_PRECONDITION) while a rollout is in progress,
//                                      paused or rolling back. Returns at once.
//   Step(RolloutStepRequest)           sent by the rollout to itself: starts SentinelService.Deploy
//                                      for the next `max_parallel` sentinels of the current wave
//                                      and collects all their results. When the wave has run:
//                                      any failure pauses the rollout (failed ids recorded);
//                                      otherwise the wave bakes (`bake_ms`: its sentinels must
//                                      still be healthy when it ends) and the next wave starts.
//                                      Because every chunk is its own invocation, a Cancel or a
//                                      crash takes effect between chunks, and a replay never
//                                      deploys a sentinel twice for one wave.
//   Resume                             only from paused: skips the failed wave, goes on.
//   Cancel                             from in_progress or paused: ends it; sentinels stay where
//                                      they are.
//   RollbackAll                        from paused or cancelled: redeploys every sentinel that
//                                      reached the new image on its previous image; returns how
//                                      many reverted; ends cancelled.
//   Get (shared)                       the rollout, without the webhook URL.
// Slack: with a webhook URL, each transition is posted (slack.h); a failed post never fails
// the rollout.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "controlplane/db/pool.h"
#include "controlplane/services/sentinelrollout/slack.h"
#include "controlplane/workflow/service.h"
#include "krane/services/v1/sentinel.pb.h"

namespace krane::services::sentinelrollout {

inline constexpr char kServiceName[] = "SentinelRolloutService";
inline constexpr char kKey[] = "singleton";
inline constexpr char kStateName[] = "rollout";

using services::v1::RolloutOperationRequest;
using services::v1::RolloutResponse;
using services::v1::RolloutStartRequest;
using services::v1::RolloutState;
using services::v1::SentinelRollout;

struct RolloutOptions {
  size_t page_size = 1000;     // sentinels listed per step
  uint32_t max_parallel = 50;  // Deploy calls of a wave at once, when the request does not say
  SlackOptions slack;
};

// Splits `ids` into waves by cumulative percentages (increasing, ending at 100): wave i ends at
// ceil(n * p_i / 100). Empty waves are dropped. 100 ids and 1, 5, 25, 50, 100 give 1, 4, 20,
// 25, 50.
std::vector<std::vector<std::string>> computeWaves(const std::vector<std::string>& ids,
                                                   const std::vector<uint32_t>& percentages);

// Checks a start request; INVALID_ARGUMENT naming the field.
absl::Status checkStartRequest(const RolloutStartRequest& request);

// The rollout as the API shows it: without the webhook URL.
SentinelRollout redacted(SentinelRollout rollout);
// "in_progress", "paused", ...
std::string stateName(RolloutState state);

workflow::ServiceDefinition sentinelRolloutService(std::shared_ptr<db::Pool> pool,
                                                   RolloutOptions options = {});

}  // namespace krane::services::sentinelrollout
