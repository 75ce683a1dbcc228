// The rolling-update benchmark: evaluator cycles per second for 10,000 deployments of 10
// instances each (the pure function, seed 002). See bench/README.md.
#include <chrono>
#include <random>
#include <thread>

#include <fmt/format.h>

#include "bench/support/figures.h"
#include "common/strings.h"
#include "controlplane/strategy/rolling.h"

namespace krane::bench {
namespace {

using Clock = std::chrono::steady_clock;
using strategy::Instance;
using strategy::InstanceState;

constexpr const char* kUsage = R"(usage: strategy [--json] [--quick] [--help]
  --json    print one JSON object {"figures": [...]} on stdout; the table and progress go to stderr
  --quick   a smoke run: 1,000 deployments
)";

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
  report(json,
         fmt::format("rolling-update evaluator, {} deployments of {} instances, surge 25%,"
                     " unavailable 0, 1 thread of {} cores{}",
                     deployments, desired, std::thread::hardware_concurrency(),
                     quick ? " (--quick)" : ""),
         {{"evaluator_cycles_per_s", median(rates), "1/s"}}, {},
         "One cycle is one deployment's evaluation (classify, compute, pick the instances to "
         "drain); the median of 7 rounds over the whole fleet.");
  return 0;
}

}  // namespace
}  // namespace krane::bench

int main(int argc, char** argv) {
  return krane::bench::benchMain(argc, argv, krane::bench::kUsage, krane::bench::run);
}
