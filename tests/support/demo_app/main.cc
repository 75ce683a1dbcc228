// krane-demo-app: the small HTTP service that tests and `./dev demo` deploy.
//
//   GET /              "krane-demo-app <version> instance=<name>\n"
//   GET /slow?ms=N     the same after N milliseconds (at most 60000): a request in flight
//   GET /healthz/live  200 while the process serves (liveness)
//   GET /healthz/ready 200 once started and not told to fail readiness (readiness)
//
// Listens on 127.0.0.1:$PORT (or --port). With $KRANE_HEALTH_PORT (as the process runtime gives
// a workload that asks for a health port) the two /healthz endpoints are served on that port
// only, and the main port answers them 404. Flags make it misbehave on purpose: --fail-readiness,
// --ready-after-ms, --crash-after-s (exit code 3), --exit-on-start (a crash loop). SIGTERM stops it
// cleanly (exit 0).
#include <httplib.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "CLI/CLI.hpp"

namespace {

httplib::Server* g_server = nullptr;
httplib::Server* g_health = nullptr;

void onTerm(int) {
  if (g_health != nullptr) g_health->stop();
  if (g_server != nullptr) g_server->stop();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"krane-demo-app: a tiny HTTP service with liveness and readiness endpoints",
               "krane-demo-app"};
  std::string version = "v1";
  int port = 0;
  std::string host = "127.0.0.1";
  bool fail_readiness = false;
  int ready_after_ms = 0;
  int crash_after_s = 0;
  int exit_on_start = -1;
  app.add_option("--version", version, "Version string served at /")->capture_default_str();
  app.add_option("--port", port, "Port (default: $PORT)");
  app.add_option("--host", host, "Address to listen on")->capture_default_str();
  app.add_flag("--fail-readiness", fail_readiness, "Answer 503 on /healthz/ready");
  app.add_option("--ready-after-ms", ready_after_ms, "Report ready only after this long");
  app.add_option("--crash-after-s", crash_after_s, "Exit with code 3 after this many seconds");
  app.add_option("--exit-on-start", exit_on_start, "Exit at once with this code (a crash loop)");
  CLI11_PARSE(app, argc, argv);

  if (exit_on_start >= 0) {
    std::fprintf(stderr, "krane-demo-app: exiting at start with code %d, as told\n", exit_on_start);
    return exit_on_start;
  }
  if (port == 0) {
    const char* env = std::getenv("PORT");
    port = env != nullptr ? std::atoi(env) : 0;
  }
  if (port <= 0 || port > 65535) {
    std::fprintf(stderr, "krane-demo-app: error: no port: pass --port or set PORT\n");
    return 2;
  }
  const char* instance_env = std::getenv("KRANE_INSTANCE");
  const std::string instance = instance_env != nullptr ? instance_env : "local";
  const auto started = std::chrono::steady_clock::now();

  httplib::Server server;
  g_server = &server;
  server.Get("/", [&](const httplib::Request&, httplib::Response& res) {
    res.set_content("krane-demo-app " + version + " instance=" + instance + "\n", "text/plain");
  });
  server.Get("/slow", [&](const httplib::Request& req, httplib::Response& res) {
    const int ms = std::clamp(std::atoi(req.get_param_value("ms").c_str()), 0, 60000);
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    res.set_content("krane-demo-app " + version + " instance=" + instance + "\n", "text/plain");
  });
  const char* health_env = std::getenv("KRANE_HEALTH_PORT");
  const int health_port = health_env != nullptr ? std::atoi(health_env) : 0;
  httplib::Server health;
  httplib::Server& probed = health_port > 0 ? health : server;
  probed.Get("/healthz/live", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok\n", "text/plain");
  });
  probed.Get("/healthz/ready", [&](const httplib::Request&, httplib::Response& res) {
    const bool warm =
        std::chrono::steady_clock::now() - started >= std::chrono::milliseconds(ready_after_ms);
    if (fail_readiness || !warm) {
      res.status = 503;
      res.set_content(fail_readiness ? "not ready (told to fail)\n" : "warming up\n", "text/plain");
      return;
    }
    res.set_content("ready\n", "text/plain");
  });
  ::signal(SIGTERM, onTerm);
  ::signal(SIGINT, onTerm);
  if (crash_after_s > 0) {
    std::thread([crash_after_s] {
      std::this_thread::sleep_for(std::chrono::seconds(crash_after_s));
      std::fprintf(stderr, "krane-demo-app: crashing after %d s, as told\n", crash_after_s);
      std::fflush(stderr);
      std::_Exit(3);
    }).detach();
  }
  for (const auto& [s, p] : {std::pair(&server, port), std::pair(&health, health_port)}) {
    if (p > 0 && !s->bind_to_port(host, p)) {
      std::fprintf(stderr, "krane-demo-app: error: cannot listen on %s:%d\n", host.c_str(), p);
      return 1;
    }
  }
  std::thread health_thread;
  if (health_port > 0) {
    health_thread = std::thread([&] { health.listen_after_bind(); });
    // Running before anything can stop it: a stop() before that would be lost.
    while (!health.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    g_health = &health;
  }
  std::printf("krane-demo-app %s listening on %s:%d\n", version.c_str(), host.c_str(), port);
  std::fflush(stdout);
  server.listen_after_bind();
  if (health_thread.joinable()) {
    health.stop();
    health_thread.join();
  }
  std::printf("krane-demo-app: stopped\n");
  return 0;
}
