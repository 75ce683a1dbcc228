// krane-sentinel: the routing proxy a sentinel runs (proxy.h), on the process runtime and as the
// entry point of the sentinel image on Kubernetes. See docs/sentinels.md.
//
//   krane-sentinel [--routes-file PATH | --routes-configmap NAMESPACE/NAME [--kubeconfig PATH]]
//                  [--port N] [--host ADDR] [--liveness-path P] [--readiness-path P]
//                  [--poll-ms N] [--threads N] [--version V]
//
// Defaults come from the environment the agent's sentinel plugin sets: KRANE_ROUTES_FILE (the
// process runtime), KRANE_ROUTES_CONFIGMAP (Kubernetes: followed through the API server with the
// pod's service account, or a kubeconfig), PORT (else 8040), KRANE_LIVENESS_PATH,
// KRANE_READINESS_PATH. SIGTERM or SIGINT stop it after the requests in flight completed.
#include <signal.h>

#include <cstdlib>
#include <memory>
#include <optional>
#include <string>

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

  CLI::App app{"krane-sentinel: a sentinel's routing proxy", "krane-sentinel"};
  app.add_option("--routes-file", options.routes_file, "Routes file to watch ($KRANE_ROUTES_FILE)");
  app.add_option("--routes-configmap", routes_configmap,
                 "ConfigMap to follow through the API server, as namespace/name "
                 "($KRANE_ROUTES_CONFIGMAP)");
  app.add_option("--kubeconfig", kubeconfig,
                 "Kubeconfig for --routes-configmap (default: the pod's service account)");
  app.add_option("--port", options.port, "Port to listen on ($PORT, else 8040)")
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
  size_t max_body_mib = options.max_body_bytes >> 20;
  app.add_option("--max-body-mib", max_body_mib,
                 "Largest request body forwarded, in MiB (held in memory); larger ones get 413")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  app.add_option("--version", version, "Version label, for logs (the image tag)");
  CLI11_PARSE(app, argc, argv);
  options.poll = std::chrono::milliseconds(poll_ms);
  options.max_body_bytes = max_body_mib << 20;
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
  spdlog::info("krane-sentinel: started version={} port={}", version.empty() ? "-" : version,
               proxy.port());
  int sig = 0;
  sigwait(&stop_signals, &sig);
  spdlog::info("krane-sentinel: signal {}: stopping after the requests in flight", sig);
  if (follower) follower->stop();
  proxy.stop();
  return 0;
}
