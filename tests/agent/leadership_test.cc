// The agent in this process, electing itself leader through a Lease it cannot always renew:
// losing leadership stops applying at once, regaining it resumes from the watermark.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <catch2/catch.hpp>

#include "agent/agent.h"
#include "agent/config.h"
#include "common/strings.h"
#include "tests/support/control_plane.h"
#include "tests/support/fake_leases.h"
#include "tests/support/matchers.h"
#include "tests/support/process.h"
#include "tests/support/wait.h"

namespace krane::agent {
namespace {

using krane::testing::eventually;
using krane::testing::FakeLeases;
using krane::testing::runfile;
using krane::testing::TestControlPlane;

cluster::v1::Resource bucket(const std::string& id) {
  cluster::v1::Resource r;
  r.set_type("example.krane.dev/bucket");
  r.set_id(id);
  r.set_region("eu-1");
  r.mutable_generic()->set_spec("x");
  return r;
}

size_t applies(const std::string& log) {
  std::ifstream in(log);
  std::string line;
  size_t n = 0;
  while (std::getline(in, line)) n += line.rfind("apply ", 0) == 0 ? 1 : 0;
  return n;
}

TEST_CASE("a demoted leader applies nothing more and resumes when it leads again",
          "[agent][leader][slow]") {
  TestControlPlane cp;
  auto& server = cp.startReplica();
  char pattern[] = "/tmp/krane-leader-XXXXXX";
  const std::string dir = ::mkdtemp(pattern);
  const std::string log = dir + "/calls.log";
  auto config =
      parseAgentConfig(strCat("region: eu-1\nagent_id: agent-a\nstate_dir: ", dir,
                              "/state\n"
                              "reconnect_min_ms: 50\nreconnect_max_ms: 200\n"
                              "control_plane:\n  address: 127.0.0.1:",
                              server.grpcPort(),
                              "\n"
                              "leader:\n  mode: lease\n  lease_duration_s: 3\n"
                              "plugins:\n"
                              "  - name: recording\n    workers: 1\n    path: ",
                              runfile("tests/support/plugins/librecording.so"),
                              "\n    config_text: |\n      log=", log,
                              "\n      types=example.krane.dev/bucket\n      apply_ms=100\n"),
                       "test");
  REQUIRE_THAT(config, IsOk());
  config->control_plane.token = cp.agentToken("eu-1");
  REQUIRE_THAT(finishAgentConfig(*config), IsOk());
  config->leader.lease_duration = std::chrono::seconds(2);  // renew deadline 1.33 s
  auto leases = std::make_shared<FakeLeases>();
  Agent agent(*config, runfile("agent/krane-plugin-host"),
              [&](const AgentConfig&) -> absl::StatusOr<std::shared_ptr<LeaseClient>> {
                return std::shared_ptr<LeaseClient>(leases);
              });
  REQUIRE_THAT(agent.start(), IsOk());
  REQUIRE(agent.isLeader());

  // 30 changes take the plugin 3 s; the lease stops being renewed at the first apply.
  for (int i = 0; i < 30; ++i) REQUIRE_THAT(server.writer().put(bucket(strCat("b", i))), IsOk());
  REQUIRE(eventually([&] { return applies(log) >= 1; }, std::chrono::seconds(20)));
  leases->setDown(true);
  REQUIRE(eventually([&] { return !agent.isLeader(); }, std::chrono::seconds(3)));
  // A call under way when leadership went has a sixth of the lease duration (333 ms) to end,
  // then the plugin host is killed; nothing starts after it.
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  const size_t at_demotion = applies(log);
  const uint64_t watermark = agent.watermark();
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  INFO("applies before demotion: " << at_demotion);
  CHECK(applies(log) == at_demotion);
  CHECK(at_demotion < 30u);
  CHECK(agent.watermark() == watermark);
  CHECK(watermark <= at_demotion);
  INFO("the lease still names this agent: nobody else took it");
  CHECK(leases->lease->holder == "agent-a");

  // The API server answers again: the agent renews its lease, leads, and applies the rest from
  // its watermark.
  leases->setDown(false);
  REQUIRE(eventually([&] { return agent.isLeader(); }, std::chrono::seconds(5)));
  REQUIRE(eventually([&] { return agent.watermark() == 30; }, std::chrono::seconds(30)));
  CHECK(applies(log) >= 30u);
  agent.stop();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace krane::agent
