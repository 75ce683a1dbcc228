#include "plugins/deployment/kube_plugin.h"

#include <algorithm>

#include "common/status.h"
#include "common/strings.h"
#include "plugins/deployment/kube_status.h"
#include "plugins/deployment/workload.h"
#include "plugins/runtime/kubernetes/names.h"
#include "plugins/runtime/kubernetes/objects.h"
#include "plugins/runtime/kubernetes/plugin_config.h"

namespace krane::deployment {

using nlohmann::json;

absl::Status KubeDeploymentPlugin::init(sdk::Host& host, std::string_view config_text) {
  host_ = &host;
  const auto prefixed = [](const absl::Status& st) {
    return withContext(st, "deployment plugin config");
  };
  auto section_or = kube::kubernetesSection(config_text);
  if (!section_or.ok()) return prefixed(section_or.status());
  const json& section = *section_or;
  auto connection =
      kube::connectionFromJson(section, "kubernetes", {"namespace_prefix", "sentinel_namespace"});
  if (!connection.ok()) return prefixed(connection.status());
  auto prefix = kube::stringAt(section, "kubernetes", "namespace_prefix", "ws");
  if (!prefix.ok()) return prefixed(prefix.status());
  auto sentinel_ns = kube::stringAt(section, "kubernetes", "sentinel_namespace", "sentinel");
  if (!sentinel_ns.ok()) return prefixed(sentinel_ns.status());
  if (sentinel_ns->empty()) {
    return prefixed(absl::InvalidArgumentError("kubernetes.sentinel_namespace: must not be empty"));
  }
  options_.namespace_prefix = *prefix;
  options_.sentinel_namespace = *sentinel_ns;
  auto client = kube::Client::create(connection->cluster, connection->options);
  if (!client.ok()) return prefixed(client.status());
  client_ = *std::move(client);

  kube::InformerOptions watch;
  watch.api_version = "v1";
  watch.kind = "Pod";
  watch.label_selector = kManagedBySelector;
  watch.on_error = [this](const absl::Status& st) {
    host_->log(sdk::LogLevel::kWarn,
               strCat("deployment plugin: watching pods failed, listing again: ", st.message()));
  };
  pods_ = std::make_unique<kube::Informer>(
      *client_, watch, [this](const json& pod, bool deleted) { onPod(pod, deleted); });
  pods_->start();
  host.log(sdk::LogLevel::kInfo,
           strCat("deployment plugin: kubernetes runtime, API server ", client_->config().server,
                  " (", client_->config().source, ")"));
  return absl::OkStatus();
}

absl::Status KubeDeploymentPlugin::apply(const cluster::v1::Change& change) {
  const auto& r = change.resource();
  const std::string context = strCat("deployment_topology ", r.id());
  if (!r.has_deployment_topology()) {
    return absl::InvalidArgumentError(
        strCat(context, ": the change carries no deployment_topology"));
  }
  auto objects = kubeObjects(r.deployment_topology(), r.id(), options_);
  if (!objects.ok()) return withContext(objects.status(), context);
  for (json& object : *objects) {
    if (object["kind"] == "Deployment")
      kube::setAppliedVersion(object, sdk::resourceVersion(change));
  }

  std::set<std::string> rendered;
  bool known = false;
  std::set<std::string> before;
  {
    std::lock_guard lock(mutex_);
    auto it = applied_.find(r.id());
    if (it != applied_.end()) {
      known = true;
      before = it->second.kinds;
    }
  }
  for (const json& object : *objects) {
    const std::string kind = object["kind"];
    if (kind == "Namespace") {
      const std::string ns = object["metadata"]["name"];
      {
        std::lock_guard lock(mutex_);
        if (namespaces_.count(ns) > 0) continue;
      }
      auto applied = client_->apply(object);
      if (!applied.ok()) return withContext(applied.status(), strCat(context, ": namespace ", ns));
      std::lock_guard lock(mutex_);
      namespaces_.insert(ns);
      continue;
    }
    rendered.insert(kind);
    auto applied = client_->apply(object);
    if (!applied.ok()) return withContext(applied.status(), strCat(context, ": ", kind));
  }
  // Kinds this topology no longer has: deleted by name (after a restart nothing is known, so
  // every such kind is tried; an object already gone is fine).
  const std::string ns = (*objects)[1]["metadata"]["namespace"];
  const std::string name = objectName(r.id());
  for (const auto& [api_version, kind] : deploymentKinds()) {
    if (rendered.count(kind) > 0 || (known && before.count(kind) == 0)) continue;
    KRANE_RETURN_IF_ERROR(
        withContext(kube::removeIfPresent(*client_, {api_version, kind, ns, name}),
                    strCat(context, ": removing its ", kind)));
  }
  {
    std::lock_guard lock(mutex_);
    Applied& a = applied_[r.id()];
    a.region = r.region().empty() ? r.deployment_topology().region() : r.region();
    a.version = sdk::resourceVersion(change);
    a.kinds = std::move(rendered);
    removed_.erase(r.id());
    adopted_.erase(r.id());
  }
  report(r.id());
  return absl::OkStatus();
}

absl::StatusOr<std::set<std::string>> KubeDeploymentPlugin::deleteMatching(
    const std::string& selector, const std::set<std::string>& keep) {
  std::set<std::string> ids;
  for (const auto& [api_version, kind] : deploymentKinds()) {
    auto found = kube::listMatching(*client_, api_version, kind, "", selector);
    if (!found.ok()) return found.status();
    for (const json& object : *found) {
      const std::string id = kube::labelOf(object, kDeploymentIdLabel);
      if (keep.count(id) > 0) continue;
      KRANE_RETURN_IF_ERROR(kube::removeIfPresent(*client_, kube::refOf(object)));
      ids.insert(id);
    }
  }
  return ids;
}

absl::Status KubeDeploymentPlugin::remove(const cluster::v1::Change& change) {
  const std::string& id = change.resource().id();
  // By label rather than by name: the namespace is not in a delete, and after a restart nothing
  // of the deployment is known here.
  auto removed = deleteMatching(strCat(kManagedBySelector, ",", kDeploymentIdLabel, "=", id), {});
  if (!removed.ok()) return withContext(removed.status(), strCat("deployment_topology ", id));
  std::string region = change.resource().region();
  {
    std::lock_guard lock(mutex_);
    auto it = applied_.find(id);
    if (it != applied_.end()) {
      if (region.empty()) region = it->second.region;
      applied_.erase(it);
    }
    adopted_.erase(id);
    // Its pods are on their way out: their last events must not report it again.
    removed_.insert(id);
  }
  reportDeleted(id, region, sdk::resourceVersion(change));
  return absl::OkStatus();
}

absl::Status KubeDeploymentPlugin::syncEnd(const plugin::v1::SyncEnd& sync_end) {
  std::set<std::string> keep;
  for (const auto& group : sync_end.resources()) {
    if (group.resource_type() != "deployment_topology") continue;
    keep.insert(group.ids().begin(), group.ids().end());
  }
  // Only this agent's region: agents of several regions may share one cluster.
  std::string selector = kManagedBySelector;
  if (!sync_end.region().empty()) {
    if (!kube::validLabelValue(sync_end.region())) {
      return absl::InvalidArgumentError(strCat("garbage collection after a sync: region \"",
                                               sync_end.region(), "\" is not a label value"));
    }
    selector = strCat(selector, ",krane.dev/region=", sync_end.region());
  }
  auto removed = deleteMatching(selector, keep);
  if (!removed.ok()) return withContext(removed.status(), "garbage collection after a sync");
  for (const auto& id : *removed) {
    host_->log(sdk::LogLevel::kInfo, strCat("deployment plugin: deployment_topology ", id,
                                            " is not in the desired state; removed its objects"));
    std::string region;
    {
      std::lock_guard lock(mutex_);
      auto it = applied_.find(id);
      if (it != applied_.end()) {
        region = it->second.region;
        applied_.erase(it);
      }
      adopted_.erase(id);
      removed_.insert(id);
    }
    reportDeleted(id, region, sync_end.snapshot_version());
  }
  return absl::OkStatus();
}

absl::Status KubeDeploymentPlugin::observe() {
  std::set<std::string> ids;
  {
    std::lock_guard lock(mutex_);
    for (const auto& [id, _] : applied_) ids.insert(id);
    for (const auto& [id, _] : by_deployment_) ids.insert(id);
  }
  for (const auto& id : ids) report(id);
  return absl::OkStatus();
}

void KubeDeploymentPlugin::shutdown() {
  if (pods_) pods_->stop();
}

void KubeDeploymentPlugin::onPod(const json& pod, bool deleted) {
  const std::string id = kube::labelOf(pod, kDeploymentIdLabel);
  if (id.empty()) return;
  const json& meta = pod.value("metadata", json::object());
  const std::string key = strCat(meta.value("namespace", ""), "/", meta.value("name", ""));
  {
    std::lock_guard lock(mutex_);
    auto& pods = by_deployment_[id];
    if (deleted) {
      pods.erase(key);
      if (pods.empty()) {
        by_deployment_.erase(id);
        // The last pod of a removed deployment is gone: nothing of it can show up any more.
        if (removed_.erase(id) > 0) return;
      }
    } else {
      pods[key] = pod;
    }
  }
  report(id);
}

void KubeDeploymentPlugin::report(const std::string& id) {
  std::lock_guard report_lock(report_mutex_);
  std::vector<json> pods;
  std::string region;
  uint64_t version = 0;
  bool known = false;
  {
    std::lock_guard lock(mutex_);
    if (removed_.count(id) > 0) return;
    auto it = by_deployment_.find(id);
    if (it != by_deployment_.end()) {
      for (const auto& [key, pod] : it->second) pods.push_back(pod);
    }
    if (auto a = applied_.find(id); a != applied_.end()) {
      region = a->second.region;
      version = a->second.version;
      known = true;
    } else if (auto d = adopted_.find(id); d != adopted_.end()) {
      region = d->second.region;
      version = d->second.version;
      known = true;
    }
  }
  // Applied by an earlier instance (a restarted host): its Deployment says what.
  if (!known) {
    if (std::optional<Adopted> adopted = adopt(id)) {
      region = adopted->region;
      version = adopted->version;
    }
  }
  // Pods of a deployment adopted after a restart carry the region.
  if (region.empty() && !pods.empty()) region = kube::labelOf(pods.front(), "krane.dev/region");
  plugin::v1::StatusReport report;
  *report.mutable_deployment() =
      deploymentReport(podsStatus(strCat("deployment/", id), pods), id, region, version);
  host_->reportStatus(report);
}

std::optional<KubeDeploymentPlugin::Adopted> KubeDeploymentPlugin::adopt(const std::string& id) {
  auto found = kube::listMatching(*client_, "apps/v1", "Deployment", "",
                                  strCat(kManagedBySelector, ",", kDeploymentIdLabel, "=", id));
  if (!found.ok()) {
    host_->log(sdk::LogLevel::kWarn, strCat("deployment plugin: reading the Deployment of ", id,
                                            " failed: ", found.status().message()));
    return std::nullopt;
  }
  Adopted adopted;  // none found (pods outliving it): version 0, as before any apply
  if (!found->empty()) {
    adopted.version = kube::appliedVersionOf(found->front());
    adopted.region = kube::labelOf(found->front(), "krane.dev/region");
  }
  std::lock_guard lock(mutex_);
  if (applied_.count(id) == 0 && removed_.count(id) == 0) adopted_[id] = adopted;
  return adopted;
}

void KubeDeploymentPlugin::reportDeleted(const std::string& id, const std::string& region,
                                         uint64_t version) {
  std::lock_guard report_lock(report_mutex_);
  plugin::v1::StatusReport report;
  auto* d = report.mutable_deployment();
  d->set_deployment_id(id);
  d->set_region(region);
  d->set_deleted(true);
  d->set_applied_version(version);
  host_->reportStatus(report);
}

}  // namespace krane::deployment
