// The sentinel plugin's half of routing on Kubernetes: keeps each sentinel's routes ConfigMap
// (sentinel.h routesConfigMap, `sentinel-routes-<id>` in namespace `sentinel`) pointing at its
// live deployment (and, during a rolling deploy, at the deployment taking over from it). The
// proxy (krane-sentinel) follows the ConfigMap through the API server.
//
// Where the addresses come from: the deployment plugin gives every deployment with a port a
// ClusterIP Service (plugins/deployment/kube_objects.h), labelled krane.dev/deployment.id. A
// deployment's endpoint is that Service's DNS name and port ("<name>.<namespace>.svc:<port>"),
// which kube-proxy or Cilium balance over the ready pods; the deployment counts as ready once
// its Deployment reports a ready replica. Two informers (every namespace, the deployment
// plugin's objects only) keep both current.
//
// SWITCHING follows the process runtime's rule (routes_publisher.h nextRoutes): a new live
// deployment takes over once it is ready; until then the routes keep the previous one.
//
// WRITES: a ConfigMap is applied only when what it says changes, on the publisher's own thread:
// after any event of the informers, after setLive, and every `retry` (a failed apply is tried
// again then). Nothing is written before both informers listed once, so a restart never
// publishes routes from a half-known cluster. A sentinel first seen after a restart starts from
// its ConfigMap as the API server has it.
//
// Threads: every method may be called from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "krane/cluster/v1/state.pb.h"
#include "plugins/runtime/kubernetes/client.h"
#include "plugins/runtime/kubernetes/informer.h"
#include "plugins/sentinel/proxy/routes.h"

namespace krane::sentinel {

struct KubeRoutesOptions {
  std::chrono::milliseconds retry{5000};
  // For logs: called with a line about a failed apply or watch.
  std::function<void(const std::string&)> warn;
  std::function<void(const std::string&)> info;
};

class KubeRoutes {
 public:
  // `client` must outlive this.
  KubeRoutes(kube::Client& client, KubeRoutesOptions options);
  ~KubeRoutes();  // stop()
  KubeRoutes(const KubeRoutes&) = delete;
  KubeRoutes& operator=(const KubeRoutes&) = delete;

  void start();
  void stop();

  // The sentinel as last applied: its live and rolling deployment; its ConfigMap is brought up
  // to date soon after.
  void setLive(const cluster::v1::Sentinel& s);
  // The sentinel is gone (its ConfigMap is deleted with its other objects).
  void forget(const std::string& sentinel_id);
  // One round now, on the caller's thread (tests): false when the informers have not listed yet.
  bool publishAll();

 private:
  struct Sentinel {
    cluster::v1::Sentinel spec;
    Routes published;
    bool written = false;  // `published` is what the ConfigMap says
    bool read = false;     // the ConfigMap was read back (after a restart)
  };
  struct Target {
    Endpoint endpoint;  // of its Service; port 0 when it has none
    bool ready = false;
  };

  void onService(const nlohmann::json& service, bool deleted);
  void onDeployment(const nlohmann::json& deployment, bool deleted);
  std::vector<Endpoint> endpointsOf(const std::string& deployment_id) const;
  void publishLocked(const std::string& id, Sentinel& s);
  void wake();
  void loop();

  kube::Client& client_;
  const KubeRoutesOptions options_;
  std::unique_ptr<kube::Informer> services_;
  std::unique_ptr<kube::Informer> deployments_;

  std::mutex mutex_;  // guards what follows
  std::map<std::string, Sentinel> sentinels_;
  std::map<std::string, Target> targets_;  // by deployment id
  bool dirty_ = false;
  bool stopping_ = false;
  std::condition_variable wake_;
  std::thread thread_;
};

}  // namespace krane::sentinel
