// The environment's traffic through its sentinel, every part real: krane-ctrl's RoutingService
// swaps, promotes and rolls back; the change reaches a real agent whose deployment plugin runs
// the demo app (v1 and v2) and whose sentinel plugin runs krane-sentinel, the routing proxy.
// Requests through the sentinel see the version change with each switch, and none fails while a
// steady stream of them runs.
#include <httplib.h>
#include <signal.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include <catch2/catch.hpp>

#include "common/strings.h"
#include "controlplane/services/routing/routing.h"
#include "controlplane/workflow/typed.h"
#include "tests/support/control_plane.h"
#include "tests/support/leftovers.h"
#include "tests/support/local_agent.h"
#include "tests/support/matchers.h"
#include "tests/support/process.h"
#include "tests/support/traffic.h"
#include "tests/support/wait.h"

namespace krane {
namespace {

using krane::testing::ChildProcess;
using krane::testing::eventually;
using krane::testing::runfile;
using krane::testing::TestControlPlane;
using namespace std::chrono_literals;

cluster::v1::Resource topology(const std::string& id, const std::string& tag) {
  cluster::v1::Resource r;
  r.set_type("deployment_topology");
  r.set_id(id);
  r.set_region("eu-1");
  auto* t = r.mutable_deployment_topology();
  t->set_deployment_id(id);
  t->set_workspace_id("ws");
  t->set_project_id("proj");
  t->set_app_id("app");
  t->set_environment_id("prod");
  t->set_region("eu-1");
  t->set_image("krane.dev/demo-app:" + tag);
  t->set_replicas(2);
  t->set_port(8080);
  t->set_cpu_millicores(100);
  t->set_memory_mib(64);
  t->mutable_healthcheck()->mutable_readiness()->set_path("/healthz/ready");
  t->mutable_healthcheck()->mutable_readiness()->set_period_seconds(1);
  t->set_desired_status(cluster::v1::DESIRED_STATUS_RUNNING);
  return r;
}

cluster::v1::Resource sentinel() {
  cluster::v1::Resource r;
  r.set_type("sentinel");
  r.set_id("sen_eu");
  r.set_region("eu-1");
  auto* s = r.mutable_sentinel();
  s->set_sentinel_id("sen_eu");
  s->set_workspace_id("ws");
  s->set_project_id("proj");
  s->set_app_id("app");
  s->set_environment_id("prod");
  s->set_region("eu-1");
  s->set_image("krane.dev/sentinel:v1");
  s->set_replicas(1);
  s->set_cpu_millicores(100);
  s->set_memory_mib(64);
  s->set_desired_state(cluster::v1::SENTINEL_DESIRED_STATE_RUNNING);
  return r;
}

using Answer = krane::testing::HttpAnswer;
Answer get(const std::string& address, const std::string& path) {
  return krane::testing::httpGet(address, path);
}

class SentinelE2eTest {
 protected:
  SentinelE2eTest() {
    char pattern[] = "/tmp/krane-se2e-XXXXXX";
    dir_ = ::mkdtemp(pattern);
  }
  ~SentinelE2eTest() { krane::testing::killInstancesAndRemove(dir_); }

  std::string dir_;
};

TEST_CASE_METHOD(SentinelE2eTest,
                 "requests through the sentinel follow swap promote and rollback with none failing",
                 "[sentinel-e2e][slow]") {
  TestControlPlane cp;
  cp.seedApp();
  auto& server = cp.startReplica();
  for (const auto& [id, at] : {std::pair<std::string, int64_t>{"d1", 100}, {"d2", 200}}) {
    REQUIRE_THAT((*cp.pool()->acquire())
                     ->exec("INSERT INTO deployments (id, workspace_id, project_id, app_id,"
                            " environment_id, status, git_branch, created_at)"
                            " VALUES (?, 'ws', 'proj', 'app', 'prod', 'ready', 'main', ?)",
                            {id, at}),
                 IsOk());
  }
  REQUIRE_THAT(server.writer().put(topology("d1", "v1")), IsOk());
  REQUIRE_THAT(server.writer().put(topology("d2", "v2")), IsOk());
  REQUIRE_THAT(server.writer().put(sentinel()), IsOk());

  const std::string config = dir_ + "/agent.yaml";
  std::ofstream(config) << krane::testing::localAgentConfig("eu-1", dir_ + "/state",
                                                            cp.replica(0).grpcPort(), 25300);
  ChildProcess agent({runfile("agent/krane"), "run", "--config", config, "--plugin-host",
                      runfile("agent/krane-plugin-host")},
                     dir_ + "/agent.log", {{"KRANE_AGENT_TOKEN", cp.agentToken("eu-1")}});
  INFO(krane::testing::slurp(dir_ + "/agent.log"));
  const std::string address = krane::testing::localSentinelAddress(dir_ + "/state");
  REQUIRE(!address.empty());
  // No live deployment yet: ready, nothing to route.
  REQUIRE(eventually([&] { return get(address, "/healthz/ready").status == 200; }, 30s));
  CHECK(get(address, "/").status == 503);

  using services::routing::kServiceName;
  const auto swap = [&](const std::string& id, services::v1::SwapReason reason) {
    services::v1::SwapLiveRequest req;
    req.set_deployment_id(id);
    req.set_reason(reason);
    return workflow::resultAs<services::v1::SwapLiveResponse>(server.workflowEngine().call(
        workflow::invocation(kServiceName, "SwapLiveDeployment", "prod", req), 30s));
  };
  const auto servedBy = [&](const std::string& version) {
    return eventually(
        [&] {
          const Answer a = get(address, "/");
          return a.status == 200 && a.body.find(" " + version + " ") != std::string::npos;
        },
        30s);
  };

  // The first deploy goes live (its instances may still be starting).
  REQUIRE_THAT(swap("d1", services::v1::SWAP_REASON_DEPLOY), IsOk());
  REQUIRE(servedBy("v1"));
  REQUIRE(eventually([&] { return get(address, "/healthz/ready").status == 200; }, 10s));

  krane::testing::SteadyTraffic traffic(address, 2, " v2 ");
  // Let both deployments be fully ready before switching (d2 started with the agent).
  std::this_thread::sleep_for(500ms);

  const auto promoted_at = std::chrono::steady_clock::now();
  REQUIRE_THAT(swap("d2", services::v1::SWAP_REASON_PROMOTE), IsOk());
  REQUIRE(servedBy("v2"));
  CHECK(std::chrono::steady_clock::now() - promoted_at < 5s);
  std::this_thread::sleep_for(500ms);

  const auto rolled_back_at = std::chrono::steady_clock::now();
  auto back = workflow::resultAs<services::v1::SwapLiveResponse>(server.workflowEngine().call(
      workflow::invocation(kServiceName, "Rollback", "prod", services::v1::RollbackRequest()),
      30s));
  REQUIRE_THAT(back, IsOk());
  CHECK(back->live_deployment_id() == "d1");
  REQUIRE(servedBy("v1"));
  CHECK(std::chrono::steady_clock::now() - rolled_back_at < 5s);
  std::this_thread::sleep_for(500ms);

  traffic.stop();
  INFO("last failure: " << traffic.lastFailure());
  CHECK(traffic.failed() == 0);
  CHECK(traffic.ok() > 20);
  CHECK(traffic.marked() > 0);
  agent.signal(SIGTERM);
  CHECK(agent.wait() == 0);
}

}  // namespace
}  // namespace krane
