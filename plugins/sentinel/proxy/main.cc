// krane-sentinel: the routing proxy a sentinel runs (proxy.h), on the process runtime and as the
// entry point of the sentinel image on Kubernetes. See docs/sentinels.md.
//
//   krane-sentinel [--routes-file PATH | --routes-configmap NAMESPACE/NAME [--kubeconfig PATH]]
//                  [--port N] [--health-port N] [--host ADDR] [--liveness-path P]
//                  [--readiness-path P] [--poll-ms N] [--threads N] [--client-timeout-s N]
//                  [--max-body-mib N] [--max-answer-mib N] [--upstream-timeout-s N]
//                  [--drain-seconds N] [--version V]
//
// Defaults come from the environment the agent's sentinel plugin sets: KRANE_ROUTES_FILE (the
// process runtime), KRANE_ROUTES_CONFIGMAP (Kubernetes: followed through the API server with the
// pod's service account, or a kubeconfig), PORT (else 8040), KRANE_HEALTH_PORT (else no health
// listener of its own), KRANE_LIVENESS_PATH, KRANE_READINESS_PATH, KRANE_DRAIN_SECONDS.
//
// SIGTERM or SIGINT: readiness turns 503 at once and requests are still served for the drain
// period (load balancers move away meanwhile); then it stops accepting and exits once the
// requests in flight completed. A second signal ends the drain at once; a third one, while
// requests in flight complete, exits without waiting for them.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include <spdlog/spdlog.h>

#include "CLI/CLI.hpp"
#include "plugins/runtime/kubernetes/client.h"
#include "plugins/runtime/kubernetes/config.h"
#include "plugins/sentinel/proxy/configmap_routes.h"
#include "plugins/sentinel/proxy/proxy.h"

namespace {

std::string env(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : fallback;
}

// Waits up to `timeout` for one of `signals` (blocked on every thread): its number, or 0.
int waitForSignal(const sigset_t& signals, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left = std::max(deadline - std::chrono::steady_clock::now(),
                               std::chrono::steady_clock::duration::zero());
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
    const timespec wait{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
    const int sig = sigtimedwait(&signals, nullptr, &wait);
    if (sig > 0) return sig;
    if (errno != EINTR || left.count() == 0) return 0;
  }
}

}  // namespace

int main(int argc, char** argv) {
  krane::sentinel::ProxyOptions options;
  options.routes_file = env("KRANE_ROUTES_FILE", "");
  options.port = std::atoi(env("PORT", "8040").c_str());
  options.liveness_path = env("KRANE_LIVENESS_PATH", options.liveness_path);
  options.readiness_path = env("KRANE_READINESS_PATH", options.readiness_path);
  std::string routes_configmap = env("KRANE_ROUTES_CONFIGMAP", "");
  std::string kubeconfig;
  std::string version;
  int poll_ms = static_cast<int>(options.poll.count());
  int health_port = -1;
  int client_timeout_s = static_cast<int>(options.client_timeout.count());
  int drain_seconds = krane::sentinel::kDrainSeconds;

  CLI::App app{"krane-sentinel: a sentinel's routing proxy", "krane-sentinel"};
  app.add_option("--routes-file", options.routes_file, "Routes file to watch ($KRANE_ROUTES_FILE)");
  app.add_option("--routes-configmap", routes_configmap,
                 "ConfigMap to follow through the API server, as namespace/name "
                 "($KRANE_ROUTES_CONFIGMAP)");
  app.add_option("--kubeconfig", kubeconfig,
                 "Kubeconfig for --routes-configmap (default: the pod's service account)");
  app.add_option("--port", options.port, "Port to listen on ($PORT, else 8040)")
      ->check(CLI::Range(0, 65535));
  app.add_option("--health-port", health_port,
                 "Port of a listener of its own for the liveness and readiness endpoints, which "
                 "the main port answers too (0: any free port; default: none)")
      ->envname("KRANE_HEALTH_PORT")
      ->check(CLI::Range(0, 65535));
  app.add_option("--host", options.host, "Address to listen on")->capture_default_str();
  app.add_option("--liveness-path", options.liveness_path, "Liveness endpoint")
      ->capture_default_str();
  app.add_option("--readiness-path", options.readiness_path, "Readiness endpoint")
      ->capture_default_str();
  app.add_option("--poll-ms", poll_ms, "How often the routes file is checked")
      ->capture_default_str()
      ->check(CLI::Range(10, 60000));
  app.add_option("--threads", options.threads, "Requests served at once")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  app.add_option("--client-timeout-s", client_timeout_s,
                 "Seconds a client may leave a request thread waiting while it sends its request "
                 "(each read), and at most 5 for its next request on a kept-alive connection; "
                 "then its connection is closed")
      ->capture_default_str()
      ->check(CLI::Range(1, 3600));
  size_t max_body_mib = options.max_body_bytes >> 20;
  app.add_option("--max-body-mib", max_body_mib,
                 "Largest request body forwarded, in MiB (held in memory); larger ones get 413")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  size_t max_answer_mib = options.max_answer_bytes >> 20;
  app.add_option("--max-answer-mib", max_answer_mib,
                 "Largest answer of an instance passed on, in MiB (held in memory until complete); "
                 "larger ones are cut off and the client gets 502")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  int upstream_timeout_s = static_cast<int>(options.upstream_timeout.count() / 1000);
  app.add_option("--upstream-timeout-s", upstream_timeout_s,
                 "Seconds a request's exchange with the instances may take, every endpoint tried "
                 "and the whole answer included; then the client gets 504. The sentinel's "
                 "termination grace period on Kubernetes allows for the default")
      ->capture_default_str()
      ->check(CLI::Range(1, 3600));
  app.add_option("--drain-seconds", drain_seconds,
                 "On SIGTERM, seconds of answering readiness with 503 while still serving, before "
                 "it stops accepting")
      ->envname("KRANE_DRAIN_SECONDS")
      ->capture_default_str()
      ->check(CLI::Range(0, 3600));
  app.add_option("--version", version, "Version label, for logs (the image tag)");
  CLI11_PARSE(app, argc, argv);
  options.poll = std::chrono::milliseconds(poll_ms);
  options.max_body_bytes = max_body_mib << 20;
  options.max_answer_bytes = max_answer_mib << 20;
  options.upstream_timeout = std::chrono::seconds(upstream_timeout_s);
  options.client_timeout = std::chrono::seconds(client_timeout_s);
  if (health_port >= 0) options.health_port = health_port;
  if (health_port > 0 && health_port == options.port) {
    spdlog::error("krane-sentinel: --health-port needs a port of its own, not --port {}",
                  options.port);
    return 2;
  }
  if (options.liveness_path == options.readiness_path) {
    spdlog::error("krane-sentinel: liveness and readiness need separate paths, both are {}",
                  options.liveness_path);
    return 2;
  }

  if (!routes_configmap.empty() && !options.routes_file.empty()) {
    spdlog::error("krane-sentinel: routes come from a file or a ConfigMap, not both ({} and {})",
                  options.routes_file, routes_configmap);
    return 2;
  }
  std::unique_ptr<krane::kube::Client> kube;
  std::optional<krane::sentinel::ConfigMapRef> configmap;
  if (!routes_configmap.empty()) {
    auto ref = krane::sentinel::parseConfigMapRef(routes_configmap, "--routes-configmap");
    if (!ref.ok()) {
      spdlog::error("krane-sentinel: {}", std::string(ref.status().message()));
      return 2;
    }
    configmap = *ref;
    auto config = kubeconfig.empty() ? krane::kube::inClusterConfig()
                                     : krane::kube::kubeconfigFromFile(kubeconfig);
    if (!config.ok()) {
      spdlog::error("krane-sentinel: {}", std::string(config.status().message()));
      return 2;
    }
    auto client = krane::kube::Client::create(*std::move(config));
    if (!client.ok()) {
      spdlog::error("krane-sentinel: {}", std::string(client.status().message()));
      return 2;
    }
    kube = *std::move(client);
  }

  // Signals are taken by sigwait below, on this thread only.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  krane::sentinel::RoutingProxy proxy(options);
  if (auto st = proxy.start(); !st.ok()) {
    spdlog::error("krane-sentinel: {}", std::string(st.message()));
    return 1;
  }
  std::unique_ptr<krane::sentinel::ConfigMapRoutes> follower;
  if (configmap) {
    follower = std::make_unique<krane::sentinel::ConfigMapRoutes>(
        *kube, *configmap, [&proxy](krane::sentinel::Routes r) { proxy.setRoutes(std::move(r)); });
    follower->start();
  }
  spdlog::info("krane-sentinel: started version={} port={} health_port={}",
               version.empty() ? "-" : version, proxy.port(), proxy.healthPort());
  int sig = 0;
  sigwait(&stop_signals, &sig);
  spdlog::info("krane-sentinel: signal {}: draining for {} s (readiness 503, still serving)", sig,
               drain_seconds);
  proxy.drain();
  if (const int again = waitForSignal(stop_signals, std::chrono::seconds(drain_seconds))) {
    spdlog::info("krane-sentinel: signal {} during the drain: stopping now", again);
  }
  spdlog::info("krane-sentinel: stopping after the requests in flight");
  std::atomic<bool> stopped{false};
  std::thread stopping([&] {
    // The ConfigMap is followed until the requests are done: one served meanwhile goes where the
    // routes point now.
    proxy.stop();
    if (follower) follower->stop();
    stopped = true;
  });
  while (!stopped) {
    if (const int again = waitForSignal(stop_signals, std::chrono::milliseconds(100))) {
      spdlog::warn("krane-sentinel: signal {}: exiting without waiting for the requests in flight",
                   again);
      // Not spdlog::shutdown(): request threads may still log, and it drops the logger.
      spdlog::default_logger()->flush();
      std::_Exit(1);
    }
  }
  stopping.join();
  return 0;
}
