// Routes from a ConfigMap, followed through the API server: how krane-sentinel learns its routes
// on Kubernetes (the agent's sentinel plugin writes the ConfigMap, kube_routes.h). A watch
// delivers a change within a second, where a ConfigMap mounted as a volume would only be updated
// at the kubelet's next sync (a minute or more).
//
// The ConfigMap's `routes.json` key holds a routes document (routes.h). A ConfigMap that is
// missing, deleted, or holds no valid document leaves the routes as they were (the latter is
// logged); the watch is resumed or listed again by the informer after any failure.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "plugins/runtime/kubernetes/client.h"
#include "plugins/runtime/kubernetes/informer.h"
#include "plugins/sentinel/proxy/routes.h"

namespace krane::sentinel {

struct ConfigMapRef {
  std::string ns;
  std::string name;
};

// "namespace/name" as a reference; INVALID_ARGUMENT naming `what` otherwise.
absl::StatusOr<ConfigMapRef> parseConfigMapRef(const std::string& text, const std::string& what);

class ConfigMapRoutes {
 public:
  using OnRoutes = std::function<void(Routes routes)>;

  // `client` must outlive this; `on_routes` runs on the watch's thread, once per new document.
  ConfigMapRoutes(kube::Client& client, ConfigMapRef ref, OnRoutes on_routes);
  ~ConfigMapRoutes();
  ConfigMapRoutes(const ConfigMapRoutes&) = delete;
  ConfigMapRoutes& operator=(const ConfigMapRoutes&) = delete;

  void start();
  void stop();

 private:
  void onConfigMap(const nlohmann::json& config_map, bool deleted);

  const ConfigMapRef ref_;
  const OnRoutes on_routes_;
  std::string last_;  // the document last delivered
  std::unique_ptr<kube::Informer> informer_;
};

}  // namespace krane::sentinel
