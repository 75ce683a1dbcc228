// The sentinel plugin's half of routing on the process runtime: keeps each sentinel's routes
// file (proxy/routes.h) pointing at the ready instances of its live deployment (and, during a
// rolling deploy, of the deployment taking over from it).
//
// Where the addresses come from: the deployment plugin's process runtime publishes every
// workload's ready endpoints in <deployment_state_dir>/endpoints/ (process_runtime.h,
// ENDPOINTS). Every `poll` this reads the file of each sentinel's live deployment and rewrites
// the sentinel's routes file (<routes_dir>/<sentinel id>.json, replaced in one step) when what it
// would say changed. The proxy watches that file.
//
// SWITCHING. A new live deployment takes over once it has a ready instance; until then the
// routes keep the previous deployment's ready instances (a rollback to a stopped deployment
// keeps serving the current one while the old one starts again). With no live deployment the
// routes are empty and name none (the proxy is ready but has nothing to route to).
//
// RESTARTS. The routes files stay when the plugin host stops: the proxies keep routing, and a new
// publisher reads them back (the deployment each names) so that it keeps them current until the
// sentinels are applied again.
//
// Threads: every method may be called from any thread; the polling thread runs between start()
// and stop().
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "plugins/sentinel/proxy/routes.h"

namespace krane::sentinel {

// The switching rule of both runtimes: what a sentinel's routes say next, given what they say now
// (`published`), its live deployment and the rolling deploy's new one ("" for none), and the
// ready endpoints of a deployment.
using EndpointsOf = std::function<std::vector<Endpoint>(const std::string& deployment_id)>;
Routes nextRoutes(const Routes& published, const std::string& live, const std::string& rolling,
                  const EndpointsOf& endpoints_of);

struct RoutesPublisherOptions {
  std::string routes_dir;            // required
  std::string deployment_state_dir;  // empty: no addresses known (routes name no endpoint)
  std::chrono::milliseconds poll{200};
};

class RoutesPublisher {
 public:
  explicit RoutesPublisher(RoutesPublisherOptions options);
  ~RoutesPublisher();
  RoutesPublisher(const RoutesPublisher&) = delete;
  RoutesPublisher& operator=(const RoutesPublisher&) = delete;

  void start();
  void stop();

  std::string routesFile(const std::string& sentinel_id) const;
  // The sentinel's live deployment ("" for none) and, during a rolling deploy, the deployment
  // taking over from it (its ready instances are routed to as well); its routes are brought up
  // to date at once.
  void setLive(const std::string& sentinel_id, const std::string& deployment_id,
               const std::string& rolling_deployment_id = "");
  // The sentinel is gone: its routes file is removed.
  void forget(const std::string& sentinel_id);
  // One round: every sentinel's routes brought up to date.
  void publishAll();

 private:
  struct Sentinel {
    std::string live;     // desired live deployment
    std::string rolling;  // a rolling deploy's new deployment, routed to as well
    Routes published;     // what its routes file says
    bool written = false;
  };
  // The ready endpoints the deployment's runtime published (empty when none or unknown).
  std::vector<Endpoint> endpointsOf(const std::string& deployment_id) const;
  void publishLocked(const std::string& id, Sentinel& s);
  void loop();

  const RoutesPublisherOptions options_;
  std::mutex mutex_;  // guards what follows
  std::map<std::string, Sentinel> sentinels_;
  bool stopping_ = false;
  std::condition_variable wake_;
  std::thread thread_;
};

}  // namespace krane::sentinel
