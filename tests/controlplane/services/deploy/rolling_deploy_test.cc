// The rolling strategy of the deploy workflow (controlplane/services/deploy/rolling.h) on the
// workflow engine, the feed writer, the ingestor and a real MariaDB, with agents played by a
// thread that runs, instantly, what each topology asks for: replicas move from the live
// deployment to the new one within surge and unavailable in every region, then the new one goes
// live; new instances that keep failing roll it back, capacity-aware, and the old one stays live;
// a roll that does not complete in time rolls back too.
#include <atomic>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include <catch2/catch.hpp>

#include "common/strings.h"
#include "controlplane/ingest/ingestor.h"
#include "controlplane/services/deploy/deploy.h"
#include "controlplane/services/deploy/readiness.h"
#include "controlplane/workflow/engine.h"
#include "controlplane/workflow/typed.h"
#include "tests/controlplane/workflow/fixture.h"
#include "tests/support/reports.h"
#include "tests/support/sentinel_reports.h"
#include "tests/support/wait.h"

namespace krane::services::deploy {
namespace {

using krane::testing::eventually;
using workflow::Engine;
using workflow::invocation;
using workflow::resultAs;
using namespace std::chrono_literals;

class RollingDeployTest : public workflow::WorkflowTest {
 protected:
  RollingDeployTest()
      : writer_(std::make_shared<feed::Writer>(pool_, std::make_shared<feed::ResourceTables>())),
        ingestor_(std::make_shared<ingest::Ingestor>(pool_)) {
    seedTenancy();
    exec(
        "UPDATE environments SET strategy = 'rolling', max_surge = 1, max_unavailable = 0,"
        " deploy_timeout_seconds = 120 WHERE id = 'prod'");
    exec(
        "INSERT INTO quotas (workspace_id, max_concurrent_builds, created_at) VALUES ('ws', 5, 1)");
    for (const char* region : {"eu-1", "us-1"}) {
      exec("INSERT INTO regions (id, display_name, created_at) VALUES (?, ?, 1)", {region, region});
      exec(
          "INSERT INTO environment_regions (environment_id, region_id, replicas, created_at)"
          " VALUES ('prod', ?, 3, 1)",
          {region});
    }
    Engine& e = engine([&](Engine& e) {
      DeployDependencies deps{pool_, writer_, std::make_shared<builder::PrebuiltBuilder>(),
                              nullptr};
      routing::RoutingOptions routing;
      routing.writer = writer_;  // the swap tells the sentinels
      for (auto& service : deployServices(deps, routing)) {
        REQUIRE_THAT(e.registerService(std::move(service)), IsOk());
      }
    });
    ingestor_->addDeploymentInstancesHook(std::make_shared<ReadinessGate>(pool_, e));
    ingestor_->addSentinelReadyHook(std::make_shared<sentinel::ReadyNotifier>(pool_, e));
    engine_ = &e;
    agents_ = std::thread([this] { playAgents(); });
  }
  ~RollingDeployTest() {
    stop_ = true;
    agents_.join();
  }

  // The agents: each topology's replicas run at once (failing, for the deployments in failing_;
  // pending, for those in pending_), reported every 20 ms; the sentinels converge.
  void playAgents() {
    while (!stop_) {
      krane::testing::settleSentinels(*pool_, *ingestor_);
      if (auto conn = pool_->acquire(); conn.ok()) {
        auto both = (*conn)->query(
            "SELECT COUNT(*) FROM sentinels WHERE rolling_deployment_id IS NOT NULL");
        if (both.ok() && both->rows[0].i64(0) > 0) sawBothRouted_ = true;
      }
      std::map<std::pair<std::string, std::string>, int> replicas;
      if (auto conn = pool_->acquire(); conn.ok()) {
        auto rows = (*conn)->query(
            "SELECT deployment_id, region_id, replicas FROM deployment_topology"
            " WHERE deleted_at IS NULL AND desired_status = 'running'");
        if (rows.ok()) {
          for (const db::Row& r : rows->rows) {
            replicas[{r.str(0), r.str(1)}] = static_cast<int>(r.i64(2));
          }
        }
      }
      std::map<std::string, int> healthy_by_region, total_by_region;
      for (const auto& [key, n] : replicas) {
        const auto& [deployment, region] = key;
        bool failing, pending;
        {
          std::lock_guard lock(mutex_);
          failing = failing_.count(deployment) > 0;
          pending = pending_.count(deployment) > 0;
        }
        cluster::v1::ReportDeploymentStatusRequest report =
            krane::testing::instancesReport(deployment, region, n);
        for (auto& i : *report.mutable_instances()->mutable_instances()) {
          if (failing) {
            i.set_status(cluster::v1::INSTANCE_STATUS_FAILED);
            i.set_failure_reason("CrashLoopBackOff: exit code 1");
          } else if (pending) {
            i.set_status(cluster::v1::INSTANCE_STATUS_PENDING);
          }
        }
        (void)ingestor_->reportDeploymentStatus(region, report);
        if (!failing && !pending) healthy_by_region[region] += n;
        total_by_region[region] += n;
      }
      {
        std::lock_guard lock(mutex_);
        for (const auto& [region, total] : total_by_region) {
          max_total_ = std::max(max_total_, total);
          if (watching_) min_healthy_ = std::min(min_healthy_, healthy_by_region[region]);
        }
      }
      std::this_thread::sleep_for(20ms);
    }
  }

  void deployment(const std::string& id, int64_t at) {
    exec(
        "INSERT INTO deployments (id, workspace_id, project_id, app_id, environment_id, status,"
        " git_branch, git_commit_sha, created_at)"
        " VALUES (?, 'ws', 'proj', 'app', 'prod', 'pending', ?, 'abc', ?)",
        {id, "branch-" + id, at});
  }
  absl::StatusOr<DeployResult> deploy(const std::string& id, const std::string& image) {
    DeployRequest r;
    r.mutable_build()->set_image(image);
    r.mutable_spec()->set_port(8080);
    r.mutable_spec()->set_cpu_millicores(100);
    r.mutable_spec()->set_memory_mib(64);
    auto sent = engine_->send(invocation(kServiceName, "Deploy", id, r, id));
    if (!sent.ok()) return sent.status();
    return resultAs<DeployResult>(engine_->awaitResult(*sent, 180s));
  }
  int64_t replicas(const std::string& deployment, const std::string& region) {
    return scalar(
        "SELECT replicas FROM deployment_topology WHERE deployment_id = ? AND region_id = ?",
        {deployment, region});
  }
  void watchFromNowOn() {
    std::lock_guard lock(mutex_);
    watching_ = true;
    min_healthy_ = 1000;
    max_total_ = 0;
  }

  std::shared_ptr<feed::Writer> writer_;
  std::shared_ptr<ingest::Ingestor> ingestor_;
  Engine* engine_ = nullptr;
  std::mutex mutex_;
  std::set<std::string> failing_;
  std::set<std::string> pending_;
  bool watching_ = false;
  int min_healthy_ = 1000;
  int max_total_ = 0;
  std::atomic<bool> sawBothRouted_{false};
  std::atomic<bool> stop_{false};
  std::thread agents_;
};

TEST_CASE_METHOD(RollingDeployTest,
                 "a rolling deploy moves replicas within surge 1 and unavailable 0, then goes live",
                 "[deploy][rolling]") {
  deployment("d1", 100);
  auto first = deploy("d1", "registry.example.com/app:v1");
  REQUIRE_THAT(first, IsOk());
  CHECK(first->live());
  CHECK(replicas("d1", "eu-1") == 3);  // the first deploy starts in full

  watchFromNowOn();
  deployment("d2", 200);
  auto second = deploy("d2", "registry.example.com/app:v2");
  REQUIRE_THAT(second, IsOk());
  CHECK(second->status() == "ready");
  CHECK(second->live());
  CHECK(scalar("SELECT COUNT(*) FROM apps WHERE current_deployment_id = 'd2'") == 1);
  for (const char* region : {"eu-1", "us-1"}) {
    INFO(region);
    CHECK(replicas("d2", region) == 3);
    CHECK(replicas("d1", region) == 0);
  }
  INFO("the sentinels routed to both during the roll, and only to the live one after the swap");
  CHECK(sawBothRouted_);
  CHECK(scalar("SELECT COUNT(*) FROM sentinels WHERE live_deployment_id = 'd2' AND"
               " rolling_deployment_id IS NULL") == 2);
  std::lock_guard lock(mutex_);
  INFO("surge 1: at most 4 instances in a region at any report");
  CHECK(max_total_ <= 4);
  INFO("unavailable 0: never fewer than 3 healthy in a region");
  CHECK(min_healthy_ >= 3);
  INFO("the topology carries the spec for the runtimes");
  CHECK(scalar("SELECT COUNT(*) FROM deployment_topology WHERE deployment_id = 'd2' AND"
               " JSON_EXTRACT(rolling_update, '$.maxSurge.value') = 1") == 2);
}

TEST_CASE_METHOD(RollingDeployTest,
                 "new instances that keep failing roll back without dropping below capacity",
                 "[deploy][rolling]") {
  deployment("d1", 100);
  REQUIRE_THAT(deploy("d1", "registry.example.com/app:v1"), IsOk());
  {
    std::lock_guard lock(mutex_);
    failing_.insert("d2");
  }
  watchFromNowOn();
  deployment("d2", 200);
  auto second = deploy("d2", "registry.example.com/app:broken");
  REQUIRE_FALSE(second.ok());
  CHECK_THAT(std::string(toStd(second.status().message())),
             ContainsRegex("rolled back to d1: new instances kept failing .*CrashLoopBackOff"));
  CHECK(scalar("SELECT COUNT(*) FROM apps WHERE current_deployment_id = 'd1'") == 1);
  CHECK(scalar("SELECT COUNT(*) FROM deployments WHERE id = 'd2' AND status = 'failed'") == 1);
  for (const char* region : {"eu-1", "us-1"}) {
    INFO(region);
    CHECK(replicas("d1", region) == 3);
  }
  INFO("the sentinels route to the live deployment only");
  CHECK(scalar("SELECT COUNT(*) FROM sentinels WHERE live_deployment_id = 'd1' AND"
               " rolling_deployment_id IS NULL") == 2);
  INFO("the new topology is gone (the deploy's compensation)");
  CHECK(scalar("SELECT COUNT(*) FROM deployment_topology WHERE deployment_id = 'd2' AND"
               " deleted_at IS NULL") == 0);
  std::lock_guard lock(mutex_);
  CHECK(max_total_ <= 4);
  INFO("the old deployment never dropped below min_available (3)");
  CHECK(min_healthy_ >= 3);
}

TEST_CASE_METHOD(RollingDeployTest, "a roll that does not complete in time rolls back",
                 "[deploy][rolling]") {
  deployment("d1", 100);
  REQUIRE_THAT(deploy("d1", "registry.example.com/app:v1"), IsOk());
  exec("UPDATE environments SET deploy_timeout_seconds = 3 WHERE id = 'prod'");
  {
    std::lock_guard lock(mutex_);
    pending_.insert("d2");  // never becomes ready
  }
  deployment("d2", 200);
  auto second = deploy("d2", "registry.example.com/app:slow");
  REQUIRE_FALSE(second.ok());
  CHECK_THAT(std::string(toStd(second.status().message())),
             ContainsRegex("rolled back to d1: not completed within 3 s"));
  CHECK(scalar("SELECT COUNT(*) FROM apps WHERE current_deployment_id = 'd1'") == 1);
  CHECK(replicas("d1", "eu-1") == 3);
  CHECK(replicas("d1", "us-1") == 3);
}

}  // namespace
}  // namespace krane::services::deploy
