#include "controlplane/workflow/maintenance.h"

#include <algorithm>

#include "common/status.h"
#include "common/strings.h"
#include "spdlog/spdlog.h"

namespace krane::workflow {

Maintenance::Maintenance(std::shared_ptr<db::Pool> pool, MaintenanceOptions options)
    : pool_(std::move(pool)), options_(std::move(options)) {}

Maintenance::~Maintenance() { stop(); }

void Maintenance::start() {
  std::lock_guard lock(mutex_);
  if (thread_.joinable()) return;
  stopping_ = false;
  thread_ = std::thread([this] {
    std::unique_lock lock(mutex_);
    while (!stopping_) {
      lock.unlock();
      auto report = runOnce();
      if (!report.ok()) {
        failures_.fetch_add(1, std::memory_order_relaxed);
        spdlog::warn("workflow: maintenance pass failed error=\"{}\"", report.status().message());
      }
      lock.lock();
      wake_.wait_for(lock, options_.interval, [&] { return stopping_; });
    }
  });
}

void Maintenance::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

absl::StatusOr<MaintenanceReport> Maintenance::runOnce() {
  MaintenanceReport report;
  KRANE_ASSIGN_OR_RETURN(report.stuck, keysHeldLongerThan(*pool_, options_.watchdog_threshold));
  stuck_.store(report.stuck.size(), std::memory_order_relaxed);
  std::vector<std::string> holders;
  for (const HeldKey& k : report.stuck) {
    holders.push_back(k.holder);
    if (std::find(reported_.begin(), reported_.end(), k.holder) == reported_.end()) {
      spdlog::warn(
          "workflow: key held too long service={} key={} holder={} handler={} status={} "
          "held_s={} queued={} (cancel, kill or resume the holder: krane-ctrl workflow ...)",
          k.service, k.key, k.holder, k.holder_handler, k.holder_status, k.held_ms / 1000,
          k.queued);
    }
    if (options_.on_stuck_key) options_.on_stuck_key(k);
  }
  reported_ = std::move(holders);
  KRANE_ASSIGN_OR_RETURN(report.cleaned, cleanupFinished(*pool_, options_.retention));
  deleted_.fetch_add(report.cleaned.invocations, std::memory_order_relaxed);
  if (report.cleaned.invocations > 0) {
    spdlog::info("workflow: retention cleanup invocations={} journal_entries={} promises={}",
                 report.cleaned.invocations, report.cleaned.journal_entries,
                 report.cleaned.promises);
  }
  return report;
}

std::vector<prometheus::MetricFamily> Maintenance::metrics() const {
  using prometheus::MetricType;
  std::vector<prometheus::MetricFamily> out;
  auto one = [&](const char* name, const char* help, MetricType type, double value) {
    prometheus::MetricFamily f;
    f.name = name;
    f.help = help;
    f.type = type;
    prometheus::ClientMetric m;
    if (type == MetricType::Counter) {
      m.counter.value = value;
    } else {
      m.gauge.value = value;
    }
    f.metric.push_back(m);
    out.push_back(std::move(f));
  };
  one("krane_workflow_keys_held_too_long", "Keys held longer than the watchdog threshold",
      MetricType::Gauge, static_cast<double>(stuck_.load()));
  one("krane_workflow_cleaned_total", "Finished invocations deleted after their retention",
      MetricType::Counter, static_cast<double>(deleted_.load()));
  one("krane_workflow_maintenance_failures_total", "Maintenance passes that failed",
      MetricType::Counter, static_cast<double>(failures_.load()));
  return out;
}

}  // namespace krane::workflow
