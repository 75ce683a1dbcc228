// The deployment plugin: owns resource type "deployment_topology" and makes each deployment's
// instances run, then reports them (pending / running / failed with the reason).
//
// Configuration (the agent's `plugins[].config`, as JSON): {"runtime": "process", "process":
// {...}} with the keys of plugins/runtime/process/config.h. Unknown keys are refused by path.
#include "common/strings.h"
#include "plugins/deployment/workload.h"
#include "plugins/runtime/process/workload_plugin.h"

namespace krane::deployment {
namespace {

cluster::v1::ReportDeploymentStatusRequest toReport(const runtime::WorkloadStatus& s,
                                                    const std::string& deployment_id,
                                                    const std::string& region,
                                                    uint64_t applied_version,
                                                    const std::string& applied_revision) {
  cluster::v1::ReportDeploymentStatusRequest r;
  r.set_deployment_id(deployment_id);
  r.set_region(region);
  r.set_applied_version(applied_version);
  auto* set = r.mutable_instances();
  for (const auto& i : s.instances) {
    if (i.phase == runtime::InstancePhase::kTerminating) continue;  // on its way out
    auto* out = set->add_instances();
    out->set_id(i.name);
    out->set_address(i.address);
    // Against what the plugin applied, not the status' own revision: a status read just before
    // a new spec was applied must not count old instances as current.
    out->set_current(i.revision == applied_revision);
    if (i.phase == runtime::InstancePhase::kFailed) {
      out->set_status(cluster::v1::INSTANCE_STATUS_FAILED);
    } else if (i.phase == runtime::InstancePhase::kRunning && i.ready) {
      out->set_status(cluster::v1::INSTANCE_STATUS_RUNNING);
    } else {
      out->set_status(cluster::v1::INSTANCE_STATUS_PENDING);
    }
    std::string reason = i.reason;
    if (!i.last_output.empty()) strAppend(&reason, "; last output: ", i.last_output.back());
    if (!reason.empty()) out->set_failure_reason(reason.substr(0, 2000));
  }
  return r;
}

class DeploymentPlugin final : public runtime::ProcessWorkloadPlugin {
 public:
  DeploymentPlugin()
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
    *report.mutable_deployment() = toReport(status, applied.id, applied.region, applied.version, applied.revision);
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

}  // namespace
}  // namespace krane::deployment

KRANE_DEFINE_PLUGIN(krane::deployment::DeploymentPlugin, "deployment", "0.1.0");
