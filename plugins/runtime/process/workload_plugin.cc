#include "plugins/runtime/process/workload_plugin.h"

#include <optional>
#include <set>

#include "common/status.h"
#include "common/strings.h"
#include "nlohmann/json.hpp"
#include "plugins/runtime/process/config.h"

namespace krane::runtime {

using nlohmann::json;

ProcessWorkloadPlugin::ProcessWorkloadPlugin(std::string name, std::string type,
                                             const std::string& prefix)
    : name_(std::move(name)), type_(std::move(type)), prefix_(strCat(prefix, "/")) {}

absl::Status ProcessWorkloadPlugin::init(sdk::Host& host, std::string_view config_text) {
  host_ = &host;
  const auto prefixed = [this](const absl::Status& st) {
    return withContext(st, strCat(name_, " config"));
  };
  const json config = json::parse(config_text.empty() ? "{}" : config_text, nullptr, false);
  if (config.is_discarded()) return prefixed(absl::InvalidArgumentError("not valid JSON"));
  if (auto st = onlyKeys(config, "", {"runtime", "process", "kubernetes"}); !st.ok()) {
    return prefixed(st);
  }
  const std::string runtime = config.value("runtime", "process");
  if (runtime != "process") {
    return prefixed(absl::InvalidArgumentError(
        strCat("runtime: \"", runtime, "\" is not served by this build; use process")));
  }
  json section = config.value("process", json::object());
  if (section.is_object()) {
    if (auto st = configure(section, "process"); !st.ok()) return prefixed(st);
  }
  auto options = processOptionsFromJson(section, "process");
  if (!options.ok()) return prefixed(options.status());
  options->on_change = [this](const WorkloadStatus& s) { report(s); };
  stop_on_shutdown_ = options->stop_instances_on_shutdown;
  auto started = ProcessRuntime::start(*std::move(options));
  if (!started.ok()) return prefixed(started.status());
  runtime_ = *std::move(started);
  host.log(sdk::LogLevel::kInfo, strCat(name_, ": process runtime started"));
  return absl::OkStatus();
}

absl::Status ProcessWorkloadPlugin::apply(const cluster::v1::Change& change) {
  const auto& r = change.resource();
  auto spec = workloadFor(r);
  if (!spec.ok()) {
    return withContext(spec.status(), strCat(type_, " ", r.id()));
  }
  if (!spec->has_value()) return removeWorkload(r.id(), r.region(), sdk::resourceVersion(change));
  const std::string revision = revisionOf(**spec);
  // Read before the lock: the runtime reports (and takes this plugin's lock) under its own.
  const auto running = runtime_->status(prefix_ + r.id());
  std::optional<Applied> before;  // what stands if the runtime refuses this spec
  {
    std::lock_guard lock(mutex_);
    const bool known = applied_.count(r.id()) > 0;
    Applied& a = applied_[r.id()];
    if (a.revision.empty() && running) adoptLocked(a, r.id(), *running);
    if (known || !a.revision.empty()) before = a;
    a.id = r.id();
    a.region = r.region();
    a.version = sdk::resourceVersion(change);
    a.image = (*spec)->image;
    if (a.revision != revision) {
      a.revision = revision;
      ++a.generation;
    }
    // Stored with the spec, so that the next plugin host goes on from here.
    (*spec)->labels[kVersionLabel] = std::to_string(a.version);
    (*spec)->labels[kGenerationLabel] = std::to_string(a.generation);
    (*spec)->labels[kRegionLabel] = a.region;
  }
  if (auto st = runtime_->apply(**spec); !st.ok()) {
    // Refused: what runs is still the previous version, and the reports say so (a report of the
    // refused version would tell krane-ctrl it applied).
    std::lock_guard lock(mutex_);
    if (before) {
      applied_[r.id()] = *before;
    } else {
      applied_.erase(r.id());
    }
    return withContext(st, strCat(type_, " ", r.id()));
  }
  // A spec that changes nothing the runtime runs changes no status either: report anyway, so
  // the control plane sees the new version applied.
  if (auto s = runtime_->status(prefix_ + r.id())) report(*s);
  return absl::OkStatus();
}

absl::Status ProcessWorkloadPlugin::remove(const cluster::v1::Change& change) {
  return removeWorkload(change.resource().id(), change.resource().region(),
                        sdk::resourceVersion(change));
}

absl::Status ProcessWorkloadPlugin::removeWorkload(const std::string& resource_id,
                                                   const std::string& region, uint64_t version) {
  KRANE_RETURN_IF_ERROR(runtime_->remove(prefix_ + resource_id));
  Applied applied;
  {
    std::lock_guard lock(mutex_);
    auto it = applied_.find(resource_id);
    if (it != applied_.end()) {
      applied = it->second;
      applied_.erase(it);
    }
  }
  applied.id = resource_id;
  if (!region.empty()) applied.region = region;
  applied.version = version;
  host_->reportStatus(deletedReport(applied));
  return absl::OkStatus();
}

absl::Status ProcessWorkloadPlugin::syncEnd(const plugin::v1::SyncEnd& sync_end) {
  std::set<std::string> keep;
  for (const auto& group : sync_end.resources()) {
    if (group.resource_type() != type_) continue;
    for (const auto& id : group.ids()) keep.insert(prefix_ + id);
  }
  for (const auto& workload : runtime_->workloads()) {
    if (workload.rfind(prefix_, 0) != 0 || keep.count(workload) > 0) continue;
    const std::string id = workload.substr(prefix_.size());
    host_->log(sdk::LogLevel::kInfo,
               strCat(name_, ": ", type_, " ", id, " is not in the desired state; removing it"));
    KRANE_RETURN_IF_ERROR(removeWorkload(id, "", sync_end.snapshot_version()));
  }
  return absl::OkStatus();
}

absl::Status ProcessWorkloadPlugin::observe() {
  for (const auto& id : runtime_->workloads()) {
    if (auto s = runtime_->status(id)) report(*s);
  }
  return absl::OkStatus();
}

void ProcessWorkloadPlugin::shutdown() {
  stopping();
  // By default instances keep running: the next host adopts them.
  if (runtime_) runtime_->shutdown(stop_on_shutdown_);
}

void ProcessWorkloadPlugin::adoptLocked(Applied& a, const std::string& id,
                                        const WorkloadStatus& status) {
  // What an earlier host applied, as it stored it with the spec: the version and generation go
  // on from there, so that reports are not taken for older ones (the control plane drops those).
  const auto label = [&](const char* key) {
    auto it = status.labels.find(key);
    return it == status.labels.end() ? std::string() : it->second;
  };
  const auto number = [&](const char* key, uint64_t otherwise) -> uint64_t {
    return parseUint64(label(key)).value_or(otherwise);
  };
  a.id = id;
  a.region = label(kRegionLabel);
  a.version = number(kVersionLabel, 0);
  a.revision = status.revision;
  a.image = status.image;
  a.generation = static_cast<int64_t>(number(kGenerationLabel, 1));
}

void ProcessWorkloadPlugin::report(const WorkloadStatus& status) {
  if (status.id.rfind(prefix_, 0) != 0) return;
  // Reports leave in the order they read what was applied (the supervision thread and apply()
  // both report): a report never carries an older applied version than the one before it.
  std::lock_guard lock(mutex_);
  const std::string id = status.id.substr(prefix_.size());
  Applied& a = applied_[id];
  if (a.revision.empty()) adoptLocked(a, id, status);  // nothing applied by this host yet
  if (status.converged && status.revision == a.revision) a.converged_image = a.image;
  host_->reportStatus(statusReport(status, a));
}

}  // namespace krane::runtime
