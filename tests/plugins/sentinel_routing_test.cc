// A sentinel that really routes, on the process runtime, across the two plugins as the agent
// loads them: libdeployment.so runs two deployments of the demo app (v1 and v2) as real
// processes, libsentinel.so runs the real routing proxy (krane-sentinel) and hands it the ready
// instances of the sentinel's live deployment. Requests through the sentinel follow promote and
// rollback (a new live_deployment_id on the sentinel resource) within seconds, with no failed
// request while a steady stream runs, and without restarting the proxy.
#include <httplib.h>
#include <signal.h>
#include <stdlib.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include <catch2/catch.hpp>

#include "agent/plugin_loader.h"
#include "common/strings.h"
#include "nlohmann/json.hpp"
#include "plugins/runtime/process/process_runtime.h"
#include "tests/support/leftovers.h"
#include "tests/support/matchers.h"
#include "tests/support/process.h"
#include "tests/support/traffic.h"
#include "tests/support/wait.h"

namespace krane {
namespace {

using krane::testing::eventually;
using krane::testing::runfile;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

cluster::v1::Change topology(const std::string& id, const std::string& tag, uint64_t version) {
  cluster::v1::Change c;
  c.set_op(cluster::v1::CHANGE_OP_APPLY);
  c.set_version(version);
  auto* r = c.mutable_resource();
  r->set_type("deployment_topology");
  r->set_id(id);
  r->set_region("local-1");
  r->set_version(version);
  auto* t = r->mutable_deployment_topology();
  t->set_deployment_id(id);
  t->set_image("krane.dev/demo-app:" + tag);
  t->set_replicas(2);
  t->set_port(8080);
  t->mutable_healthcheck()->mutable_readiness()->set_path("/healthz/ready");
  t->mutable_healthcheck()->mutable_readiness()->set_period_seconds(1);
  t->set_termination_grace_period_seconds(5);
  return c;
}

cluster::v1::Change sentinel(const std::string& live, uint64_t version) {
  cluster::v1::Change c;
  c.set_op(cluster::v1::CHANGE_OP_APPLY);
  c.set_version(version);
  auto* r = c.mutable_resource();
  r->set_type("sentinel");
  r->set_id("sen1");
  r->set_region("local-1");
  auto* s = r->mutable_sentinel();
  s->set_sentinel_id("sen1");
  s->set_workspace_id("ws1");
  s->set_project_id("p1");
  s->set_app_id("a1");
  s->set_environment_id("e1");
  s->set_region("local-1");
  s->set_image("krane.dev/sentinel:v1");
  s->set_replicas(1);
  s->set_live_deployment_id(live);
  return c;
}

using Answer = krane::testing::HttpAnswer;
Answer get(const std::string& address, const std::string& path) {
  return krane::testing::httpGet(address, path);
}

class SentinelRoutingTest {
 protected:
  SentinelRoutingTest() {
    char pattern[] = "/tmp/krane-sr-XXXXXX";
    dir_ = ::mkdtemp(pattern);
    const std::string demo_app = runfile("tests/support/demo_app/krane-demo-app");
    deployments_ = load(
        "plugins/deployment/libdeployment.so",
        nlohmann::json{{"runtime", "process"},
                       {"process",
                        {{"state_dir", dir_ + "/deployments"},
                         {"ports", {{"from", 26300}, {"to", 26349}}},
                         {"images", {{"krane.dev/demo-app", {demo_app, "--version", "{tag}"}}}}}}});
    sentinels_ =
        load("plugins/sentinel/libsentinel.so",
             nlohmann::json{
                 {"runtime", "process"},
                 {"process",
                  {{"state_dir", dir_ + "/sentinels"},
                   {"ports", {{"from", 26350}, {"to", 26399}}},
                   {"routes", {{"deployment_state_dir", dir_ + "/deployments"}, {"poll_ms", 50}}},
                   {"images",
                    {{"krane.dev/sentinel",
                      {runfile("plugins/sentinel/krane-sentinel"), "--version", "{tag}", "--host",
                       "127.0.0.1", "--poll-ms", "50"}}}}}}});
  }

  ~SentinelRoutingTest() {
    sentinels_.reset();
    deployments_.reset();
    krane::testing::killInstancesAndRemove(dir_);
  }

  std::unique_ptr<agent::LoadedPlugin> load(const std::string& path, const nlohmann::json& config) {
    agent::HostCallbacks callbacks;
    callbacks.report_status = [](const plugin::v1::StatusReport&) {};
    auto loaded = agent::loadPlugin(runfile(path), config.dump(), callbacks);
    REQUIRE_THAT(loaded, IsOk());
    return *std::move(loaded);
  }

  // The addresses the process runtime publishes for a workload ("sentinel/sen1", ...).
  std::vector<std::string> endpoints(const std::string& state_dir, const std::string& workload) {
    std::ifstream in(runtime::endpointsFile(state_dir, workload));
    auto doc = nlohmann::json::parse(in, nullptr, false);
    if (doc.is_discarded()) return {};
    return doc.value("endpoints", nlohmann::json::array()).get<std::vector<std::string>>();
  }

  // The sentinel's process, as the environment's traffic reaches it.
  std::string sentinelAddress() {
    std::string address;
    REQUIRE(eventually(
        [&] {
          auto e = endpoints(dir_ + "/sentinels", "sentinel/sen1");
          if (e.empty()) return false;
          address = e[0];
          return true;
        },
        30s));
    return address;
  }

  std::string dir_;
  std::unique_ptr<agent::LoadedPlugin> deployments_;
  std::unique_ptr<agent::LoadedPlugin> sentinels_;
};

TEST_CASE_METHOD(SentinelRoutingTest,
                 "requests through the sentinel follow promote and rollback with none failing",
                 "[sentinel-routing]") {
  REQUIRE_THAT(deployments_->apply(topology("dep1", "v1", 1)), IsOk());
  REQUIRE_THAT(deployments_->apply(topology("dep2", "v2", 2)), IsOk());
  REQUIRE(eventually(
      [&] {
        return endpoints(dir_ + "/deployments", "deployment/dep1").size() == 2u &&
               endpoints(dir_ + "/deployments", "deployment/dep2").size() == 2u;
      },
      30s));

  // A new environment's sentinel: no live deployment yet, nothing to route, but ready.
  REQUIRE_THAT(sentinels_->apply(sentinel("", 3)), IsOk());
  const std::string address = sentinelAddress();
  CHECK(get(address, "/healthz/ready").status == 200);
  CHECK(get(address, "/").status == 503);

  // The first deploy goes live.
  REQUIRE_THAT(sentinels_->apply(sentinel("dep1", 4)), IsOk());
  const auto servedBy = [&](const std::string& version) {
    return eventually(
        [&] {
          const Answer a = get(address, "/");
          return a.status == 200 && a.body.find(" " + version + " ") != std::string::npos;
        },
        5s);
  };
  REQUIRE(servedBy("v1"));

  krane::testing::SteadyTraffic traffic(address, 3, " v2 ");
  std::this_thread::sleep_for(300ms);

  // Promote dep2, with a request in flight on dep1 that completes there.
  Answer slow;
  std::thread in_flight([&] { slow = get(address, "/slow?ms=1500"); });
  std::this_thread::sleep_for(300ms);
  const auto promoted_at = std::chrono::steady_clock::now();
  REQUIRE_THAT(sentinels_->apply(sentinel("dep2", 5)), IsOk());
  REQUIRE(servedBy("v2"));
  CHECK(std::chrono::steady_clock::now() - promoted_at < 3s);
  in_flight.join();
  CHECK(slow.status == 200);
  CHECK_THAT(slow.body, Catch::Contains(" v1 "));
  std::this_thread::sleep_for(300ms);

  // Roll back to dep1.
  const auto rolled_back_at = std::chrono::steady_clock::now();
  REQUIRE_THAT(sentinels_->apply(sentinel("dep1", 6)), IsOk());
  REQUIRE(servedBy("v1"));
  CHECK(std::chrono::steady_clock::now() - rolled_back_at < 3s);
  std::this_thread::sleep_for(300ms);

  traffic.stop();
  INFO("last failure: " << traffic.lastFailure());
  CHECK(traffic.failed() == 0);
  CHECK(traffic.ok() > 30);
  CHECK(traffic.marked() > 0);
  INFO("a new live deployment changes the routes, not the proxy");
  CHECK(endpoints(dir_ + "/sentinels", "sentinel/sen1") == std::vector<std::string>{address});
}

TEST_CASE_METHOD(SentinelRoutingTest,
                 "a live deployment with no ready instance yet keeps the previous one serving",
                 "[sentinel-routing]") {
  REQUIRE_THAT(deployments_->apply(topology("dep1", "v1", 1)), IsOk());
  REQUIRE(eventually(
      [&] { return endpoints(dir_ + "/deployments", "deployment/dep1").size() == 2u; }, 30s));
  REQUIRE_THAT(sentinels_->apply(sentinel("dep1", 2)), IsOk());
  const std::string address = sentinelAddress();
  REQUIRE(eventually([&] { return get(address, "/").status == 200; }, 5s));

  // dep3 is not running (yet): the sentinel stays on dep1 until it is.
  REQUIRE_THAT(sentinels_->apply(sentinel("dep3", 3)), IsOk());
  std::this_thread::sleep_for(500ms);
  for (int i = 0; i < 10; ++i) {
    const Answer a = get(address, "/");
    CHECK(a.status == 200);
    CHECK_THAT(a.body, Catch::Contains(" v1 "));
  }
  REQUIRE_THAT(deployments_->apply(topology("dep3", "v3", 4)), IsOk());
  REQUIRE(eventually(
      [&] {
        const Answer a = get(address, "/");
        return a.status == 200 && a.body.find(" v3 ") != std::string::npos;
      },
      30s));
}

TEST_CASE("the routes keys are checked, naming the key", "[sentinel-routing]") {
  const auto refused = [](const nlohmann::json& routes) {
    agent::HostCallbacks callbacks;
    callbacks.report_status = [](const plugin::v1::StatusReport&) {};
    auto loaded = agent::loadPlugin(
        runfile("plugins/sentinel/libsentinel.so"),
        nlohmann::json{{"runtime", "process"},
                       {"process", {{"state_dir", "/tmp/krane-sr-unused"}, {"routes", routes}}}}
            .dump(),
        callbacks);
    return loaded.ok() ? std::string("accepted") : std::string(toStd(loaded.status().message()));
  };
  CHECK_THAT(refused({{"pol_ms", 5}}),
             Catch::Contains("sentinel plugin config: process.routes.pol_ms: unknown key"));
  CHECK_THAT(refused({{"poll_ms", 1}}), Catch::Contains("process.routes.poll_ms: must be"));
  CHECK_THAT(refused({{"deployment_state_dir", 3}}),
             Catch::Contains("process.routes.deployment_state_dir: must be a directory path"));
}

}  // namespace
}  // namespace krane
