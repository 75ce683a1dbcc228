#include "plugins/deployment/workload.h"

#include <algorithm>
#include <csignal>
#include <map>

#include "common/strings.h"

namespace krane::deployment {
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

std::string workloadId(const std::string& deployment_id) {
  return strCat("deployment/", deployment_id);
}

absl::StatusOr<int> signalNumber(const std::string& name) {
  static const std::map<std::string, int> kSignals = {
      {"TERM", SIGTERM}, {"INT", SIGINT},   {"QUIT", SIGQUIT}, {"HUP", SIGHUP},
      {"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"KILL", SIGKILL}, {"WINCH", SIGWINCH},
  };
  if (name.empty()) return SIGTERM;
  const std::string bare = name.rfind("SIG", 0) == 0 ? name.substr(3) : name;
  auto it = kSignals.find(bare);
  if (it == kSignals.end()) {
    return absl::InvalidArgumentError(strCat("shutdown_signal: \"", name,
                                             "\" is not one of SIGTERM, SIGINT, SIGQUIT, SIGHUP, "
                                             "SIGUSR1, SIGUSR2, SIGKILL, SIGWINCH"));
  }
  return it->second;
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
  w.liveness = probe(t.healthcheck().liveness());
  w.readiness = probe(t.healthcheck().readiness());
  auto sig = signalNumber(t.shutdown_signal());
  if (!sig.ok()) return sig.status();
  w.shutdown_signal = *sig;
  w.grace = std::chrono::seconds(
      t.termination_grace_period_seconds() > 0 ? t.termination_grace_period_seconds() : 30);
  return w;
}

}  // namespace krane::deployment
