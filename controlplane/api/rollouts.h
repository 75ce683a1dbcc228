// krane.api.v1.RolloutService and krane.api.v1.SentinelService: fleet-wide sentinel image
// rollouts (through SentinelRolloutService, controlplane/services/sentinelrollout) and the
// sentinels with their convergence, for operators.
//
// Thread-safety: gRPC calls them from its threads; everything they hold is shared and
// thread-safe.
#pragma once

#include <memory>

#include "controlplane/api/auth.h"
#include "controlplane/api/checked_requests.h"
#include "controlplane/db/pool.h"
#include "controlplane/workflow/engine.h"
#include "krane/api/v1/rollouts.grpc.pb.h"
#include "krane/api/v1/sentinels.grpc.pb.h"
#include "krane/services/v1/sentinel.pb.h"

namespace krane::api {

// The rollout state as the API shows it (no webhook URL, 1-based waves, state names).
v1::SentinelRollout publicRollout(const services::v1::SentinelRollout& rollout);

class RolloutServiceImpl final : public CheckedRequests<krane::api::v1::RolloutService::Service> {
 public:
  // `engine` must outlive the service (the server stops gRPC first).
  RolloutServiceImpl(std::shared_ptr<db::Pool> pool, workflow::Engine& engine,
                     std::shared_ptr<const OperatorTokens> operators);

  grpc::Status StartSentinelRollout(grpc::ServerContext* context,
                                    const v1::StartSentinelRolloutRequest* request,
                                    v1::SentinelRollout* response) override;
  grpc::Status GetSentinelRollout(grpc::ServerContext* context,
                                  const v1::GetSentinelRolloutRequest* request,
                                  v1::SentinelRollout* response) override;
  // The WatchSentinelRollout RPC.
  grpc::Status Watch(grpc::ServerContext* context, const v1::GetSentinelRolloutRequest* request,
                     grpc::ServerWriterInterface<v1::SentinelRollout>* writer);
  grpc::Status ResumeSentinelRollout(grpc::ServerContext* context,
                                     const v1::GetSentinelRolloutRequest* request,
                                     v1::SentinelRollout* response) override;
  grpc::Status CancelSentinelRollout(grpc::ServerContext* context,
                                     const v1::GetSentinelRolloutRequest* request,
                                     v1::SentinelRollout* response) override;
  grpc::Status RollbackSentinelRollout(grpc::ServerContext* context,
                                       const v1::GetSentinelRolloutRequest* request,
                                       v1::SentinelRollout* response) override;

 private:
  // Starts `invoke` and waits up to `timeout` for its result. One that is still queued behind
  // another operation then is withdrawn (ABORTED, nothing done), so that it does not run
  // later with nobody watching; one that started goes on (DEADLINE_EXCEEDED says so).
  absl::StatusOr<std::string> callOrWithdraw(const workflow::InvokeRequest& invoke,
                                             std::chrono::milliseconds timeout);
  grpc::Status operation(grpc::ServerContext* context, const char* handler,
                         v1::SentinelRollout* response);

  std::shared_ptr<db::Pool> pool_;
  workflow::Engine& engine_;
  std::shared_ptr<const OperatorTokens> operators_;
};

class SentinelApiImpl final : public CheckedRequests<krane::api::v1::SentinelService::Service> {
 public:
  SentinelApiImpl(std::shared_ptr<db::Pool> pool, std::shared_ptr<const OperatorTokens> operators);

  grpc::Status GetSentinel(grpc::ServerContext* context, const v1::GetSentinelRequest* request,
                           v1::Sentinel* response) override;
  grpc::Status ListSentinels(grpc::ServerContext* context, const v1::ListSentinelsRequest* request,
                             v1::ListSentinelsResponse* response) override;

 private:
  std::shared_ptr<db::Pool> pool_;
  std::shared_ptr<const OperatorTokens> operators_;
};

}  // namespace krane::api
