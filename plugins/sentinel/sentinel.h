// A sentinel (the routing proxy of one environment in one region) as what a runtime runs.
//
// On Kubernetes, exactly six objects in namespace `sentinel`, all server-side applied:
//   per sentinel:    Deployment, ClusterIP Service (8040), PodDisruptionBudget (one available),
//                    and the routes ConfigMap (kube_routes.h) the proxy watches
//   per environment: headless gossip Service (7946 TCP+UDP) and the gossip CiliumNetworkPolicy,
//                    shared by the environment's sentinels and removed with the last of them.
// The pods run as ServiceAccount `krane-sentinel` (manifests/sentinel.yaml), which may only read
// ConfigMaps in `sentinel`: the proxy follows its routes ConfigMap through the API server
// (KRANE_ROUTES_CONFIGMAP=sentinel/<name>), so a promote reaches it within a second, where a
// mounted ConfigMap would take the kubelet's sync period.
// Every object carries app.kubernetes.io/managed-by=krane, app.kubernetes.io/component=sentinel
// and the ids under krane.dev/ (workspace.id, project.id, app.id, environment.id, and
// sentinel.id on the per-sentinel ones). Liveness and readiness are separate endpoints
// (/healthz/live: the process is alive; /healthz/ready: it can serve traffic), probed on the
// proxy's health port (container port `health`, 8041), whose threads requests cannot take. The
// pod's grace period covers the proxy's drain on SIGTERM and its longest request.
//
// On the process runtime, a workload of the process runtime with the same probes, on PORT (the
// runtime probes no other port; the proxy answers them there too).
#pragma once

#include <initializer_list>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "krane/cluster/v1/cluster.pb.h"
#include "krane/cluster/v1/state.pb.h"
#include "nlohmann/json.hpp"
#include "plugins/runtime/process/process_runtime.h"
#include "plugins/sentinel/defaults.h"
#include "plugins/sentinel/proxy/routes.h"

namespace krane::sentinel {

inline constexpr char kNamespace[] = "sentinel";
inline constexpr int kHttpPort = 8040;
// The proxy's listener for liveness and readiness only (KRANE_HEALTH_PORT), named kHealthPortName.
inline constexpr int kHealthPort = 8041;
inline constexpr char kHealthPortName[] = "health";
// Drain, then the requests in flight, then a margin: only a proxy that hangs is killed.
inline constexpr int kTerminationGraceSeconds = kDrainSeconds + kUpstreamTimeoutSeconds + 10;
inline constexpr int kGossipPort = 7946;
inline constexpr char kLivenessPath[] = "/healthz/live";
inline constexpr char kReadinessPath[] = "/healthz/ready";
inline constexpr char kServiceAccount[] = "krane-sentinel";

// A DNS-1123 label (lowercase letters, digits, '-'; at most 63; starts with a letter) made from
// `prefix` and `id`; ids that had to be changed get a hash suffix, so two ids never collide.
std::string objectName(const std::string& prefix, const std::string& id);

// The objects' names.
std::string deploymentName(const cluster::v1::Sentinel& s);
std::string gossipName(const cluster::v1::Sentinel& s);
std::string routesName(const std::string& sentinel_id);

// The sentinel's probes with every unset field at its default: liveness GET /healthz/live on
// the health port (8041) every 10 s, timeout 2 s, 3 failures; readiness GET /healthz/ready on
// 8041 every 5 s, timeout 2 s, 2 failures, 1 success. (The process runtime probes each
// instance's own health port, KRANE_HEALTH_PORT, whatever the port says.)
cluster::v1::Healthcheck probesOf(const cluster::v1::Sentinel& s);

// A container environment variable from a key of a Secret (env[].valueFrom.secretKeyRef).
struct SecretEnv {
  std::string name;    // variable
  std::string secret;  // Secret in namespace `sentinel`
  std::string key;
};

// What the plugin's configuration adds to every sentinel pod (kube_plugin.h documents the keys).
struct PodOptions {
  // Sentinels run only on the sentinel node class: a node selector and a toleration of its taint.
  std::map<std::string, std::string> node_selector = {{"node-class", "sentinel"}};
  std::vector<nlohmann::json> tolerations = {{{"key", "node-class"},
                                              {"operator", "Equal"},
                                              {"value", "sentinel"},
                                              {"effect", "NoSchedule"}}};
  // Credentials (database, ClickHouse, Redis, ...): only ever references to Secrets.
  std::vector<SecretEnv> secret_env;
  std::vector<std::string> env_from_secrets;  // envFrom[].secretRef, every key of each Secret
};

// The plugin's pod keys of its `kubernetes` section (at `path`), over the defaults:
//   node_selector: {node-class: sentinel}      # a mapping of label key -> value; {} for none
//   tolerations: [{key: node-class, operator: Equal, value: sentinel, effect: NoSchedule}]
//                                               # Kubernetes tolerations; [] for none
//   secret_env: [{name: DATABASE_URL, secret: sentinel-database, key: url}]
//   env_from_secrets: [sentinel-credentials]
// INVALID_ARGUMENT naming the key for a bad value (a label key or value Kubernetes refuses, a
// toleration with an unknown field or operator/effect, a Secret name that is not a DNS name).
absl::StatusOr<PodOptions> podOptionsFromJson(const nlohmann::json& section,
                                              const std::string& path);

// The per-sentinel objects: Deployment, Service, PodDisruptionBudget.
std::vector<nlohmann::json> sentinelObjects(const cluster::v1::Sentinel& s,
                                            const PodOptions& pod = {});
// The routes ConfigMap: `routes` (proxy/routes.h) under kRoutesKey.
nlohmann::json routesConfigMap(const cluster::v1::Sentinel& s, const Routes& routes);
// The per-environment objects: headless gossip Service, gossip CiliumNetworkPolicy.
std::vector<nlohmann::json> environmentObjects(const cluster::v1::Sentinel& s);

// INVALID_ARGUMENT naming the field for a sentinel that cannot be run (missing ids or image).
absl::Status validate(const cluster::v1::Sentinel& s);

std::string workloadId(const std::string& sentinel_id);
runtime::WorkloadSpec toWorkload(const cluster::v1::Sentinel& s, const std::string& sentinel_id);

// What a runtime shows of one sentinel's rollout.
struct Observed {
  int replicas = 0;   // wanted
  int available = 0;  // ready for at least the minimum ready time
  int updated = 0;    // of the current spec
  int ready = 0;
  int64_t observed_generation = 0;
  bool converged = false;  // every instance of the current spec and available, none other
  std::string image;       // of the current spec
};

// The report of both runtimes. Health: paused at zero replicas wanted, healthy with an available
// replica, else unhealthy. `running_image` is the image of the last converged rollout.
cluster::v1::ReportSentinelStatusRequest sentinelReport(const Observed& observed,
                                                        const std::string& sentinel_id,
                                                        const std::string& running_image,
                                                        uint64_t applied_version);

// A sentinel Deployment as the API server stores it: spec.replicas, status counts and
// observedGeneration; converged when the controller observed the current generation and
// updated = replicas (status) = available = spec.replicas.
Observed observeDeployment(const nlohmann::json& deployment);

// What the process runtime shows, as the control plane wants it. `generation` counts the spec
// changes applied; `converged_image` is the image of the last converged rollout (running_image is
// only set once a rollout converged).
cluster::v1::ReportSentinelStatusRequest toReport(const runtime::WorkloadStatus& status,
                                                  const std::string& sentinel_id,
                                                  int64_t generation,
                                                  const std::string& converged_image,
                                                  uint64_t applied_version);

}  // namespace krane::sentinel
