// Sends what the agent observes to krane-ctrl: status reports and heartbeats.
//
// Reports are coalesced per resource, latest wins: during an outage memory holds at most one
// report per resource, and at most `max_pending` resources (beyond that the oldest report is
// dropped and counted; the plugin reports that resource again at its next observation). Sending
// is retried with jittered backoff behind a circuit breaker: after `breaker_failures`
// consecutive failures the breaker opens for `breaker_cooldown`, then lets one attempt through.
// Heartbeats carry the applied watermark, so the control plane can show each region's lag.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <list>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "common/backoff.h"
#include "krane/cluster/v1/cluster.grpc.pb.h"

namespace krane::agent {

struct ReporterOptions {
  std::string region;
  std::string agent_id;
  std::string token;
  std::string build_version;
  size_t max_pending = 10000;
  std::chrono::milliseconds heartbeat_interval{10000};
  int breaker_failures = 5;
  std::chrono::milliseconds breaker_cooldown{10000};
  BackoffPolicy retry{std::chrono::milliseconds(200), 2.0, std::chrono::milliseconds(5000), 0.5};
  std::chrono::milliseconds rpc_timeout{5000};
  // Told each answer to a heartbeat, on the reporter's thread.
  std::function<void(const cluster::v1::HeartbeatResponse&)> on_heartbeat;
};

struct ReporterStats {
  uint64_t sent = 0;
  uint64_t coalesced = 0;  // replaced by a newer report before it was sent
  uint64_t dropped = 0;    // pushed out by the max_pending bound
  uint64_t failures = 0;
  uint64_t rejected = 0;  // refused by the server as invalid: not retried
  uint64_t heartbeats = 0;
  uint64_t breaker_opened = 0;
  bool breaker_open = false;
  size_t pending = 0;
};

class Reporter {
 public:
  using Report = std::variant<cluster::v1::ReportDeploymentStatusRequest,
                              cluster::v1::ReportSentinelStatusRequest,
                              cluster::v1::ReportResourceStatusRequest>;

  // `heartbeat` fills the per-beat fields (applied version, leader flag, plugins).
  Reporter(std::shared_ptr<grpc::Channel> channel, ReporterOptions options,
           std::function<void(cluster::v1::HeartbeatRequest&)> heartbeat);
  ~Reporter();

  void start();
  void stop();
  // Queues a report, replacing an unsent one for the same resource.
  void report(Report report);
  // Sends a heartbeat now (also sent every heartbeat_interval).
  void beatNow();
  ReporterStats stats() const;

 private:
  static std::string keyOf(const Report& report);
  grpc::Status send(const Report& report);
  void run();
  bool breakerAllows();
  void recordResult(bool ok);

  std::unique_ptr<cluster::v1::ClusterService::Stub> stub_;
  ReporterOptions options_;
  std::function<void(cluster::v1::HeartbeatRequest&)> heartbeat_;

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::list<std::string> order_;  // oldest first
  std::map<std::string, std::pair<Report, std::list<std::string>::iterator>> pending_;
  bool stopping_ = false;
  bool beat_now_ = false;
  int consecutive_failures_ = 0;
  std::chrono::steady_clock::time_point open_until_{};
  ReporterStats stats_;
  std::thread thread_;
};

}  // namespace krane::agent
