#include "plugins/sentinel/kube_routes.h"

#include "common/strings.h"
#include "plugins/runtime/kubernetes/objects.h"
#include "plugins/sentinel/routes_publisher.h"
#include "plugins/sentinel/sentinel.h"

namespace krane::sentinel {

using nlohmann::json;

namespace {

// The deployment plugin's objects (plugins/deployment/kube_objects.h) that belong to a deployment.
constexpr char kDeploymentSelector[] =
    "app.kubernetes.io/managed-by=krane,app.kubernetes.io/component=deployment,"
    "krane.dev/deployment.id";
constexpr char kDeploymentIdLabel[] = "krane.dev/deployment.id";

}  // namespace

KubeRoutes::KubeRoutes(kube::Client& client, KubeRoutesOptions options)
    : client_(client), options_(std::move(options)) {
  const auto informer = [this](const char* api_version, const char* kind) {
    kube::InformerOptions o;
    o.api_version = api_version;
    o.kind = kind;
    o.label_selector = kDeploymentSelector;
    o.on_error = [this, kind](const absl::Status& st) {
      if (options_.warn) {
        options_.warn(
            strCat("sentinel routes: watching ", kind, "s failed, listing again: ", st.message()));
      }
    };
    return o;
  };
  services_ = std::make_unique<kube::Informer>(
      client_, informer("v1", "Service"),
      [this](const json& object, bool deleted) { onService(object, deleted); });
  deployments_ = std::make_unique<kube::Informer>(
      client_, informer("apps/v1", "Deployment"),
      [this](const json& object, bool deleted) { onDeployment(object, deleted); });
}

KubeRoutes::~KubeRoutes() { stop(); }

void KubeRoutes::start() {
  std::lock_guard lock(mutex_);
  if (thread_.joinable()) return;
  stopping_ = false;
  services_->start();
  deployments_->start();
  thread_ = std::thread([this] { loop(); });
}

void KubeRoutes::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  services_->stop();
  deployments_->stop();
}

void KubeRoutes::setLive(const cluster::v1::Sentinel& s) {
  {
    std::lock_guard lock(mutex_);
    sentinels_[s.sentinel_id()].spec = s;
  }
  wake();
}

void KubeRoutes::forget(const std::string& sentinel_id) {
  std::lock_guard lock(mutex_);
  sentinels_.erase(sentinel_id);
}

bool KubeRoutes::publishAll() {
  if (!services_->waitSynced(std::chrono::milliseconds(0)) ||
      !deployments_->waitSynced(std::chrono::milliseconds(0))) {
    return false;
  }
  std::lock_guard lock(mutex_);
  for (auto& [id, s] : sentinels_) publishLocked(id, s);
  return true;
}

void KubeRoutes::onService(const json& service, bool deleted) {
  const std::string id = kube::labelOf(service, kDeploymentIdLabel);
  if (id.empty()) return;
  Endpoint endpoint;
  const json& ports = service.value("spec", json::object()).value("ports", json::array());
  if (!deleted && ports.is_array() && !ports.empty() && ports[0].value("port", 0) > 0) {
    const json& meta = service["metadata"];
    endpoint.host = strCat(meta.value("name", ""), ".", meta.value("namespace", ""), ".svc");
    endpoint.port = ports[0].value("port", 0);
  }
  {
    std::lock_guard lock(mutex_);
    Target& t = targets_[id];
    t.endpoint = endpoint;
    if (t.endpoint.port == 0 && !t.ready) targets_.erase(id);
  }
  wake();
}

void KubeRoutes::onDeployment(const json& deployment, bool deleted) {
  const std::string id = kube::labelOf(deployment, kDeploymentIdLabel);
  if (id.empty()) return;
  const json& status = deployment.value("status", json::object());
  const bool ready = !deleted && status.is_object() && status.value("readyReplicas", 0) > 0;
  {
    std::lock_guard lock(mutex_);
    Target& t = targets_[id];
    t.ready = ready;
    if (t.endpoint.port == 0 && !t.ready) targets_.erase(id);
  }
  wake();
}

std::vector<Endpoint> KubeRoutes::endpointsOf(const std::string& deployment_id) const {
  auto it = targets_.find(deployment_id);
  if (it == targets_.end() || !it->second.ready || it->second.endpoint.port == 0) return {};
  return {it->second.endpoint};
}

void KubeRoutes::publishLocked(const std::string& id, Sentinel& s) {
  const std::string name = routesName(id);
  if (!s.written && !s.read) {
    // After a restart: what the proxy follows now is where a switch in progress starts from.
    auto current = client_.get({"v1", "ConfigMap", kNamespace, name});
    if (current.ok()) {
      auto document = routesDocumentOf(*current);
      auto routes = document.ok() ? parseRoutes(*document) : document.status();
      if (routes.ok()) {
        s.published = *std::move(routes);
        s.written = true;
      }
    } else if (!absl::IsNotFound(current.status())) {
      if (options_.warn) {
        options_.warn(strCat("sentinel routes: sentinel=", id, " cannot read ConfigMap ", name,
                             ": ", current.status().message()));
      }
      return;  // tried again next round
    }
    s.read = true;
  }
  Routes next = nextRoutes(s.published, s.spec.live_deployment_id(), s.spec.rolling_deployment_id(),
                           [this](const std::string& d) { return endpointsOf(d); });
  if (s.written && next == s.published) return;
  auto applied = client_.apply(routesConfigMap(s.spec, next));
  if (!applied.ok()) {
    if (options_.warn) {
      options_.warn(strCat("sentinel routes: sentinel=", id, " cannot apply ConfigMap ", name, ": ",
                           applied.status().message()));
    }
    return;  // tried again next round
  }
  if (options_.info) {
    const std::string& live = s.spec.live_deployment_id();
    options_.info(strCat("sentinel routes: sentinel=", id, " routes to deployment=",
                         next.deployment_id.empty() ? "-" : next.deployment_id, " (",
                         next.endpoints.size(), " endpoints)",
                         next.deployment_id != live ? strCat(", until ", live, " is ready") : ""));
  }
  s.published = std::move(next);
  s.written = true;
}

void KubeRoutes::wake() {
  {
    std::lock_guard lock(mutex_);
    dirty_ = true;
  }
  wake_.notify_all();
}

void KubeRoutes::loop() {
  bool synced = false;
  while (true) {
    {
      std::unique_lock lock(mutex_);
      // Until the informers listed once, checked often: the first round should not wait.
      const auto wait = synced ? options_.retry : std::chrono::milliseconds(100);
      wake_.wait_for(lock, wait, [this] { return stopping_ || dirty_; });
      if (stopping_) return;
      dirty_ = false;
    }
    synced = publishAll();
  }
}

}  // namespace krane::sentinel
