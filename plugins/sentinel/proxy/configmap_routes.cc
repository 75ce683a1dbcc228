#include "plugins/sentinel/proxy/configmap_routes.h"

#include "common/strings.h"
#include "spdlog/spdlog.h"

namespace krane::sentinel {

absl::StatusOr<ConfigMapRef> parseConfigMapRef(const std::string& text, const std::string& what) {
  const auto slash = text.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 == text.size() ||
      text.find('/', slash + 1) != std::string::npos) {
    return absl::InvalidArgumentError(
        strCat(what, ": \"", text, "\" is not <namespace>/<name> of a ConfigMap"));
  }
  return ConfigMapRef{text.substr(0, slash), text.substr(slash + 1)};
}

ConfigMapRoutes::ConfigMapRoutes(kube::Client& client, ConfigMapRef ref, OnRoutes on_routes)
    : ref_(std::move(ref)), on_routes_(std::move(on_routes)) {
  kube::InformerOptions o;
  o.api_version = "v1";
  o.kind = "ConfigMap";
  o.ns = ref_.ns;
  o.field_selector = strCat("metadata.name=", ref_.name);
  o.on_error = [this](const absl::Status& st) {
    spdlog::warn("krane-sentinel: watching ConfigMap {}/{} failed, listing again: {}", ref_.ns,
                 ref_.name, std::string(st.message()));
  };
  informer_ = std::make_unique<kube::Informer>(
      client, o,
      [this](const nlohmann::json& object, bool deleted) { onConfigMap(object, deleted); });
}

ConfigMapRoutes::~ConfigMapRoutes() { stop(); }

void ConfigMapRoutes::start() { informer_->start(); }

void ConfigMapRoutes::stop() { informer_->stop(); }

void ConfigMapRoutes::onConfigMap(const nlohmann::json& config_map, bool deleted) {
  if (deleted) {
    spdlog::warn("krane-sentinel: ConfigMap {}/{} was deleted; keeping the routes there were",
                 ref_.ns, ref_.name);
    return;
  }
  auto text = routesDocumentOf(config_map);
  if (!text.ok()) {
    spdlog::error("krane-sentinel: ConfigMap {}/{}: {}; ignored", ref_.ns, ref_.name,
                  std::string(text.status().message()));
    return;
  }
  if (*text == last_) return;
  auto routes = parseRoutes(*text);
  if (!routes.ok()) {
    spdlog::error("krane-sentinel: ConfigMap {}/{}: {}; ignored", ref_.ns, ref_.name,
                  std::string(routes.status().message()));
    return;
  }
  last_ = *std::move(text);
  on_routes_(*std::move(routes));
}

}  // namespace krane::sentinel
