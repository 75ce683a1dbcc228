// The gRPC services of krane-ctrl: ClusterService for agents, ResourceService and AgentService
// for operators. Handlers authenticate, validate and delegate; they hold no state of their own.
#pragma once

#include <atomic>
#include <memory>

#include "controlplane/api/auth.h"
#include "controlplane/api/checked_requests.h"
#include "controlplane/feed/watch_loops.h"
#include "controlplane/feed/watch_stream.h"
#include "controlplane/feed/writer.h"
#include "controlplane/ingest/ingestor.h"
#include "krane/api/v1/agents.grpc.pb.h"
#include "krane/api/v1/resources.grpc.pb.h"
#include "krane/cluster/v1/cluster.grpc.pb.h"

namespace krane::api {

// Watch runs on gRPC's completion-queue API, on the feed's WatchLoops (a stream holds no
// thread), and on the feed's own HTTP/2 listener when it is configured (h2_watch_server.h);
// the unary reports are sync.
class ClusterServiceImpl final
    : public CheckedRequests<
          cluster::v1::ClusterService::WithRawMethod_Watch<cluster::v1::ClusterService::Service>> {
 public:
  ClusterServiceImpl(std::shared_ptr<feed::WatchContext> watch, std::shared_ptr<AgentTokens> tokens,
                     std::shared_ptr<ingest::Ingestor> ingestor);

  // Asks gRPC for the next Watch call, accepted on `cq` (a loop's queue).
  void requestWatch(grpc::ServerContext* context, grpc::ByteBuffer* request,
                    grpc::ServerAsyncWriter<grpc::ByteBuffer>* writer,
                    grpc::ServerCompletionQueue* cq, void* tag) {
    RequestWatch(context, request, writer, cq, cq, tag);
  }
  // An accepted Watch: its request checked as every request is (parseRequest), then a stream
  // answering with WatchEvent messages encoded once for every stream (encoded_event.h).
  void openWatch(feed::GrpcWatchCall* call);
  // The same for a call of the feed's HTTP/2 listener (h2_watch_server.h), with the request's
  // bytes, its `authorization` header and the client's address.
  void openWatch(feed::WatchCall* call, std::string_view request, std::string_view authorization,
                 std::string peer);
  grpc::Status ReportDeploymentStatus(
      grpc::ServerContext* context, const cluster::v1::ReportDeploymentStatusRequest* request,
      cluster::v1::ReportDeploymentStatusResponse* response) override;
  grpc::Status ReportSentinelStatus(grpc::ServerContext* context,
                                    const cluster::v1::ReportSentinelStatusRequest* request,
                                    cluster::v1::ReportSentinelStatusResponse* response) override;
  grpc::Status ReportResourceStatus(grpc::ServerContext* context,
                                    const cluster::v1::ReportResourceStatusRequest* request,
                                    cluster::v1::ReportResourceStatusResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext* context, const cluster::v1::HeartbeatRequest* request,
                         cluster::v1::HeartbeatResponse* response) override;
  // The watch listener's port, told to agents in heartbeats (0: none).
  void setWatchListenerPort(uint32_t port) { watch_listener_port_ = port; }

 private:
  std::atomic<uint32_t> watch_listener_port_{0};
  std::shared_ptr<feed::WatchContext> watch_;
  std::shared_ptr<AgentTokens> tokens_;
  std::shared_ptr<ingest::Ingestor> ingestor_;
};

// Watch runs on gRPC's callback API, served from the hub (resource_watch.h); the rest is sync.
class ResourceServiceImpl final
    : public CheckedRequests<krane::api::v1::ResourceService::WithCallbackMethod_Watch<
          krane::api::v1::ResourceService::Service>> {
 public:
  ResourceServiceImpl(std::shared_ptr<feed::Writer> writer, std::shared_ptr<db::Pool> pool,
                      std::shared_ptr<const OperatorTokens> operators,
                      std::shared_ptr<feed::Hub> hub);

  grpc::Status Put(grpc::ServerContext* context, const v1::PutResourceRequest* request,
                   v1::PutResourceResponse* response) override;
  grpc::Status Get(grpc::ServerContext* context, const v1::GetResourceRequest* request,
                   v1::GetResourceResponse* response) override;
  grpc::Status List(grpc::ServerContext* context, const v1::ListResourcesRequest* request,
                    v1::ListResourcesResponse* response) override;
  grpc::Status Delete(grpc::ServerContext* context, const v1::DeleteResourceRequest* request,
                      v1::DeleteResourceResponse* response) override;
  grpc::Status GetStatus(grpc::ServerContext* context, const v1::GetResourceStatusRequest* request,
                         v1::GetResourceStatusResponse* response) override;
  grpc::ServerWriteReactor<v1::ResourceChange>* Watch(
      grpc::CallbackServerContext* context, const v1::WatchResourcesRequest* request) override;

 private:
  std::shared_ptr<feed::Writer> writer_;
  std::shared_ptr<db::Pool> pool_;
  std::shared_ptr<const OperatorTokens> operators_;
  std::shared_ptr<feed::Hub> hub_;
};

class AgentServiceImpl final : public CheckedRequests<krane::api::v1::AgentService::Service> {
 public:
  AgentServiceImpl(std::shared_ptr<ingest::Ingestor> ingestor,
                   std::shared_ptr<const OperatorTokens> operators);
  grpc::Status ListAgents(grpc::ServerContext* context, const v1::ListAgentsRequest* request,
                          v1::ListAgentsResponse* response) override;
  grpc::Status RemoveAgent(grpc::ServerContext* context, const v1::RemoveAgentRequest* request,
                           v1::RemoveAgentResponse* response) override;

 private:
  std::shared_ptr<ingest::Ingestor> ingestor_;
  std::shared_ptr<const OperatorTokens> operators_;
};

// UNAUTHENTICATED unless the call carries one of the operator tokens.
absl::Status checkOperator(const grpc::ServerContextBase& context, const OperatorTokens& operators);

}  // namespace krane::api
