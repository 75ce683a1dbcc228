// krane.api.v1.TenancyService: workspaces (with their build quota), projects, apps and
// environments (with their regions and rollout settings), so that everything a deploy needs is
// created through the API.
//
// Thread-safety: gRPC calls it from its threads; it holds only shared, thread-safe objects.
#pragma once

#include <memory>

#include "controlplane/api/auth.h"
#include "controlplane/api/checked_requests.h"
#include "controlplane/db/pool.h"
#include "krane/api/v1/tenancy.grpc.pb.h"

namespace krane::api {

class TenancyServiceImpl final : public CheckedRequests<krane::api::v1::TenancyService::Service> {
 public:
  TenancyServiceImpl(std::shared_ptr<db::Pool> pool,
                     std::shared_ptr<const OperatorTokens> operators);

  grpc::Status CreateWorkspace(grpc::ServerContext* context,
                               const v1::CreateWorkspaceRequest* request,
                               v1::Workspace* response) override;
  grpc::Status CreateProject(grpc::ServerContext* context, const v1::CreateProjectRequest* request,
                             v1::Project* response) override;
  grpc::Status CreateApp(grpc::ServerContext* context, const v1::CreateAppRequest* request,
                         v1::App* response) override;
  grpc::Status CreateEnvironment(grpc::ServerContext* context,
                                 const v1::CreateEnvironmentRequest* request,
                                 v1::Environment* response) override;

 private:
  std::shared_ptr<db::Pool> pool_;
  std::shared_ptr<const OperatorTokens> operators_;
};

}  // namespace krane::api
