// DeployService on the workflow engine, the feed writer, the ingestor and a real MariaDB, with
// BuildSlotService and RoutingService beside it. Agents are stood in for by status reports
// through the real Ingestor, so the readiness gate runs as in krane-ctrl. Covered: the happy
// path in two regions with its steps in order; readiness with one region down (1 of 2 healthy is
// enough) and its timeout (compensated); a build that fails (slot released, nothing deployed);
// cancel while waiting for a slot and for readiness; a deploy superseded while it waited for its
// slot; three quick deploys on one branch; self-skip; a spec no region accepts.
#include "controlplane/services/deploy/deploy.h"

#include <filesystem>
#include <fstream>
#include <thread>

#include <catch2/catch.hpp>

#include "controlplane/ingest/ingestor.h"
#include "controlplane/services/buildslot/buildslot.h"
#include "controlplane/services/dedup/dedup.h"
#include "controlplane/services/deploy/readiness.h"
#include "controlplane/services/routing/routing.h"
#include "controlplane/workflow/engine.h"
#include "controlplane/workflow/typed.h"
#include "tests/controlplane/workflow/fixture.h"
#include "tests/support/matchers.h"
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

class DeployTest : public workflow::WorkflowTest {
 protected:
  DeployTest()
      : writer_(std::make_shared<feed::Writer>(pool_, std::make_shared<feed::ResourceTables>())),
        ingestor_(std::make_shared<ingest::Ingestor>(pool_)) {
    seedTenancy();
    exec("UPDATE environments SET deploy_timeout_seconds = 600 WHERE id = 'prod'");
    exec(
        "INSERT INTO quotas (workspace_id, max_concurrent_builds, created_at) VALUES ('ws', 1, 1)");
    seedRegions(2);
    dir_ = std::filesystem::path(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp") /
           ("deploy-" + std::to_string(::getpid()));
    // The regions' agents run the sentinels a first deploy creates: each converges as soon as
    // it is written.
    sentinel_agents_ = std::thread([this] {
      while (!stop_) {
        krane::testing::settleSentinels(*pool_, *ingestor_);
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    });
  }
  ~DeployTest() {
    stop_ = true;
    sentinel_agents_.join();
    for (auto& e : engines_) e->stop();
    engines_.clear();
  }

  void deployment(const std::string& id, int64_t at, const std::string& sha = "abc123",
                  const std::string& branch = "main") {
    exec(
        "INSERT INTO deployments (id, workspace_id, project_id, app_id, environment_id, status,"
        " git_branch, git_commit_sha, created_at)"
        " VALUES (?, 'ws', 'proj', 'app', 'prod', 'pending', ?, ?, ?)",
        {id, branch, sha, at});
  }

  // A control-plane replica's engine: the deploy workflow and the services it calls, with a
  // readiness gate on `ingestor` (the one its agents report to).
  Engine& replica(ingest::Ingestor& ingestor) {
    Engine& e = engine([&](Engine& e) {
      DeployDependencies deps{pool_, writer_, std::make_shared<builder::PrebuiltBuilder>(),
                              std::make_shared<builder::CommandBuilder>(
                                  builder::CommandBuilderOptions{.log_dir = dir_ / "logs"})};
      for (auto& service : deployServices(deps)) {
        REQUIRE_THAT(e.registerService(std::move(service)), IsOk());
      }
    });
    ingestor.addDeploymentInstancesHook(std::make_shared<ReadinessGate>(pool_, e));
    ingestor.addSentinelReadyHook(std::make_shared<sentinel::ReadyNotifier>(pool_, e));
    return e;
  }
  Engine& start() { return replica(*ingestor_); }

  static DeployRequest prebuilt(const std::string& image = "registry.example.com/app:v1") {
    DeployRequest r;
    r.mutable_build()->set_image(image);
    auto* spec = r.mutable_spec();
    spec->set_port(8080);
    spec->set_cpu_millicores(250);
    spec->set_memory_mib(128);
    return r;
  }
  absl::StatusOr<std::string> send(Engine& e, const std::string& id, const DeployRequest& r) {
    return e.send(invocation(kServiceName, "Deploy", id, r, /*idempotency_key=*/id));
  }

  // An agent's report: `running` instances up in the region.
  void report(const std::string& deployment, const std::string& region, int running) {
    REQUIRE_THAT(ingestor_->reportDeploymentStatus(
                     region, krane::testing::instancesReport(deployment, region, running)),
                 IsOk());
  }

  std::string statusOfDeployment(const std::string& id) {
    auto rows = (*pool_->acquire())->query("SELECT status FROM deployments WHERE id = ?", {id});
    return rows.ok() && !rows->empty() ? rows->rows[0].str(0) : "<none>";
  }
  std::vector<std::string> steps(const std::string& id) {
    std::vector<std::string> out;
    auto rows = (*pool_->acquire())
                    ->query(
                        "SELECT step, ended_at IS NOT NULL, COALESCE(error, '')"
                        " FROM deployment_steps WHERE deployment_id = ? ORDER BY id",
                        {id});
    if (rows.ok()) {
      for (const auto& r : rows->rows) {
        out.push_back(r.str(0) + (r.i64(1) ? "" : " (open)") +
                      (r.str(2).empty() ? "" : " error: " + r.str(2)));
      }
    }
    return out;
  }
  int64_t topologyRows(const std::string& id) {
    return scalar(
        "SELECT COUNT(*) FROM deployment_topology WHERE deployment_id = ?"
        " AND deleted_at IS NULL",
        {id});
  }
  bool slotsEmpty(Engine& e) {
    auto s = resultAs<buildslot::BuildSlots>(
        e.call(invocation(buildslot::kServiceName, "Slots", "ws", buildslot::SlotsRequest()), 10s));
    return s.ok() && s->active().empty() && s->production().empty() && s->preview().empty();
  }
  bool waitingForInstances(const std::string& id) {
    return scalar(
               "SELECT COUNT(*) FROM workflow_state WHERE service = ? AND object_key = ?"
               " AND name = ?",
               {kServiceName, id, kReadyAwakeableState}) == 1;
  }

  std::shared_ptr<feed::Writer> writer_;
  std::shared_ptr<ingest::Ingestor> ingestor_;
  std::atomic<bool> stop_{false};
  std::thread sentinel_agents_;
  std::filesystem::path dir_;
};

TEST_CASE_METHOD(DeployTest, "a deploy reaches ready in two regions and goes live", "[deploy]") {
  Engine& e = start();
  deployment("d1", 100);
  auto id = send(e, "d1", prebuilt());
  REQUIRE_THAT(id, IsOk());
  REQUIRE(eventually([&] { return waitingForInstances("d1"); }));
  CHECK(topologyRows("d1") == 2);
  CHECK(statusOfDeployment("d1") == "deploying");
  INFO("the build slot was released once the build was done, while the deploy rolls out");
  REQUIRE(eventually([&] { return slotsEmpty(e); }));
  report("d1", "eu-1", 1);  // below its two replicas
  report("d1", "us-1", 2);
  report("d1", "eu-1", 2);
  auto result = resultAs<DeployResult>(e.awaitResult(*id, 30s));
  REQUIRE_THAT(result, IsOk());
  CHECK(result->status() == "ready");
  CHECK(result->image() == "registry.example.com/app:v1");
  CHECK(result->live());
  CHECK(statusOfDeployment("d1") == "ready");
  CHECK(steps("d1") == std::vector<std::string>{"queued", "starting", "building", "deploying",
                                                "waiting", "network", "finalizing", "ready"});
  CHECK(scalar("SELECT COUNT(*) FROM apps WHERE current_deployment_id = 'd1'") == 1);
  CHECK(scalar("SELECT COUNT(*) FROM deployments WHERE id = 'd1' AND"
               " image = 'registry.example.com/app:v1'") == 1);
  REQUIRE(eventually([&] { return slotsEmpty(e); }));
  INFO("one notification, however many reports and replicas saw the threshold");
  CHECK(scalar("SELECT COUNT(*) FROM workflow_invocations WHERE service = ?"
               " AND handler = 'NotifyInstancesReady'",
               {kServiceName}) == 1);
}

// Seed 001's ensureSentinels and ensureCiliumNetworkPolicy: the first deploy of an environment
// gives each region a sentinel and the environment's policy, in its deploying step; the next
// deploy finds them and writes none; a region added later gets its own.
TEST_CASE_METHOD(DeployTest, "the first deploy creates the environment's sentinels and policies",
                 "[deploy]") {
  Engine& e = start();
  auto deployToReady = [&](const std::string& id, int64_t at) {
    deployment(id, at, "sha-" + id, "branch-" + id);
    auto sent = send(e, id, prebuilt());
    REQUIRE_THAT(sent, IsOk());
    REQUIRE(eventually([&] { return waitingForInstances(id); }));
    for (const char* region : {"eu-1", "us-1", "ap-1"}) report(id, region, 2);
    auto result = resultAs<DeployResult>(e.awaitResult(*sent, 30s));
    REQUIRE_THAT(result, IsOk());
    CHECK(result->status() == "ready");
    return std::vector<std::string>(result->created_sentinel_ids().begin(),
                                    result->created_sentinel_ids().end());
  };
  auto first = deployToReady("d1", 100);
  CHECK(first.size() == 2);
  CHECK(scalar("SELECT COUNT(*) FROM sentinels WHERE environment_id = 'prod' AND workspace_id ="
               " 'ws' AND project_id = 'proj' AND app_id = 'app' AND desired_state = 'running'"
               " AND image = 'krane.dev/sentinel:v1' AND replicas = 1 AND version > 0") == 2);
  CHECK(scalar("SELECT COUNT(DISTINCT region_id) FROM sentinels WHERE environment_id = 'prod'") ==
        2);
  CHECK(scalar("SELECT COUNT(*) FROM cilium_network_policies WHERE environment_id = 'prod'"
               " AND name = ? AND version > 0",
               {environmentPolicyName("prod")}) == 2);
  INFO("each with its change record, in the deploy's own transaction");
  CHECK(scalar("SELECT COUNT(*) FROM resource_changes WHERE resource_type = 'sentinel'") == 2);
  CHECK(scalar("SELECT COUNT(*) FROM resource_changes"
               " WHERE resource_type = 'cilium_network_policy'") == 2);

  CHECK(deployToReady("d2", 200).empty());
  CHECK(scalar("SELECT COUNT(*) FROM resource_changes WHERE resource_type = 'sentinel'") == 2);

  seedRegion("ap-1", 2);
  auto third = deployToReady("d3", 300);
  REQUIRE(third.size() == 1);
  CHECK(scalar("SELECT COUNT(*) FROM sentinels WHERE id = ? AND region_id = 'ap-1'", {third[0]}) ==
        1);
  CHECK(scalar("SELECT COUNT(*) FROM cilium_network_policies WHERE environment_id = 'prod'") == 3);
}

// Two control-plane replicas (two engines, each with its own gate on the ingestor its agents
// report to) both see the threshold met: the deploy is notified once.
TEST_CASE_METHOD(DeployTest, "two replicas seeing the threshold notify once", "[deploy]") {
  Engine& first = start();
  auto other_ingestor = std::make_shared<ingest::Ingestor>(pool_);
  replica(*other_ingestor);  // the second replica, with its own gate
  deployment("d1", 100);
  auto id = send(first, "d1", prebuilt());
  REQUIRE(eventually([&] { return waitingForInstances("d1"); }));
  report("d1", "eu-1", 2);
  // us-1's agent reports to the other replica, then both hear more reports.
  const auto r = krane::testing::instancesReport("d1", "us-1", 2);
  REQUIRE_THAT(other_ingestor->reportDeploymentStatus("us-1", r), IsOk());
  report("d1", "eu-1", 2);
  REQUIRE_THAT(other_ingestor->reportDeploymentStatus("us-1", r), IsOk());
  auto result = resultAs<DeployResult>(first.awaitResult(*id, 30s));
  REQUIRE_THAT(result, IsOk());
  CHECK(result->status() == "ready");
  CHECK(scalar("SELECT COUNT(*) FROM workflow_invocations WHERE service = ?"
               " AND handler = 'NotifyInstancesReady'",
               {kServiceName}) == 1);
}

TEST_CASE_METHOD(DeployTest, "one region down is tolerated and none up times out", "[deploy]") {
  seedRegion("ap-1", 1);
  Engine& e = start();
  deployment("d1", 100);
  auto ok = send(e, "d1", prebuilt());
  REQUIRE(eventually([&] { return waitingForInstances("d1"); }));
  report("d1", "eu-1", 2);
  report("d1", "us-1", 2);  // ap-1 never reports: 2 of 3 regions
  auto result = resultAs<DeployResult>(e.awaitResult(*ok, 30s));
  REQUIRE_THAT(result, IsOk());
  CHECK(result->status() == "ready");

  exec("UPDATE environments SET deploy_timeout_seconds = 2 WHERE id = 'prod'");
  deployment("d2", 200, "def456");
  auto late = send(e, "d2", prebuilt("registry.example.com/app:v2"));
  REQUIRE(eventually([&] { return waitingForInstances("d2"); }));
  report("d2", "eu-1", 2);  // 1 of 3: not enough
  auto timed_out = e.awaitResult(*late, 30s);
  REQUIRE_FALSE(timed_out.ok());
  CHECK(timed_out.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK_THAT(workflow::messageOf(timed_out.status()),
             Catch::Contains("instances not ready within 2 s (1 of 3 regions healthy, 2 needed)"));
  CHECK(statusOfDeployment("d2") == "failed");
  CHECK(topologyRows("d2") == 0);  // compensated
  CHECK_THAT(steps("d2").back(), Catch::StartsWith("waiting error: instances not ready"));
  CHECK_FALSE(waitingForInstances("d2"));
  CHECK(scalar("SELECT COUNT(*) FROM apps WHERE current_deployment_id = 'd1'") == 1);
  REQUIRE(eventually([&] { return slotsEmpty(e); }));
}

TEST_CASE_METHOD(DeployTest, "a failing build releases the slot and deploys nothing", "[deploy]") {
  Engine& e = start();
  deployment("d1", 100);
  DeployRequest r = prebuilt();
  auto* command = r.mutable_build()->mutable_command();
  command->add_argv("/bin/sh");
  command->add_argv("-c");
  command->add_argv("echo compiling; echo 'error: missing semicolon' >&2; exit 2");
  command->set_image_name("demo-app");
  auto id = send(e, "d1", r);
  auto failed = e.awaitResult(*id, 30s);
  REQUIRE_FALSE(failed.ok());
  CHECK_THAT(workflow::messageOf(failed.status()), Catch::Contains("exited with status 2"));
  CHECK_THAT(workflow::messageOf(failed.status()), Catch::Contains("missing semicolon"));
  CHECK(statusOfDeployment("d1") == "failed");
  CHECK(topologyRows("d1") == 0);
  REQUIRE(steps("d1").size() == 3u);
  CHECK_THAT(steps("d1")[2], Catch::StartsWith("building error: build of d1 failed"));
  REQUIRE(eventually([&] { return slotsEmpty(e); }));
}

TEST_CASE_METHOD(DeployTest, "a spec no region accepts fails at once naming the field",
                 "[deploy]") {
  Engine& e = start();
  deployment("d1", 100);
  DeployRequest bad = prebuilt();
  bad.mutable_spec()->set_port(70000);
  auto id = send(e, "d1", bad);
  auto failed = e.awaitResult(*id, 30s);
  CHECK_THAT(failed, IsError(absl::StatusCode::kInvalidArgument));
  CHECK_THAT(workflow::messageOf(failed.status()),
             Catch::StartsWith("spec: deployment_topology.port"));
  CHECK(workflow::isTerminal(failed.status()));
  CHECK(statusOfDeployment("d1") == "failed");
  CHECK(topologyRows("d1") == 0);
  CHECK(scalar("SELECT attempts FROM workflow_invocations WHERE id = ?", {*id}) == 0);
  CHECK(slotsEmpty(e));  // it never asked for one
}

TEST_CASE_METHOD(DeployTest, "cancel while waiting for a slot and a deploy superseded in the queue",
                 "[deploy]") {
  Engine& e = start();
  // A build slot held by someone else (quota 1).
  buildslot::AcquireSlotRequest hold;
  hold.set_deployment_id("elsewhere");
  hold.set_awakeable_id("prm_unknown_elsewhere");
  REQUIRE_THAT(e.call(invocation(buildslot::kServiceName, "AcquireOrWait", "ws", hold), 10s),
               IsOk());
  // Two branches, so neither skips itself for the other.
  deployment("d1", 100, "sha1", "feature");
  deployment("d2", 200, "sha2");
  auto one = send(e, "d1", prebuilt());
  auto two = send(e, "d2", prebuilt());
  REQUIRE(eventually([&] {
    auto s = resultAs<buildslot::BuildSlots>(
        e.call(invocation(buildslot::kServiceName, "Slots", "ws", buildslot::SlotsRequest()), 10s));
    return s.ok() && s->production_size() == 2;
  }));
  // d1 is cancelled by an operator while it waits; d2 is superseded by a newer commit.
  REQUIRE_THAT(e.cancel(*one), IsOk());
  CHECK_THAT(e.awaitResult(*one, 30s), IsError(absl::StatusCode::kCancelled));
  CHECK(statusOfDeployment("d1") == "cancelled");
  CHECK(steps("d1").back() == "queued error: cancelled");
  INFO("the workflow recorded its invocation, for commit dedup to cancel");
  CHECK(scalar("SELECT COUNT(*) FROM deployments WHERE id = 'd2' AND invocation_id = ?", {*two}) ==
        1);
  deployment("d3", 300, "sha3");
  auto superseded = dedup::cancelOlderSiblings(*pool_, "d3");
  REQUIRE_THAT(superseded, IsOk());
  CHECK(superseded->size() == 1u);  // d2 (d1 is finished)
  CHECK(statusOfDeployment("d2") == "superseded");
  (void)e.awaitResult(*two, 30s);
  CHECK(statusOfDeployment("d2") == "superseded");  // its compensations did not overwrite it
  CHECK(topologyRows("d1") + topologyRows("d2") == 0);
  REQUIRE(eventually([&] {
    auto s = resultAs<buildslot::BuildSlots>(
        e.call(invocation(buildslot::kServiceName, "Slots", "ws", buildslot::SlotsRequest()), 10s));
    return s.ok() && s->production().empty() && s->active_size() == 1;  // only "elsewhere"
  }));
}

// A kill runs no compensations: a deploy killed while it held the workspace's build slot (quota
// 1) must not keep it for good.
TEST_CASE_METHOD(DeployTest, "a deploy killed while it holds its build slot gives it back",
                 "[deploy]") {
  Engine& e = start();
  deployment("dk", 50, "shak", "other");
  auto killed = send(e, "dk", prebuilt());
  REQUIRE_THAT(killed, IsOk());
  REQUIRE_THAT(e.kill(*killed), IsOk());
  exec("UPDATE deployments SET invocation_id = ? WHERE id = 'dk'", {*killed});
  // The slot it held when it was killed.
  buildslot::AcquireSlotRequest hold;
  hold.set_deployment_id("dk");
  hold.set_awakeable_id("prm_unknown_dk");
  REQUIRE_THAT(e.call(invocation(buildslot::kServiceName, "AcquireOrWait", "ws", hold), 10s),
               IsOk());
  deployment("d1", 100);
  REQUIRE_THAT(send(e, "d1", prebuilt()), IsOk());
  INFO("the next deploy builds");
  REQUIRE(eventually([&] { return waitingForInstances("d1"); }));
  auto s = resultAs<buildslot::BuildSlots>(
      e.call(invocation(buildslot::kServiceName, "Slots", "ws", buildslot::SlotsRequest()), 10s));
  REQUIRE_THAT(s, IsOk());
  CHECK(s->active_size() == 0);  // d1 built and released it; dk's hold is gone
}

TEST_CASE_METHOD(DeployTest, "cancel while waiting for readiness undoes the deploy", "[deploy]") {
  Engine& e = start();
  deployment("d1", 100);
  auto id = send(e, "d1", prebuilt());
  REQUIRE(eventually([&] { return waitingForInstances("d1"); }));
  CHECK(topologyRows("d1") == 2);
  REQUIRE_THAT(e.cancel(*id), IsOk());
  CHECK_THAT(e.awaitResult(*id, 30s), IsError(absl::StatusCode::kCancelled));
  CHECK(statusOfDeployment("d1") == "cancelled");
  CHECK(steps("d1").back() == "waiting error: cancelled");
  CHECK(topologyRows("d1") == 0);
  CHECK_FALSE(waitingForInstances("d1"));
  CHECK(scalar("SELECT COUNT(*) FROM apps WHERE current_deployment_id IS NULL") == 1);
  REQUIRE(eventually([&] { return slotsEmpty(e); }));
}

// A cancel sent to the workflow after its deployment went live (it raced the swap, or came
// straight to the invocation): the compensations must not remove what now serves traffic.
TEST_CASE_METHOD(DeployTest, "a cancel does not remove a deployment that serves traffic",
                 "[deploy]") {
  Engine& e = start();
  deployment("d1", 100);
  auto id = send(e, "d1", prebuilt());
  REQUIRE(eventually([&] { return waitingForInstances("d1"); }));
  CHECK(topologyRows("d1") == 2);
  exec("UPDATE apps SET current_deployment_id = 'd1' WHERE id = 'app'");  // as the swap does
  REQUIRE_THAT(e.cancel(*id), IsOk());
  CHECK_THAT(e.awaitResult(*id, 30s), IsError(absl::StatusCode::kCancelled));
  CHECK(topologyRows("d1") == 2);
}

// The same while the swap is under way: the swap holds the deployment's row, then makes it live.
// The cancel's removal waits for the swap and keeps what the routes now point at; checking the
// app without the row, it removed the instances of the deployment going live.
TEST_CASE_METHOD(DeployTest, "a cancel racing a swap to live keeps the deployment's instances",
                 "[deploy]") {
  Engine& e = start();
  deployment("d1", 100);
  auto id = send(e, "d1", prebuilt());
  REQUIRE(eventually([&] { return waitingForInstances("d1"); }));
  REQUIRE(topologyRows("d1") == 2);
  auto swap = pool_->acquire();
  REQUIRE_THAT(swap, IsOk());
  REQUIRE_THAT((*swap)->execText("START TRANSACTION"), IsOk());
  REQUIRE_THAT((*swap)->query("SELECT id FROM deployments WHERE id = 'd1' FOR UPDATE"), IsOk());
  REQUIRE_THAT(e.cancel(*id), IsOk());
  const bool waited = eventually([&] { return lockWaits() > 0; }, 20s);
  REQUIRE_THAT((*swap)->exec("UPDATE apps SET current_deployment_id = 'd1' WHERE id = 'app'"),
               IsOk());
  REQUIRE_THAT((*swap)->execText("COMMIT"), IsOk());
  CHECK(waited);
  CHECK_THAT(e.awaitResult(*id, 30s), IsError(absl::StatusCode::kCancelled));
  CHECK(topologyRows("d1") == 2);
}

// Three quick pushes to one branch with one build slot: the one building is committed and
// finishes, the one still queued when the third arrives is superseded, the newest builds next.
TEST_CASE_METHOD(DeployTest, "three quick deploys on one branch", "[deploy]") {
  Engine& e = start();
  const std::string gate = (dir_ / "release-build").string();
  std::filesystem::create_directories(dir_);
  auto building = [&](const std::string& tag) {
    DeployRequest r = prebuilt();
    auto* command = r.mutable_build()->mutable_command();
    command->add_argv("/bin/sh");
    command->add_argv("-c");
    command->add_argv("while [ ! -e " + gate + " ]; do sleep 0.05; done; echo " + tag);
    command->set_image_name("demo-app");
    return r;
  };
  deployment("d1", 100, "sha1");
  auto one = send(e, "d1", building("one"));
  REQUIRE(eventually([&] { return statusOfDeployment("d1") == "building"; }));
  deployment("d2", 200, "sha2");
  auto two = send(e, "d2", building("two"));
  REQUIRE(eventually([&] {
    auto s = resultAs<buildslot::BuildSlots>(
        e.call(invocation(buildslot::kServiceName, "Slots", "ws", buildslot::SlotsRequest()), 10s));
    return s.ok() && s->production_size() == 1;
  }));
  deployment("d3", 300, "sha3");
  auto superseded = dedup::cancelOlderSiblings(*pool_, "d3");  // what creating d3 does
  REQUIRE_THAT(superseded, IsOk());
  REQUIRE(superseded->size() == 1u);
  CHECK((*superseded)[0].deployment_id == "d2");
  auto three = send(e, "d3", building("three"));
  std::ofstream(gate).put('\n');  // the builds may finish now

  auto up = [&](const std::string& id) {
    REQUIRE(eventually([&] { return waitingForInstances(id); }));
    report(id, "eu-1", 2);
    report(id, "us-1", 2);
  };
  up("d1");
  auto first = resultAs<DeployResult>(e.awaitResult(*one, 30s));
  REQUIRE_THAT(first, IsOk());
  CHECK(first->status() == "ready");  // it held a slot: committed, never superseded
  CHECK_THAT(e.awaitResult(*two, 30s), IsError(absl::StatusCode::kCancelled));
  CHECK(statusOfDeployment("d2") == "superseded");
  up("d3");
  auto third = resultAs<DeployResult>(e.awaitResult(*three, 30s));
  REQUIRE_THAT(third, IsOk());
  CHECK(third->status() == "ready");
  CHECK(third->image() == "demo-app:sha3");
  CHECK(scalar("SELECT COUNT(*) FROM apps WHERE current_deployment_id = 'd3'") == 1);
  CHECK(topologyRows("d2") == 0);
}

// The cancel of commit dedup did not reach a deploy (its invocation was not recorded yet): it
// finds the newer sibling itself and stops before taking a build slot.
TEST_CASE_METHOD(DeployTest, "a deploy skips itself when a newer commit is queued", "[deploy]") {
  Engine& e = start();
  deployment("d1", 100, "sha1");
  deployment("d2", 200, "sha2");
  auto id = send(e, "d1", prebuilt());
  auto result = resultAs<DeployResult>(e.awaitResult(*id, 30s));
  REQUIRE_THAT(result, IsOk());
  CHECK(result->status() == "superseded");
  CHECK(statusOfDeployment("d1") == "superseded");
  CHECK(steps("d1") ==
        std::vector<std::string>{std::string("queued error: ") + dedup::kSupersededMessage});
  CHECK(topologyRows("d1") == 0);
  CHECK(slotsEmpty(e));
}

// Crash loops in enough regions that readiness can never be reached: the deploy fails at once
// with the reasons, well before its timeout.
TEST_CASE_METHOD(DeployTest, "failing regions fail the deploy at once with their reasons",
                 "[deploy]") {
  Engine& e = start();
  deployment("d1", 100);
  auto id = send(e, "d1", prebuilt());
  REQUIRE(eventually([&] { return waitingForInstances("d1"); }));
  auto failing = [&](const std::string& region, const std::string& reason) {
    REQUIRE_THAT(ingestor_->reportDeploymentStatus(
                     region, krane::testing::instancesReport("d1", region, 0, reason)),
                 IsOk());
  };
  failing("eu-1", "CrashLoopBackOff: exit code 1");
  // One region failing of two still leaves one that may come up: it waits.
  std::this_thread::sleep_for(300ms);
  CHECK(statusOfDeployment("d1") == "deploying");
  failing("us-1", "ErrImagePull: manifest unknown");
  const auto started = std::chrono::steady_clock::now();
  auto failed = e.awaitResult(*id, 30s);
  CHECK(std::chrono::steady_clock::now() - started < 20s);  // the timeout is 600 s
  CHECK_THAT(failed, IsError(absl::StatusCode::kFailedPrecondition));
  const std::string message = workflow::messageOf(failed.status());
  CHECK_THAT(message, Catch::Contains("instances failing in 2 of 2 regions (1 must be healthy)"));
  CHECK_THAT(message, Catch::Contains("eu-1: CrashLoopBackOff: exit code 1"));
  CHECK_THAT(message, Catch::Contains("us-1: ErrImagePull: manifest unknown"));
  CHECK(statusOfDeployment("d1") == "failed");
  CHECK(topologyRows("d1") == 0);
  CHECK_THAT(steps("d1").back(), Catch::StartsWith("waiting error: instances failing"));
}

}  // namespace
}  // namespace krane::services::deploy
