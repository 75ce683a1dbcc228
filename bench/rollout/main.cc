// The sentinel rollout benchmark: a fleet-wide rollout of 10,000 sentinels in the default waves,
// on the real engine (SentinelRolloutService, SentinelService), feed writer, ingestor and a
// scratch MariaDB, with agents that report each sentinel converged as soon as it is written.
// See bench/README.md.
#include <atomic>
#include <thread>

#include <fmt/format.h>

#include "bench/support/commit_rate.h"
#include "bench/support/figures.h"
#include "bench/support/scratch.h"
#include "common/strings.h"
#include "controlplane/db/migrate.h"
#include "controlplane/feed/writer.h"
#include "controlplane/ingest/ingestor.h"
#include "controlplane/services/sentinel/sentinel.h"
#include "controlplane/services/sentinelrollout/rollout.h"
#include "controlplane/workflow/engine.h"
#include "controlplane/workflow/operations.h"
#include "controlplane/workflow/typed.h"
#include "spdlog/spdlog.h"
#include "tests/support/mariadb.h"
#include "tests/support/sentinel_reports.h"

namespace krane::bench {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
namespace rollout = services::sentinelrollout;

constexpr const char* kUsage = R"(usage: rollout [--json] [--quick] [--help]
  --json    print one JSON object {"figures": [...]} on stdout; the table and progress go to stderr
  --quick   a smoke run: 1,000 sentinels instead of 10,000
)";

constexpr int kRegions = 20;

void exec(db::Pool& pool, const std::string& sql, const db::Params& params = {}) {
  auto conn = check(pool.acquire(), "connection");
  check(conn->exec(sql, params).status(), sql.c_str());
}

feed::Resource sentinel(int i) {
  feed::Resource r;
  r.set_type("sentinel");
  r.set_id(fmt::format("snt_{:05d}", i));
  r.set_region(fmt::format("r{:02d}", i % kRegions));
  auto* s = r.mutable_sentinel();
  s->set_sentinel_id(r.id());
  s->set_workspace_id("ws");
  s->set_project_id("proj");
  s->set_app_id("app");
  s->set_environment_id("prod");
  s->set_region(r.region());
  s->set_image("krane.dev/sentinel:v1");
  s->set_replicas(2);
  s->set_cpu_millicores(250);
  s->set_memory_mib(256);
  s->set_desired_state(cluster::v1::SENTINEL_DESIRED_STATE_RUNNING);
  return r;
}

int run(bool json, bool quick) {
  logsToStderr();
  spdlog::set_level(spdlog::level::warn);  // one info line per sentinel would drown the progress
  const int sentinels = quick ? 1000 : 10000;
  auto pool = seededScratchDatabase();
  for (int r = 0; r < kRegions; ++r) {
    exec(*pool, "INSERT INTO regions (id, display_name, created_at) VALUES (?, ?, 1)",
         {fmt::format("r{:02d}", r), fmt::format("r{:02d}", r)});
  }
  auto writer = std::make_shared<feed::Writer>(pool, std::make_shared<feed::ResourceTables>());
  std::fprintf(stderr, "writing %d sentinels in %d regions\n", sentinels, kRegions);
  for (int start = 0; start < sentinels; start += 500) {
    check(writer
              ->transact("bench sentinels",
                         [&](feed::WriteTx& tx) -> absl::Status {
                           for (int i = start; i < std::min(sentinels, start + 500); ++i) {
                             auto st = tx.put(sentinel(i));
                             if (!st.ok()) return st;
                           }
                           return absl::OkStatus();
                         })
              .status(),
          "write sentinels");
  }
  exec(*pool,
       "UPDATE sentinels SET health = 'healthy', running_image = image, available_replicas ="
       " replicas, deploy_status = 'ready'");

  const double raw = check(rawCommitRate(*pool, 8, 3s, "bench_raw"), "raw commit rate");
  std::fprintf(stderr, "raw commit rate: %.0f commits/s\n", raw);

  ingest::Ingestor ingestor(pool);
  workflow::EngineOptions options;
  options.threads = 16;
  options.poll_interval = 20ms;
  workflow::Engine engine(pool, options);
  check(engine.registerService(services::sentinel::sentinelService(pool, writer)),
        "register SentinelService");
  check(engine.registerService(rollout::sentinelRolloutService(pool)),
        "register SentinelRolloutService");
  engine.start();
  ingestor.addSentinelReadyHook(std::make_shared<services::sentinel::ReadyNotifier>(pool, engine));
  // The agents: every sentinel in `progressing` is reported converged at once.
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> reports{0};
  std::thread agents([&] {
    while (!stop) {
      const int n = testing::settleSentinels(*pool, ingestor);
      reports += n;
      if (n == 0) std::this_thread::sleep_for(2ms);
    }
  });

  services::v1::RolloutStartRequest start;
  start.set_image("krane.dev/sentinel:v2");
  const auto t0 = Clock::now();
  auto started = check(
      workflow::resultAs<services::v1::RolloutResponse>(engine.call(
          workflow::invocation(rollout::kServiceName, "Rollout", rollout::kKey, start), 300s)),
      "start the rollout");
  const double listed_s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::fprintf(stderr, "started: %u sentinels in %d waves (listing took %.2f s)\n",
               started.rollout().total(), started.rollout().waves_size(), listed_s);
  services::v1::SentinelRollout last;
  uint32_t shown_wave = 0;
  for (;;) {
    auto raw_state =
        check(workflow::readState(*pool, rollout::kServiceName, rollout::kKey, rollout::kStateName),
              "read the rollout");
    if (raw_state) {
      last = check(workflow::decodeAs<services::v1::SentinelRollout>(*raw_state, "rollout"),
                   "decode the rollout");
    }
    if (last.current_wave() != shown_wave ||
        last.state() != services::v1::ROLLOUT_STATE_IN_PROGRESS) {
      std::fprintf(stderr, "  %.1f s: wave %u/%d, %s\n",
                   std::chrono::duration<double>(Clock::now() - t0).count(),
                   std::min<uint32_t>(last.current_wave() + 1, last.waves_size()),
                   last.waves_size(), rollout::stateName(last.state()).c_str());
      shown_wave = last.current_wave();
    }
    if (last.state() != services::v1::ROLLOUT_STATE_IN_PROGRESS) break;
    std::this_thread::sleep_for(100ms);
  }
  const double total_s = std::chrono::duration<double>(Clock::now() - t0).count();
  stop = true;
  agents.join();
  engine.stop();
  if (last.state() != services::v1::ROLLOUT_STATE_COMPLETED) {
    throw std::runtime_error("the rollout ended " + rollout::stateName(last.state()) + ": " +
                             last.message());
  }
  const double ms_per_sentinel = 1000.0 * total_s / sentinels;
  report(json,
         fmt::format("fleet rollout of {} sentinels in the default waves (1, 5, 25, 50, 100 %),"
                     " 50 deploys at once, agents converging at once, {} cores{}",
                     sentinels, std::thread::hardware_concurrency(),
                     quick ? " (--quick: a smoke run)" : ""),
         {{quick ? "rollout_1k_s" : "rollout_10k_s", total_s, "s"},
          {"engine_ms_per_sentinel", ms_per_sentinel, "ms"},
          {"raw_commit_rate_per_s", raw, "1/s"}},
         {{"sentinels_per_s_vs_raw_commit_rate", sentinels / total_s / raw, ""}},
         fmt::format("The agents report a sentinel converged as soon as it is written, so the time "
                     "is the control plane's: listing, {} SentinelService.Deploy invocations "
                     "(write, wait, notify), {} sentinel reports through the ingestor, and the "
                     "rollout's own steps.",
                     sentinels, reports.load()));
  return 0;
}

}  // namespace
}  // namespace krane::bench

int main(int argc, char** argv) {
  return krane::bench::benchMain(argc, argv, krane::bench::kUsage, krane::bench::run);
}
