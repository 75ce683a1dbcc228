// The deploy benchmark: deploys of a prebuilt image to two regions whose instances come up at
// once, on the real engine, feed writer, ingestor and a scratch MariaDB. See bench/README.md.
#include <atomic>
#include <map>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "bench/support/commit_rate.h"
#include "bench/support/figures.h"
#include "bench/support/scratch.h"
#include "common/strings.h"
#include "controlplane/db/migrate.h"
#include "controlplane/feed/writer.h"
#include "controlplane/ingest/ingestor.h"
#include "controlplane/services/buildslot/buildslot.h"
#include "controlplane/services/deploy/deploy.h"
#include "controlplane/services/deploy/readiness.h"
#include "controlplane/services/routing/routing.h"
#include "controlplane/workflow/engine.h"
#include "controlplane/workflow/typed.h"
#include "tests/support/mariadb.h"
#include "tests/support/reports.h"
#include "tests/support/sentinel_reports.h"

namespace krane::bench {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr const char* kUsage = R"(usage: deploy [--json] [--quick] [--help]
  --json    print one JSON object {"figures": [...]} on stdout; the table and progress go to stderr
  --quick   a smoke run: fewer deploys
)";

std::FILE* progress = stderr;

void exec(db::Pool& pool, const std::string& sql, const db::Params& params = {}) {
  auto conn = check(pool.acquire(), "connection");
  check(conn->exec(sql, params).status(), sql.c_str());
}

double msSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// The agents of both regions: as soon as a deploy waits for its instances, they are reported
// running. Records when, for the engine's share of a deploy's time.
class FakeAgents {
 public:
  FakeAgents(std::shared_ptr<db::Pool> pool, ingest::Ingestor& ingestor)
      : pool_(std::move(pool)), ingestor_(ingestor), thread_([this] { loop(); }) {}
  ~FakeAgents() {
    stop_ = true;
    thread_.join();
  }
  // When the instances of `id` were reported, if they were.
  std::optional<Clock::time_point> reportedAt(const std::string& id) {
    std::lock_guard lock(mutex_);
    auto it = reported_.find(id);
    if (it == reported_.end()) return std::nullopt;
    return it->second;
  }

 private:
  void loop() {
    while (!stop_) {
      auto conn = pool_->acquire();
      if (conn.ok()) {
        auto rows = (*conn)->query(
            "SELECT object_key FROM workflow_state WHERE service = ? AND name = ?",
            {services::deploy::kServiceName, services::deploy::kReadyAwakeableState});
        for (const auto& r : rows.ok() ? rows->rows : std::vector<db::Row>{}) {
          const std::string id = r.str(0);
          {
            std::lock_guard lock(mutex_);
            if (reported_.count(id)) continue;
          }
          for (const char* region : {"r1", "r2"}) {
            check(ingestor_.reportDeploymentStatus(region, testing::instancesReport(id, region)),
                  "report");
          }
          std::lock_guard lock(mutex_);
          reported_[id] = Clock::now();
        }
        // The sentinels a first deploy creates converge as soon as they are written.
        testing::settleSentinels(*pool_, ingestor_);
      }
      std::this_thread::sleep_for(1ms);
    }
  }

  std::shared_ptr<db::Pool> pool_;
  ingest::Ingestor& ingestor_;
  std::mutex mutex_;
  std::map<std::string, Clock::time_point> reported_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

int run(bool json, bool quick) {
  if (json) progress = stderr;
  logsToStderr();
  auto pool = seededScratchDatabase();
  for (const std::string sql :
       {"INSERT INTO quotas (workspace_id, max_concurrent_builds, created_at)"
        " VALUES ('ws', 1000, 1)",
        "INSERT INTO regions (id, display_name, created_at) VALUES ('r1', 'r1', 1),"
        " ('r2', 'r2', 1)",
        "INSERT INTO environment_regions (environment_id, region_id, replicas, created_at)"
        " VALUES ('prod', 'r1', 1, 1), ('prod', 'r2', 1, 1)"}) {
    exec(*pool, sql);
  }
  auto writer = std::make_shared<feed::Writer>(pool, std::make_shared<feed::ResourceTables>());
  ingest::Ingestor ingestor(pool);
  workflow::EngineOptions options;
  options.threads = 16;
  options.poll_interval = 20ms;
  workflow::Engine engine(pool, options);
  for (auto& service : services::deploy::deployServices(
           {pool, writer, std::make_shared<services::builder::PrebuiltBuilder>(),
            std::make_shared<services::builder::CommandBuilder>(
                services::builder::CommandBuilderOptions{.log_dir = "/tmp/krane-bench-builds"})})) {
    check(engine.registerService(std::move(service)), "register the deploy services");
  }
  engine.start();
  ingestor.addDeploymentInstancesHook(
      std::make_shared<services::deploy::ReadinessGate>(pool, engine));
  ingestor.addSentinelReadyHook(std::make_shared<services::sentinel::ReadyNotifier>(pool, engine));
  FakeAgents agents(pool, ingestor);

  services::v1::DeployRequest request;
  request.mutable_build()->set_image("registry.example.com/app:v1");
  request.mutable_spec()->set_port(8080);
  request.mutable_spec()->set_cpu_millicores(100);
  request.mutable_spec()->set_memory_mib(64);
  int next = 0;
  // A deployment row of its own branch (no dedup between them), sent; returns id, invocation.
  auto start = [&]() {
    const std::string id = fmt::format("dep_{:06d}", next++);
    // As the API does it: in a transaction retried on deadlock (the row's foreign key locks
    // the app, which the live swaps of other deploys lock too).
    check(pool->transact("create deployment",
                         [&](db::Connection& conn) {
                           return conn
                               .exec(
                                   "INSERT INTO deployments (id, workspace_id, project_id,"
                                   " app_id, environment_id, status, git_branch,"
                                   " git_commit_sha, created_at) VALUES (?, 'ws', 'proj', 'app',"
                                   " 'prod', 'pending', ?, 'abc', ?)",
                                   {id, "branch-" + id, static_cast<int64_t>(next)})
                               .status();
                         }),
          "create deployment");
    auto inv = check(engine.send(workflow::invocation(services::deploy::kServiceName, "Deploy", id,
                                                      request, id)),
                     "send");
    return std::make_pair(id, inv);
  };

  const int sequential = quick ? 10 : 40;
  const int batch = quick ? 40 : 200;
  std::fprintf(progress, "warm-up: 5 deploys\n");
  for (int i = 0; i < 5; ++i) check(engine.awaitResult(start().second, 60s), "warm-up deploy");

  const double raw = check(rawCommitRate(*pool, 8, 3s, "bench_raw"), "raw commit rate");
  std::fprintf(progress, "raw commit rate: %.0f commits/s\n", raw);

  std::vector<double> latency_ms, overhead_pct;
  for (int i = 0; i < sequential; ++i) {
    const auto t0 = Clock::now();
    auto [id, inv] = start();
    check(engine.awaitResult(inv, 60s), "deploy");
    const double total = msSince(t0);
    latency_ms.push_back(total);
    // The part spent waiting on instances: from the deploy starting to wait until they were up.
    auto conn = check(pool->acquire(), "connection");
    auto waited = check(conn->query("SELECT started_at FROM deployment_steps WHERE"
                                    " deployment_id = ? AND step = 'waiting'",
                                    {id}),
                        "steps");
    const auto up = agents.reportedAt(id);
    double instances_ms = 0;
    if (up && !waited.empty()) {
      const int64_t wait_started_unix = waited.rows[0].i64(0);
      const int64_t now_unix = std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count();
      const double up_ago = std::chrono::duration<double, std::milli>(Clock::now() - *up).count();
      instances_ms = std::max(0.0, static_cast<double>(now_unix - wait_started_unix) - up_ago);
      instances_ms = std::min(instances_ms, total);
    }
    overhead_pct.push_back(100.0 * (total - instances_ms) / total);
  }
  std::fprintf(progress, "%d sequential deploys: p50 %.1f ms, p99 %.1f ms\n", sequential,
               percentile(latency_ms, 50), percentile(latency_ms, 99));

  const auto t0 = Clock::now();
  std::vector<std::string> invocations(batch);
  {
    std::mutex m;
    std::vector<std::thread> senders;
    for (int s = 0; s < 8; ++s) {
      senders.emplace_back([&, s] {
        for (int i = s; i < batch; i += 8) {
          std::pair<std::string, std::string> started;
          {
            std::lock_guard lock(m);  // `next` and the row ids
            started = start();
          }
          invocations[i] = started.second;
        }
      });
    }
    for (auto& t : senders) t.join();
  }
  for (const auto& inv : invocations) check(engine.awaitResult(inv, 600s), "batch deploy");
  const double batch_s = msSince(t0) / 1000.0;
  const double per_s = batch / batch_s;
  std::fprintf(progress, "%d concurrent deploys: %.2f s, %.1f deploys/s\n", batch, batch_s, per_s);
  engine.stop();

  report(json,
         fmt::format("deploys (prebuilt image, 2 regions, instances up at once), {} cores{}",
                     std::thread::hardware_concurrency(), quick ? " (--quick: a smoke run)" : ""),
         {{"deploys_per_s", per_s, "1/s"},
          {"deploy_to_ready_p50_ms", percentile(latency_ms, 50), "ms"},
          {"deploy_to_ready_p99_ms", percentile(latency_ms, 99), "ms"},
          {"engine_overhead_pct", median(overhead_pct), "%"},
          {"raw_commit_rate_per_s", raw, "1/s"}},
         {{"deploys_per_s_vs_raw_commit_rate", per_s / raw, ""}},
         "engine_overhead_pct: the share of a deploy's time (send to ready) not spent waiting for "
         "its instances (from the deploy starting to wait until the agents reported them up).");
  return 0;
}

}  // namespace
}  // namespace krane::bench

int main(int argc, char** argv) {
  return krane::bench::benchMain(argc, argv, krane::bench::kUsage, krane::bench::run);
}
