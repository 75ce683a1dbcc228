// libdeployment.so on the process runtime, loaded as the agent loads it, with the demo app as
// the workload: apply, status reports, crash loop, update, delete, garbage collection after a
// sync, configuration errors. No process is left behind.
#include <httplib.h>
#include <signal.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <mutex>

#include <catch2/catch.hpp>

#include "agent/plugin_loader.h"
#include "common/strings.h"
#include "nlohmann/json.hpp"
#include "tests/support/leftovers.h"
#include "tests/support/matchers.h"
#include "tests/support/process.h"
#include "tests/support/wait.h"

namespace krane {
namespace {

using krane::testing::eventually;
using krane::testing::runfile;
namespace fs = std::filesystem;

std::string get(const std::string& address) {
  const auto colon = address.rfind(':');
  httplib::Client client(address.substr(0, colon), std::stoi(address.substr(colon + 1)));
  client.set_connection_timeout(1, 0);
  auto res = client.Get("/");
  return res ? res->body : "";
}

cluster::v1::Change topology(const std::string& id, uint32_t replicas, const std::string& tag,
                             uint64_t version) {
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
  t->set_replicas(replicas);
  t->set_port(8080);
  t->mutable_healthcheck()->mutable_readiness()->set_path("/healthz/ready");
  t->mutable_healthcheck()->mutable_readiness()->set_period_seconds(1);
  t->set_termination_grace_period_seconds(5);
  return c;
}

class DeploymentPluginTest {
 protected:
  DeploymentPluginTest() {
    char pattern[] = "/tmp/krane-dp-XXXXXX";
    dir_ = ::mkdtemp(pattern);
  }

  ~DeploymentPluginTest() {
    plugin_.reset();  // instances keep running across a plugin restart: stop them here
    krane::testing::killInstancesAndRemove(dir_);
  }

  std::string config(int port_from) const {
    return nlohmann::json{
        {"runtime", "process"},
        {"process",
         {{"state_dir", dir_},
          {"ports", {{"from", port_from}, {"to", port_from + 49}}},
          {"images",
           {{"krane.dev/demo-app",
             {runfile("tests/support/demo_app/krane-demo-app"), "--version", "{tag}"}}}},
          {"restart_backoff_ms", {{"min", 50}, {"max", 200}}}}}}
        .dump();
  }

  absl::Status load(const std::string& config_json) {
    agent::HostCallbacks callbacks;
    callbacks.report_status = [this](const plugin::v1::StatusReport& r) {
      std::lock_guard lock(mutex_);
      reports_.push_back(r);
    };
    auto loaded =
        agent::loadPlugin(runfile("plugins/deployment/libdeployment.so"), config_json, callbacks);
    if (!loaded.ok()) return loaded.status();
    plugin_ = *std::move(loaded);
    return absl::OkStatus();
  }

  // The latest report about `id`.
  std::optional<cluster::v1::ReportDeploymentStatusRequest> latest(const std::string& id) {
    std::lock_guard lock(mutex_);
    for (auto it = reports_.rbegin(); it != reports_.rend(); ++it) {
      if (it->has_deployment() && it->deployment().deployment_id() == id) return it->deployment();
    }
    return std::nullopt;
  }

  // Whether the latest report of `id` has `n` instances, all running.
  bool running(const std::string& id, int n) {
    auto r = latest(id);
    if (!r || !r->has_instances() || r->instances().instances_size() != n) return false;
    for (const auto& i : r->instances().instances()) {
      if (i.status() != cluster::v1::INSTANCE_STATUS_RUNNING) return false;
    }
    return true;
  }

  std::string dir_;
  std::unique_ptr<agent::LoadedPlugin> plugin_;
  std::mutex mutex_;
  std::vector<plugin::v1::StatusReport> reports_;
};

TEST_CASE_METHOD(DeploymentPluginTest, "applies reports rolls and deletes", "[deployment-plugin]") {
  REQUIRE_THAT(load(config(23000)), IsOk());
  CHECK(plugin_->resourceTypes() == std::vector<std::string>{"deployment_topology"});
  REQUIRE_THAT(plugin_->apply(topology("d1", 3, "v1", 5)), IsOk());
  REQUIRE(eventually([&] { return running("d1", 3); }));
  auto report = *latest("d1");
  CHECK(report.applied_version() == 5u);
  CHECK(report.region() == "local-1");
  for (const auto& i : report.instances().instances()) {
    CHECK_THAT(i.address(), Catch::StartsWith("127.0.0.1:230"));
    CHECK_THAT(get(i.address()), Catch::Contains("krane-demo-app v1"));
  }

  // A new version rolls; the report ends with three instances of v2.
  REQUIRE_THAT(plugin_->apply(topology("d1", 3, "v2", 9)), IsOk());
  REQUIRE(eventually([&] {
    auto r = latest("d1");
    if (!running("d1", 3)) return false;
    for (const auto& i : r->instances().instances()) {
      if (get(i.address()).find("v2") == std::string::npos) return false;
    }
    return true;
  }));
  CHECK(latest("d1")->applied_version() == 9u);

  cluster::v1::Change del;
  del.set_op(cluster::v1::CHANGE_OP_DELETE);
  del.set_version(10);
  del.mutable_resource()->set_type("deployment_topology");
  del.mutable_resource()->set_id("d1");
  const auto last = latest("d1")->instances();
  REQUIRE_THAT(plugin_->remove(del), IsOk());
  CHECK(latest("d1")->deleted());
  REQUIRE(eventually([&] {
    for (const auto& i : last.instances()) {
      if (!get(i.address()).empty()) return false;
    }
    return true;
  }));
}

TEST_CASE_METHOD(DeploymentPluginTest, "a spec the runtime refuses leaves the version that runs",
                 "[deployment-plugin]") {
  REQUIRE_THAT(load(config(23050)), IsOk());
  REQUIRE_THAT(plugin_->apply(topology("d1", 1, "v1", 5)), IsOk());
  REQUIRE(eventually([&] { return running("d1", 1); }));
  auto refused = topology("d1", 1, "v2", 6);
  refused.mutable_resource()->mutable_deployment_topology()->add_command("relative/app");
  const absl::Status st = plugin_->apply(refused);
  CHECK(st.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(toStd(st.message())), Catch::Contains("must be an absolute path"));
  {
    std::lock_guard lock(mutex_);
    reports_.clear();
  }
  // The agent parks version 6 and reports it failed; the plugin's reports must go on saying
  // that version 5 runs, or krane-ctrl would take 6 for applied.
  REQUIRE_THAT(plugin_->observe(), IsOk());
  REQUIRE(latest("d1").has_value());
  CHECK(latest("d1")->applied_version() == 5u);
  CHECK(running("d1", 1));
}

TEST_CASE_METHOD(DeploymentPluginTest,
                 "a crash loop is reported as a failed instance with the reason",
                 "[deployment-plugin]") {
  REQUIRE_THAT(load(config(23100)), IsOk());
  auto change = topology("broken", 1, "v1", 3);
  change.mutable_resource()->mutable_deployment_topology()->add_args("--exit-on-start");
  change.mutable_resource()->mutable_deployment_topology()->add_args("4");
  REQUIRE_THAT(plugin_->apply(change), IsOk());
  REQUIRE(eventually([&] {
    auto r = latest("broken");
    return r && r->has_instances() && r->instances().instances_size() == 1 &&
           r->instances().instances(0).status() == cluster::v1::INSTANCE_STATUS_FAILED;
  }));
  const auto i = latest("broken")->instances().instances(0);
  CHECK_THAT(i.failure_reason(), Catch::Contains("crash loop: exited with code 4"));
  INFO("the last output lines, one per line, so that a failed deploy shows them");
  CHECK_THAT(i.failure_reason(),
             Catch::Contains("; last output:\n  | krane-demo-app: exiting at start with code 4"));
  size_t lines = 0;
  for (size_t at = 0; (at = i.failure_reason().find("\n  | ", at)) != std::string::npos; ++at) {
    ++lines;
  }
  CHECK(lines >= 2);  // one line per start, and it started at least three times
  CHECK(lines <= 5);
}

TEST_CASE_METHOD(DeploymentPluginTest, "after a sync what it did not mention is removed",
                 "[deployment-plugin]") {
  REQUIRE_THAT(load(config(23200)), IsOk());
  REQUIRE_THAT(plugin_->apply(topology("keep", 1, "v1", 1)), IsOk());
  REQUIRE_THAT(plugin_->apply(topology("gone", 1, "v1", 2)), IsOk());
  REQUIRE(eventually([&] { return running("keep", 1) && running("gone", 1); }));
  const std::string gone_address = latest("gone")->instances().instances(0).address();
  plugin::v1::SyncEnd end;
  end.set_snapshot_version(7);
  auto* ids = end.add_resources();
  ids->set_resource_type("deployment_topology");
  ids->add_ids("keep");
  REQUIRE_THAT(plugin_->syncEnd(end), IsOk());
  CHECK(latest("gone")->deleted());
  REQUIRE(eventually([&] { return get(gone_address).empty(); }));
  INFO("what the sync mentioned is untouched");
  CHECK(running("keep", 1));
}

TEST_CASE_METHOD(DeploymentPluginTest, "a restarted plugin adopts its instances",
                 "[deployment-plugin]") {
  REQUIRE_THAT(load(config(23300)), IsOk());
  REQUIRE_THAT(plugin_->apply(topology("d1", 2, "v1", 1)), IsOk());
  REQUIRE(eventually([&] { return running("d1", 2); }));
  const auto before = latest("d1")->instances();
  plugin_.reset();  // the host went away; its instances did not
  for (const auto& i : before.instances()) CHECK_FALSE(get(i.address()).empty());
  REQUIRE_THAT(load(config(23300)), IsOk());
  REQUIRE_THAT(plugin_->observe(), IsOk());
  REQUIRE(eventually([&] { return running("d1", 2); }));
  std::set<std::string> ids;
  const auto after = *latest("d1");
  // What the last host applied: the control plane drops reports of older versions.
  CHECK(after.applied_version() == 1u);
  for (const auto& i : after.instances().instances()) ids.insert(i.id());
  for (const auto& i : before.instances()) {
    INFO(i.id());
    CHECK(ids.count(i.id()) == 1u);
  }
}

// stop_instances_on_shutdown (a local stack that must leave nothing behind): the instances go
// with the plugin instead of waiting to be adopted.
TEST_CASE_METHOD(DeploymentPluginTest, "with stop on shutdown the instances stop with the plugin",
                 "[deployment-plugin]") {
  auto json = nlohmann::json::parse(config(23450));
  json["process"]["stop_instances_on_shutdown"] = true;
  REQUIRE_THAT(load(json.dump()), IsOk());
  REQUIRE_THAT(plugin_->apply(topology("d1", 2, "v1", 1)), IsOk());
  REQUIRE(eventually([&] { return running("d1", 2); }));
  const auto before = latest("d1")->instances();
  plugin_.reset();
  for (const auto& i : before.instances()) {
    INFO(i.address());
    CHECK(get(i.address()).empty());
  }
}

TEST_CASE_METHOD(DeploymentPluginTest, "bad configuration and bad topologies are refused by name",
                 "[deployment-plugin]") {
  auto st = load(R"({"runtime": "process", "process": {"state_dir": "/tmp/x", "prots": {}}})");
  CHECK_THAT(std::string(toStd(st.message())), Catch::Contains("process.prots: unknown key"));
  st = load(R"({"runtime": "process", "process": {}})");
  CHECK_THAT(std::string(toStd(st.message())), Catch::Contains("process.state_dir: required"));
  st = load(R"({"runtime": "process", "process": {"state_dir": "/tmp/x", "ports": {"from": 0}}})");
  CHECK_THAT(
      std::string(toStd(st.message())),
      Catch::Contains("process.ports.from: must be a whole number between 1 and 65535, got 0"));
  st = load(
      R"({"runtime": "process", "process": {"state_dir": "/tmp/x", "stop_instances_on_shutdown": 1}})");
  CHECK_THAT(std::string(toStd(st.message())),
             Catch::Contains("process.stop_instances_on_shutdown: must be true or false"));
  st = load(
      R"({"runtime": "process", "process": {"state_dir": "/tmp/x", "deregistration_delay_ms": -1}})");
  CHECK_THAT(std::string(toStd(st.message())),
             Catch::Contains("process.deregistration_delay_ms: must be a whole number between 0"));
  st = load(R"({"runtime": "nomad"})");
  CHECK_THAT(std::string(toStd(st.message())), Catch::Contains("runtime: \"nomad\""));

  REQUIRE_THAT(load(config(23400)), IsOk());
  auto bad = topology("bad", 1, "v1", 1);
  bad.mutable_resource()->mutable_deployment_topology()->set_shutdown_signal("SIGNOPE");
  st = plugin_->apply(bad);
  CHECK_THAT(std::string(toStd(st.message())), Catch::Contains("shutdown_signal: \"SIGNOPE\""));
  auto unknown = topology("unknown", 1, "v1", 2);
  unknown.mutable_resource()->mutable_deployment_topology()->set_image("registry.example/x:1");
  st = plugin_->apply(unknown);
  CHECK_THAT(std::string(toStd(st.message())), Catch::Contains("image: \"registry.example/x:1\""));
}

}  // namespace
}  // namespace krane
