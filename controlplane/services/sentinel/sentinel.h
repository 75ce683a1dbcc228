// SentinelService (seed 000, "Convergence tracking"): changes one sentinel and waits until the
// agent of its region reports it healthy on the desired image. A virtual object keyed by
// sentinel id, so the changes of one sentinel serialize.
//
// Handlers (typed, messages of proto/krane/services/v1/sentinel.proto):
//   Deploy(SentinelDeployRequest) -> SentinelDeployResponse            exclusive
//   NotifyReady(SentinelNotifyReadyRequest) -> SentinelNotifyReadyResponse   shared
//
// Deploy merges the request over the sentinel's row (an unset field keeps the current value).
// When nothing changes and the sentinel is already healthy on its image, it answers READY at
// once. Otherwise it stores an awakeable under `notify_ready_awakeable`, then writes the new
// config with its change record (if anything changed) and `deploy_status = progressing` in one
// step, and waits for the awakeable or the timeout (10 minutes by default):
//   - the ingestor flips the row to `ready` when a report shows the desired image healthy with
//     the desired replicas, from an agent that has applied the latest change, and ReadyNotifier
//     sends NotifyReady, which resolves the awakeable: READY;
//   - the timeout marks the row `failed` (unless a report flipped it meanwhile) and answers
//     FAILED. Nothing is rolled back: fleet rollback is the operator's call
//     (SentinelRolloutService.RollbackAll).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "controlplane/db/pool.h"
#include "controlplane/feed/writer.h"
#include "controlplane/ingest/ingestor.h"
#include "controlplane/workflow/engine.h"
#include "controlplane/workflow/service.h"
#include "krane/services/v1/sentinel.pb.h"

namespace krane::services::sentinel {

inline constexpr char kServiceName[] = "SentinelService";
// The state key holding the awakeable a Deploy waits on.
inline constexpr char kReadyAwakeableState[] = "notify_ready_awakeable";

using SentinelDeployRequest = services::v1::SentinelDeployRequest;
using SentinelDeployResponse = services::v1::SentinelDeployResponse;
using SentinelNotifyReadyRequest = services::v1::SentinelNotifyReadyRequest;
using SentinelNotifyReadyResponse = services::v1::SentinelNotifyReadyResponse;

struct SentinelOptions {
  // How long Deploy waits for convergence when the request does not say.
  std::chrono::milliseconds deploy_timeout{std::chrono::minutes(10)};
};

workflow::ServiceDefinition sentinelService(std::shared_ptr<db::Pool> pool,
                                            std::shared_ptr<feed::Writer> writer,
                                            SentinelOptions options = {});

// The ingestor's hook: a sentinel flipped to ready, so the Deploy waiting on it (if any) is
// told, once, whichever replica sees the report (the send's idempotency key is the awakeable).
class ReadyNotifier : public ingest::SentinelReadyHook {
 public:
  // `engine` must outlive the notifier (both belong to the server).
  ReadyNotifier(std::shared_ptr<db::Pool> pool, workflow::Engine& engine)
      : pool_(std::move(pool)), engine_(engine) {}
  void onSentinelReady(const std::string& sentinel_id, const std::string& region) override;

 private:
  std::shared_ptr<db::Pool> pool_;
  workflow::Engine& engine_;
};

}  // namespace krane::services::sentinel
