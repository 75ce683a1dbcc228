// The Cilium plugin: owns resource type "cilium_network_policy". Each policy is checked
// (policy.h), then held by the configured runtime:
//   kubernetes  server-side applied as a cilium.io/v2 CiliumNetworkPolicy, deleted on a delete
//               change, and after a full sync every managed policy the sync did not list is
//               deleted (found by app.kubernetes.io/managed-by=krane and component=cilium-policy);
//   process     recorded as a file under the state directory and reported READY with "not
//               enforced on the process runtime" (nothing on one machine enforces it).
// An invalid policy is reported FAILED with the reason (ReportResourceStatusRequest.apply_error)
// and refused as INVALID, so the agent parks that version until a newer one arrives.
//
// Configuration (JSON; unknown keys are refused with their path):
//   {"runtime": "process", "process": {"state_dir": "/var/lib/krane/cilium"}}
//   {"runtime": "kubernetes",
//    "kubernetes": {"kubeconfig": "",      # empty: the in-cluster service account
//                   "context": "",         # kubeconfig context; empty: its current one
//                   "namespace": "",       # for policies without metadata.namespace; empty: the
//                                          # workspace's namespace
//                   "qps": 20, "burst": 40}}
#include "plugins/sdk/plugin.h"

#include <map>
#include <memory>
#include <mutex>
#include <set>

#include "common/status.h"
#include "common/strings.h"
#include "nlohmann/json.hpp"
#include "plugins/cilium/kube_store.h"
#include "plugins/cilium/policy.h"
#include "plugins/cilium/store.h"
#include "plugins/runtime/kubernetes/client.h"
#include "plugins/runtime/kubernetes/config.h"
#include "plugins/runtime/process/config.h"

namespace krane::cilium {
namespace {

using nlohmann::json;

constexpr char kPluginName[] = "cilium";

absl::StatusOr<std::string> stringAt(const json& object, const std::string& key,
                                     const std::string& path) {
  if (!object.contains(key)) return std::string();
  if (!object[key].is_string()) {
    return absl::InvalidArgumentError(strCat(path, ".", key, ": must be a string"));
  }
  return object[key].get<std::string>();
}

class CiliumPlugin final : public sdk::Plugin {
 public:
  absl::Status init(sdk::Host& host, std::string_view config_text) override {
    host_ = &host;
    auto st = configure(config_text);
    if (!st.ok()) return withContext(st, "cilium plugin config");
    host.log(sdk::LogLevel::kInfo, strCat("cilium plugin: ", runtime_, " runtime"));
    return absl::OkStatus();
  }

  std::vector<std::string> resourceTypes() override { return {kResourceType}; }

  absl::Status apply(const cluster::v1::Change& change) override {
    const auto& r = change.resource();
    if (!r.has_cilium_network_policy()) {
      return refuse(change,
                    absl::InvalidArgumentError("the change carries no cilium_network_policy"));
    }
    auto object = policyObject(r.cilium_network_policy(), r.id(), default_namespace_);
    if (!object.ok()) return refuse(change, object.status());
    auto applied = store_->apply(r.id(), *object, sdk::resourceVersion(change));
    if (!applied.ok()) {
      if (applied.status().code() == absl::StatusCode::kInvalidArgument) {
        return refuse(change, applied.status());
      }
      return absl::Status(applied.status().code(), strCat("cilium_network_policy ", r.id(), ": ",
                                                          applied.status().message()));
    }
    report(r.id(), r.region(), sdk::resourceVersion(change), cluster::v1::RESOURCE_PHASE_READY,
           *applied);
    return absl::OkStatus();
  }

  absl::Status remove(const cluster::v1::Change& change) override {
    const auto& r = change.resource();
    KRANE_RETURN_IF_ERROR(removePolicy(r.id(), r.region(), sdk::resourceVersion(change)));
    return absl::OkStatus();
  }

  absl::Status syncEnd(const plugin::v1::SyncEnd& sync_end) override {
    std::set<std::string> keep;
    for (const auto& group : sync_end.resources()) {
      if (group.resource_type() != kResourceType) continue;
      keep.insert(group.ids().begin(), group.ids().end());
    }
    KRANE_ASSIGN_OR_RETURN(auto held, store_->list(""));
    std::set<std::string> removed;
    for (const auto& h : held) {
      if (!h.id.empty() && keep.count(h.id) > 0) continue;
      // Another region's agent shares the cluster: its policies are not this sync's business.
      if (!h.region.empty() && !sync_end.region().empty() && h.region != sync_end.region()) {
        continue;
      }
      host_->log(
          sdk::LogLevel::kInfo,
          strCat("cilium plugin: policy ", h.id.empty() ? "(no id)" : h.id, " (", h.ns,
                 h.ns.empty() ? "" : "/", h.name, ") is not in the desired state; removing it"));
      KRANE_RETURN_IF_ERROR(store_->erase(h));
      if (!h.id.empty()) removed.insert(h.id);
    }
    for (const auto& id : removed) {
      report(id, "", sync_end.snapshot_version(), cluster::v1::RESOURCE_PHASE_DELETED,
             "removed: not in the desired state");
    }
    return absl::OkStatus();
  }

  absl::Status observe() override {
    std::vector<cluster::v1::ReportResourceStatusRequest> latest;
    {
      std::lock_guard lock(mutex_);
      for (const auto& [id, r] : latest_) latest.push_back(r);
    }
    for (const auto& r : latest) host_->reportResourceStatus(r);
    return absl::OkStatus();
  }

 private:
  absl::Status configure(std::string_view config_text) {
    const json config = json::parse(config_text.empty() ? "{}" : config_text, nullptr, false);
    if (config.is_discarded()) return absl::InvalidArgumentError("not valid JSON");
    KRANE_RETURN_IF_ERROR(runtime::onlyKeys(config, "", {"runtime", "process", "kubernetes"}));
    KRANE_ASSIGN_OR_RETURN(runtime_, stringAt(config, "runtime", ""));
    if (runtime_.empty()) runtime_ = "process";
    if (runtime_ == "process") {
      if (config.contains("kubernetes")) {
        return absl::InvalidArgumentError("kubernetes: only for runtime kubernetes");
      }
      const json process = config.value("process", json::object());
      KRANE_RETURN_IF_ERROR(runtime::onlyKeys(process, "process", {"state_dir"}));
      KRANE_ASSIGN_OR_RETURN(const std::string dir, stringAt(process, "state_dir", "process"));
      if (dir.empty()) {
        return absl::InvalidArgumentError("process.state_dir: required (a directory)");
      }
      KRANE_ASSIGN_OR_RETURN(store_, makeProcessStore(dir));
      return absl::OkStatus();
    }
    if (runtime_ != "kubernetes") {
      return absl::InvalidArgumentError(
          strCat("runtime: must be process or kubernetes, got \"", runtime_, "\""));
    }
    if (config.contains("process")) {
      return absl::InvalidArgumentError("process: only for runtime process");
    }
    const json k = config.value("kubernetes", json::object());
    KRANE_RETURN_IF_ERROR(
        runtime::onlyKeys(k, "kubernetes", {"kubeconfig", "context", "namespace", "qps", "burst"}));
    KRANE_ASSIGN_OR_RETURN(const std::string kubeconfig, stringAt(k, "kubeconfig", "kubernetes"));
    KRANE_ASSIGN_OR_RETURN(const std::string context, stringAt(k, "context", "kubernetes"));
    KRANE_ASSIGN_OR_RETURN(default_namespace_, stringAt(k, "namespace", "kubernetes"));
    if (!default_namespace_.empty() && !isDnsLabel(default_namespace_)) {
      return absl::InvalidArgumentError(
          strCat("kubernetes.namespace: \"", default_namespace_, "\" is not a valid namespace"));
    }
    kube::ClientOptions options;
    options.qps = 20;
    options.burst = 40;
    KRANE_ASSIGN_OR_RETURN(const int qps, runtime::intAt(k, "qps", "kubernetes", 20, 0, 100000));
    KRANE_ASSIGN_OR_RETURN(options.burst, runtime::intAt(k, "burst", "kubernetes", 40, 1, 100000));
    options.qps = qps;
    if (!context.empty() && kubeconfig.empty()) {
      return absl::InvalidArgumentError("kubernetes.context: needs kubernetes.kubeconfig");
    }
    auto cluster = kubeconfig.empty() ? kube::inClusterConfig()
                                      : kube::kubeconfigFromFile(kubeconfig, context);
    if (!cluster.ok()) {
      return absl::Status(cluster.status().code(),
                          strCat("kubernetes: ", cluster.status().message()));
    }
    KRANE_ASSIGN_OR_RETURN(client_, kube::Client::create(*std::move(cluster), options));
    store_ = makeKubeStore(*client_);
    return absl::OkStatus();
  }

  // Reports `error` (why this version can never be applied) and returns it as INVALID.
  absl::Status refuse(const cluster::v1::Change& change, const absl::Status& error) {
    const auto& r = change.resource();
    const std::string message = strCat("invalid policy: ", error.message());
    cluster::v1::ReportResourceStatusRequest status =
        statusOf(r.id(), r.region(), sdk::resourceVersion(change),
                 cluster::v1::RESOURCE_PHASE_FAILED, message);
    auto* e = status.mutable_apply_error();
    e->set_code(KRANE_INVALID);
    e->set_message(message);
    e->set_retryable(false);
    e->set_attempts(1);
    send(status);
    return absl::InvalidArgumentError(strCat("cilium_network_policy ", r.id(), ": ", message));
  }

  absl::Status removePolicy(const std::string& id, const std::string& region, uint64_t version) {
    KRANE_ASSIGN_OR_RETURN(auto held, store_->list(id));
    for (const auto& h : held) KRANE_RETURN_IF_ERROR(store_->erase(h));
    report(id, region, version, cluster::v1::RESOURCE_PHASE_DELETED,
           held.empty() ? "nothing to remove" : "removed");
    return absl::OkStatus();
  }

  cluster::v1::ReportResourceStatusRequest statusOf(const std::string& id,
                                                    const std::string& region, uint64_t version,
                                                    cluster::v1::ResourcePhase phase,
                                                    const std::string& message) {
    cluster::v1::ReportResourceStatusRequest r;
    r.set_type(kResourceType);
    r.set_id(id);
    r.set_region(region);
    r.set_version(version);
    r.set_phase(phase);
    r.set_message(message.substr(0, 4000));
    r.set_plugin(kPluginName);
    return r;
  }

  void report(const std::string& id, const std::string& region, uint64_t version,
              cluster::v1::ResourcePhase phase, const std::string& message) {
    send(statusOf(id, region, version, phase, message));
  }

  void send(const cluster::v1::ReportResourceStatusRequest& status) {
    {
      std::lock_guard lock(mutex_);
      if (status.phase() == cluster::v1::RESOURCE_PHASE_DELETED) {
        latest_.erase(status.id());
      } else {
        latest_[status.id()] = status;
      }
    }
    host_->reportResourceStatus(status);
  }

  sdk::Host* host_ = nullptr;
  std::string runtime_;
  std::string default_namespace_;
  std::unique_ptr<kube::Client> client_;
  std::unique_ptr<PolicyStore> store_;
  std::mutex mutex_;
  std::map<std::string, cluster::v1::ReportResourceStatusRequest> latest_;  // for observe()
};

}  // namespace
}  // namespace krane::cilium

KRANE_DEFINE_PLUGIN(krane::cilium::CiliumPlugin, "cilium", "0.1.0");
