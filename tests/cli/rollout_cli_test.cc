// kranectl's sentinel rollout commands against a krane-ctrl server in process (real MariaDB),
// with the regions' agents played through ClusterService: `rollout sentinels --watch` follows
// the waves to completion, a failing sentinel pauses the rollout (exit 6), a second rollout is
// refused, `rollback` reverts what reached the image, `sentinels list|get`, and bad input is
// refused naming the field.
#include <optional>
#include <thread>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "common/strings.h"
#include "tests/support/control_plane.h"
#include "tests/support/matchers.h"
#include "tests/support/process.h"
#include "tests/support/wait.h"

namespace krane {
namespace {

using krane::testing::CommandResult;
using krane::testing::kOperatorToken;
using krane::testing::runCommand;
using krane::testing::runfile;
using krane::testing::SentinelAgents;
using krane::testing::TestControlPlane;

constexpr char kV1[] = "krane.dev/sentinel:v1";
constexpr char kV2[] = "krane.dev/sentinel:v2";

class RolloutCliTest {
 protected:
  RolloutCliTest() {
    auto& server = cp_.startReplica(
        [](ctrl::CtrlConfig& c) { c.workflow.poll_interval = std::chrono::milliseconds(20); });
    address_ = strCat("127.0.0.1:", server.grpcPort());
    cp_.seedApp();
    // Four sentinels running v1, two per region: snt_a, snt_b, snt_c, snt_d.
    for (const char* id : {"snt_a", "snt_b", "snt_c", "snt_d"}) {
      cluster::v1::Resource r;
      r.set_type("sentinel");
      r.set_id(id);
      r.set_region(id[4] < 'c' ? "eu-1" : "us-1");
      auto* s = r.mutable_sentinel();
      s->set_sentinel_id(id);
      s->set_workspace_id("ws");
      s->set_project_id("proj");
      s->set_app_id("app");
      s->set_environment_id("prod");
      s->set_region(r.region());
      s->set_image(kV1);
      s->set_replicas(1);
      s->set_cpu_millicores(100);
      s->set_memory_mib(64);
      s->set_desired_state(cluster::v1::SENTINEL_DESIRED_STATE_RUNNING);
      REQUIRE_THAT(server.writer().put(r), IsOk());
    }
    REQUIRE_THAT((*cp_.pool()->acquire())
                     ->exec("UPDATE sentinels SET health = 'healthy', running_image = image,"
                            " available_replicas = replicas, deploy_status = 'ready'"),
                 IsOk());
  }

  CommandResult kranectl(std::vector<std::string> args) {
    std::vector<std::string> argv = {runfile("cli/kranectl")};
    argv.insert(argv.end(), args.begin(), args.end());
    return runCommand(argv, {{"KRANE_SERVER", address_}, {"KRANE_TOKEN", kOperatorToken}},
                      std::chrono::seconds(120));
  }
  int64_t onImage(const std::string& image) {
    auto rows =
        (*cp_.pool()->acquire())->query("SELECT COUNT(*) FROM sentinels WHERE image = ?", {image});
    return rows.ok() ? rows->rows[0].i64(0) : -1;
  }

  TestControlPlane cp_;
  std::string address_;
};

TEST_CASE_METHOD(RolloutCliTest, "kranectl rolls the sentinels out wave by wave", "[cli]") {
  SentinelAgents agents(cp_);
  auto rolled = kranectl({"rollout", "sentinels", "--image", kV2, "--waves", "50,100", "--watch"});
  INFO(rolled.out << rolled.err);
  REQUIRE(rolled.exit_code == 0);
  CHECK_THAT(rolled.out, Catch::Contains("4 sentinels in 2 waves"));
  CHECK_THAT(rolled.out, Catch::Contains("wave 1/2  2 sentinels  done  2 ready"));
  CHECK_THAT(rolled.out, Catch::Contains("wave 2/2  2 sentinels  done  2 ready"));
  CHECK_THAT(rolled.out,
             Catch::Contains("rollout completed: 4 of 4 sentinels on " + std::string(kV2)));
  CHECK(onImage(kV2) == 4);

  auto status = kranectl({"rollout", "status"});
  CHECK(status.exit_code == 0);
  CHECK_THAT(status.out, Catch::Contains("completed, image krane.dev/sentinel:v2"));
  auto listed = kranectl({"sentinels", "list", "--region", "us-1", "-o", "json"});
  REQUIRE(listed.exit_code == 0);
  auto json = nlohmann::json::parse(listed.out);
  REQUIRE(json.size() == 2u);
  CHECK(json[0]["id"] == "snt_c");
  CHECK(json[0]["running_image"] == kV2);
  CHECK(json[0]["deploy_status"] == "ready");
  auto one = kranectl({"sentinels", "get", "snt_a"});
  CHECK(one.exit_code == 0);
  CHECK_THAT(one.out, Catch::Contains("health: healthy"));
  CHECK(kranectl({"sentinels", "get", "snt_missing"}).exit_code == 5);
}

TEST_CASE_METHOD(RolloutCliTest, "a failing sentinel pauses the rollout until rolled back",
                 "[cli]") {
  SentinelAgents agents(cp_, {"snt_c"});
  auto rolled = kranectl({"rollout", "sentinels", "--image", kV2, "--waves", "50,100",
                          "--sentinel-timeout", "2s", "--watch"});
  INFO(rolled.out << rolled.err);
  CHECK(rolled.exit_code == 6);
  CHECK_THAT(rolled.out, Catch::Contains("wave 2/2  2 sentinels  failed  1 ready, 1 failed"));
  CHECK_THAT(rolled.err, Catch::Contains("is paused: 1 of 2 sentinels of wave 2"));
  CHECK_THAT(rolled.err, Catch::Contains("snt_c"));

  auto status = kranectl({"rollout", "status"});
  CHECK(status.exit_code == 6);
  CHECK_THAT(status.out, Catch::Contains("next: kranectl rollout resume"));
  auto second = kranectl({"rollout", "sentinels", "--image", "krane.dev/sentinel:v3"});
  CHECK(second.exit_code == 1);
  CHECK_THAT(second.err, Catch::Contains("is paused"));

  auto back = kranectl({"rollout", "rollback"});
  INFO(back.out << back.err);
  CHECK(back.exit_code == 0);
  CHECK_THAT(back.out, Catch::Contains("3 sentinels reverted to their previous image"));
  // The one that failed its wave is deployed back too (it had the new image); it fails in this
  // test whatever its image, so it is not counted as reverted.
  CHECK(onImage(kV1) == 4);
  auto resume = kranectl({"rollout", "resume"});
  CHECK(resume.exit_code == 1);
  CHECK_THAT(resume.err, Catch::Contains("is cancelled"));
}

TEST_CASE_METHOD(RolloutCliTest, "bad rollouts are refused naming the field", "[cli]") {
  auto decreasing = kranectl({"rollout", "sentinels", "--image", kV2, "--waves", "5,1,100"});
  CHECK(decreasing.exit_code == 1);
  CHECK_THAT(decreasing.err, Catch::Contains("wave_percentages[1]"));
  auto not_a_list = kranectl({"rollout", "sentinels", "--image", kV2, "--waves", "5,x"});
  CHECK(not_a_list.exit_code == 2);
  CHECK_THAT(not_a_list.err, Catch::Contains("--waves"));
  auto bake = kranectl({"rollout", "sentinels", "--image", kV2, "--bake", "2x"});
  CHECK(bake.exit_code == 2);
  CHECK_THAT(bake.err, Catch::Contains("--bake"));
  auto webhook = kranectl(
      {"rollout", "sentinels", "--image", kV2, "--slack-webhook", "http://hooks.example.com/x"});
  CHECK(webhook.exit_code == 1);
  CHECK_THAT(webhook.err, Catch::Contains("slack_webhook_url: must be https"));
  CHECK(kranectl({"rollout", "sentinels"}).exit_code == 2);  // --image is required
  INFO("nothing started");
  auto status = kranectl({"rollout", "status"});
  CHECK(status.exit_code == 0);
  CHECK_THAT(status.out, Catch::Contains("no sentinel rollout yet"));
  CHECK(onImage(kV1) == 4);
}

TEST_CASE_METHOD(RolloutCliTest,
                 "an operation that times out waiting for another is withdrawn, not run later",
                 "[cli]") {
  SentinelAgents agents(cp_, {"snt_c"});
  auto rolled = kranectl({"rollout", "sentinels", "--image", kV2, "--waves", "50,100",
                          "--sentinel-timeout", "3s", "--watch"});
  REQUIRE(rolled.exit_code == 6);  // paused by snt_c
  // The rollback holds the rollout while snt_c fails again (3 s).
  std::optional<CommandResult> back;
  std::thread rollback([&] { back = kranectl({"rollout", "rollback"}); });
  // Checked, not required: a failed REQUIRE would leave the thread unjoined (std::terminate).
  CHECK(krane::testing::eventually(
      [&] {
        return kranectl({"rollout", "status"}).out.find(": rolling_back,") != std::string::npos;
      },
      std::chrono::seconds(5)));
  auto start = kranectl(
      {"--request-timeout", "1", "rollout", "sentinels", "--image", "krane.dev/sentinel:v3"});
  rollback.join();
  INFO(start.out << start.err);
  CHECK(start.exit_code == 1);
  CHECK_THAT(start.err, Catch::Contains("another rollout operation still holds the rollout"));
  CHECK_THAT(start.err, Catch::Contains("nothing was done"));
  REQUIRE(back.has_value());
  CHECK(back->exit_code == 0);
  INFO("the withdrawn start never runs, not even once the rollback ended: it was cancelled");
  CHECK(krane::testing::eventually([&] {
    auto rows = (*cp_.pool()->acquire())
                    ->query(
                        "SELECT status FROM workflow_invocations WHERE handler = 'Rollout'"
                        " ORDER BY created_at DESC, id DESC LIMIT 1",
                        {});
    return rows.ok() && !rows->empty() && rows->rows[0].str(0) == "cancelled";
  }));
  CHECK(onImage("krane.dev/sentinel:v3") == 0);
  auto status = kranectl({"rollout", "status"});
  CHECK_THAT(status.out, Catch::Contains("cancelled"));
}

}  // namespace
}  // namespace krane
