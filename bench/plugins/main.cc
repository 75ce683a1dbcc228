// bench/plugins: how fast the plugins make workloads real.
//
//   ./dev bench plugins [--json] [--quick]
//
// Figures: process_50_instances_healthy_s (the process runtime, from apply of a 50-replica
// workload of the demo app to all 50 passing their readiness probe; median of rounds).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "plugins/runtime/process/process_runtime.h"
#include "spdlog/spdlog.h"

namespace {

using Clock = std::chrono::steady_clock;

std::string runfilesDir(const char* argv0) {
  if (const char* d = std::getenv("RUNFILES_DIR")) return d;
  return std::string(argv0) + ".runfiles";
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Seconds from apply to `replicas` ready instances; -1 on failure.
double timeToHealthy(const std::string& demo_app, int replicas) {
  char pattern[] = "/tmp/krane-bench-rt-XXXXXX";
  const std::string dir = ::mkdtemp(pattern);
  krane::runtime::ProcessRuntimeOptions options;
  options.state_dir = dir;
  options.port_from = 24000;
  options.port_to = 24999;
  options.tick = std::chrono::milliseconds(20);
  options.images["krane.dev/demo-app"] = {demo_app, "--version", "{tag}"};
  auto runtime = krane::runtime::ProcessRuntime::start(options);
  if (!runtime.ok()) {
    std::fprintf(stderr, "bench: %s\n", std::string(runtime.status().message()).c_str());
    return -1;
  }
  krane::runtime::WorkloadSpec spec;
  spec.id = "bench";
  spec.image = "krane.dev/demo-app:v1";
  spec.replicas = replicas;
  spec.readiness.path = "/healthz/ready";
  spec.readiness.interval = std::chrono::milliseconds(100);
  const auto start = Clock::now();
  if (!(*runtime)->apply(spec).ok()) return -1;
  double seconds = -1;
  while (Clock::now() - start < std::chrono::seconds(120)) {
    const auto s = (*runtime)->status("bench");
    if (s && s->converged) {
      seconds = std::chrono::duration<double>(Clock::now() - start).count();
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  (*runtime)->shutdown(/*stop_instances=*/true);
  std::filesystem::remove_all(dir);
  return seconds;
}

}  // namespace

int main(int argc, char** argv) {
  bool json = false;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json") {
      json = true;
    } else if (a == "--quick") {
      quick = true;
    } else {
      std::printf("usage: plugins [--json] [--quick]\n");
      return a == "--help" ? 0 : 2;
    }
  }
  spdlog::set_level(spdlog::level::warn);  // one line per instance start otherwise
  const std::string demo_app =
      runfilesDir(argv[0]) + "/krane/tests/support/demo_app/krane-demo-app";
  std::vector<double> runs;
  for (int round = 0; round < (quick ? 1 : 3); ++round) {
    const double s = timeToHealthy(demo_app, 50);
    if (s < 0) {
      std::fprintf(stderr, "bench: 50 instances did not become healthy within 120 s\n");
      return 1;
    }
    runs.push_back(s);
  }
  const double healthy = median(runs);
  if (json) {
    std::printf(
        "{\"figures\": [{\"name\": \"process_50_instances_healthy_s\", \"value\": %.3f, "
        "\"unit\": \"s\"}]}\n",
        healthy);
    return 0;
  }
  std::printf("%-34s %10s\n", "figure", "value");
  std::printf("%-34s %9.3fs\n", "process_50_instances_healthy_s", healthy);
  std::printf(
      "(median of %zu rounds: apply of 50 demo-app instances to all ready, probe every "
      "100 ms)\n",
      runs.size());
  return 0;
}
