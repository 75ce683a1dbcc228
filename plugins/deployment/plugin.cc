// The deployment plugin: owns resource type "deployment_topology" and makes each deployment's
// instances run, then reports them (pending / running / failed with the reason).
//
// Configuration (the agent's `plugins[].config`, as JSON): {"runtime": "process", "process":
// {...}} with the keys of plugins/runtime/process/config.h, or {"runtime": "kubernetes",
// "kubernetes": {...}} (kube_plugin.h). Unknown keys are refused by path.
#include "common/strings.h"
#include "plugins/deployment/kube_plugin.h"
#include "plugins/deployment/workload.h"
#include "plugins/runtime/process/workload_plugin.h"
#include "plugins/runtime/runtime_switch.h"

namespace krane::deployment {
namespace {

class ProcessDeploymentPlugin final : public runtime::ProcessWorkloadPlugin {
 public:
  ProcessDeploymentPlugin()
      : ProcessWorkloadPlugin("deployment plugin", "deployment_topology", "deployment") {}

 protected:
  absl::StatusOr<std::optional<runtime::WorkloadSpec>> workloadFor(
      const cluster::v1::Resource& r) override {
    if (!r.has_deployment_topology()) {
      return absl::InvalidArgumentError("the change carries no deployment_topology");
    }
    auto spec = toWorkload(r.deployment_topology(), r.id());
    if (!spec.ok()) return spec.status();
    return std::optional<runtime::WorkloadSpec>(*std::move(spec));
  }

  plugin::v1::StatusReport statusReport(const runtime::WorkloadStatus& status,
                                        const Applied& applied) override {
    plugin::v1::StatusReport report;
    *report.mutable_deployment() =
        deploymentReport(status, applied.id, applied.region, applied.version, applied.revision);
    return report;
  }

  plugin::v1::StatusReport deletedReport(const Applied& applied) override {
    plugin::v1::StatusReport report;
    auto* d = report.mutable_deployment();
    d->set_deployment_id(applied.id);
    d->set_region(applied.region);
    d->set_deleted(true);
    d->set_applied_version(applied.version);
    return report;
  }
};

class DeploymentPlugin final
    : public runtime::RuntimeSwitch<ProcessDeploymentPlugin, KubeDeploymentPlugin> {
 public:
  DeploymentPlugin() : RuntimeSwitch("deployment plugin") {}
};

}  // namespace
}  // namespace krane::deployment

KRANE_DEFINE_PLUGIN(krane::deployment::DeploymentPlugin, "deployment", "0.1.0");
