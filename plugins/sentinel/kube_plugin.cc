#include "plugins/sentinel/kube_plugin.h"

#include <functional>

#include "common/status.h"
#include "common/strings.h"
#include "plugins/runtime/kubernetes/names.h"
#include "plugins/runtime/kubernetes/objects.h"
#include "plugins/runtime/kubernetes/plugin_config.h"
#include "plugins/sentinel/sentinel.h"

namespace krane::sentinel {

using nlohmann::json;

namespace {

constexpr char kSelector[] =
    "app.kubernetes.io/managed-by=krane,app.kubernetes.io/component=sentinel";
constexpr char kIdLabel[] = "krane.dev/sentinel.id";
constexpr char kEnvironmentLabel[] = "krane.dev/environment.id";

using Kinds = std::vector<std::pair<std::string, std::string>>;

// The kinds of the per-sentinel and the per-environment objects.
const Kinds& sentinelKinds() {
  static const Kinds kinds = {{"apps/v1", "Deployment"},
                              {"v1", "Service"},
                              {"policy/v1", "PodDisruptionBudget"},
                              {"v1", "ConfigMap"}};
  return kinds;
}
const Kinds& environmentKinds() {
  static const Kinds kinds = {{"v1", "Service"}, {"cilium.io/v2", "CiliumNetworkPolicy"}};
  return kinds;
}

}  // namespace

absl::Status KubeSentinelPlugin::init(sdk::Host& host, std::string_view config_text) {
  host_ = &host;
  const auto prefixed = [](const absl::Status& st) {
    return withContext(st, "sentinel plugin config");
  };
  auto section_or = kube::kubernetesSection(config_text);
  if (!section_or.ok()) return prefixed(section_or.status());
  auto connection =
      kube::connectionFromJson(*section_or, "kubernetes",
                               {"node_selector", "tolerations", "secret_env", "env_from_secrets"});
  if (!connection.ok()) return prefixed(connection.status());
  auto pod = podOptionsFromJson(*section_or, "kubernetes");
  if (!pod.ok()) return prefixed(pod.status());
  pod_ = *std::move(pod);
  auto client = kube::Client::create(connection->cluster, connection->options);
  if (!client.ok()) return prefixed(client.status());
  client_ = *std::move(client);

  kube::InformerOptions watch;
  watch.api_version = "apps/v1";
  watch.kind = "Deployment";
  watch.ns = kNamespace;
  watch.label_selector = strCat(kSelector, ",", kIdLabel);
  watch.on_error = [this](const absl::Status& st) {
    host_->log(
        sdk::LogLevel::kWarn,
        strCat("sentinel plugin: watching deployments failed, listing again: ", st.message()));
  };
  deployments_ = std::make_unique<kube::Informer>(
      *client_, watch, [this](const json& d, bool deleted) { onDeployment(d, deleted); });
  deployments_->start();
  KubeRoutesOptions routes;
  routes.warn = [this](const std::string& line) { host_->log(sdk::LogLevel::kWarn, line); };
  routes.info = [this](const std::string& line) { host_->log(sdk::LogLevel::kInfo, line); };
  routes_ = std::make_unique<KubeRoutes>(*client_, std::move(routes));
  routes_->start();
  host.log(sdk::LogLevel::kInfo,
           strCat("sentinel plugin: kubernetes runtime, API server ", client_->config().server,
                  " (", client_->config().source, ")"));
  return absl::OkStatus();
}

std::mutex& KubeSentinelPlugin::environmentLock(const std::string& environment_id) {
  return environment_locks_[std::hash<std::string>{}(environment_id) % environment_locks_.size()];
}

absl::Status KubeSentinelPlugin::apply(const cluster::v1::Change& change) {
  const auto& r = change.resource();
  const std::string context = strCat("sentinel ", r.id());
  if (!r.has_sentinel()) {
    return absl::InvalidArgumentError(strCat(context, ": the change carries no sentinel"));
  }
  const auto& s = r.sentinel();
  KRANE_RETURN_IF_ERROR(withContext(validate(s), context));
  if (s.sentinel_id() != r.id()) {
    return absl::InvalidArgumentError(strCat(context, ": sentinel.sentinel_id: \"", s.sentinel_id(),
                                             "\" is not the resource id"));
  }
  if (s.desired_state() == cluster::v1::SENTINEL_DESIRED_STATE_ARCHIVED) {
    return removeSentinel(r.id(), r.region().empty() ? s.region() : r.region(),
                          sdk::resourceVersion(change));
  }
  {
    std::lock_guard env_lock(environmentLock(s.environment_id()));
    // The shared objects first: a new sentinel finds its gossip peers' Service from the start.
    for (const json& object : environmentObjects(s)) {
      auto applied = client_->apply(object);
      if (!applied.ok()) {
        return withContext(applied.status(), strCat(context, ": environment ", s.environment_id(),
                                                    ": ", object["kind"].get<std::string>()));
      }
    }
    for (json& object : sentinelObjects(s, pod_)) {
      if (object["kind"] == "Deployment") {
        kube::setAppliedVersion(object, sdk::resourceVersion(change));
      }
      auto applied = client_->apply(object);
      if (!applied.ok()) {
        return withContext(applied.status(),
                           strCat(context, ": ", object["kind"].get<std::string>()));
      }
    }
    routes_->setLive(s);
    std::lock_guard lock(mutex_);
    Applied& a = applied_[r.id()];
    a.region = r.region().empty() ? s.region() : r.region();
    a.environment_id = s.environment_id();
    a.version = sdk::resourceVersion(change);
    removed_.erase(r.id());
  }
  // The Deployment as the informer saw it last (the watch brings the new one right after).
  std::optional<json> seen;
  for (const auto& d : deployments_->snapshot()) {
    if (kube::labelOf(d, kIdLabel) == r.id()) seen = d;
  }
  if (seen) report(r.id(), &*seen);
  return absl::OkStatus();
}

absl::Status KubeSentinelPlugin::remove(const cluster::v1::Change& change) {
  return removeSentinel(change.resource().id(), change.resource().region(),
                        sdk::resourceVersion(change));
}

absl::Status KubeSentinelPlugin::removeSentinel(const std::string& id, const std::string& region,
                                                uint64_t version) {
  const std::string context = strCat("sentinel ", id);
  const std::string name = objectName("sentinel", id);
  // The environment: remembered from an apply, else read from the Deployment (after a restart).
  std::string environment_id;
  std::string known_region = region;
  {
    std::lock_guard lock(mutex_);
    auto it = applied_.find(id);
    if (it != applied_.end()) {
      environment_id = it->second.environment_id;
      if (known_region.empty()) known_region = it->second.region;
    }
  }
  if (environment_id.empty()) {
    auto d = client_->get({"apps/v1", "Deployment", kNamespace, name});
    if (d.ok()) {
      environment_id = kube::labelOf(*d, kEnvironmentLabel);
    } else if (!absl::IsNotFound(d.status())) {
      return withContext(d.status(), context);
    }
  }
  {
    std::lock_guard lock(mutex_);
    removed_.insert(id);  // before the Deployment goes: its deletion event is not reported
  }
  routes_->forget(id);  // before its ConfigMap goes: nothing applies it again
  {
    std::unique_lock<std::mutex> env_lock;
    if (!environment_id.empty()) env_lock = std::unique_lock(environmentLock(environment_id));
    for (const auto& [api_version, kind] : sentinelKinds()) {
      const std::string object_name = kind == "ConfigMap" ? routesName(id) : name;
      KRANE_RETURN_IF_ERROR(withContext(
          kube::removeIfPresent(*client_, {api_version, kind, kNamespace, object_name}), context));
    }
    if (!environment_id.empty()) {
      KRANE_RETURN_IF_ERROR(withContext(removeEnvironmentIfUnused(environment_id), context));
    }
    std::lock_guard lock(mutex_);
    applied_.erase(id);
    converged_image_.erase(id);
  }
  reportRemoved(id, known_region, version);
  return absl::OkStatus();
}

absl::Status KubeSentinelPlugin::removeEnvironmentIfUnused(const std::string& environment_id) {
  auto left = kube::listMatching(
      *client_, "apps/v1", "Deployment", kNamespace,
      strCat(kSelector, ",", kIdLabel, ",", kEnvironmentLabel, "=", environment_id));
  if (!left.ok()) return left.status();
  if (!left->empty()) return absl::OkStatus();
  const std::string name = objectName("sentinel-gossip", environment_id);
  for (const auto& [api_version, kind] : environmentKinds()) {
    KRANE_RETURN_IF_ERROR(kube::removeIfPresent(*client_, {api_version, kind, kNamespace, name}));
  }
  host_->log(sdk::LogLevel::kInfo,
             strCat("sentinel plugin: environment ", environment_id,
                    " has no sentinel left; removed its gossip Service and network policy"));
  return absl::OkStatus();
}

absl::Status KubeSentinelPlugin::syncEnd(const plugin::v1::SyncEnd& sync_end) {
  std::set<std::string> keep;
  for (const auto& group : sync_end.resources()) {
    if (group.resource_type() != "sentinel") continue;
    keep.insert(group.ids().begin(), group.ids().end());
  }
  const std::string context = "garbage collection after a sync";
  std::set<std::string> removed;
  // Only this agent's region (agents of several regions may share a cluster); the environment's
  // gossip objects below are shared by every region's sentinels, so they are counted across all.
  std::string mine = strCat(kSelector, ",", kIdLabel);
  if (!sync_end.region().empty()) {
    if (!kube::validLabelValue(sync_end.region())) {
      return absl::InvalidArgumentError(
          strCat(context, ": region \"", sync_end.region(), "\" is not a label value"));
    }
    mine = strCat(mine, ",krane.dev/region=", sync_end.region());
  }
  for (const auto& [api_version, kind] : sentinelKinds()) {
    auto found = kube::listMatching(*client_, api_version, kind, kNamespace, mine);
    if (!found.ok()) return withContext(found.status(), context);
    for (const json& object : *found) {
      const std::string id = kube::labelOf(object, kIdLabel);
      if (keep.count(id) > 0) continue;
      routes_->forget(id);
      KRANE_RETURN_IF_ERROR(
          withContext(kube::removeIfPresent(*client_, kube::refOf(object)), context));
      removed.insert(id);
    }
  }
  // Environments whose last sentinel is gone (now, or before an earlier agent stopped).
  auto left = kube::listMatching(*client_, "apps/v1", "Deployment", kNamespace,
                                 strCat(kSelector, ",", kIdLabel));
  if (!left.ok()) return withContext(left.status(), context);
  std::set<std::string> alive;
  for (const json& d : *left) alive.insert(kube::labelOf(d, kEnvironmentLabel));
  for (const auto& [api_version, kind] : environmentKinds()) {
    auto found = kube::listMatching(*client_, api_version, kind, kNamespace,
                                    strCat(kSelector, ",!", kIdLabel));
    if (!found.ok()) return withContext(found.status(), context);
    for (const json& object : *found) {
      if (alive.count(kube::labelOf(object, kEnvironmentLabel)) > 0) continue;
      KRANE_RETURN_IF_ERROR(
          withContext(kube::removeIfPresent(*client_, kube::refOf(object)), context));
    }
  }
  for (const auto& id : removed) {
    host_->log(sdk::LogLevel::kInfo, strCat("sentinel plugin: sentinel ", id,
                                            " is not in the desired state; removed its objects"));
    std::string region;
    {
      std::lock_guard lock(mutex_);
      auto it = applied_.find(id);
      if (it != applied_.end()) region = it->second.region;
      applied_.erase(id);
      converged_image_.erase(id);
      removed_.insert(id);
    }
    reportRemoved(id, region, sync_end.snapshot_version());
  }
  return absl::OkStatus();
}

absl::Status KubeSentinelPlugin::observe() {
  for (const auto& d : deployments_->snapshot()) report(kube::labelOf(d, kIdLabel), &d);
  return absl::OkStatus();
}

void KubeSentinelPlugin::shutdown() {
  if (routes_) routes_->stop();
  if (deployments_) deployments_->stop();
}

void KubeSentinelPlugin::onDeployment(const json& deployment, bool deleted) {
  const std::string id = kube::labelOf(deployment, kIdLabel);
  if (id.empty()) return;
  if (deleted) {
    std::lock_guard lock(mutex_);
    // A removal from here is complete once its Deployment is gone.
    if (removed_.erase(id) > 0) return;
  }
  report(id, deleted ? nullptr : &deployment);
}

void KubeSentinelPlugin::report(const std::string& id, const json* deployment) {
  std::lock_guard report_lock(report_mutex_);
  Observed observed;
  std::string running_image;
  uint64_t version = 0;
  std::string region;
  {
    std::lock_guard lock(mutex_);
    if (removed_.count(id) > 0) return;
    if (deployment != nullptr) {
      observed = observeDeployment(*deployment);
      if (observed.converged) converged_image_[id] = observed.image;
    } else {
      // Gone without a removal from here: nothing runs, though replicas are wanted.
      observed.replicas = 1;
      converged_image_.erase(id);
    }
    auto image = converged_image_.find(id);
    if (image != converged_image_.end()) running_image = image->second;
    auto a = applied_.find(id);
    if (a != applied_.end()) {
      version = a->second.version;
      region = a->second.region;
    } else if (deployment != nullptr) {
      // Applied by an earlier instance (a restarted host): its Deployment says what.
      version = kube::appliedVersionOf(*deployment);
      region = kube::labelOf(*deployment, "krane.dev/region");
    }
  }
  plugin::v1::StatusReport report;
  auto* r = report.mutable_sentinel();
  *r = sentinelReport(observed, id, running_image, version);
  r->set_region(region);
  host_->reportStatus(report);
}

void KubeSentinelPlugin::reportRemoved(const std::string& id, const std::string& region,
                                       uint64_t version) {
  // A removed sentinel runs nothing: zero replicas, paused (as on the process runtime).
  std::lock_guard report_lock(report_mutex_);
  plugin::v1::StatusReport report;
  auto* r = report.mutable_sentinel();
  r->set_sentinel_id(id);
  r->set_region(region);
  r->set_health(cluster::v1::SENTINEL_HEALTH_PAUSED);
  r->set_applied_version(version);
  host_->reportStatus(report);
}

}  // namespace krane::sentinel
