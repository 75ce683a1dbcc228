// kranectl's deploy commands against a krane-ctrl server in process (real MariaDB): `deploy`
// follows the steps to ready (agents' reports come from the test through ClusterService), fails
// with exit 6 and the failed step's error, refuses bad input with exit 1; `deployments list|get`,
// `rollback`, `promote` and `cancel`, with their exit codes.
#include <optional>
#include <thread>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "common/strings.h"
#include "krane/cluster/v1/cluster.grpc.pb.h"
#include "tests/support/control_plane.h"
#include "tests/support/matchers.h"
#include "tests/support/process.h"
#include "tests/support/reports.h"
#include "tests/support/tcp_relay.h"
#include "tests/support/threads.h"
#include "tests/support/wait.h"

namespace krane {
namespace {

using krane::testing::CommandResult;
using krane::testing::eventually;
using krane::testing::kOperatorToken;
using krane::testing::runCommand;
using krane::testing::runfile;
using krane::testing::TestControlPlane;

class DeployCliTest {
 protected:
  DeployCliTest() {
    auto& server = cp_.startReplica(
        [](ctrl::CtrlConfig& c) { c.workflow.poll_interval = std::chrono::milliseconds(20); });
    address_ = strCat("127.0.0.1:", server.grpcPort());
    cp_.seedApp();
    sentinel_agents_ = std::make_unique<krane::testing::SentinelAgents>(cp_);
  }

  CommandResult kranectl(std::vector<std::string> args) {
    std::vector<std::string> argv = {runfile("cli/kranectl")};
    argv.insert(argv.end(), args.begin(), args.end());
    return runCommand(argv, {{"KRANE_SERVER", address_}, {"KRANE_TOKEN", kOperatorToken}},
                      std::chrono::seconds(120));
  }

  // Plays the agents: once a deployment waits for its instances, both regions report them up.
  // Runs on its own thread while kranectl follows the deploy; records failures instead of
  // asserting.
  std::thread agentsBringUp(const std::string& sha) {
    return std::thread([this, sha] {
      std::string id;
      const bool waiting = eventually(
          [&] {
            auto rows = (*cp_.pool()->acquire())
                            ->query(
                                "SELECT d.id FROM deployments d JOIN deployment_steps s ON"
                                " s.deployment_id = d.id WHERE d.git_commit_sha = ? AND"
                                " s.step = 'waiting'",
                                {sha});
            if (!rows.ok() || rows->empty()) return false;
            id = rows->rows[0].str(0);
            return true;
          },
          std::chrono::seconds(60));
      if (!failures_.expect(waiting, "deployment " + sha + " never waited")) return;
      auto cluster = cp_.cluster();
      for (const char* region : {"eu-1", "us-1"}) {
        cluster::v1::ReportDeploymentStatusResponse ignored;
        failures_.expect(
            cluster
                ->ReportDeploymentStatus(TestControlPlane::withToken(cp_.agentToken(region)).get(),
                                         krane::testing::instancesReport(id, region), &ignored)
                .ok(),
            "report");
      }
    });
  }

  CommandResult deployImage(const std::string& sha) {
    auto agents = agentsBringUp(sha);
    auto result = kranectl({"deploy", "--app", "app", "--env", "prod", "--branch", "main",
                            "--commit", sha, "--image", "registry.example.com/app:" + sha});
    agents.join();
    return result;
  }

  TestControlPlane cp_;
  std::unique_ptr<krane::testing::SentinelAgents> sentinel_agents_;
  std::string address_;
  krane::testing::ThreadFailures failures_;
};

TEST_CASE_METHOD(DeployCliTest, "kranectl deploys follows the steps and steers the live one",
                 "[kranectl][deploy]") {
  auto first = deployImage("sha1");
  INFO(first.out << first.err);
  CHECK(failures_.all() == std::vector<std::string>{});
  REQUIRE(first.exit_code == 0);
  CHECK_THAT(first.out, Catch::Matches("deployment dep_[0-9a-f]+ created \\(app app, environment "
                                       "prod, branch main\\)\\n(.|\\n)*"));
  for (const char* step :
       {"queued", "starting", "building", "deploying", "waiting", "network", "finalizing"}) {
    CHECK_THAT(first.out, Catch::Contains(strCat("\n  ", step)));
  }
  CHECK_THAT(first.out, Catch::Contains("is ready and live: registry.example.com/app:sha1"));
  const std::string first_id = first.out.substr(11, first.out.find(' ', 11) - 11);

  auto second = deployImage("sha2");
  REQUIRE(second.exit_code == 0);
  const std::string second_id = second.out.substr(11, second.out.find(' ', 11) - 11);

  auto listed = kranectl({"deployments", "list", "--app", "app"});
  REQUIRE(listed.exit_code == 0);
  CHECK_THAT(listed.out, Catch::StartsWith("ID"));
  CHECK(listed.out.find(second_id) < listed.out.find(first_id));  // newest first
  auto page = kranectl({"deployments", "list", "--app", "app", "--limit", "1"});
  REQUIRE(page.exit_code == 0);
  CHECK(page.out.find(second_id) != std::string::npos);
  CHECK(page.out.find(first_id) == std::string::npos);
  const auto hint = page.err.find("--page-token ");
  REQUIRE(hint != std::string::npos);
  const std::string token = page.err.substr(hint + 13, page.err.find('\n', hint) - hint - 13);
  auto older =
      kranectl({"deployments", "list", "--app", "app", "--limit", "1", "--page-token", token});
  REQUIRE(older.exit_code == 0);
  CHECK(older.out.find(first_id) != std::string::npos);
  CHECK(older.err.empty());
  auto as_json = kranectl({"deployments", "list", "--env", "prod", "-o", "json"});
  REQUIRE(as_json.exit_code == 0);
  auto parsed = nlohmann::json::parse(as_json.out);
  REQUIRE(parsed.size() == 2u);
  CHECK(parsed[0]["status"] == "ready");
  CHECK(parsed[0]["live"] == true);

  auto shown = kranectl({"deployments", "get", first_id});
  REQUIRE(shown.exit_code == 0);
  CHECK_THAT(shown.out, Catch::Contains("STEP"));
  CHECK_THAT(shown.out, Catch::Contains("finalizing"));
  CHECK_THAT(shown.out, !Catch::Contains("rolling"));  // a blue-green deploy has no phases

  // A rolling deploy's phase history (as rolling.h records it), one line per phase.
  const int64_t now = unixMillis();
  REQUIRE_THAT((*cp_.pool()->acquire())
                   ->exec("INSERT INTO deployment_phases (deployment_id, region_id, phase, detail,"
                          " phase_started_at, updated_at, attempts) VALUES"
                          " (?, 'eu-1', 'provisioning', '', ?, ?, 4),"
                          " (?, 'eu-1', 'rolling_back', 'not completed within 3 s', ?, ?, 1)",
                          {first_id, now - 9000, now - 5000, first_id, now - 4000, now - 4000}),
               IsOk());
  auto phases = kranectl({"deployments", "get", first_id});
  REQUIRE(phases.exit_code == 0);
  CHECK_THAT(phases.out, Catch::Contains("CYCLES"));
  CHECK_THAT(phases.out, Catch::Matches("(.|\\n)*eu-1 +provisioning +9s ago +4.0s +4(.|\\n)*"));
  CHECK_THAT(phases.out, Catch::Contains("not completed within 3 s"));
  auto phases_json =
      nlohmann::json::parse(kranectl({"deployments", "get", first_id, "-o", "json"}).out);
  CHECK(phases_json["phases"][0]["attempts"] == 4);
  CHECK(phases_json["phases"][1]["phase"] == "rolling_back");

  auto back = kranectl({"rollback", "--env", "prod"});
  REQUIRE(back.exit_code == 0);
  CHECK(back.out == strCat("rollback prod: ", first_id, " is live (was ", second_id, ")\n"));
  auto promoted = kranectl({"promote", second_id});
  REQUIRE(promoted.exit_code == 0);
  CHECK(promoted.out ==
        strCat("promote ", second_id, ": ", second_id, " is live (was ", first_id, ")\n"));

  auto finished = kranectl({"cancel", first_id});
  CHECK(finished.exit_code == 1);
  CHECK_THAT(finished.err, Catch::Contains("already finished (ready)"));
  auto unknown = kranectl({"deployments", "get", "dep_nope"});
  CHECK(unknown.exit_code == 5);
  CHECK_THAT(unknown.err, Catch::Contains("no deployment 'dep_nope'"));
}

TEST_CASE_METHOD(DeployCliTest, "kranectl deploy fails with the failed steps error",
                 "[kranectl][deploy]") {
  auto bad =
      kranectl({"deploy", "--app", "app", "--env", "prod", "--image", "app:v1", "--port", "70000"});
  CHECK(bad.exit_code == 1);
  CHECK_THAT(bad.err, Catch::Contains("deploy: refused: spec: deployment_topology.port"));
  auto both =
      kranectl({"deploy", "--app", "app", "--env", "prod", "--image", "app:v1", "--", "true"});
  CHECK(both.exit_code == 2);
  auto env_var = kranectl(
      {"deploy", "--app", "app", "--env", "prod", "--image", "app:v1", "--env-var", "NOVALUE"});
  CHECK(env_var.exit_code == 2);
  CHECK_THAT(env_var.err, Catch::Contains("--env-var \"NOVALUE\": use KEY=VALUE"));

  // Nobody reports its instances: kranectl stops following after --timeout, the deploy goes on.
  auto slow = kranectl({"deploy", "--app", "app", "--env", "prod", "--branch", "slow", "--commit",
                        "sha8", "--image", "app:v8", "--timeout", "3"});
  CHECK(slow.exit_code == 7);
  CHECK_THAT(slow.err, Catch::Contains("is still deploying in step waiting after 3 s"));
  CHECK_THAT(slow.out, Catch::Contains("  deploying"));
  // It holds the workspace's one build slot until it finishes: cancelled, it lets the next build.
  const std::string slow_id = slow.out.substr(11, slow.out.find(' ', 11) - 11);
  REQUIRE(kranectl({"cancel", slow_id}).exit_code == 0);

  auto failed = kranectl({"deploy", "--app", "app", "--env", "prod", "--commit", "sha9",
                          "--image-name", "demo", "--", "/bin/sh", "-c",
                          "echo compiling; echo 'error: no main' >&2; exit 3"});
  INFO(failed.out << failed.err);
  CHECK(failed.exit_code == 6);
  CHECK_THAT(failed.out, Catch::Contains("  queued"));
  CHECK_THAT(failed.out, Catch::Contains("  building"));
  CHECK_THAT(failed.err, Catch::Contains("failed: building: build of dep_"));
  CHECK_THAT(failed.err, Catch::Contains("exited with status 3"));
  CHECK_THAT(failed.err, Catch::Contains("error: no main"));
}

// krane-ctrl ends a watch after deploy.watch_max_lifetime_s: kranectl watches again, and
// follows the deploy until its own --timeout.
TEST_CASE_METHOD(DeployCliTest, "kranectl deploy follows past the watch's lifetime",
                 "[kranectl][deploy]") {
  auto& short_watches = cp_.startReplica(
      [](ctrl::CtrlConfig& c) { c.deploy.watch_max_lifetime = std::chrono::seconds(1); });
  auto ended =
      runCommand({runfile("cli/kranectl"), "deploy", "--app", "app", "--env", "prod", "--branch",
                  "long", "--commit", "sha7", "--image", "app:v7", "--timeout", "4"},
                 {{"KRANE_SERVER", strCat("127.0.0.1:", short_watches.grpcPort())},
                  {"KRANE_TOKEN", kOperatorToken}},
                 std::chrono::seconds(120));
  INFO(ended.out << ended.err);
  CHECK(ended.exit_code == 7);  // its own timeout, after three or four watches
  CHECK_THAT(ended.err, Catch::Contains("after 4 s (it goes on"));
  CHECK_THAT(ended.err, !Catch::Contains("maximum lifetime"));
  const std::string id = ended.out.substr(11, ended.out.find(' ', 11) - 11);
  REQUIRE(kranectl({"cancel", id}).exit_code == 0);
}

TEST_CASE_METHOD(DeployCliTest, "kranectl creates what a deployment needs", "[kranectl][tenancy]") {
  auto ws = kranectl({"create", "workspace", "Acme Corp", "--id", "acme", "--max-builds", "2"});
  INFO(ws.out << ws.err);
  REQUIRE(ws.exit_code == 0);
  CHECK(ws.out == "workspace acme created (slug acme-corp, builds at once: 2)\n");
  auto project = kranectl({"create", "project", "Web", "--id", "web", "--workspace", "acme"});
  REQUIRE(project.exit_code == 0);
  CHECK(project.out == "project web created in workspace acme\n");
  auto app = kranectl({"create", "app", "Shop", "--id", "shop", "--project", "web"});
  REQUIRE(app.exit_code == 0);
  auto env = kranectl({"create", "environment", "production", "--id", "shop-prod", "--app", "shop",
                       "--region", "eu-1=2", "--region", "us-1"});
  REQUIRE(env.exit_code == 0);
  CHECK(env.out ==
        "environment shop-prod created (app shop, production, blue_green: eu-1 x2, us-1 x1)\n");
  auto as_json = kranectl({"create", "app", "Admin", "--project", "web", "-o", "json"});
  REQUIRE(as_json.exit_code == 0);
  CHECK(nlohmann::json::parse(as_json.out)["slug"] == "admin");

  auto unknown =
      kranectl({"create", "environment", "staging", "--app", "shop", "--region", "mars-1"});
  CHECK(unknown.exit_code == 5);
  CHECK_THAT(unknown.err, Catch::Contains("regions[0].region: no region 'mars-1'"));
  auto bad_spec =
      kranectl({"create", "environment", "staging", "--app", "shop", "--region", "eu-1=many"});
  CHECK(bad_spec.exit_code == 2);
  CHECK_THAT(bad_spec.err, Catch::Contains("use REGION or REGION=REPLICAS"));
  auto taken = kranectl({"create", "workspace", "Acme", "--id", "acme"});
  CHECK(taken.exit_code == 1);
  CHECK_THAT(taken.err, Catch::Contains("is taken"));

  auto deployed = kranectl({"deploy", "--app", "shop", "--env", "shop-prod", "--image",
                            "registry.example.com/shop:v1", "--no-wait"});
  CHECK(deployed.exit_code == 0);
  CHECK_THAT(deployed.out, Catch::Contains("created (app shop, environment shop-prod)"));
}

TEST_CASE_METHOD(DeployCliTest, "a watch whose connection goes silent ends with an error",
                 "[kranectl]") {
  // A partition between kranectl and krane-ctrl: nothing arrives, nothing closes. The pings
  // (--keepalive) find it; without them the watch waits for good.
  krane::testing::TcpRelay relay(address_);
  std::optional<CommandResult> watched;
  std::thread watcher([&] {
    watched = runCommand({runfile("cli/kranectl"), "--keepalive", "1", "watch"},
                         {{"KRANE_SERVER", relay.address()}, {"KRANE_TOKEN", kOperatorToken}},
                         std::chrono::seconds(30));
  });
  // Checked, not required: a failed REQUIRE would leave the thread unjoined (std::terminate).
  // Without the connection, the partition below cuts nothing and the watch ends by timeout.
  CHECK(eventually([&] { return relay.accepted() >= 1; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  relay.blackHole();
  const auto cut = std::chrono::steady_clock::now();
  watcher.join();
  const auto ended =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - cut);
  REQUIRE(watched.has_value());
  INFO(watched->err);
  CHECK(watched->signal == 0);  // not killed by runCommand's timeout
  CHECK(watched->exit_code == 3);
  CHECK_THAT(watched->err, Catch::Contains("watch: cannot reach krane-ctrl"));
  CHECK(ended.count() < 15);
}

}  // namespace
}  // namespace krane
