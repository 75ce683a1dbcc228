// The routing proxy of a sentinel: sends an environment's HTTP requests to the ready instances of
// its live deployment (round robin), as a routes file (routes.h) lists them.
//
//   GET <liveness_path>   200 while the process serves: restart it when this fails.
//   GET <readiness_path>  200 once it has routes and is not draining, else 503: it can serve
//                         traffic. Routes means a routes file with a ready endpoint of the live
//                         deployment, or one that says the environment has no live deployment yet
//                         (nothing to route; requests get 503): a sentinel is created, and waited
//                         for, before its environment's first deployment goes live.
//   anything else         forwarded to one endpoint: method, path and query, headers (without
//                         hop-by-hop ones, with X-Forwarded-For and X-Forwarded-Host), body; the
//                         answer comes back with `X-Krane-Deployment: <live deployment id>`.
//                         503 without routes; 502 when no endpoint answered, or when the
//                         answer is larger than max_answer_bytes; 504 when the answer is not
//                         complete within upstream_timeout.
//
// SWITCHING. A new routes file takes effect for the next request; a request already forwarded
// keeps the route set it started with until it completes, and the old set is released (drained)
// once its last request finished. A request whose endpoint refuses the connection, or does not
// accept it within connect_timeout, is retried on the next endpoint of the same set (any method:
// nothing was sent); a failure after sending is retried only for idempotent methods.
//
// HEALTH LISTENER. With `health_port`, the two endpoints above are also served on a listener of
// its own with a few threads of its own: the request threads can all be busy (slow clients, an
// instance that does not answer) without a probe going unanswered, which would get a working proxy
// restarted. The main port answers them too (probes of older configurations, and of a resource
// that names the main port).
//
// DRAINING. drain() turns readiness to 503 at once while requests are still accepted and
// forwarded (answered with `Connection: close`, so that clients reconnect through their load
// balancer); stop() then stops accepting and waits for the requests in flight.
//
// WATCHING. The routes file is checked every `poll` (inode, size, modification time: the writer
// replaces it with a rename). A missing or unreadable file keeps the routes there were; a file
// that does not parse is logged and ignored.
//
// Threads: start() and stop() from one owner thread; setRoutes() and ready() from any.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "plugins/sentinel/defaults.h"
#include "plugins/sentinel/proxy/routes.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace krane::sentinel {

struct ProxyOptions {
  std::string host = "0.0.0.0";
  int port = 8040;  // 0: any free port (see RoutingProxy::port)
  std::string liveness_path = "/healthz/live";
  std::string readiness_path = "/healthz/ready";
  std::string routes_file;  // empty: routes only through setRoutes()
  std::chrono::milliseconds poll{100};
  std::chrono::milliseconds connect_timeout{2000};
  // The longest a request's exchange with the instances may take, from the first connection to
  // the last byte of the answer, over every endpoint tried: then the client gets 504.
  std::chrono::milliseconds upstream_timeout{kUpstreamTimeoutSeconds * 1000};
  // Requests served at once (each holds a thread while its upstream answers); more wait.
  int threads = 64;
  // How long a client may keep a request thread waiting for the next bytes of its request
  // (headers or body; each read) before its connection is closed, and (5 s at most) for its next
  // request on a kept-alive connection. Answers of the instances are bounded by upstream_timeout
  // instead.
  std::chrono::seconds client_timeout{10};
  // The liveness and readiness endpoints' own listener (HEALTH LISTENER above); 0: any free port
  // (see RoutingProxy::healthPort). None: only on `port`.
  std::optional<int> health_port;
  // A request body is held in memory (three copies while it is forwarded): a larger one is
  // refused with 413 before it is read in full.
  size_t max_body_bytes = size_t{64} << 20;
  // An answer is held in memory until it is complete too: a larger one (an endless one included)
  // is cut off, and the client gets 502.
  size_t max_answer_bytes = size_t{64} << 20;
};

class RoutingProxy {
 public:
  explicit RoutingProxy(ProxyOptions options);
  ~RoutingProxy();
  RoutingProxy(const RoutingProxy&) = delete;
  RoutingProxy& operator=(const RoutingProxy&) = delete;

  // Binds (UNAVAILABLE naming the address when it cannot), reads the routes file once, then
  // serves and watches on threads of its own.
  absl::Status start();
  // The bound port.
  int port() const { return port_; }
  // The health listener's bound port; -1 without one.
  int healthPort() const { return health_port_; }
  // Readiness answers 503 from now on; requests are still served (DRAINING above). Any thread.
  void drain();
  // Stops accepting; requests in flight complete first, and so do connections accepted and
  // waiting for a thread (for up to the client timeout). Then stops the health listener and the
  // routes' watch.
  void stop();

  void setRoutes(Routes routes);
  // Has routes and is not draining.
  bool ready() const;
  // The routes requests are sent to now.
  Routes routes() const;

 private:
  struct RouteSet;
  class Watchdog;

  std::shared_ptr<RouteSet> current() const;
  // Answers the liveness and readiness endpoints; false for any other request.
  bool health(const httplib::Request& req, httplib::Response& res) const;
  void handle(const httplib::Request& req, httplib::Response& res);
  void forward(const httplib::Request& req, httplib::Response& res);
  void watch();
  void reload();

  const ProxyOptions options_;
  std::unique_ptr<httplib::Server> server_;
  int port_ = 0;
  std::thread serve_thread_;
  // The request threads' queue while the server runs: connections accepted and not yet taken
  // by a thread are counted, so that stop() lets them in first (httplib's stop() closes them
  // unread).
  class CountingQueue;
  std::atomic<CountingQueue*> queue_{nullptr};
  std::unique_ptr<httplib::Server> health_server_;  // with options_.health_port
  int health_port_ = -1;
  std::thread health_thread_;
  std::atomic<bool> draining_{false};
  std::thread watch_thread_;
  // Ends requests' exchanges with the instances at their deadlines (forward); from start() to
  // the end of stop().
  std::unique_ptr<Watchdog> watchdog_;

  mutable std::mutex mutex_;  // guards what follows
  std::shared_ptr<RouteSet> routes_;
  bool stopping_ = false;
  std::condition_variable stop_cv_;
  // The routes file as last seen (inode, size, mtime in ns).
  uint64_t seen_inode_ = 0;
  int64_t seen_size_ = -1;
  int64_t seen_mtime_ns_ = -1;
};

}  // namespace krane::sentinel
