// The sentinel plugin: owns resource type "sentinel" and runs each sentinel, then reports its
// replicas, the image it runs once a rollout converged, and its health (paused at zero
// replicas, healthy with an available replica, else unhealthy). An archived sentinel is
// removed. Configuration as for the deployment plugin: {"runtime": "process", "process": {...}}
// (plugins/runtime/process/config.h) or {"runtime": "kubernetes", "kubernetes": {...}}
// (kube_plugin.h).
//
// On the process runtime each sentinel instance (the routing proxy, proxy/proxy.h) gets
// KRANE_ROUTES_FILE, which a RoutesPublisher (routes_publisher.h) keeps pointing at the ready
// instances of the sentinel's live deployment. Two more keys of the `process` section:
//
//   routes:
//     deployment_state_dir: /var/lib/krane/deployments   # the deployment plugin's state_dir
//     poll_ms: 200                                        # how often endpoints are read
//
// Without deployment_state_dir no addresses are known: routes name the live deployment only.
#include "common/status.h"
#include "common/strings.h"
#include "plugins/runtime/process/config.h"
#include "plugins/runtime/process/workload_plugin.h"
#include "plugins/runtime/runtime_switch.h"
#include "plugins/sentinel/kube_plugin.h"
#include "plugins/sentinel/routes_publisher.h"
#include "plugins/sentinel/sentinel.h"

namespace krane::sentinel {
namespace {

class ProcessSentinelPlugin final : public runtime::ProcessWorkloadPlugin {
 public:
  ProcessSentinelPlugin() : ProcessWorkloadPlugin("sentinel plugin", "sentinel", "sentinel") {}
  ~ProcessSentinelPlugin() override { stopping(); }

 protected:
  absl::Status configure(nlohmann::json& section, const std::string& path) override {
    RoutesPublisherOptions options;
    const std::string state_dir = section.value("state_dir", "");
    options.routes_dir = strCat(state_dir.empty() ? "." : state_dir, "/routes");
    if (section.contains("routes")) {
      const nlohmann::json routes = section["routes"];
      section.erase("routes");
      const std::string at = strCat(path, ".routes");
      KRANE_RETURN_IF_ERROR(runtime::onlyKeys(routes, at, {"deployment_state_dir", "poll_ms"}));
      if (routes.contains("deployment_state_dir")) {
        if (!routes["deployment_state_dir"].is_string()) {
          return absl::InvalidArgumentError(
              strCat(at, ".deployment_state_dir: must be a directory path"));
        }
        options.deployment_state_dir = routes["deployment_state_dir"].get<std::string>();
      }
      KRANE_ASSIGN_OR_RETURN(int poll_ms, runtime::intAt(routes, "poll_ms", at, 200, 10, 60000));
      options.poll = std::chrono::milliseconds(poll_ms);
    }
    if (state_dir.empty()) return absl::OkStatus();  // the runtime refuses it, naming the key
    routes_ = std::make_unique<RoutesPublisher>(std::move(options));
    routes_->start();
    return absl::OkStatus();
  }

  void stopping() override {
    if (routes_) routes_->stop();
  }

  absl::StatusOr<std::optional<runtime::WorkloadSpec>> workloadFor(
      const cluster::v1::Resource& r) override {
    if (!r.has_sentinel()) return absl::InvalidArgumentError("the change carries no sentinel");
    const auto& s = r.sentinel();
    if (auto st = validate(s); !st.ok()) return st;
    if (s.desired_state() == cluster::v1::SENTINEL_DESIRED_STATE_ARCHIVED) {
      return std::optional<runtime::WorkloadSpec>();
    }
    runtime::WorkloadSpec spec = toWorkload(s, r.id());
    // The routes are not part of the spec: a new live deployment must not restart the proxy.
    routes_->setLive(r.id(), s.live_deployment_id(), s.rolling_deployment_id());
    spec.env["KRANE_ROUTES_FILE"] = routes_->routesFile(r.id());
    return std::optional<runtime::WorkloadSpec>(std::move(spec));
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
    routes_->forget(applied.id);
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

 private:
  std::unique_ptr<RoutesPublisher> routes_;
};

class SentinelPlugin final
    : public runtime::RuntimeSwitch<ProcessSentinelPlugin, KubeSentinelPlugin> {
 public:
  SentinelPlugin() : RuntimeSwitch("sentinel plugin") {}
};

}  // namespace
}  // namespace krane::sentinel

KRANE_DEFINE_PLUGIN(krane::sentinel::SentinelPlugin, "sentinel", "0.1.0");
