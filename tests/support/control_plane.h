// A real krane-ctrl server inside the test process (gRPC and HTTP on free ports) on a fresh
// scratch database, with regions registered, tokens made, and clients for both APIs.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "controlplane/config.h"
#include "controlplane/db/pool.h"
#include "controlplane/server.h"
#include "krane/api/v1/agents.grpc.pb.h"
#include "krane/api/v1/resources.grpc.pb.h"
#include "krane/cluster/v1/cluster.grpc.pb.h"

namespace krane::testing {

inline constexpr const char* kOperatorToken = "operator-token-for-tests-0123456789";

class TestControlPlane {
 public:
  // A fresh database with the schema and the given regions; no server yet.
  explicit TestControlPlane(std::vector<std::string> regions = {"eu-1", "us-1"});
  ~TestControlPlane();

  // Starts a replica on the shared database (call several times for several replicas).
  ctrl::Server& startReplica(std::function<void(ctrl::CtrlConfig&)> adjust = {});
  void stopReplica(size_t index);
  ctrl::Server& replica(size_t index = 0) { return *replicas_.at(index); }

  std::shared_ptr<db::Pool> pool() { return pool_; }
  const db::Dsn& dsn() const { return dsn_; }
  // An agent token of the region (created once per region).
  std::string agentToken(const std::string& region);
  // What deployments need, in SQL: workspace 'ws', project 'proj', app 'app' and its production
  // environment 'prod' deploying to eu-1 and us-1 with one replica each.
  void seedApp();

  // A connection of its own. `small_window`: its HTTP/2 window stays at 64 KiB, so a call
  // that reads nothing holds the server's writes after a few frames (gRPC's probing would let
  // it take in megabytes first).
  std::shared_ptr<grpc::Channel> channel(size_t replica = 0, bool small_window = false);
  // Where agents' Watch calls go: with $KRANE_TEST_WATCH_LISTENER=1 every replica also serves
  // feed.watch_listen (the feed's HTTP/2 listener) and this dials it; otherwise channel().
  std::shared_ptr<grpc::Channel> watchChannel(size_t replica = 0, bool small_window = false);
  std::unique_ptr<cluster::v1::ClusterService::Stub> watchStub(size_t replica = 0,
                                                               bool small_window = false);
  static bool watchListener();
  std::unique_ptr<krane::api::v1::ResourceService::Stub> resources(size_t replica = 0);
  std::unique_ptr<krane::api::v1::AgentService::Stub> agents(size_t replica = 0);
  std::unique_ptr<cluster::v1::ClusterService::Stub> cluster(size_t replica = 0);

  // A context with `authorization: Bearer <token>`, and a deadline.
  static std::unique_ptr<grpc::ClientContext> withToken(
      const std::string& token, std::chrono::seconds deadline = std::chrono::seconds(30));

 private:
  db::Dsn dsn_;
  std::shared_ptr<db::Pool> pool_;
  std::vector<std::unique_ptr<ctrl::Server>> replicas_;
  std::map<std::string, std::string> tokens_;
};

// Plays the regions' agents for sentinels: while it lives, every sentinel in `progressing` is
// reported converged on its desired image (through ClusterService, with its region's agent
// token), as agents running it would, except those in `failing` (reported unhealthy). Deploys
// that create sentinels wait for this.
class SentinelAgents {
 public:
  explicit SentinelAgents(TestControlPlane& cp, std::set<std::string> failing = {});
  ~SentinelAgents();
  SentinelAgents(const SentinelAgents&) = delete;
  SentinelAgents& operator=(const SentinelAgents&) = delete;

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Reads a Watch stream on its own thread and keeps every event, for assertions.
class WatchRecorder {
 public:
  // Watches as an agent does, accepting batches unless told not to; events() holds the events
  // of a batch one by one, as if each had come alone.
  WatchRecorder(std::shared_ptr<grpc::Channel> channel, const std::string& token,
                const std::string& region, uint64_t version, std::vector<std::string> types = {},
                bool accept_batches = true);
  ~WatchRecorder();

  // Waits until `pred(events)` holds; false on timeout.
  bool waitFor(const std::function<bool(const std::vector<cluster::v1::WatchEvent>&)>& pred,
               std::chrono::milliseconds timeout = std::chrono::seconds(30));
  // Waits until a change or bookmark reached `version`.
  bool waitForVersion(uint64_t version,
                      std::chrono::milliseconds timeout = std::chrono::seconds(30));
  std::vector<cluster::v1::WatchEvent> events();
  // Waits until the server ended the stream; false on timeout.
  bool waitFinished(std::chrono::milliseconds timeout = std::chrono::seconds(10));
  // Highest version seen in changes, bookmarks and sync ends.
  uint64_t lastVersion();
  bool finished();
  grpc::Status status();
  void cancel();
  // Messages read, how many of them were batches, and the largest batch in bytes.
  size_t messages();
  size_t batches();
  size_t largestBatchBytes();

 private:
  std::unique_ptr<cluster::v1::ClusterService::Stub> stub_;
  grpc::ClientContext context_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<cluster::v1::WatchEvent> events_;
  uint64_t last_version_ = 0;
  size_t messages_ = 0;
  size_t batches_ = 0;
  size_t largest_batch_bytes_ = 0;
  bool finished_ = false;
  grpc::Status status_;
  std::thread reader_;
};

}  // namespace krane::testing
