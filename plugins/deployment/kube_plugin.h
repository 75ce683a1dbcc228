// The deployment plugin on the Kubernetes runtime.
//
// apply: server-side applies the objects of kube_objects.h (the workspace Namespace once per
//   plugin instance, then Deployment, Service, HorizontalPodAutoscaler, NetworkPolicy) and
//   deletes the kinds a topology no longer has (an autoscaler after min = max, a Service after
//   the port went away).
// remove: deletes the deployment's objects, found by label (krane.dev/deployment.id), so a
//   delete works after a restart too; reports the deployment deleted.
// syncEnd: lists every object with app.kubernetes.io/managed-by=krane and
//   app.kubernetes.io/component=deployment and deletes those of deployments the sync did not
//   list (Namespaces are never deleted).
// status: an informer (list + watch) on the pods of every namespace with the same two labels;
//   each change of a deployment's pods reports all its instances (kube_status.h), so crash loops
//   and image-pull failures reach the control plane as soon as the kubelet sees them. observe()
//   reports every known deployment again.
//
// Configuration: {"runtime": "kubernetes", "kubernetes": {connection keys of
// plugins/runtime/kubernetes/plugin_config.h, "namespace_prefix": "ws", "sentinel_namespace":
// "sentinel"}}.
//
// Threads: apply / remove / observe may run concurrently for different deployments; reports are
// built and sent under one lock, so the control plane never gets an older picture after a newer
// one.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>

#include "plugins/deployment/kube_objects.h"
#include "plugins/runtime/kubernetes/client.h"
#include "plugins/runtime/kubernetes/informer.h"
#include "plugins/sdk/plugin.h"

namespace krane::deployment {

class KubeDeploymentPlugin final : public sdk::Plugin {
 public:
  absl::Status init(sdk::Host& host, std::string_view config) override;
  std::vector<std::string> resourceTypes() override { return {"deployment_topology"}; }
  absl::Status apply(const cluster::v1::Change& change) override;
  absl::Status remove(const cluster::v1::Change& change) override;
  absl::Status syncEnd(const plugin::v1::SyncEnd& sync_end) override;
  absl::Status observe() override;
  void shutdown() override;

 private:
  struct Applied {
    std::string region;
    uint64_t version = 0;
    std::set<std::string> kinds;  // what the last apply rendered
  };
  // What an earlier instance applied, as its Deployment records it.
  struct Adopted {
    std::string region;
    uint64_t version = 0;
  };

  void onPod(const nlohmann::json& pod, bool deleted);
  // Builds and sends the report of `id` from the pods seen (nothing after a removal).
  void report(const std::string& id);
  void reportDeleted(const std::string& id, const std::string& region, uint64_t version);
  // Reads what an earlier instance applied to `id` from its Deployment; nullopt when the API
  // cannot be read (tried again at the next report).
  std::optional<Adopted> adopt(const std::string& id);
  // Deletes every object (of deploymentKinds()) matching `selector`; the deployment ids found.
  absl::StatusOr<std::set<std::string>> deleteMatching(const std::string& selector,
                                                       const std::set<std::string>& keep);

  sdk::Host* host_ = nullptr;
  KubeOptions options_;
  std::unique_ptr<kube::Client> client_;
  std::unique_ptr<kube::Informer> pods_;

  std::mutex mutex_;                        // guards what follows
  std::map<std::string, Applied> applied_;  // by deployment id
  // What the Deployments of ids not applied by this instance recorded (found at their first
  // report): the version and region they report. Apart from applied_, whose kinds an apply
  // relies on.
  std::map<std::string, Adopted> adopted_;
  std::map<std::string, std::map<std::string, nlohmann::json>> by_deployment_;  // id -> pods
  std::set<std::string> removed_;     // removed here and not applied since: not reported
  std::set<std::string> namespaces_;  // applied by this instance

  std::mutex report_mutex_;
};

}  // namespace krane::deployment
