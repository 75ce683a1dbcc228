// The real agent, with the deployment plugin in its own host on the process runtime, against a
// real krane-ctrl: a deployment becomes running processes whose instances reach the control
// plane; a kill -9 of the agent leaves them running and the restarted agent adopts them; a
// delete stops them. No process is left behind.
#include <signal.h>

#include <filesystem>
#include <fstream>

#include <catch2/catch.hpp>

#include "common/strings.h"
#include "nlohmann/json.hpp"
#include "tests/support/control_plane.h"
#include "tests/support/leftovers.h"
#include "tests/support/matchers.h"
#include "tests/support/process.h"
#include "tests/support/wait.h"

namespace krane {
namespace {

using krane::testing::ChildProcess;
using krane::testing::eventually;
using krane::testing::runfile;
using krane::testing::TestControlPlane;
namespace fs = std::filesystem;

cluster::v1::Resource deployment(const std::string& id, uint32_t replicas) {
  cluster::v1::Resource r;
  r.set_type("deployment_topology");
  r.set_id(id);
  r.set_region("eu-1");
  auto* t = r.mutable_deployment_topology();
  t->set_deployment_id(id);
  t->set_workspace_id("ws-1");
  t->set_project_id("p-1");
  t->set_app_id("app-1");
  t->set_environment_id("env-1");
  t->set_region("eu-1");
  t->set_image("krane.dev/demo-app:v1");
  t->set_replicas(replicas);
  t->set_port(8080);
  t->set_cpu_millicores(100);
  t->set_memory_mib(64);
  t->mutable_healthcheck()->mutable_readiness()->set_path("/healthz/ready");
  t->mutable_healthcheck()->mutable_readiness()->set_period_seconds(1);
  return r;
}

// Instances of `id` the control plane has, by status.
std::map<std::string, std::string> instances(TestControlPlane& cp, const std::string& id) {
  std::map<std::string, std::string> out;
  auto conn = cp.pool()->acquire();
  if (!conn.ok()) return out;
  auto rows =
      (*conn)->query("SELECT id, status FROM instances WHERE deployment_id = ?", {db::Value(id)});
  if (!rows.ok()) return out;
  for (const auto& row : rows->rows) out[row.str(0)] = row.str(1);
  return out;
}

bool allRunning(const std::map<std::string, std::string>& m, size_t n) {
  if (m.size() != n) return false;
  for (const auto& [id, status] : m) {
    if (status != "running") return false;
  }
  return true;
}

class DeploymentE2eTest {
 protected:
  DeploymentE2eTest() {
    char pattern[] = "/tmp/krane-de2e-XXXXXX";
    dir_ = ::mkdtemp(pattern);
  }
  ~DeploymentE2eTest() {
    leaked_ = krane::testing::killInstancesAndRemove(dir_);
    INFO("instances left running");
    CHECK(leaked_ == 0);
  }
  std::string dir_;
  int leaked_ = 0;
};

TEST_CASE_METHOD(DeploymentE2eTest,
                 "a deployment runs as processes survives an agent kill and is deleted",
                 "[deployment-e2e][slow]") {
  TestControlPlane cp;
  auto& server = cp.startReplica();
  const std::string config = dir_ + "/agent.yaml";
  std::ofstream(config) << strCat("region: eu-1\nstate_dir: ", dir_,
                                  "/state\n"
                                  "reconnect_min_ms: 50\nreconnect_max_ms: 200\n"
                                  "control_plane:\n  address: 127.0.0.1:",
                                  cp.replica(0).grpcPort(),
                                  "\n"
                                  "reporter:\n  heartbeat_interval_ms: 200\n"
                                  "plugins:\n"
                                  "  - name: deployment\n"
                                  "    path: ",
                                  runfile("plugins/deployment/libdeployment.so"),
                                  "\n"
                                  "    config:\n"
                                  "      runtime: process\n"
                                  "      process:\n"
                                  "        state_dir: ",
                                  dir_,
                                  "/state/deployments\n"
                                  "        ports: {from: 25000, to: 25099}\n"
                                  "        images:\n"
                                  "          krane.dev/demo-app: [",
                                  runfile("tests/support/demo_app/krane-demo-app"),
                                  ", --version, \"{tag}\"]\n");
  const std::map<std::string, std::string> env = {{"KRANE_AGENT_TOKEN", cp.agentToken("eu-1")}};
  const std::vector<std::string> args = {runfile("agent/krane"),
                                         "run",
                                         "--config",
                                         config,
                                         "--plugin-host",
                                         runfile("agent/krane-plugin-host")};

  REQUIRE(server.writer().put(deployment("d1", 2)).status() == absl::OkStatus());
  std::map<std::string, std::string> before;
  {
    ChildProcess agent(args, dir_ + "/agent1.log", env);
    INFO(krane::testing::slurp(dir_ + "/agent1.log"));
    REQUIRE(eventually([&] { return allRunning(instances(cp, "d1"), 2); }));
    before = instances(cp, "d1");
    agent.signal(SIGKILL);
    agent.wait();
  }
  // The agent and its plugin host are gone; the instances are not. A scale-up while nobody
  // watches is picked up by the restarted agent, which adopts the two it had.
  REQUIRE_THAT(server.writer().put(deployment("d1", 3)), IsOk());
  ChildProcess agent(args, dir_ + "/agent2.log", env);
  INFO(krane::testing::slurp(dir_ + "/agent2.log"));
  REQUIRE(eventually([&] { return allRunning(instances(cp, "d1"), 3); }));
  const auto after = instances(cp, "d1");
  for (const auto& [id, status] : before) {
    INFO(id << " was replaced");
    CHECK(after.count(id) == 1u);
  }

  REQUIRE_THAT(server.writer().remove({"deployment_topology", "d1", "eu-1"}), IsOk());
  INFO(krane::testing::slurp(dir_ + "/agent2.log"));
  REQUIRE(eventually([&] { return instances(cp, "d1").empty(); }));
  // Their directories go once the processes are gone.
  REQUIRE(eventually([&] {
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(dir_ + "/state/deployments/instances", ec);
         it != fs::recursive_directory_iterator(); it.increment(ec)) {
      if (it->path().filename() == "instance.json") return false;
    }
    return true;
  }));
  agent.signal(SIGTERM);
  CHECK(agent.wait() == 0);
}

}  // namespace
}  // namespace krane
