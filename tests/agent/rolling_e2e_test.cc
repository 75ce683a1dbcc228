// A rolling deploy end to end, every part real: krane-ctrl runs the deploy workflow, two agents
// (regions eu-1 and us-1) run the demo app on the process runtime and a sentinel each
// (krane-sentinel). Five replicas per region move from v1 to v2 with surge 1 and unavailable 0
// while requests flow through both regions' sentinels: none fails, every sampled moment has at
// least five running instances in each region, no more than six, and the history shows the roll.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <map>
#include <thread>

#include <catch2/catch.hpp>

#include "common/strings.h"
#include "krane/api/v1/deployments.grpc.pb.h"
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
using krane::testing::kOperatorToken;
using krane::testing::runfile;
using krane::testing::TestControlPlane;
using namespace std::chrono_literals;

constexpr int kReplicas = 5;

class RollingE2eTest {
 protected:
  RollingE2eTest() {
    char pattern[] = "/tmp/krane-re2e-XXXXXX";
    dir_ = ::mkdtemp(pattern);
  }
  ~RollingE2eTest() { krane::testing::killInstancesAndRemove(dir_); }

  std::string dir_;
};

// Running instances of the app per region, as the agents reported them.
std::map<std::string, int64_t> running(db::Pool& pool) {
  std::map<std::string, int64_t> out;
  auto conn = pool.acquire();
  if (!conn.ok()) return out;
  auto rows = (*conn)->query(
      "SELECT region_id, COUNT(*) FROM instances i JOIN deployments d ON d.id = i.deployment_id"
      " WHERE d.app_id = 'app' AND i.status = 'running' GROUP BY region_id");
  if (!rows.ok()) return out;
  for (const db::Row& r : rows->rows) out[r.str(0)] = r.i64(1);
  return out;
}

TEST_CASE_METHOD(RollingE2eTest,
                 "a rolling deploy of 5 replicas in two regions drops no request and no capacity",
                 "[rolling-e2e][slow]") {
  TestControlPlane cp;
  cp.seedApp();
  for (const std::string& sql :
       {strCat("UPDATE environment_regions SET replicas = ", kReplicas),
        std::string("UPDATE environments SET strategy = 'rolling', max_surge = 1,"
                    " max_unavailable = 0, deploy_timeout_seconds = 240 WHERE id = 'prod'")}) {
    REQUIRE_THAT((*cp.pool()->acquire())->exec(sql, {}), IsOk());
  }
  cp.startReplica(
      [](ctrl::CtrlConfig& c) { c.workflow.poll_interval = std::chrono::milliseconds(20); });
  std::map<std::string, std::unique_ptr<ChildProcess>> agents;
  int ports = 25400;
  for (const std::string region : {"eu-1", "us-1"}) {
    const std::string config = strCat(dir_, "/", region, ".yaml");
    std::ofstream(config) << krane::testing::localAgentConfig(region, strCat(dir_, "/", region),
                                                              cp.replica(0).grpcPort(), ports);
    ports += 100;
    agents[region] = std::make_unique<ChildProcess>(
        std::vector<std::string>{runfile("agent/krane"), "run", "--config", config, "--plugin-host",
                                 runfile("agent/krane-plugin-host")},
        strCat(dir_, "/", region, ".log"),
        std::map<std::string, std::string>{{"KRANE_AGENT_TOKEN", cp.agentToken(region)}});
  }
  INFO(krane::testing::slurp(dir_ + "/eu-1.log"));

  auto api = api::v1::DeploymentService::NewStub(cp.channel());
  const auto deploy = [&](const std::string& tag) {
    api::v1::CreateDeploymentRequest r;
    r.set_app_id("app");
    r.set_environment_id("prod");
    r.set_git_branch("main");
    r.set_git_commit_sha(tag);
    r.set_image("krane.dev/demo-app:" + tag);
    r.mutable_spec()->set_port(8080);
    r.mutable_spec()->set_cpu_millicores(50);
    r.mutable_spec()->set_memory_mib(32);
    r.mutable_spec()->mutable_healthcheck()->mutable_readiness()->set_path("/healthz/ready");
    r.mutable_spec()->mutable_healthcheck()->mutable_readiness()->set_period_seconds(1);
    api::v1::Deployment d;
    REQUIRE_THAT(api->CreateDeployment(TestControlPlane::withToken(kOperatorToken).get(), r, &d),
                 IsOk());
    return d.id();
  };
  const auto get = [&](const std::string& id) {
    api::v1::DeploymentRef ref;
    ref.set_id(id);
    api::v1::Deployment d;
    api->GetDeployment(TestControlPlane::withToken(kOperatorToken).get(), ref, &d);
    return d;
  };
  const auto finished = [&](const std::string& id) {
    std::string status;
    eventually(
        [&] {
          status = get(id).status();
          return status == "ready" || status == "failed" || status == "cancelled";
        },
        180s);
    return status;
  };

  INFO("the first deploy starts in full (nothing to roll from) and creates the sentinels");
  const std::string v1 = deploy("v1");
  REQUIRE(finished(v1) == "ready");
  std::map<std::string, std::string> sentinels;
  for (const std::string region : {"eu-1", "us-1"}) {
    sentinels[region] = krane::testing::localSentinelAddress(strCat(dir_, "/", region));
    REQUIRE(!sentinels[region].empty());
    REQUIRE(eventually(
        [&] {
          return krane::testing::httpGet(sentinels[region], "/").body.find(" v1 ") !=
                 std::string::npos;
        },
        30s));
  }
  REQUIRE(eventually([&] {
    auto r = running(*cp.pool());
    return r["eu-1"] == kReplicas && r["us-1"] == kReplicas;
  }));

  // Requests through both sentinels, and the running instances sampled, for the whole roll.
  krane::testing::SteadyTraffic eu(sentinels["eu-1"], 2, " v2 ");
  krane::testing::SteadyTraffic us(sentinels["us-1"], 2, " v2 ");
  std::atomic<bool> sampling{true};
  std::map<std::string, int64_t> least{{"eu-1", kReplicas}, {"us-1", kReplicas}};
  std::map<std::string, int64_t> most{{"eu-1", kReplicas}, {"us-1", kReplicas}};
  int samples = 0;
  std::thread sampler([&] {
    while (sampling) {
      for (const auto& [region, n] : running(*cp.pool())) {
        least[region] = std::min(least[region], n);
        most[region] = std::max(most[region], n);
      }
      ++samples;
      std::this_thread::sleep_for(50ms);
    }
  });
  const std::string v2 = deploy("v2");
  const std::string status = finished(v2);
  for (const std::string region : {"eu-1", "us-1"}) {
    CHECK(eventually(
        [&] {
          return krane::testing::httpGet(sentinels[region], "/").body.find(" v2 ") !=
                 std::string::npos;
        },
        10s));
  }
  std::this_thread::sleep_for(500ms);
  sampling = false;
  sampler.join();
  eu.stop();
  us.stop();
  REQUIRE(status == "ready");

  INFO("no request failed in either region, and both saw v2 during the roll");
  INFO("eu-1 last failure: " << eu.lastFailure() << "; us-1: " << us.lastFailure());
  CHECK(eu.failed() == 0);
  CHECK(us.failed() == 0);
  CHECK(eu.marked() > 0);
  CHECK(us.marked() > 0);
  INFO("unavailable 0: never fewer than 5 running in a region; surge 1: never more than 6");
  INFO("samples: " << samples);
  CHECK(samples > 20);
  for (const std::string region : {"eu-1", "us-1"}) {
    INFO(region);
    CHECK(least[region] >= kReplicas);
    CHECK(most[region] <= kReplicas + 1);
  }
  const api::v1::Deployment done = get(v2);
  CHECK(done.live());
  CHECK_FALSE(done.deploying());
  INFO("the history: both regions progressed and completed");
  std::map<std::string, std::string> last;
  for (const auto& p : done.phases()) last[p.region()] = p.phase();
  CHECK(last["eu-1"] == "completed");
  CHECK(last["us-1"] == "completed");

  for (auto& [region, agent] : agents) {
    agent->signal(SIGTERM);
    CHECK(agent->wait() == 0);
  }
}

}  // namespace
}  // namespace krane
