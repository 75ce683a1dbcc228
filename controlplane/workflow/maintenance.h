// Background housekeeping of the workflow tables, one thread per replica (running it on several
// replicas is harmless): the watchdog that reports keys held longer than a threshold, and the
// retention cleanup of finished invocations.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <prometheus/metric_family.h>

#include "absl/status/statusor.h"
#include "controlplane/db/pool.h"
#include "controlplane/workflow/operations.h"

namespace krane::workflow {

struct MaintenanceOptions {
  std::chrono::milliseconds interval{60000};
  // A key held by one exclusive invocation for longer than this is reported (logged once per
  // holder, and counted in krane_workflow_keys_held_too_long).
  std::chrono::milliseconds watchdog_threshold{std::chrono::hours(1)};
  // Finished invocations are deleted this long after they finished.
  std::chrono::milliseconds retention{std::chrono::hours(24 * 7)};
  // Called with every key over the threshold on every pass (besides the log line).
  std::function<void(const HeldKey&)> on_stuck_key;
};

struct MaintenanceReport {
  std::vector<HeldKey> stuck;
  CleanupResult cleaned;
};

class Maintenance {
 public:
  Maintenance(std::shared_ptr<db::Pool> pool, MaintenanceOptions options);
  ~Maintenance();
  void start();
  void stop();
  // One pass: watchdog, then cleanup.
  absl::StatusOr<MaintenanceReport> runOnce();
  std::vector<prometheus::MetricFamily> metrics() const;

 private:
  std::shared_ptr<db::Pool> pool_;
  MaintenanceOptions options_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
  std::vector<std::string> reported_;  // holders already logged
  std::atomic<uint64_t> stuck_{0};
  std::atomic<uint64_t> deleted_{0};
  std::atomic<uint64_t> failures_{0};
};

}  // namespace krane::workflow
