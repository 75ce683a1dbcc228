#include "plugins/deployment/workload.h"

#include <algorithm>
#include <map>

#include "common/strings.h"
#include "controlplane/strategy/rolling.h"

namespace krane::deployment {
namespace {

// The instance's reason with its last output lines (at most kReasonLines, each cut to
// kReasonLineBytes), so that whoever reads a failed deploy sees why without a shell on the host;
// at most kReasonBytes in all, never cut inside a UTF-8 sequence.
constexpr size_t kReasonLines = 5;
constexpr size_t kReasonLineBytes = 300;
constexpr size_t kReasonBytes = 2000;

std::string utf8Prefix(const std::string& s, size_t max_bytes) {
  if (s.size() <= max_bytes) return s;
  size_t cut = max_bytes;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  return s.substr(0, cut);
}

std::string failureReason(const runtime::InstanceStatus& i) {
  std::string reason = i.reason;
  if (!i.last_output.empty()) {
    strAppend(&reason, "; last output:");
    const size_t first =
        i.last_output.size() > kReasonLines ? i.last_output.size() - kReasonLines : 0;
    for (size_t k = first; k < i.last_output.size(); ++k) {
      strAppend(&reason, "\n  | ", utf8Prefix(i.last_output[k], kReasonLineBytes));
    }
  }
  return utf8Prefix(reason, kReasonBytes);
}

}  // namespace

namespace {

runtime::HttpProbe probe(const cluster::v1::HttpProbe& p) {
  runtime::HttpProbe out;
  out.path = p.path();
  // Zero means the runtime's default, as in Kubernetes.
  out.initial_delay = std::chrono::seconds(p.initial_delay_seconds());
  if (p.period_seconds() > 0) out.interval = std::chrono::seconds(p.period_seconds());
  if (p.timeout_seconds() > 0) out.timeout = std::chrono::seconds(p.timeout_seconds());
  if (p.failure_threshold() > 0) out.failure_threshold = static_cast<int>(p.failure_threshold());
  return out;
}

}  // namespace

const std::vector<std::pair<std::string, std::string>> kNotOnProcessRuntime = {
    {"workspace_id", "identity: carried in the report, not by the process"},
    {"project_id", "identity: carried in the report, not by the process"},
    {"region", "one agent per region: the runtime is the region"},
    {"labels", "labels select objects in a cluster; processes have none"},
    {"autoscaling", "no metrics pipeline on one machine: replicas are clamped into min..max"},
};
// rolling_update reaches the workload: surge, unavailable and min_ready shape its roll.

std::string workloadId(const std::string& deployment_id) {
  return strCat("deployment/", deployment_id);
}

absl::StatusOr<runtime::WorkloadSpec> toWorkload(const cluster::v1::DeploymentTopology& t,
                                                 const std::string& deployment_id) {
  runtime::WorkloadSpec w;
  w.id = workloadId(deployment_id);
  w.image = t.image();
  w.command.assign(t.command().begin(), t.command().end());
  w.args.assign(t.args().begin(), t.args().end());
  for (const auto& e : t.env()) {
    if (e.name().empty()) return absl::InvalidArgumentError("env[].name: required");
    w.env[e.name()] = e.value();
  }
  w.env["KRANE_DEPLOYMENT_ID"] = t.deployment_id().empty() ? deployment_id : t.deployment_id();
  if (!t.app_id().empty()) w.env["KRANE_APP_ID"] = t.app_id();
  if (!t.environment_id().empty()) w.env["KRANE_ENVIRONMENT_ID"] = t.environment_id();
  if (t.port() > 0) w.env["KRANE_APP_PORT"] = std::to_string(t.port());
  if (t.cpu_millicores() > 0) w.env["KRANE_CPU_MILLICORES"] = std::to_string(t.cpu_millicores());
  if (t.memory_mib() > 0) w.env["KRANE_MEMORY_MIB"] = std::to_string(t.memory_mib());
  uint32_t replicas = t.replicas();
  if (t.has_autoscaling() && t.autoscaling().max_replicas() > 0) {
    replicas = std::clamp(replicas, t.autoscaling().min_replicas(), t.autoscaling().max_replicas());
  }
  if (t.desired_status() == cluster::v1::DESIRED_STATUS_STOPPED) replicas = 0;
  w.replicas = static_cast<int>(replicas);
  // The roll: the topology's spec, resolved for its replicas (percentages as Kubernetes does).
  if (t.has_rolling_update()) {
    if (auto st = strategy::checkRollingUpdate(t.rolling_update(), "rolling_update."); !st.ok()) {
      return st;
    }
  }
  const strategy::ResolvedSpec roll =
      strategy::resolve(strategy::specOf(t.rolling_update()), replicas);
  w.max_surge = static_cast<int>(roll.max_surge);
  w.max_unavailable = static_cast<int>(roll.max_unavailable);
  w.min_ready = std::chrono::seconds(t.rolling_update().min_ready_seconds());
  w.liveness = probe(t.healthcheck().liveness());
  w.readiness = probe(t.healthcheck().readiness());
  auto sig = signalNumber(t.shutdown_signal());
  if (!sig.ok()) return sig.status();
  w.shutdown_signal = *sig;
  w.grace = std::chrono::seconds(
      t.termination_grace_period_seconds() > 0 ? t.termination_grace_period_seconds() : 30);
  return w;
}

cluster::v1::ReportDeploymentStatusRequest deploymentReport(const runtime::WorkloadStatus& s,
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
    if (!applied_revision.empty()) out->set_current(i.revision == applied_revision);
    if (i.phase == runtime::InstancePhase::kFailed) {
      out->set_status(cluster::v1::INSTANCE_STATUS_FAILED);
    } else if (i.phase == runtime::InstancePhase::kRunning && i.ready) {
      out->set_status(cluster::v1::INSTANCE_STATUS_RUNNING);
    } else {
      out->set_status(cluster::v1::INSTANCE_STATUS_PENDING);
    }
    const std::string reason = failureReason(i);
    if (!reason.empty()) out->set_failure_reason(reason);
  }
  return r;
}

}  // namespace krane::deployment
