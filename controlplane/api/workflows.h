// WorkflowService of the public API: operators list and inspect workflow invocations, cancel,
// kill and resume them, settle awakeables and read the watchdog. Every call needs an operator
// token; the handlers delegate to controlplane/workflow/operations.h and hold no state.
#pragma once

#include <memory>

#include "controlplane/api/auth.h"
#include "controlplane/api/checked_requests.h"
#include "controlplane/db/pool.h"
#include "krane/api/v1/workflows.grpc.pb.h"

namespace krane::api {

class WorkflowServiceImpl final : public CheckedRequests<krane::api::v1::WorkflowService::Service> {
 public:
  WorkflowServiceImpl(std::shared_ptr<db::Pool> pool,
                      std::shared_ptr<const OperatorTokens> operators);

  grpc::Status ListInvocations(grpc::ServerContext* context,
                               const v1::ListInvocationsRequest* request,
                               v1::ListInvocationsResponse* response) override;
  grpc::Status GetInvocation(grpc::ServerContext* context, const v1::GetInvocationRequest* request,
                             v1::GetInvocationResponse* response) override;
  grpc::Status CancelInvocation(grpc::ServerContext* context, const v1::InvocationRef* request,
                                v1::InvocationActionResponse* response) override;
  grpc::Status KillInvocation(grpc::ServerContext* context, const v1::InvocationRef* request,
                              v1::InvocationActionResponse* response) override;
  grpc::Status ResumeInvocation(grpc::ServerContext* context, const v1::InvocationRef* request,
                                v1::InvocationActionResponse* response) override;
  grpc::Status SettleAwakeable(grpc::ServerContext* context,
                               const v1::SettleAwakeableRequest* request,
                               v1::SettleAwakeableResponse* response) override;
  grpc::Status ListHeldKeys(grpc::ServerContext* context, const v1::ListHeldKeysRequest* request,
                            v1::ListHeldKeysResponse* response) override;

 private:
  std::shared_ptr<db::Pool> pool_;
  std::shared_ptr<const OperatorTokens> operators_;
};

}  // namespace krane::api
