// kill -9 of the process running a deploy, once in each step: another process resumes it, the
// deploy reaches ready, every step is recorded once, each region got its desired state once, and
// the build ran again only when the kill interrupted it.
#include <signal.h>

#include <fstream>

#include <catch2/catch.hpp>

#include "common/strings.h"
#include "controlplane/ingest/ingestor.h"
#include "controlplane/services/buildslot/buildslot.h"
#include "controlplane/services/deploy/deploy.h"
#include "controlplane/services/deploy/readiness.h"
#include "controlplane/services/routing/routing.h"
#include "controlplane/workflow/engine.h"
#include "controlplane/workflow/typed.h"
#include "tests/controlplane/workflow/fixture.h"
#include "tests/support/child_engine.h"
#include "tests/support/matchers.h"
#include "tests/support/process.h"
#include "tests/support/reports.h"
#include "tests/support/sentinel_reports.h"
#include "tests/support/wait.h"

namespace krane::services::deploy {
namespace {

using krane::testing::ChildProcess;
using krane::testing::eventually;
using krane::testing::runfile;
using workflow::invocation;
using namespace std::chrono_literals;

const std::vector<std::string> kSteps = {"queued",  "starting", "building",   "deploying",
                                         "waiting", "network",  "finalizing", "ready"};

class DeployCrashTest : public workflow::WorkflowTest {
 protected:
  DeployCrashTest() : ingestor_(std::make_shared<ingest::Ingestor>(pool_)), submitter_(pool_) {
    seedTenancy();
    seedRegions(1);
    // The test process sends invocations and, through the gate, notifications; it runs none.
    DeployDependencies deps{pool_, nullptr, nullptr, nullptr};
    REQUIRE_THAT(submitter_.registerService(deployService(deps)), IsOk());
    REQUIRE_THAT(submitter_.registerService(sentinel::sentinelService(pool_, nullptr)), IsOk());
    ingestor_->addDeploymentInstancesHook(std::make_shared<ReadinessGate>(pool_, submitter_));
    ingestor_->addSentinelReadyHook(std::make_shared<sentinel::ReadyNotifier>(pool_, submitter_));
    // The regions' agents run the sentinels the first deploy creates.
    sentinel_agents_ = std::thread([this] {
      while (!stop_) {
        krane::testing::settleSentinels(*pool_, *ingestor_);
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    });
    const char* tmp = std::getenv("TEST_TMPDIR");
    dir_ = strCat(tmp != nullptr ? tmp : "/tmp", "/deploy-crash-", ::getpid());
    std::filesystem::create_directories(dir_);
    dsn_text_ = krane::testing::childDsn(dsn_);
  }

  std::unique_ptr<ChildProcess> child(const std::string& worker) {
    return std::make_unique<ChildProcess>(
        std::vector<std::string>{runfile("tests/controlplane/services/deploy/deploy_child"),
                                 "--dsn", dsn_text_, "--worker", worker, "--log-dir",
                                 dir_ + "/logs", "--lease-ms", "1000"},
        strCat(dir_, "/", worker, ".log"));
  }
  static void killHard(ChildProcess& c) {
    c.signal(SIGKILL);
    c.wait();
  }
  bool stepStarted(const std::string& id, const std::string& step) {
    return scalar("SELECT COUNT(*) FROM deployment_steps WHERE deployment_id = ? AND step = ?",
                  {id, step}) > 0;
  }
  bool waiting(const std::string& id) {
    return scalar(
               "SELECT COUNT(*) FROM workflow_state WHERE service = ? AND object_key = ?"
               " AND name = ?",
               {kServiceName, id, kReadyAwakeableState}) == 1;
  }
  void reportRunning(const std::string& id) {
    for (const char* region : {"eu-1", "us-1"}) {
      REQUIRE_THAT(
          ingestor_->reportDeploymentStatus(region, krane::testing::instancesReport(id, region)),
          IsOk());
    }
  }
  int builds(const std::string& id) {
    std::ifstream in(dir_ + "/builds.txt");
    int n = 0;
    for (std::string line; std::getline(in, line);) n += line == id ? 1 : 0;
    return n;
  }

  ~DeployCrashTest() {
    stop_ = true;
    sentinel_agents_.join();
  }

  std::shared_ptr<ingest::Ingestor> ingestor_;
  workflow::Engine submitter_;
  std::atomic<bool> stop_{false};
  std::thread sentinel_agents_;
  std::string dir_;
  std::string dsn_text_;
};

TEST_CASE_METHOD(DeployCrashTest, "a deploy killed in each step completes with no step twice",
                 "[deploy][crash][slow]") {
  for (size_t k = 0; k + 1 < kSteps.size(); ++k) {
    const std::string& kill_in = kSteps[k];
    const std::string id = "d-" + kill_in;
    INFO("killed in " << kill_in);
    exec(
        "INSERT INTO deployments (id, workspace_id, project_id, app_id, environment_id, status,"
        " git_branch, git_commit_sha, created_at)"
        " VALUES (?, 'ws', 'proj', 'app', 'prod', 'pending', ?, 'abc', ?)",
        {id, "branch-" + kill_in, static_cast<int64_t>(100 + k)});
    DeployRequest req;
    auto* command = req.mutable_build()->mutable_command();
    command->add_argv("/bin/sh");
    command->add_argv("-c");
    // The build records that it ran, then takes a second: long enough to be killed in.
    command->add_argv(strCat("echo $KRANE_DEPLOYMENT_ID >> ", dir_, "/builds.txt; sleep 1"));
    command->set_image_name("demo-app");
    req.mutable_spec()->set_port(8080);
    req.mutable_spec()->set_cpu_millicores(100);
    req.mutable_spec()->set_memory_mib(64);
    auto invocation_id = submitter_.send(invocation(kServiceName, "Deploy", id, req, id));
    REQUIRE_THAT(invocation_id, IsOk());

    auto first = child("a-" + kill_in);
    // To be killed past the wait, the instances must have come up first.
    const bool past_waiting = k > 4;
    if (past_waiting) {
      REQUIRE(eventually([&] { return waiting(id); }, 60s));
      reportRunning(id);
    }
    REQUIRE(eventually([&] { return stepStarted(id, kill_in); }, 60s));
    killHard(*first);
    auto second = child("b-" + kill_in);
    if (!past_waiting) {
      REQUIRE(eventually([&] { return waiting(id) || stepStarted(id, "network"); }, 60s));
      reportRunning(id);
    }
    auto result = workflow::resultAs<DeployResult>(submitter_.awaitResult(*invocation_id, 60s));
    killHard(*second);
    REQUIRE_THAT(result, IsOk());
    CHECK(result->status() == "ready");

    std::vector<std::string> steps;
    auto rows = (*pool_->acquire())
                    ->query(
                        "SELECT step FROM deployment_steps WHERE deployment_id = ?"
                        " ORDER BY id",
                        {id});
    REQUIRE_THAT(rows, IsOk());
    for (const auto& r : rows->rows) steps.push_back(r.str(0));
    CHECK(steps == kSteps);
    INFO("one desired-state change per region");
    CHECK(scalar("SELECT COUNT(*) FROM resource_changes WHERE resource_id = ?", {id}) == 2);
    INFO("the environment's sentinel and policy of each region, created once, by the first deploy");
    for (const char* type : {"sentinel", "cilium_network_policy"}) {
      INFO(type);
      CHECK(scalar("SELECT COUNT(*) FROM resource_changes WHERE resource_type = ?", {type}) == 2);
    }
    CHECK(scalar("SELECT COUNT(*) FROM deployments WHERE id = ? AND status = 'ready'", {id}) == 1);
    CHECK(scalar("SELECT COUNT(*) FROM apps WHERE current_deployment_id = ?", {id}) == 1);
    INFO(
        "the build is the one step that is at-least-once: it ran again only if the kill could"
        " have interrupted it (the step after `starting` follows at once)");
    const bool in_build = kill_in == "starting" || kill_in == "building";
    CHECK(builds(id) >= 1);
    CHECK(builds(id) <= (in_build ? 2 : 1));
  }
}

}  // namespace
}  // namespace krane::services::deploy
