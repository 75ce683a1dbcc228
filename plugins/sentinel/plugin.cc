// The sentinel plugin: owns resource type "sentinel" and runs each sentinel, then reports its
// replicas, the image it runs once a rollout converged, and its health (paused at zero
// replicas, healthy with an available replica, else unhealthy). An archived sentinel is
// removed. Configuration as for the deployment plugin: {"runtime": "process", "process": {...}}
// (plugins/runtime/process/config.h) or {"runtime": "kubernetes", "kubernetes": {...}}
// (kube_plugin.h).
#include "common/strings.h"
#include "plugins/runtime/process/workload_plugin.h"
#include "plugins/runtime/runtime_switch.h"
#include "plugins/sentinel/kube_plugin.h"
#include "plugins/sentinel/sentinel.h"

namespace krane::sentinel {
namespace {

class ProcessSentinelPlugin final : public runtime::ProcessWorkloadPlugin {
 public:
  ProcessSentinelPlugin() : ProcessWorkloadPlugin("sentinel plugin", "sentinel", "sentinel") {}

 protected:
  absl::StatusOr<std::optional<runtime::WorkloadSpec>> workloadFor(
      const cluster::v1::Resource& r) override {
    if (!r.has_sentinel()) return absl::InvalidArgumentError("the change carries no sentinel");
    const auto& s = r.sentinel();
    if (auto st = validate(s); !st.ok()) return st;
    if (s.desired_state() == cluster::v1::SENTINEL_DESIRED_STATE_ARCHIVED) {
      return std::optional<runtime::WorkloadSpec>();
    }
    return std::optional<runtime::WorkloadSpec>(toWorkload(s, r.id()));
  }

  plugin::v1::StatusReport statusReport(const runtime::WorkloadStatus& status,
                                        const Applied& applied) override {
    plugin::v1::StatusReport report;
    auto* r = report.mutable_sentinel();
    *r = toReport(status, applied.id, applied.generation, applied.converged_image, applied.version);
    r->set_region(applied.region);
    return report;
  }

  plugin::v1::StatusReport deletedReport(const Applied& applied) override {
    // A removed sentinel runs nothing: zero replicas, paused.
    plugin::v1::StatusReport report;
    auto* r = report.mutable_sentinel();
    r->set_sentinel_id(applied.id);
    r->set_region(applied.region);
    r->set_observed_generation(applied.generation);
    r->set_health(cluster::v1::SENTINEL_HEALTH_PAUSED);
    r->set_applied_version(applied.version);
    return report;
  }
};

class SentinelPlugin final
    : public runtime::RuntimeSwitch<ProcessSentinelPlugin, KubeSentinelPlugin> {
 public:
  SentinelPlugin() : RuntimeSwitch("sentinel plugin") {}
};

}  // namespace
}  // namespace krane::sentinel

KRANE_DEFINE_PLUGIN(krane::sentinel::SentinelPlugin, "sentinel", "0.1.0");
