// Status reported by agents: instances of deployments, sentinel rollouts, generic resources,
// heartbeats. Every report is validated, then written in one retried transaction.
//
// Callers pass the region the agent's token belongs to; a report about another region is
// refused with PERMISSION_DENIED. Thread-safe.
//
// One rule for every report RPC:
// - A report about a resource the control plane does not hold (no live row of that type, id and
//   region: never written, or deleted) is accepted and dropped: nothing is stored, and it is
//   counted (krane_ingest_reports_dropped_total). A report that the resource is gone purges what
//   is stored about it. (Deleting a resource through the writer purges its status and
//   instances in the same transaction, so nothing is left behind by an agent that never reports.)
// - A report older than the stored one is dropped the same way: by (applied version, the
//   agent's observation time) for deployments and resources, by (observed generation,
//   observation time) for sentinels. A retried report, or one from a replaced leader, never
//   overwrites a newer one.
// - The reporting agent's id is stored with the status.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "controlplane/db/pool.h"
#include "controlplane/feed/resource_table.h"
#include "krane/cluster/v1/cluster.pb.h"

namespace krane::ingest {

// Told when a sentinel in `progressing` flipped to `ready` (the deploy workflow resumes there).
class SentinelReadyHook {
 public:
  virtual ~SentinelReadyHook() = default;
  virtual void onSentinelReady(const std::string& sentinel_id, const std::string& region) = 0;
};

// Told after the instance set of a (deployment, region) was stored, with the counts, so the
// deploy workflow can decide whether enough regions are healthy.
class DeploymentInstancesHook {
 public:
  virtual ~DeploymentInstancesHook() = default;
  virtual void onInstancesReported(const std::string& deployment_id, const std::string& region,
                                   uint32_t running, uint32_t pending, uint32_t failed) = 0;
};

struct AgentInfo {
  std::string agent_id;
  std::string region;
  std::string build_version;
  uint64_t applied_version = 0;
  uint64_t latest_version = 0;  // the region's latest change version
  uint64_t lag = 0;             // latest_version - applied_version (0 if ahead)
  bool is_leader = false;
  uint64_t parked_events = 0;    // refused as invalid, acknowledged
  uint64_t retrying_events = 0;  // failing for a transient reason; the cursor waits for them
  std::vector<cluster::v1::PluginInfo> plugins;
  int64_t first_seen_ms = 0;
  int64_t last_seen_ms = 0;
};

struct IngestCounters {
  std::atomic<uint64_t> deployment_reports{0};
  std::atomic<uint64_t> sentinel_reports{0};
  std::atomic<uint64_t> resource_reports{0};
  std::atomic<uint64_t> heartbeats{0};
  std::atomic<uint64_t> rejected{0};  // invalid or not allowed
  std::atomic<uint64_t> dropped{0};   // about a resource not held, or older than the stored one
  std::atomic<uint64_t> errors{0};    // database failures
};

class Ingestor {
 public:
  explicit Ingestor(std::shared_ptr<db::Pool> pool);

  // Register before reports arrive.
  void addSentinelReadyHook(std::shared_ptr<SentinelReadyHook> hook);
  void addDeploymentInstancesHook(std::shared_ptr<DeploymentInstancesHook> hook);

  absl::Status reportDeploymentStatus(const std::string& region,
                                      const cluster::v1::ReportDeploymentStatusRequest& request);
  absl::Status reportSentinelStatus(const std::string& region,
                                    const cluster::v1::ReportSentinelStatusRequest& request);
  absl::Status reportResourceStatus(const std::string& region,
                                    const cluster::v1::ReportResourceStatusRequest& request);
  absl::StatusOr<cluster::v1::HeartbeatResponse> heartbeat(
      const std::string& region, const cluster::v1::HeartbeatRequest& request);

  // Agents that sent a heartbeat, newest first; `region` filters when not empty.
  absl::StatusOr<std::vector<AgentInfo>> listAgents(const std::string& region);
  // Forgets an agent; returns its last heartbeat (Unix ms). NOT_FOUND when there is none;
  // FAILED_PRECONDITION when it sent a heartbeat within `alive_within` (it would only come
  // back), unless `force`.
  absl::StatusOr<int64_t> removeAgent(
      const std::string& region, const std::string& agent_id, bool force,
      std::chrono::milliseconds alive_within = std::chrono::minutes(1));

  const IngestCounters& counters() const { return counters_; }

 private:
  std::shared_ptr<db::Pool> pool_;
  feed::ResourceTables tables_;  // to find the resource a report is about
  std::mutex hooks_mutex_;
  std::vector<std::shared_ptr<SentinelReadyHook>> sentinel_hooks_;
  std::vector<std::shared_ptr<DeploymentInstancesHook>> deployment_hooks_;
  IngestCounters counters_;
};

}  // namespace krane::ingest
