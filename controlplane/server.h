// krane-ctrl serve: everything one control-plane replica runs, started as an ordered list of
// named steps and stopped in reverse order.
#pragma once

#include <memory>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "controlplane/api/auth.h"
#include "controlplane/api/deployments.h"
#include "controlplane/api/rollouts.h"
#include "controlplane/api/services.h"
#include "controlplane/api/tenancy.h"
#include "controlplane/api/workflows.h"
#include "controlplane/config.h"
#include "controlplane/feed/cleanup.h"
#include "controlplane/feed/h2_watch_server.h"
#include "controlplane/feed/peer_hints.h"
#include "controlplane/feed/tailer.h"
#include "controlplane/feed/watch_loops.h"
#include "controlplane/feed/watch_stream.h"
#include "controlplane/feed/writer.h"
#include "controlplane/ingest/ingestor.h"
#include "controlplane/workflow/engine.h"
#include "controlplane/workflow/maintenance.h"

namespace httplib {
class Server;
}

namespace krane::ctrl {

class Server {
 public:
  explicit Server(CtrlConfig config);
  ~Server();

  // Runs the start-up steps in order; on failure, what was started is stopped again and the
  // error names the step.
  absl::Status start();
  void stop();

  int grpcPort() const { return grpc_port_; }
  // The port of feed.watch_listen; 0 when it is off.
  int watchPort() const { return h2_watch_ ? h2_watch_->port() : 0; }
  int httpPort() const { return http_port_; }
  // For tests and the metrics page.
  feed::Writer& writer() { return *writer_; }
  // The fan-out of this replica's watch streams (tests inject batches through it).
  feed::Hub& hub() { return *hub_; }
  feed::Tailer& tailer() { return *tailer_; }
  api::AgentTokens& tokens() { return *tokens_; }
  const feed::WatchContext& watch() const { return *watch_; }
  workflow::Engine& workflowEngine() { return *engine_; }
  std::string metricsText() const;
  // OK when the database answers; the reason otherwise.
  absl::Status ready() const;

 private:
  absl::Status startDatabase();
  absl::Status startFeed();
  absl::Status startWorkflow();
  absl::Status startGrpc();
  absl::Status startHttp();

  CtrlConfig config_;
  std::shared_ptr<db::Pool> pool_;
  std::shared_ptr<const feed::ResourceTables> tables_;
  std::shared_ptr<feed::Hub> hub_;
  std::shared_ptr<feed::Writer> writer_;
  std::unique_ptr<feed::Tailer> tailer_;
  std::unique_ptr<feed::PeerHints> peer_hints_;
  std::unique_ptr<feed::Cleanup> cleanup_;
  std::shared_ptr<feed::WatchContext> watch_;
  std::shared_ptr<api::AgentTokens> tokens_;
  std::shared_ptr<const api::OperatorTokens> operators_;
  std::shared_ptr<ingest::Ingestor> ingestor_;
  std::unique_ptr<workflow::Engine> engine_;
  std::unique_ptr<workflow::Maintenance> maintenance_;
  std::unique_ptr<api::ClusterServiceImpl> cluster_service_;
  std::unique_ptr<api::ResourceServiceImpl> resource_service_;
  std::unique_ptr<api::AgentServiceImpl> agent_service_;
  std::unique_ptr<api::WorkflowServiceImpl> workflow_service_;
  std::unique_ptr<api::DeploymentServiceImpl> deployment_service_;
  std::unique_ptr<api::TenancyServiceImpl> tenancy_service_;
  std::unique_ptr<api::RolloutServiceImpl> rollout_service_;
  std::unique_ptr<api::SentinelApiImpl> sentinel_service_;
  std::unique_ptr<grpc::Server> grpc_;
  // The Watch calls' threads; stopped after grpc_'s shutdown, before grpc_ is destroyed.
  std::unique_ptr<feed::WatchLoops> watch_loops_;
  // feed.watch_listen: Watch calls on the feed's own HTTP/2 listener.
  std::unique_ptr<feed::H2WatchServer> h2_watch_;
  std::unique_ptr<httplib::Server> http_;
  std::thread http_thread_;
  std::thread ticker_;
  std::atomic<bool> stopping_{false};
  int grpc_port_ = 0;
  int http_port_ = 0;
  std::vector<std::string> started_;  // names of the steps that completed
};

}  // namespace krane::ctrl
