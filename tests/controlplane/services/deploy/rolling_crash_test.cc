// kill -9 of the process running a rolling deploy, in the middle of the roll: another process
// resumes it from its journal (the cycles already applied are not applied again), the roll
// completes within its bounds, and the new deployment goes live.
#include <signal.h>

#include <filesystem>

#include <catch2/catch.hpp>

#include "common/strings.h"
#include "controlplane/ingest/ingestor.h"
#include "controlplane/services/deploy/deploy.h"
#include "controlplane/services/deploy/readiness.h"
#include "controlplane/workflow/engine.h"
#include "controlplane/workflow/typed.h"
#include "tests/controlplane/services/deploy/rolling_agents.h"
#include "tests/controlplane/workflow/fixture.h"
#include "tests/support/child_engine.h"
#include "tests/support/process.h"
#include "tests/support/wait.h"

namespace krane::services::deploy {
namespace {

using krane::testing::ChildProcess;
using krane::testing::eventually;
using krane::testing::runfile;
using workflow::invocation;
using namespace std::chrono_literals;

class RollingCrashTest : public workflow::WorkflowTest {
 protected:
  RollingCrashTest() : ingestor_(std::make_shared<ingest::Ingestor>(pool_)), submitter_(pool_) {
    seedTenancy();
    exec(
        "UPDATE environments SET strategy = 'rolling', max_surge = 1, max_unavailable = 0,"
        " deploy_timeout_seconds = 300 WHERE id = 'prod'");
    seedRegions(4);
    // The test process sends invocations and, through the hooks, notifications; it runs none.
    REQUIRE_THAT(submitter_.registerService(deployService({pool_, nullptr, nullptr, nullptr})),
                 IsOk());
    REQUIRE_THAT(submitter_.registerService(sentinel::sentinelService(pool_, nullptr)), IsOk());
    ingestor_->addDeploymentInstancesHook(std::make_shared<ReadinessGate>(pool_, submitter_));
    ingestor_->addSentinelReadyHook(std::make_shared<sentinel::ReadyNotifier>(pool_, submitter_));
    agents_ = std::make_unique<testing::RollingAgents>(pool_, ingestor_);
    const char* tmp = std::getenv("TEST_TMPDIR");
    dir_ = strCat(tmp != nullptr ? tmp : "/tmp", "/rolling-crash-", ::getpid());
    std::filesystem::create_directories(dir_);
    dsn_text_ = krane::testing::childDsn(dsn_);
  }
  ~RollingCrashTest() { agents_.reset(); }

  std::unique_ptr<ChildProcess> child(const std::string& worker) {
    return std::make_unique<ChildProcess>(
        std::vector<std::string>{runfile("tests/controlplane/services/deploy/deploy_child"),
                                 "--dsn", dsn_text_, "--worker", worker, "--log-dir",
                                 dir_ + "/logs", "--lease-ms", "1000"},
        strCat(dir_, "/", worker, ".log"));
  }
  absl::StatusOr<std::string> send(const std::string& id, const std::string& image) {
    exec(
        "INSERT INTO deployments (id, workspace_id, project_id, app_id, environment_id, status,"
        " git_branch, git_commit_sha, created_at)"
        " VALUES (?, 'ws', 'proj', 'app', 'prod', 'pending', ?, 'abc', ?)",
        {id, "branch-" + id, static_cast<int64_t>(id.back())});
    DeployRequest r;
    r.mutable_build()->set_image(image);
    r.mutable_spec()->set_port(8080);
    r.mutable_spec()->set_cpu_millicores(100);
    r.mutable_spec()->set_memory_mib(64);
    return submitter_.send(invocation(kServiceName, "Deploy", id, r, id));
  }
  int64_t replicas(const std::string& deployment, const std::string& region) {
    return scalar(
        "SELECT replicas FROM deployment_topology WHERE deployment_id = ? AND region_id = ?",
        {deployment, region});
  }

  std::shared_ptr<ingest::Ingestor> ingestor_;
  workflow::Engine submitter_;
  std::unique_ptr<testing::RollingAgents> agents_;
  std::string dir_;
  std::string dsn_text_;
};

TEST_CASE_METHOD(RollingCrashTest, "a rolling deploy killed mid-roll resumes and completes",
                 "[deploy][rolling][crash]") {
  auto first = child("a");
  auto d1 = send("d1", "registry.example.com/app:v1");
  REQUIRE_THAT(d1, IsOk());
  REQUIRE_THAT(workflow::resultAs<DeployResult>(submitter_.awaitResult(*d1, 120s)), IsOk());

  agents_->watch();
  auto d2 = send("d2", "registry.example.com/app:v2");
  REQUIRE_THAT(d2, IsOk());
  // Killed once the roll is under way in both regions, well before it ends.
  REQUIRE(
      eventually([&] { return replicas("d2", "eu-1") >= 2 && replicas("d2", "us-1") >= 1; }, 120s));
  first->signal(SIGKILL);
  first->wait();
  CHECK(replicas("d1", "eu-1") + replicas("d1", "us-1") > 0);
  auto second = child("b");
  auto result = workflow::resultAs<DeployResult>(submitter_.awaitResult(*d2, 180s));
  second->signal(SIGKILL);
  second->wait();
  REQUIRE_THAT(result, IsOk());
  CHECK(result->status() == "ready");
  CHECK(result->live());
  for (const char* region : {"eu-1", "us-1"}) {
    INFO(region);
    CHECK(replicas("d2", region) == 4);
    CHECK(replicas("d1", region) == 0);
  }
  INFO("within surge 1 and unavailable 0 across the kill");
  CHECK(agents_->maxTotal() <= 5);
  CHECK(agents_->minHealthy() >= 4);
  INFO("every cycle's apply step is journaled once");
  CHECK(scalar(
            "SELECT COUNT(*) FROM (SELECT name FROM workflow_journal j JOIN"
            " workflow_invocations i ON i.id = j.invocation_id WHERE i.object_key = 'd2'"
            " AND j.name LIKE 'rolling cycle %: apply' GROUP BY name HAVING COUNT(*) > 1) twice") ==
        0);
}

}  // namespace
}  // namespace krane::services::deploy
