// krane.api.v1.DeploymentService: deployments for operators and CI pipelines. Creating one
// records it and starts its deploy workflow (controlplane/services/deploy); promote and rollback
// go through RoutingService, so they serialize with deploys of the same environment.
//
// Thread-safety: gRPC calls it from its threads; everything it holds is shared and thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>

#include "controlplane/api/auth.h"
#include "controlplane/api/checked_requests.h"
#include "controlplane/db/pool.h"
#include "controlplane/feed/resource_table.h"
#include "controlplane/workflow/engine.h"
#include "krane/api/v1/deployments.grpc.pb.h"

namespace krane::api {

// Bounds on WatchDeployment, whose streams each poll the database while they live.
struct DeploymentWatchLimits {
  // Streams open at once on this replica (deploy.watch_max_streams); one more is refused with
  // RESOURCE_EXHAUSTED.
  size_t max_streams = 256;
  // A stream ends after this long (deploy.watch_max_lifetime_s) with OUT_OF_RANGE: the client
  // watches again (its first message is the deployment as it is then).
  std::chrono::milliseconds max_lifetime{std::chrono::hours(1)};
};

class DeploymentServiceImpl final
    : public CheckedRequests<krane::api::v1::DeploymentService::Service> {
 public:
  // `engine` must outlive the service (the server stops gRPC first).
  DeploymentServiceImpl(std::shared_ptr<db::Pool> pool,
                        std::shared_ptr<const feed::ResourceTables> tables,
                        workflow::Engine& engine, std::shared_ptr<const OperatorTokens> operators,
                        DeploymentWatchLimits watch_limits = {});

  grpc::Status CreateDeployment(grpc::ServerContext* context,
                                const v1::CreateDeploymentRequest* request,
                                v1::Deployment* response) override;
  grpc::Status GetDeployment(grpc::ServerContext* context, const v1::DeploymentRef* request,
                             v1::Deployment* response) override;
  grpc::Status ListDeployments(grpc::ServerContext* context,
                               const v1::ListDeploymentsRequest* request,
                               v1::ListDeploymentsResponse* response) override;
  // The WatchDeployment RPC.
  grpc::Status WatchUntilFinished(grpc::ServerContext* context, const v1::DeploymentRef* request,
                                  grpc::ServerWriterInterface<v1::Deployment>* writer);
  grpc::Status CancelDeployment(grpc::ServerContext* context, const v1::DeploymentRef* request,
                                v1::Deployment* response) override;
  grpc::Status PromoteDeployment(grpc::ServerContext* context, const v1::DeploymentRef* request,
                                 v1::LiveChange* response) override;
  grpc::Status RollbackEnvironment(grpc::ServerContext* context,
                                   const v1::RollbackEnvironmentRequest* request,
                                   v1::LiveChange* response) override;

 private:
  std::shared_ptr<db::Pool> pool_;
  std::shared_ptr<const feed::ResourceTables> tables_;
  workflow::Engine& engine_;
  std::shared_ptr<const OperatorTokens> operators_;
  const DeploymentWatchLimits watch_limits_;
  std::atomic<size_t> watches_{0};  // WatchDeployment streams open
};

}  // namespace krane::api
