// The rolling-update benchmark: evaluator cycles per second for 10,000 deployments of 10
// instances each (the pure function, seed 002), and a roll of 20 real demo-app instances on the
// process runtime with surge 1 / unavailable 0: its wall time and the fewest ready instances seen.
// See bench/README.md.
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <mutex>
#include <random>
#include <thread>

#include <fmt/format.h>

#include "bench/support/figures.h"
#include "common/strings.h"
#include "controlplane/strategy/rolling.h"
#include "plugins/runtime/process/process_runtime.h"

namespace krane::bench {
namespace {

using Clock = std::chrono::steady_clock;
using strategy::Instance;
using strategy::InstanceState;

constexpr const char* kUsage = R"(usage: strategy [--json] [--quick] [--help]
  --json    print one JSON object {"figures": [...]} on stdout; the table and progress go to stderr
  --quick   a smoke run: 1,000 deployments
)";

struct RollRun {
  double wall_s = -1;
  int min_ready = -1;
};

// A roll of `replicas` demo-app instances from v1 to v2 on the process runtime (readiness probed
// every 50 ms), surge 1, unavailable 0.
RollRun roll(const std::string& demo_app, int replicas) {
  char pattern[] = "/tmp/krane-bench-roll-XXXXXX";
  const std::string dir = ::mkdtemp(pattern);
  std::mutex mutex;
  bool rolling = false;
  int min_ready = 1 << 20;
  runtime::ProcessRuntimeOptions options;
  options.state_dir = dir;
  options.port_from = 25000;
  options.port_to = 25199;
  options.tick = std::chrono::milliseconds(20);
  options.images["krane.dev/demo-app"] = {demo_app, "--version", "{tag}"};
  options.on_change = [&](const runtime::WorkloadStatus& s) {
    std::lock_guard lock(mutex);
    if (rolling) min_ready = std::min(min_ready, s.ready);
  };
  auto rt = check(runtime::ProcessRuntime::start(options), "process runtime");
  runtime::WorkloadSpec spec;
  spec.id = "bench";
  spec.image = "krane.dev/demo-app:v1";
  spec.replicas = replicas;
  spec.readiness.path = "/healthz/ready";
  spec.readiness.interval = std::chrono::milliseconds(50);
  spec.max_surge = 1;
  spec.max_unavailable = 0;
  auto wait = [&](const std::string& revision) {
    const auto deadline = Clock::now() + std::chrono::seconds(300);
    while (Clock::now() < deadline) {
      const auto s = rt->status("bench");
      if (s && s->converged && s->revision == revision &&
          static_cast<int>(s->instances.size()) == replicas) {
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  };
  check(rt->apply(spec), "apply v1");
  if (!wait(runtime::revisionOf(spec))) throw std::runtime_error("v1 never became ready");
  spec.image = "krane.dev/demo-app:v2";
  {
    std::lock_guard lock(mutex);
    rolling = true;
  }
  const auto t0 = Clock::now();
  check(rt->apply(spec), "apply v2");
  if (!wait(runtime::revisionOf(spec))) throw std::runtime_error("the roll to v2 never completed");
  RollRun out;
  out.wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
  {
    std::lock_guard lock(mutex);
    rolling = false;
    out.min_ready = min_ready;
  }
  rt->shutdown(/*stop_instances=*/true);
  std::filesystem::remove_all(dir);
  return out;
}

std::string runfilesDir(const char* argv0) {
  if (const char* d = std::getenv("RUNFILES_DIR")) return d;
  return std::string(argv0) + ".runfiles";
}

std::string g_argv0;

int run(bool json, bool quick) {
  logsToStderr();
  const int deployments = quick ? 1000 : 10000;
  const uint32_t desired = 10;
  // Each deployment somewhere in its rollout: k of 10 replaced, some new ones still starting.
  std::mt19937 rng(7);
  std::vector<std::vector<Instance>> fleet(deployments);
  for (int d = 0; d < deployments; ++d) {
    const int replaced = static_cast<int>(rng() % (desired + 1));
    for (int i = 0; i < static_cast<int>(desired); ++i) {
      Instance inst;
      inst.id = fmt::format("d{}-{}", d, i);
      inst.is_new = i < replaced;
      inst.state =
          inst.is_new && rng() % 4 == 0 ? InstanceState::kProvisioning : InstanceState::kHealthy;
      fleet[d].push_back(std::move(inst));
    }
  }
  const strategy::ResolvedSpec spec = strategy::resolve({{25, true}, {0, false}}, desired);
  std::vector<double> rates;
  uint64_t progressing = 0;
  for (int round = 0; round < 7; ++round) {
    const auto t0 = Clock::now();
    for (const auto& instances : fleet) {
      const auto e = strategy::evaluate(instances, desired, spec);
      progressing += e.result == strategy::Result::kProgressing ? 1 : 0;
    }
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    rates.push_back(deployments / s);
  }
  std::fprintf(stderr, "%d deployments x 7 rounds, %llu progressing evaluations\n", deployments,
               static_cast<unsigned long long>(progressing));
  const std::string demo_app =
      runfilesDir(g_argv0.c_str()) + "/krane/tests/support/demo_app/krane-demo-app";
  std::fprintf(stderr, "rolling 20 demo-app instances v1 -> v2 on the process runtime\n");
  const RollRun rolled = roll(demo_app, 20);
  report(
      json,
      fmt::format("rolling update: the evaluator over {} deployments of {} instances (surge 25%,"
                  " unavailable 0, 1 thread), and a roll of 20 instances on the process runtime"
                  " (surge 1, unavailable 0), {} cores{}",
                  deployments, desired, std::thread::hardware_concurrency(),
                  quick ? " (--quick)" : ""),
      {{"evaluator_cycles_per_s", median(rates), "1/s"},
       {"rolling_20_wall_s", rolled.wall_s, "s"},
       {"rolling_min_healthy", static_cast<double>(rolled.min_ready), "instances", ">= 20",
        rolled.min_ready >= 20}},
      {},
      "evaluator_cycles_per_s: one cycle is one deployment's evaluation (classify, compute, pick "
      "the instances to drain); the median of 7 rounds over the whole fleet. rolling_20_wall_s: "
      "from applying v2 to 20 ready v2 instances and no v1 left; rolling_min_healthy: the fewest "
      "ready instances any status change showed during the roll.");
  return 0;
}

}  // namespace
}  // namespace krane::bench

int main(int argc, char** argv) {
  krane::bench::g_argv0 = argv[0];
  return krane::bench::benchMain(argc, argv, krane::bench::kUsage, krane::bench::run);
}
