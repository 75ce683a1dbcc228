// Runs a ProcessRuntime the way the agent does, for the re-adoption test: applies workloads
// "keep" and "drop" (2 instances each of the demo app), prints "converged", then waits to be
// killed.
#include <chrono>
#include <cstdio>
#include <thread>

#include "plugins/runtime/process/process_runtime.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: process_driver STATE_DIR DEMO_APP\n");
    return 2;
  }
  krane::runtime::ProcessRuntimeOptions options;
  options.state_dir = argv[1];
  options.port_from = 21000;
  options.port_to = 21999;
  options.images["krane.dev/demo-app"] = {argv[2], "--version", "{tag}"};
  auto runtime = krane::runtime::ProcessRuntime::start(options);
  if (!runtime.ok()) {
    std::fprintf(stderr, "%s\n", std::string(runtime.status().message()).c_str());
    return 1;
  }
  for (const char* id : {"keep", "drop"}) {
    krane::runtime::WorkloadSpec spec;
    spec.id = id;
    spec.image = "krane.dev/demo-app:v1";
    spec.replicas = 2;
    spec.readiness.path = "/healthz/ready";
    // "keep" is probed on a health port of its own: the adopting owner must go on probing there.
    if (std::string(id) == "keep") spec.health_port_env = "KRANE_HEALTH_PORT";
    spec.readiness.interval = std::chrono::milliseconds(100);
    if (auto st = (*runtime)->apply(spec); !st.ok()) return 1;
  }
  for (;;) {
    const auto keep = (*runtime)->status("keep");
    const auto drop = (*runtime)->status("drop");
    if (keep && drop && keep->converged && drop->converged) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::printf("converged\n");
  std::fflush(stdout);
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}
