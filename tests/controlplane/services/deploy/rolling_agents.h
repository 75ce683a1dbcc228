// Agents for rolling-deploy tests, played by a thread: every 20 ms each deployment topology's
// replicas are reported running at once (failed, for deployments marked failing; pending, for
// those marked pending), the sentinels converge, and what the regions ran is recorded: the most
// instances a region had, and (while watching) the fewest healthy ones.
#pragma once

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "controlplane/db/pool.h"
#include "controlplane/ingest/ingestor.h"
#include "tests/support/reports.h"
#include "tests/support/sentinel_reports.h"

namespace krane::services::deploy::testing {

class RollingAgents {
 public:
  RollingAgents(std::shared_ptr<db::Pool> pool, std::shared_ptr<ingest::Ingestor> ingestor)
      : pool_(std::move(pool)), ingestor_(std::move(ingestor)), thread_([this] { loop(); }) {}
  ~RollingAgents() {
    stop_ = true;
    thread_.join();
  }

  void failing(const std::string& deployment) {
    std::lock_guard lock(mutex_);
    failing_.insert(deployment);
  }
  void pending(const std::string& deployment) {
    std::lock_guard lock(mutex_);
    pending_.insert(deployment);
  }
  // Its instances come up from now on.
  void running(const std::string& deployment) {
    std::lock_guard lock(mutex_);
    pending_.erase(deployment);
    failing_.erase(deployment);
  }
  // From now on, record the fewest healthy instances of a region (and reset the most).
  void watch() {
    std::lock_guard lock(mutex_);
    watching_ = true;
    min_healthy_ = 1 << 20;
    max_total_ = 0;
  }
  int minHealthy() {
    std::lock_guard lock(mutex_);
    return min_healthy_;
  }
  int maxTotal() {
    std::lock_guard lock(mutex_);
    return max_total_;
  }
  // Whether a sentinel was ever seen routing to a rolling deployment.
  bool sawBothRouted() const { return saw_both_; }

 private:
  void loop() {
    while (!stop_) {
      krane::testing::settleSentinels(*pool_, *ingestor_);
      std::map<std::pair<std::string, std::string>, int> replicas;
      if (auto conn = pool_->acquire(); conn.ok()) {
        auto both = (*conn)->query(
            "SELECT COUNT(*) FROM sentinels WHERE rolling_deployment_id IS NOT NULL");
        if (both.ok() && both->rows[0].i64(0) > 0) saw_both_ = true;
        auto rows = (*conn)->query(
            "SELECT deployment_id, region_id, replicas FROM deployment_topology"
            " WHERE deleted_at IS NULL AND desired_status = 'running'");
        if (rows.ok()) {
          for (const db::Row& r : rows->rows) {
            replicas[{r.str(0), r.str(1)}] = static_cast<int>(r.i64(2));
          }
        }
      }
      std::map<std::string, int> healthy_by_region, total_by_region;
      for (const auto& [key, n] : replicas) {
        const auto& [deployment, region] = key;
        bool failing, pending;
        {
          std::lock_guard lock(mutex_);
          failing = failing_.count(deployment) > 0;
          pending = pending_.count(deployment) > 0;
        }
        auto report = krane::testing::instancesReport(deployment, region, n);
        for (auto& i : *report.mutable_instances()->mutable_instances()) {
          if (failing) {
            i.set_status(cluster::v1::INSTANCE_STATUS_FAILED);
            i.set_failure_reason("CrashLoopBackOff: exit code 1");
          } else if (pending) {
            i.set_status(cluster::v1::INSTANCE_STATUS_PENDING);
          }
        }
        (void)ingestor_->reportDeploymentStatus(region, report);
        if (!failing && !pending) healthy_by_region[region] += n;
        total_by_region[region] += n;
      }
      {
        std::lock_guard lock(mutex_);
        for (const auto& [region, total] : total_by_region) {
          max_total_ = std::max(max_total_, total);
          if (watching_) min_healthy_ = std::min(min_healthy_, healthy_by_region[region]);
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  std::shared_ptr<db::Pool> pool_;
  std::shared_ptr<ingest::Ingestor> ingestor_;
  std::mutex mutex_;
  std::set<std::string> failing_;
  std::set<std::string> pending_;
  bool watching_ = false;
  int min_healthy_ = 1 << 20;
  int max_total_ = 0;
  std::atomic<bool> saw_both_{false};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace krane::services::deploy::testing
