// The deployment plugin: owns resource type "deployment_topology" and makes each deployment's
// instances run, then reports them (pending / running / failed with the reason).
//
// Configuration (the agent's `plugins[].config`, as JSON):
//   runtime: process                  # process (local processes); kubernetes is not served yet
//   process:
//     state_dir: /var/lib/krane/deployments   # required: instances, logs, stored specs
//     ports: {from: 20000, to: 20999}          # one port per instance, given as PORT
//     images:                                  # image name -> argv, "{tag}" replaced
//       krane.dev/demo-app: [/usr/lib/krane/krane-demo-app, --version, "{tag}"]
//     restart_backoff_ms: {min: 1000, max: 60000}
// Unknown keys are refused with their path.
#include "plugins/sdk/plugin.h"

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <set>

#include "common/status.h"
#include "common/strings.h"
#include "nlohmann/json.hpp"
#include "plugins/deployment/workload.h"
#include "plugins/runtime/process/process_runtime.h"

namespace krane::deployment {
namespace {

using nlohmann::json;
constexpr std::string_view kType = "deployment_topology";
constexpr std::string_view kPrefix = "deployment/";

// Refuses keys of `object` (at `path`) that are not in `known`.
absl::Status onlyKeys(const json& object, const std::string& path,
                      std::initializer_list<std::string_view> known) {
  if (!object.is_object()) return absl::InvalidArgumentError(strCat(path, ": must be a mapping"));
  for (const auto& [key, _] : object.items()) {
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      return absl::InvalidArgumentError(
          strCat(path.empty() ? "" : strCat(path, "."), key, ": unknown key"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int> intAt(const json& object, const std::string& key, const std::string& path,
                          int fallback, int min, int max) {
  if (!object.contains(key)) return fallback;
  const json& v = object.at(key);
  if (!v.is_number_integer() || v.get<int64_t>() < min || v.get<int64_t>() > max) {
    return absl::InvalidArgumentError(strCat(path, ".", key, ": must be a whole number between ",
                                             min, " and ", max, ", got ", v.dump()));
  }
  return v.get<int>();
}

absl::StatusOr<runtime::ProcessRuntimeOptions> processOptions(const json& config) {
  KRANE_RETURN_IF_ERROR(
      onlyKeys(config, "process", {"state_dir", "ports", "images", "restart_backoff_ms"}));
  runtime::ProcessRuntimeOptions o;
  if (!config.contains("state_dir") || !config["state_dir"].is_string() ||
      config["state_dir"].get<std::string>().empty()) {
    return absl::InvalidArgumentError("process.state_dir: required (a directory)");
  }
  o.state_dir = config["state_dir"].get<std::string>();
  if (config.contains("ports")) {
    const json& ports = config["ports"];
    KRANE_RETURN_IF_ERROR(onlyKeys(ports, "process.ports", {"from", "to"}));
    KRANE_ASSIGN_OR_RETURN(o.port_from, intAt(ports, "from", "process.ports", 20000, 1, 65535));
    KRANE_ASSIGN_OR_RETURN(o.port_to, intAt(ports, "to", "process.ports", 20999, 1, 65535));
    if (o.port_from > o.port_to) {
      return absl::InvalidArgumentError(
          strCat("process.ports: from ", o.port_from, " is above to ", o.port_to));
    }
  }
  if (config.contains("images")) {
    const json& images = config["images"];
    if (!images.is_object()) {
      return absl::InvalidArgumentError("process.images: must be a mapping of image to argv");
    }
    for (const auto& [name, argv] : images.items()) {
      const std::string path = strCat("process.images.", name);
      if (!argv.is_array() || argv.empty()) {
        return absl::InvalidArgumentError(strCat(path, ": must be a non-empty list of strings"));
      }
      for (const auto& a : argv) {
        if (!a.is_string())
          return absl::InvalidArgumentError(strCat(path, ": ", a.dump(), " is not a string"));
        o.images[name].push_back(a.get<std::string>());
      }
      if (o.images[name][0].empty() || o.images[name][0][0] != '/') {
        return absl::InvalidArgumentError(strCat(path, ": the program must be an absolute path"));
      }
    }
  }
  if (config.contains("restart_backoff_ms")) {
    const json& b = config["restart_backoff_ms"];
    KRANE_RETURN_IF_ERROR(onlyKeys(b, "process.restart_backoff_ms", {"min", "max"}));
    KRANE_ASSIGN_OR_RETURN(int min,
                           intAt(b, "min", "process.restart_backoff_ms", 1000, 10, 600000));
    KRANE_ASSIGN_OR_RETURN(int max,
                           intAt(b, "max", "process.restart_backoff_ms", 60000, 10, 3600000));
    o.restart.initial = std::chrono::milliseconds(min);
    o.restart.max = std::chrono::milliseconds(std::max(min, max));
  }
  return o;
}

cluster::v1::ReportDeploymentStatusRequest toReport(const runtime::WorkloadStatus& s,
                                                    const std::string& deployment_id,
                                                    const std::string& region,
                                                    uint64_t applied_version) {
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

class DeploymentPlugin final : public sdk::Plugin {
 public:
  absl::Status init(sdk::Host& host, std::string_view config_text) override {
    host_ = &host;
    const json config = json::parse(config_text.empty() ? "{}" : config_text, nullptr, false);
    if (config.is_discarded()) {
      return absl::InvalidArgumentError("deployment plugin: the configuration is not JSON");
    }
    KRANE_RETURN_IF_ERROR(prefixed(onlyKeys(config, "", {"runtime", "process"})));
    const std::string runtime = config.value("runtime", "process");
    if (runtime != "process") {
      return absl::InvalidArgumentError(strCat("deployment plugin: runtime: \"", runtime,
                                               "\" is not served by this build; use process"));
    }
    auto options = processOptions(config.value("process", json::object()));
    if (!options.ok()) return prefixed(options.status());
    options->on_change = [this](const runtime::WorkloadStatus& s) { report(s); };
    auto started = runtime::ProcessRuntime::start(*std::move(options));
    if (!started.ok()) return prefixed(started.status());
    runtime_ = *std::move(started);
    host.log(sdk::LogLevel::kInfo, "deployment plugin: process runtime started");
    return absl::OkStatus();
  }

  std::vector<std::string> resourceTypes() override { return {std::string(kType)}; }

  absl::Status apply(const cluster::v1::Change& change) override {
    const auto& r = change.resource();
    if (!r.has_deployment_topology()) {
      return absl::InvalidArgumentError(
          strCat("deployment ", r.id(), ": the change carries no deployment_topology"));
    }
    auto spec = toWorkload(r.deployment_topology(), r.id());
    if (!spec.ok()) {
      return absl::InvalidArgumentError(
          strCat("deployment ", r.id(), ": ", spec.status().message()));
    }
    {
      std::lock_guard lock(mutex_);
      known_[spec->id] = {r.id(), r.region(), change.version()};
    }
    if (auto st = runtime_->apply(*spec); !st.ok()) {
      return absl::Status(st.code(), strCat("deployment ", r.id(), ": ", st.message()));
    }
    return absl::OkStatus();
  }

  absl::Status remove(const cluster::v1::Change& change) override {
    const auto& r = change.resource();
    KRANE_RETURN_IF_ERROR(runtime_->remove(workloadId(r.id())));
    reportDeleted(r.id(), r.region(), change.version());
    return absl::OkStatus();
  }

  absl::Status syncEnd(const plugin::v1::SyncEnd& sync_end) override {
    std::set<std::string> keep;
    for (const auto& group : sync_end.resources()) {
      if (group.resource_type() != kType) continue;
      for (const auto& id : group.ids()) keep.insert(workloadId(id));
    }
    for (const auto& id : runtime_->workloads()) {
      if (id.rfind(kPrefix, 0) != 0 || keep.count(id) > 0) continue;
      const std::string deployment_id = id.substr(kPrefix.size());
      host_->log(sdk::LogLevel::kInfo, strCat("deployment plugin: ", deployment_id,
                                              " is not in the desired state; removing"));
      KRANE_RETURN_IF_ERROR(runtime_->remove(id));
      std::string region;
      {
        std::lock_guard lock(mutex_);
        if (auto it = known_.find(id); it != known_.end()) region = it->second.region;
      }
      reportDeleted(deployment_id, region, sync_end.snapshot_version());
    }
    return absl::OkStatus();
  }

  absl::Status observe() override {
    for (const auto& id : runtime_->workloads()) {
      if (auto s = runtime_->status(id)) report(*s);
    }
    return absl::OkStatus();
  }

  void shutdown() override {
    // Instances keep running: the next host adopts them.
    if (runtime_) runtime_->shutdown(/*stop_instances=*/false);
  }

 private:
  struct Known {
    std::string deployment_id;
    std::string region;
    uint64_t version = 0;
  };

  static absl::Status prefixed(const absl::Status& st) {
    if (st.ok()) return st;
    return absl::Status(st.code(), strCat("deployment plugin config: ", st.message()));
  }

  void report(const runtime::WorkloadStatus& s) {
    if (s.id.rfind(kPrefix, 0) != 0) return;
    Known known;
    {
      std::lock_guard lock(mutex_);
      auto it = known_.find(s.id);
      if (it != known_.end()) known = it->second;
    }
    if (known.deployment_id.empty()) known.deployment_id = s.id.substr(kPrefix.size());
    plugin::v1::StatusReport report;
    *report.mutable_deployment() = toReport(s, known.deployment_id, known.region, known.version);
    host_->reportStatus(report);
  }

  void reportDeleted(const std::string& deployment_id, const std::string& region,
                     uint64_t version) {
    {
      std::lock_guard lock(mutex_);
      known_.erase(workloadId(deployment_id));
    }
    plugin::v1::StatusReport report;
    auto* d = report.mutable_deployment();
    d->set_deployment_id(deployment_id);
    d->set_region(region);
    d->set_deleted(true);
    d->set_applied_version(version);
    host_->reportStatus(report);
  }

  sdk::Host* host_ = nullptr;
  std::unique_ptr<runtime::ProcessRuntime> runtime_;
  std::mutex mutex_;
  std::map<std::string, Known> known_;  // workload id -> what the last apply said
};

}  // namespace
}  // namespace krane::deployment

KRANE_DEFINE_PLUGIN(krane::deployment::DeploymentPlugin, "deployment", "0.1.0");
