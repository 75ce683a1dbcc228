// The sentinel plugin on the Kubernetes runtime: the six objects of sentinel.h in namespace
// `sentinel` (which the cluster's manifests create).
//
// apply: server-side applies the environment's gossip Service and CiliumNetworkPolicy, then the
//   sentinel's Deployment, Service and PodDisruptionBudget; its routes ConfigMap follows the
//   live deployment (kube_routes.h). An archived sentinel is removed.
// remove: deletes the sentinel's four objects; the environment's two go only when no other
//   sentinel Deployment of that environment is left. Applies and removals of one environment
//   are serialized, so a removal never takes the gossip objects from a sentinel being applied.
// syncEnd: deletes the per-sentinel objects (app.kubernetes.io/managed-by=krane,
//   app.kubernetes.io/component=sentinel, with krane.dev/sentinel.id) of sentinels the sync did
//   not list, then the gossip objects of environments with no sentinel Deployment left.
// status: an informer (list + watch) on the sentinel Deployments; each change reports
//   available / updated / ready replicas and observedGeneration, the running image only once
//   the rollout converged (the image of the last converged rollout until then) and the health
//   (paused at zero replicas, healthy with an available replica, else unhealthy). A Deployment
//   deleted behind Krane's back reports unhealthy with nothing available.
//
// Configuration: {"runtime": "kubernetes", "kubernetes": {connection keys of
// plugins/runtime/kubernetes/plugin_config.h, and the pod keys of sentinel.h podOptionsFromJson:
// node_selector, tolerations (default: the sentinel node class and its NoSchedule taint),
// secret_env, env_from_secrets (credentials, as Secret references only)}}.
#pragma once

#include <array>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "plugins/runtime/kubernetes/client.h"
#include "plugins/runtime/kubernetes/informer.h"
#include "plugins/sdk/plugin.h"
#include "plugins/sentinel/kube_routes.h"
#include "plugins/sentinel/sentinel.h"

namespace krane::sentinel {

class KubeSentinelPlugin final : public sdk::Plugin {
 public:
  absl::Status init(sdk::Host& host, std::string_view config) override;
  std::vector<std::string> resourceTypes() override { return {"sentinel"}; }
  absl::Status apply(const cluster::v1::Change& change) override;
  absl::Status remove(const cluster::v1::Change& change) override;
  absl::Status syncEnd(const plugin::v1::SyncEnd& sync_end) override;
  absl::Status observe() override;
  void shutdown() override;

 private:
  struct Applied {
    std::string region;
    std::string environment_id;
    uint64_t version = 0;
  };

  absl::Status removeSentinel(const std::string& id, const std::string& region, uint64_t version);
  // Deletes the gossip objects of `environment_id` when no sentinel Deployment of it is left.
  absl::Status removeEnvironmentIfUnused(const std::string& environment_id);
  std::mutex& environmentLock(const std::string& environment_id);
  void onDeployment(const nlohmann::json& deployment, bool deleted);
  void report(const std::string& id, const nlohmann::json* deployment);
  void reportRemoved(const std::string& id, const std::string& region, uint64_t version);

  sdk::Host* host_ = nullptr;
  std::unique_ptr<kube::Client> client_;
  PodOptions pod_;
  std::unique_ptr<kube::Informer> deployments_;
  std::unique_ptr<KubeRoutes> routes_;
  std::array<std::mutex, 16> environment_locks_;

  std::mutex mutex_;                                    // guards what follows
  std::map<std::string, Applied> applied_;              // by sentinel id
  std::map<std::string, std::string> converged_image_;  // by sentinel id
  std::set<std::string> removed_;  // removed here and not applied since: not reported

  std::mutex report_mutex_;  // reports are built and sent in order
};

}  // namespace krane::sentinel
