// The rolling strategy of the deploy workflow (controlplane/services/deploy/rolling.h) on the
// workflow engine, the feed writer, the ingestor and a real MariaDB, with agents played by a
// thread that runs, instantly, what each topology asks for (rolling_agents.h): replicas move from
// the live deployment to the new one within surge and unavailable in every region, then the new one
// goes live; new instances that keep failing roll it back, capacity-aware, and the old one stays
// live; a roll that does not complete in time rolls back too.
#include <future>

#include <catch2/catch.hpp>

#include "common/strings.h"
#include "controlplane/ingest/ingestor.h"
#include "controlplane/services/deploy/deploy.h"
#include "controlplane/services/deploy/readiness.h"
#include "controlplane/workflow/engine.h"
#include "controlplane/workflow/typed.h"
#include "tests/controlplane/services/deploy/rolling_agents.h"
#include "tests/controlplane/workflow/fixture.h"
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
    seedRegions(3);
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
    agents_ = std::make_unique<testing::RollingAgents>(pool_, ingestor_);
  }
  ~RollingDeployTest() { agents_.reset(); }

  void deployment(const std::string& id, int64_t at, const std::string& branch = "") {
    exec(
        "INSERT INTO deployments (id, workspace_id, project_id, app_id, environment_id, status,"
        " git_branch, git_commit_sha, created_at)"
        " VALUES (?, 'ws', 'proj', 'app', 'prod', 'pending', ?, 'abc', ?)",
        {id, branch.empty() ? "branch-" + id : branch, at});
  }
  static DeployRequest request(const std::string& image) {
    DeployRequest r;
    r.mutable_build()->set_image(image);
    r.mutable_spec()->set_port(8080);
    r.mutable_spec()->set_cpu_millicores(100);
    r.mutable_spec()->set_memory_mib(64);
    return r;
  }
  // Starts the deploy of `id`; its invocation id.
  absl::StatusOr<std::string> start(const std::string& id, const std::string& image) {
    return engine_->send(invocation(kServiceName, "Deploy", id, request(image), id));
  }
  absl::StatusOr<DeployResult> deploy(const std::string& id, const std::string& image) {
    auto sent = start(id, image);
    if (!sent.ok()) return sent.status();
    return resultAs<DeployResult>(engine_->awaitResult(*sent, 180s));
  }
  int64_t replicas(const std::string& deployment, const std::string& region) {
    return scalar(
        "SELECT replicas FROM deployment_topology WHERE deployment_id = ? AND region_id = ?",
        {deployment, region});
  }
  int64_t topologyRows(const std::string& deployment) {
    return scalar("SELECT COUNT(*) FROM deployment_topology WHERE deployment_id = ?", {deployment});
  }
  // Journal entries of `deployment`'s deploy workflow whose name is LIKE `name`.
  int64_t journaled(const std::string& deployment, const std::string& name) {
    return scalar(
        "SELECT COUNT(*) FROM workflow_journal j JOIN deployments d ON"
        " d.invocation_id = j.invocation_id WHERE d.id = ? AND j.name LIKE ?",
        {deployment, name});
  }
  std::shared_ptr<feed::Writer> writer_;
  std::shared_ptr<ingest::Ingestor> ingestor_;
  Engine* engine_ = nullptr;
  std::unique_ptr<testing::RollingAgents> agents_;
};

TEST_CASE_METHOD(RollingDeployTest,
                 "a rolling deploy moves replicas within surge 1 and unavailable 0, then goes live",
                 "[deploy][rolling]") {
  deployment("d1", 100);
  auto first = deploy("d1", "registry.example.com/app:v1");
  REQUIRE_THAT(first, IsOk());
  CHECK(first->live());
  CHECK(replicas("d1", "eu-1") == 3);  // the first deploy starts in full

  agents_->watch();
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
  CHECK(agents_->sawBothRouted());
  CHECK(scalar("SELECT COUNT(*) FROM sentinels WHERE live_deployment_id = 'd2' AND"
               " rolling_deployment_id IS NULL") == 2);
  INFO("surge 1: at most 4 instances in a region at any report");
  CHECK(agents_->maxTotal() <= 4);
  INFO("unavailable 0: never fewer than 3 healthy in a region");
  CHECK(agents_->minHealthy() >= 3);
  INFO("the topology carries the spec for the runtimes");
  CHECK(scalar("SELECT COUNT(*) FROM deployment_topology WHERE deployment_id = 'd2' AND"
               " JSON_EXTRACT(rolling_update, '$.maxSurge.value') = 1") == 2);
  INFO("the swap made the deploying revision current and cleared it");
  CHECK(scalar("SELECT COUNT(*) FROM apps WHERE current_deployment_id = 'd2' AND"
               " deploying_deployment_id IS NULL") == 1);
  INFO("the history: each region progressed, then completed (its latest record)");
  for (const char* region : {"eu-1", "us-1"}) {
    INFO(region);
    CHECK(scalar("SELECT COUNT(*) FROM deployment_phases WHERE deployment_id = 'd2' AND"
                 " region_id = ? AND phase = 'progressing'",
                 {region}) >= 1);
    CHECK(scalar("SELECT phase = 'completed' FROM deployment_phases WHERE deployment_id = 'd2'"
                 " AND region_id = ? ORDER BY id DESC LIMIT 1",
                 {region}) == 1);
  }
  CHECK(scalar("SELECT COUNT(*) FROM deployment_phases WHERE deployment_id = 'd1'") == 0);
  INFO("reports of the new instances woke cycles (not only the one-second tick)");
  CHECK(scalar("SELECT COUNT(*) FROM workflow_promises p JOIN deployments d ON"
               " d.invocation_id = p.invocation_id WHERE d.id = 'd2' AND p.kind = 'awakeable'"
               " AND p.state = 'resolved'") >= 1);
  CHECK(scalar("SELECT COUNT(*) FROM workflow_state WHERE name = ?", {kRollAwakeableState}) == 0);
}

TEST_CASE_METHOD(RollingDeployTest,
                 "a roll cancelled midway gives the live deployment back its replicas",
                 "[deploy][rolling]") {
  exec("UPDATE environments SET max_unavailable = 1 WHERE id = 'prod'");
  deployment("d1", 100);
  REQUIRE_THAT(deploy("d1", "registry.example.com/app:v1"), IsOk());
  agents_->pending("d2");  // the roll drains one old instance, then waits for the new ones
  deployment("d2", 200);
  auto sent = start("d2", "registry.example.com/app:v2");
  REQUIRE_THAT(sent, IsOk());
  REQUIRE(eventually([&] { return replicas("d1", "eu-1") < 3; }, 60s));
  REQUIRE_THAT(engine_->cancel(*sent), IsOk());
  CHECK_THAT(engine_->awaitResult(*sent, 60s), IsError(absl::StatusCode::kCancelled));
  for (const char* region : {"eu-1", "us-1"}) {
    INFO(region);
    CHECK(replicas("d1", region) == 3);
  }
  CHECK(scalar("SELECT COUNT(*) FROM apps WHERE current_deployment_id = 'd1'") == 1);
}

// A swap (promote, rollback, a deploy going live) that moves the live deployment while a stopped
// roll gives it its replicas back: played here by a transaction that locks the app's row as a swap
// does, changes the live deployment, and commits once the compensation waits for that row. The
// deployment that stopped being live must keep the replicas the roll left it.
TEST_CASE_METHOD(RollingDeployTest,
                 "a roll's compensation leaves alone a deployment a swap took off live meanwhile",
                 "[deploy][rolling]") {
  exec("UPDATE environments SET max_unavailable = 1 WHERE id = 'prod'");
  deployment("d0", 50);
  exec("UPDATE deployments SET status = 'ready' WHERE id = 'd0'");
  deployment("d1", 100);
  REQUIRE_THAT(deploy("d1", "registry.example.com/app:v1"), IsOk());
  agents_->pending("d2");  // the roll drains one old instance per region, then waits
  deployment("d2", 200);
  auto sent = start("d2", "registry.example.com/app:v2");
  REQUIRE_THAT(sent, IsOk());
  REQUIRE(
      eventually([&] { return replicas("d1", "eu-1") < 3 && replicas("d1", "us-1") < 3; }, 60s));

  auto swap = pool_->acquire();
  REQUIRE_THAT(swap, IsOk());
  REQUIRE_THAT((*swap)->execText("START TRANSACTION"), IsOk());
  REQUIRE_THAT((*swap)->query("SELECT current_deployment_id FROM apps WHERE id = 'app' FOR UPDATE"),
               IsOk());
  REQUIRE_THAT((*swap)->exec("UPDATE apps SET current_deployment_id = 'd0' WHERE id = 'app'"),
               IsOk());
  REQUIRE_THAT(engine_->cancel(*sent), IsOk());
  INFO("the compensations come to the app's row, and wait for the swap");
  // (Only the app's row is locked: whatever waits, waits for it.)
  const bool waited = eventually([&] { return lockWaits() > 0; }, 20s);
  REQUIRE_THAT((*swap)->execText("COMMIT"), IsOk());
  REQUIRE(waited);
  CHECK_THAT(engine_->awaitResult(*sent, 60s), IsError(absl::StatusCode::kCancelled));
  CHECK(scalar("SELECT COUNT(*) FROM apps WHERE current_deployment_id = 'd0'") == 1);
  INFO("d1 is no longer live: it keeps what the roll left it");
  for (const char* region : {"eu-1", "us-1"}) {
    INFO(region);
    CHECK(replicas("d1", region) == 2);
  }

  INFO("promoted later, d1 runs the environment's replicas again, not what the roll left it");
  routing::SwapLiveRequest promote;
  promote.set_deployment_id("d1");
  promote.set_reason(services::v1::SWAP_REASON_PROMOTE);
  auto promoted = resultAs<routing::SwapLiveResponse>(
      engine_->call(invocation(routing::kServiceName, "SwapLiveDeployment", "prod", promote), 30s));
  REQUIRE_THAT(promoted, IsOk());
  CHECK(promoted->live_deployment_id() == "d1");
  for (const char* region : {"eu-1", "us-1"}) {
    INFO(region);
    CHECK(replicas("d1", region) == 3);
  }
}

TEST_CASE_METHOD(RollingDeployTest, "a rollback to a deployment a roll drained runs it again",
                 "[deploy][rolling]") {
  deployment("d1", 100);
  REQUIRE_THAT(deploy("d1", "registry.example.com/app:v1"), IsOk());
  deployment("d2", 200);
  REQUIRE_THAT(deploy("d2", "registry.example.com/app:v2"), IsOk());
  REQUIRE(replicas("d1", "eu-1") == 0);  // drained by the roll, and still ready
  auto rolled = resultAs<routing::SwapLiveResponse>(engine_->call(
      invocation(routing::kServiceName, "Rollback", "prod", routing::RollbackRequest()), 30s));
  REQUIRE_THAT(rolled, IsOk());
  CHECK(rolled->live_deployment_id() == "d1");
  INFO("live again, it runs the environment's replicas, not the 0 the roll left");
  for (const char* region : {"eu-1", "us-1"}) {
    INFO(region);
    CHECK(replicas("d1", region) == 3);
  }

  INFO("the app is rolled back: a new deploy stays off live, so it must not drain d1");
  deployment("d3", 300);
  auto third = deploy("d3", "registry.example.com/app:v3");
  REQUIRE_THAT(third, IsOk());
  CHECK(third->status() == "ready");
  CHECK_FALSE(third->live());
  for (const char* region : {"eu-1", "us-1"}) {
    INFO(region);
    CHECK(replicas("d1", region) == 3);
    CHECK(replicas("d3", region) == 3);
  }
  CHECK(scalar("SELECT COUNT(*) FROM apps WHERE current_deployment_id = 'd1'") == 1);
}

// Two deploys of one environment a few minutes apart: the second rolls once the first is done,
// from the deployment live then. Rolling at once, both would drain the same live deployment
// and route the sentinels to each other's revision.
TEST_CASE_METHOD(RollingDeployTest, "a second rolling deploy waits for the first to finish",
                 "[deploy][rolling]") {
  deployment("d1", 100);
  REQUIRE_THAT(deploy("d1", "registry.example.com/app:v1"), IsOk());
  agents_->pending("d2");  // d2's roll stalls while its instances do not come up
  deployment("d2", 200);
  auto second = start("d2", "registry.example.com/app:v2");
  REQUIRE_THAT(second, IsOk());
  REQUIRE(eventually([&] { return topologyRows("d2") == 2; }));
  deployment("d3", 300);
  auto third = start("d3", "registry.example.com/app:v3");
  REQUIRE_THAT(third, IsOk());
  REQUIRE(eventually([&] {
    return scalar(
               "SELECT COUNT(*) FROM deployment_steps WHERE deployment_id = 'd3' AND"
               " step = 'building' AND ended_at IS NOT NULL") == 1 ||
           scalar("SELECT COUNT(*) FROM deployments WHERE id = 'd3' AND status = 'building'") == 1;
  }));
  INFO("d3 built, looked for its turn twice, and waits while d2 rolls");
  REQUIRE(eventually([&] { return journaled("d3", "step deploying%") >= 2; }));
  CHECK(scalar("SELECT COUNT(*) FROM deployments WHERE id = 'd3' AND status = 'building'") == 1);
  CHECK(topologyRows("d3") == 0);
  CHECK(scalar("SELECT COUNT(*) FROM sentinels WHERE rolling_deployment_id = 'd2'") == 2);

  agents_->running("d2");
  auto two = resultAs<DeployResult>(engine_->awaitResult(*second, 120s));
  REQUIRE_THAT(two, IsOk());
  CHECK(two->live());
  auto three = resultAs<DeployResult>(engine_->awaitResult(*third, 120s));
  REQUIRE_THAT(three, IsOk());
  CHECK(three->live());
  INFO("d3 rolled from d2, the deployment live when its turn came");
  for (const char* region : {"eu-1", "us-1"}) {
    INFO(region);
    CHECK(replicas("d3", region) == 3);
    CHECK(replicas("d2", region) == 0);
    CHECK(replicas("d1", region) == 0);
  }
  CHECK(scalar("SELECT COUNT(*) FROM apps WHERE current_deployment_id = 'd3'") == 1);
}

// A deploy waiting for its turn to roll: one of its branch that is newer supersedes it, and a
// roll whose workflow was killed (it stays `deploying`) does not hold the environment for good.
TEST_CASE_METHOD(RollingDeployTest, "waiting rolls give way to newer ones and not to killed ones",
                 "[deploy][rolling]") {
  deployment("d1", 100);
  REQUIRE_THAT(deploy("d1", "registry.example.com/app:v1"), IsOk());
  agents_->pending("d2");
  deployment("d2", 200);
  auto second = start("d2", "registry.example.com/app:v2");
  REQUIRE_THAT(second, IsOk());
  REQUIRE(eventually([&] { return topologyRows("d2") == 2; }));
  deployment("d3", 300, "main");
  auto third = start("d3", "registry.example.com/app:v3");
  REQUIRE_THAT(third, IsOk());
  REQUIRE(eventually([&] {
    return scalar("SELECT COUNT(*) FROM deployments WHERE id = 'd3' AND status = 'building'") == 1;
  }));
  deployment("d4", 400, "main");
  auto fourth = start("d4", "registry.example.com/app:v4");
  REQUIRE_THAT(fourth, IsOk());
  auto three = resultAs<DeployResult>(engine_->awaitResult(*third, 60s));
  REQUIRE_THAT(three, IsOk());
  CHECK(three->status() == "superseded");
  INFO("d2's workflow is killed mid-roll: d4 goes on");
  REQUIRE_THAT(engine_->kill(*second), IsOk());
  auto four = resultAs<DeployResult>(engine_->awaitResult(*fourth, 120s));
  REQUIRE_THAT(four, IsOk());
  CHECK(four->live());
}

// The agents report every 20 ms, and each report wakes a cycle of the roll: a new instance that
// fails for a moment must count once a second, not once a report.
TEST_CASE_METHOD(RollingDeployTest, "a new instance failing for a moment does not roll back",
                 "[deploy][rolling]") {
  deployment("d1", 100);
  REQUIRE_THAT(deploy("d1", "registry.example.com/app:v1"), IsOk());
  agents_->failing("d2");
  deployment("d2", 200);
  auto sent = start("d2", "registry.example.com/app:v2");
  REQUIRE_THAT(sent, IsOk());
  REQUIRE(eventually([&] {
    return scalar(
               "SELECT COUNT(*) FROM deployment_phases WHERE deployment_id = 'd2' AND"
               " detail LIKE '%CrashLoopBackOff%'") >= 1;
  }));
  // 20 cycles of the roll while its new instances fail: more failures seen than the cap (18)
  // if each cycle counted them.
  REQUIRE(eventually([&] { return journaled("d2", "rolling cycle %: observe") >= 20; }));
  agents_->running("d2");
  auto done = resultAs<DeployResult>(engine_->awaitResult(*sent, 120s));
  REQUIRE_THAT(done, IsOk());
  CHECK(done->live());
}

TEST_CASE_METHOD(RollingDeployTest,
                 "new instances that keep failing roll back without dropping below capacity",
                 "[deploy][rolling]") {
  deployment("d1", 100);
  REQUIRE_THAT(deploy("d1", "registry.example.com/app:v1"), IsOk());
  agents_->failing("d2");
  agents_->watch();
  deployment("d2", 200);
  auto second = deploy("d2", "registry.example.com/app:broken");
  REQUIRE_FALSE(second.ok());
  CHECK_THAT(std::string(toStd(second.status().message())),
             ContainsRegex("rolled back to d1: new instances kept failing .*CrashLoopBackOff"));
  CHECK(scalar("SELECT COUNT(*) FROM apps WHERE current_deployment_id = 'd1'") == 1);
  CHECK(scalar("SELECT COUNT(*) FROM deployments WHERE id = 'd2' AND status = 'failed'") == 1);
  INFO("the rollback is a phase of its own, ended by the reason");
  CHECK(scalar("SELECT COUNT(*) FROM deployment_steps WHERE deployment_id = 'd2' AND"
               " step = 'rolling_back' AND error LIKE 'rolled back to d1%'") == 1);
  INFO("in the history of both regions, with why");
  CHECK(scalar("SELECT COUNT(DISTINCT region_id) FROM deployment_phases WHERE"
               " deployment_id = 'd2' AND phase = 'rolling_back' AND"
               " detail LIKE 'new instances kept failing%'") == 2);
  CHECK(scalar("SELECT COUNT(*) FROM deployment_phases WHERE deployment_id = 'd2' AND"
               " detail LIKE '%CrashLoopBackOff%'") >= 1);
  CHECK(scalar("SELECT COUNT(*) FROM apps WHERE deploying_deployment_id IS NULL") == 1);
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
  CHECK(agents_->maxTotal() <= 4);
  INFO("the old deployment never dropped below min_available (3)");
  CHECK(agents_->minHealthy() >= 3);
}

TEST_CASE_METHOD(RollingDeployTest,
                 "a new instance counts as available only after min_ready_seconds",
                 "[deploy][rolling]") {
  deployment("d1", 100);
  REQUIRE_THAT(deploy("d1", "registry.example.com/app:v1"), IsOk());
  exec("UPDATE environments SET min_ready_seconds = 2 WHERE id = 'prod'");
  agents_->watch();
  deployment("d2", 200);
  REQUIRE_THAT(deploy("d2", "registry.example.com/app:v2"), IsOk());
  INFO(
      "the agents report new instances running at once, yet each region waited for them: its"
      " history has provisioning cycles");
  for (const char* region : {"eu-1", "us-1"}) {
    INFO(region);
    CHECK(scalar("SELECT COALESCE(SUM(attempts), 0) FROM deployment_phases WHERE"
                 " deployment_id = 'd2' AND region_id = ? AND phase = 'provisioning'",
                 {region}) >= 3);
    CHECK(replicas("d2", region) == 3);
  }
  CHECK(agents_->minHealthy() >= 3);
}

TEST_CASE_METHOD(RollingDeployTest, "a roll that does not complete in time rolls back",
                 "[deploy][rolling]") {
  deployment("d1", 100);
  REQUIRE_THAT(deploy("d1", "registry.example.com/app:v1"), IsOk());
  exec("UPDATE environments SET deploy_timeout_seconds = 3 WHERE id = 'prod'");
  agents_->pending("d2");  // never becomes ready
  deployment("d2", 200);
  auto rolling =
      std::async(std::launch::async, [&] { return deploy("d2", "registry.example.com/app:slow"); });
  INFO("while it rolls, d2 is the app's deploying revision, d1 its current one");
  CHECK(eventually([&] {
    return scalar(
               "SELECT COUNT(*) FROM apps WHERE current_deployment_id = 'd1' AND"
               " deploying_deployment_id = 'd2'") == 1;
  }));
  auto second = rolling.get();
  REQUIRE_FALSE(second.ok());
  CHECK_THAT(std::string(toStd(second.status().message())),
             ContainsRegex("rolled back to d1: not completed within 3 s"));
  CHECK(scalar("SELECT COUNT(*) FROM apps WHERE current_deployment_id = 'd1'") == 1);
  CHECK(replicas("d1", "eu-1") == 3);
  CHECK(replicas("d1", "us-1") == 3);
  CHECK(scalar("SELECT COUNT(*) FROM apps WHERE deploying_deployment_id IS NULL") == 1);
  INFO(
      "waiting for new instances is one record per region, however many cycles it took: its"
      " attempts grow and phase_started_at stays");
  for (const char* region : {"eu-1", "us-1"}) {
    INFO(region);
    CHECK(scalar("SELECT COUNT(*) FROM deployment_phases WHERE deployment_id = 'd2' AND"
                 " region_id = ? AND phase = 'provisioning'",
                 {region}) == 1);
    CHECK(scalar("SELECT attempts FROM deployment_phases WHERE deployment_id = 'd2' AND"
                 " region_id = ? AND phase = 'provisioning'",
                 {region}) >= 2);
    CHECK(scalar("SELECT updated_at - phase_started_at FROM deployment_phases WHERE"
                 " deployment_id = 'd2' AND region_id = ? AND phase = 'provisioning'",
                 {region}) >= 1000);
    CHECK(
        scalar("SELECT COUNT(*) FROM deployment_phases WHERE deployment_id = 'd2' AND"
               " region_id = ? AND phase = 'rolling_back' AND detail = 'not completed within 3 s'",
               {region}) == 1);
  }
}

}  // namespace
}  // namespace krane::services::deploy
