// libsentinel.so on the process runtime (the demo app stands in for the sentinel image): status
// flow, the running image only once a rollout converged, standby, archive, garbage collection.
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

cluster::v1::Change sentinelChange(
    const std::string& id, const std::string& tag, uint32_t replicas, uint64_t version,
    cluster::v1::SentinelDesiredState state = cluster::v1::SENTINEL_DESIRED_STATE_RUNNING) {
  cluster::v1::Change c;
  c.set_op(cluster::v1::CHANGE_OP_APPLY);
  c.set_version(version);
  auto* r = c.mutable_resource();
  r->set_type("sentinel");
  r->set_id(id);
  r->set_region("local-1");
  auto* s = r->mutable_sentinel();
  s->set_sentinel_id(id);
  s->set_workspace_id("ws1");
  s->set_project_id("p1");
  s->set_app_id("a1");
  s->set_environment_id("e1");
  s->set_region("local-1");
  s->set_image("krane.dev/sentinel:" + tag);
  s->set_replicas(replicas);
  s->set_desired_state(state);
  return c;
}

class SentinelPluginTest {
 protected:
  SentinelPluginTest() {
    char pattern[] = "/tmp/krane-sp-XXXXXX";
    dir_ = ::mkdtemp(pattern);
    load();
  }

  // Loads the plugin on the test's state directory (again: a new plugin host).
  void load() {
    agent::HostCallbacks callbacks;
    callbacks.report_status = [this](const plugin::v1::StatusReport& r) {
      std::lock_guard lock(mutex_);
      if (r.has_sentinel()) reports_.push_back(r.sentinel());
    };
    const std::string config = nlohmann::json{
        {"runtime", "process"},
        {"process",
         {{"state_dir", dir_},
          {"ports", {{"from", 26000}, {"to", 26049}}},
          {"images",
           {{"krane.dev/sentinel",
             {runfile("tests/support/demo_app/krane-demo-app"), "--version",
              "{tag}"}}}}}}}.dump();
    auto loaded = agent::loadPlugin(runfile("plugins/sentinel/libsentinel.so"), config, callbacks);
    REQUIRE_THAT(loaded, IsOk());
    plugin_ = *std::move(loaded);
  }

  ~SentinelPluginTest() {
    plugin_.reset();
    krane::testing::killInstancesAndRemove(dir_);
  }

  std::optional<cluster::v1::ReportSentinelStatusRequest> latest(const std::string& id) {
    std::lock_guard lock(mutex_);
    for (auto it = reports_.rbegin(); it != reports_.rend(); ++it) {
      if (it->sentinel_id() == id) return *it;
    }
    return std::nullopt;
  }

  std::vector<cluster::v1::ReportSentinelStatusRequest> all(const std::string& id) {
    std::lock_guard lock(mutex_);
    std::vector<cluster::v1::ReportSentinelStatusRequest> out;
    for (const auto& r : reports_) {
      if (r.sentinel_id() == id) out.push_back(r);
    }
    return out;
  }

  std::string dir_;
  std::unique_ptr<agent::LoadedPlugin> plugin_;
  std::mutex mutex_;
  std::vector<cluster::v1::ReportSentinelStatusRequest> reports_;
};

TEST_CASE_METHOD(SentinelPluginTest, "reports the running image only once a rollout converged",
                 "[sentinel-plugin]") {
  REQUIRE_THAT(plugin_->apply(sentinelChange("s1", "v1", 2, 1)), IsOk());
  REQUIRE(eventually([&] {
    auto r = latest("s1");
    return r && r->ready_replicas() == 2 && r->running_image() == "krane.dev/sentinel:v1";
  }));
  auto r = *latest("s1");
  CHECK(r.health() == cluster::v1::SENTINEL_HEALTH_HEALTHY);
  CHECK(r.available_replicas() == 2u);
  CHECK(r.updated_replicas() == 2u);
  CHECK(r.observed_generation() == 1);
  CHECK(r.region() == "local-1");
  const size_t before = all("s1").size();

  REQUIRE_THAT(plugin_->apply(sentinelChange("s1", "v2", 2, 2)), IsOk());
  REQUIRE(eventually([&] {
    auto r = latest("s1");
    return r && r->running_image() == "krane.dev/sentinel:v2" && r->updated_replicas() == 2;
  }));
  // While the rollout ran, the reports still named the old image.
  const auto reports = all("s1");
  bool saw_progress = false;
  for (size_t i = before; i < reports.size(); ++i) {
    CHECK(reports[i].observed_generation() == 2);
    if (reports[i].running_image() == "krane.dev/sentinel:v1") saw_progress = true;
    if (reports[i].updated_replicas() < 2) {
      INFO("not converged yet");
      CHECK(reports[i].running_image() == "krane.dev/sentinel:v1");
    }
  }
  CHECK(saw_progress);
}

TEST_CASE_METHOD(SentinelPluginTest,
                 "standby pauses archive removes and garbage collection cleans up",
                 "[sentinel-plugin]") {
  REQUIRE_THAT(plugin_->apply(sentinelChange("s1", "v1", 1, 1)), IsOk());
  REQUIRE_THAT(plugin_->apply(sentinelChange("s2", "v1", 1, 2)), IsOk());
  REQUIRE(eventually([&] {
    auto a = latest("s1");
    auto b = latest("s2");
    return a && b && a->ready_replicas() == 1 && b->ready_replicas() == 1;
  }));
  REQUIRE_THAT(
      plugin_->apply(sentinelChange("s1", "v1", 1, 3, cluster::v1::SENTINEL_DESIRED_STATE_STANDBY)),
      IsOk());
  REQUIRE(eventually([&] {
    auto r = latest("s1");
    return r->health() == cluster::v1::SENTINEL_HEALTH_PAUSED && r->ready_replicas() == 0;
  }));
  REQUIRE_THAT(plugin_->apply(
                   sentinelChange("s1", "v1", 1, 4, cluster::v1::SENTINEL_DESIRED_STATE_ARCHIVED)),
               IsOk());
  CHECK(latest("s1")->applied_version() == 4u);
  // A sync that no longer mentions s2 removes it.
  plugin::v1::SyncEnd end;
  end.set_snapshot_version(10);
  end.add_resources()->set_resource_type("sentinel");
  REQUIRE_THAT(plugin_->syncEnd(end), IsOk());
  CHECK(latest("s2")->health() == cluster::v1::SENTINEL_HEALTH_PAUSED);
  REQUIRE(eventually([&] {
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(dir_, ec);
         it != fs::recursive_directory_iterator(); it.increment(ec)) {
      if (it->path().filename() == "instance.json") return false;
    }
    return true;
  }));
}

// The control plane drops reports of a generation older than the last it stored: a new plugin
// host goes on from what the last one applied, and so do its reports.
TEST_CASE_METHOD(SentinelPluginTest, "a new plugin host goes on from the applied generation",
                 "[sentinel-plugin]") {
  for (uint64_t v = 1; v <= 3; ++v) {
    REQUIRE_THAT(plugin_->apply(sentinelChange("s1", strCat("v", v), 1, v)), IsOk());
    REQUIRE(eventually([&] {
      auto r = latest("s1");
      return r && r->running_image() == strCat("krane.dev/sentinel:v", v);
    }));
  }
  CHECK(latest("s1")->observed_generation() == 3);
  plugin_.reset();  // the host went away; its instances did not
  {
    std::lock_guard lock(mutex_);
    reports_.clear();
  }
  load();
  REQUIRE_THAT(plugin_->observe(), IsOk());
  REQUIRE(eventually([&] { return latest("s1").has_value(); }));
  auto adopted = *latest("s1");
  CHECK(adopted.observed_generation() == 3);
  CHECK(adopted.applied_version() == 3u);
  CHECK(adopted.region() == "local-1");
  // Once its adopted instances answer their probes.
  CHECK(eventually([&] { return latest("s1")->running_image() == "krane.dev/sentinel:v3"; }));
  // The next rollout is generation 4, and converges as such.
  REQUIRE_THAT(plugin_->apply(sentinelChange("s1", "v4", 1, 4)), IsOk());
  REQUIRE(eventually([&] {
    auto r = latest("s1");
    return r && r->running_image() == "krane.dev/sentinel:v4";
  }));
  CHECK(latest("s1")->observed_generation() == 4);
}

TEST_CASE_METHOD(SentinelPluginTest, "a bad sentinel is refused naming the field",
                 "[sentinel-plugin]") {
  auto bad = sentinelChange("s1", "v1", 1, 1);
  bad.mutable_resource()->mutable_sentinel()->clear_workspace_id();
  auto st = plugin_->apply(bad);
  CHECK_THAT(std::string(toStd(st.message())),
             Catch::Contains("sentinel s1: sentinel.workspace_id: required"));
}

}  // namespace
}  // namespace krane
