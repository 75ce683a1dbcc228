// libdeployment.so on the Kubernetes runtime, loaded as the agent loads it, against the fake API
// server: the objects applied, updates (autoscaler and Service come and go), pods reported as
// instances (ready, crash-looping, failing to pull), delete, garbage collection after a sync,
// adoption by a new plugin instance, configuration and topology errors.
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <mutex>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "agent/plugin_loader.h"
#include "common/strings.h"
#include "nlohmann/json.hpp"
#include "tests/support/fake_kube_api.h"
#include "tests/support/process.h"
#include "tests/support/wait.h"

namespace krane {
namespace {

using krane::testing::eventually;
using krane::testing::FakeKubeApi;
using krane::testing::runfile;
using nlohmann::json;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

constexpr char kNs[] = "ws-ws1";
constexpr char kSelector[] =
    "app.kubernetes.io/managed-by=krane,app.kubernetes.io/component=deployment";

cluster::v1::Change topology(const std::string& id, uint32_t replicas, uint64_t version,
                             const std::string& workspace = "ws1") {
  cluster::v1::Change c;
  c.set_op(cluster::v1::CHANGE_OP_APPLY);
  c.set_version(version);
  auto* r = c.mutable_resource();
  r->set_type("deployment_topology");
  r->set_id(id);
  r->set_region("eu-west-1");
  r->set_version(version);
  auto* t = r->mutable_deployment_topology();
  t->set_workspace_id(workspace);
  t->set_project_id("p1");
  t->set_app_id("a1");
  t->set_environment_id("e1");
  t->set_region("eu-west-1");
  t->set_deployment_id(id);
  t->set_image("registry.example/app:v1");
  t->set_replicas(replicas);
  t->set_port(8080);
  t->mutable_healthcheck()->mutable_readiness()->set_path("/healthz/ready");
  return c;
}

cluster::v1::Change deletion(const std::string& id, uint64_t version) {
  cluster::v1::Change c;
  c.set_op(cluster::v1::CHANGE_OP_DELETE);
  c.set_version(version);
  c.mutable_resource()->set_type("deployment_topology");
  c.mutable_resource()->set_id(id);
  c.mutable_resource()->set_region("eu-west-1");
  return c;
}

class DeploymentKubePluginTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/krane-dk-XXXXXX";
    dir_ = ::mkdtemp(pattern);
    kubeconfig_ = dir_ + "/kubeconfig";
    std::ofstream(kubeconfig_) << api_.kubeconfigYaml();
  }

  void TearDown() override {
    plugin_.reset();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  std::string config() const {
    return json{{"runtime", "kubernetes"}, {"kubernetes", {{"kubeconfig", kubeconfig_}}}}.dump();
  }

  absl::Status load(const std::string& config_json) {
    agent::HostCallbacks callbacks;
    callbacks.report_status = [this](const plugin::v1::StatusReport& r) {
      std::lock_guard lock(mutex_);
      if (r.has_deployment()) reports_.push_back(r.deployment());
    };
    plugin_.reset();
    auto loaded =
        agent::loadPlugin(runfile("plugins/deployment/libdeployment.so"), config_json, callbacks);
    if (!loaded.ok()) return loaded.status();
    plugin_ = *std::move(loaded);
    return absl::OkStatus();
  }

  std::optional<cluster::v1::ReportDeploymentStatusRequest> latest(const std::string& id) {
    std::lock_guard lock(mutex_);
    for (auto it = reports_.rbegin(); it != reports_.rend(); ++it) {
      if (it->deployment_id() == id) return *it;
    }
    return std::nullopt;
  }

  size_t reportCount(const std::string& id) {
    std::lock_guard lock(mutex_);
    size_t n = 0;
    for (const auto& r : reports_) n += r.deployment_id() == id ? 1 : 0;
    return n;
  }

  // Whether the latest report of `id` lists `n` instances, all with `status`.
  bool instances(const std::string& id, int n, cluster::v1::InstanceStatus status) {
    auto r = latest(id);
    if (!r || !r->has_instances() || r->instances().instances_size() != n) return false;
    for (const auto& i : r->instances().instances()) {
      if (i.status() != status) return false;
    }
    return true;
  }

  std::optional<json> object(const std::string& api_version, const std::string& kind,
                             const std::string& name, const std::string& ns = kNs) {
    return api_.object(api_version, kind, ns, name);
  }

  FakeKubeApi api_;
  std::string dir_;
  std::string kubeconfig_;
  std::unique_ptr<agent::LoadedPlugin> plugin_;
  std::mutex mutex_;
  std::vector<cluster::v1::ReportDeploymentStatusRequest> reports_;
};

TEST_F(DeploymentKubePluginTest, AppliesTheObjectsAndReportsReadyPodsAsRunningInstances) {
  ASSERT_TRUE(load(config()).ok());
  EXPECT_THAT(plugin_->resourceTypes(), ::testing::ElementsAre("deployment_topology"));
  auto change = topology("d1", 3, 5);
  change.mutable_resource()->mutable_deployment_topology()->add_command("/srv/app");
  ASSERT_TRUE(plugin_->apply(change).ok());

  const auto ns = api_.object("v1", "Namespace", "", kNs);
  ASSERT_TRUE(ns);
  EXPECT_EQ((*ns)["metadata"]["labels"]["krane.dev/workspace.id"], "ws1");
  const auto deployment = object("apps/v1", "Deployment", "d-d1");
  ASSERT_TRUE(deployment);
  EXPECT_EQ((*deployment)["spec"]["replicas"], 3);
  EXPECT_EQ((*deployment)["metadata"]["labels"]["app.kubernetes.io/managed-by"], "krane");
  EXPECT_EQ((*deployment)["spec"]["template"]["spec"]["containers"][0]["command"][0], "/srv/app");
  EXPECT_TRUE(object("v1", "Service", "d-d1"));
  EXPECT_TRUE(object("networking.k8s.io/v1", "NetworkPolicy", "d-d1"));
  EXPECT_FALSE(object("autoscaling/v2", "HorizontalPodAutoscaler", "d-d1"));
  // Every write is a server-side apply by field manager krane.
  for (const auto& r : api_.requests()) {
    if (r.method == "PATCH") {
      EXPECT_EQ(r.content_type, "application/apply-patch+yaml");
      EXPECT_THAT(r.query, HasSubstr("fieldManager=krane"));
    }
  }

  // Applied, no pods yet: an empty instance set at the applied version.
  ASSERT_TRUE(eventually([&] { return instances("d1", 0, cluster::v1::INSTANCE_STATUS_RUNNING); }));
  EXPECT_EQ(latest("d1")->applied_version(), 5u);

  ASSERT_TRUE(api_.makePodsReady(kNs, "d-d1").ok());
  ASSERT_TRUE(eventually([&] { return instances("d1", 3, cluster::v1::INSTANCE_STATUS_RUNNING); }));
  const auto report = *latest("d1");
  EXPECT_EQ(report.region(), "eu-west-1");
  EXPECT_EQ(report.applied_version(), 5u);
  for (const auto& i : report.instances().instances()) {
    EXPECT_THAT(i.address(), ::testing::MatchesRegex("10\\.244\\.[0-9]+\\.[0-9]+:8080"));
    EXPECT_THAT(i.id(), ::testing::StartsWith("d-d1-"));
  }

  // The same change again changes nothing in the cluster.
  const uint64_t rv = api_.resourceVersion();
  ASSERT_TRUE(plugin_->apply(change).ok());
  EXPECT_EQ(api_.resourceVersion(), rv);
}

TEST_F(DeploymentKubePluginTest, UpdatesAddAndRemoveTheAutoscalerAndTheService) {
  ASSERT_TRUE(load(config()).ok());
  ASSERT_TRUE(plugin_->apply(topology("d1", 2, 1)).ok());
  const int64_t generation = (*object("apps/v1", "Deployment", "d-d1"))["metadata"]["generation"];

  // min != max: an autoscaler owns the replica count.
  auto scaled = topology("d1", 2, 2);
  auto* as = scaled.mutable_resource()->mutable_deployment_topology()->mutable_autoscaling();
  as->set_min_replicas(2);
  as->set_max_replicas(6);
  as->set_target_cpu_percent(65);
  ASSERT_TRUE(plugin_->apply(scaled).ok());
  const auto hpa = object("autoscaling/v2", "HorizontalPodAutoscaler", "d-d1");
  ASSERT_TRUE(hpa);
  EXPECT_EQ((*hpa)["spec"]["minReplicas"], 2);
  EXPECT_EQ((*hpa)["spec"]["maxReplicas"], 6);
  EXPECT_EQ((*hpa)["spec"]["scaleTargetRef"]["name"], "d-d1");
  EXPECT_EQ((*hpa)["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"], 65);
  EXPECT_FALSE((*object("apps/v1", "Deployment", "d-d1"))["spec"].contains("replicas"));

  // min == max again: the autoscaler goes, the count is fixed.
  auto fixed = topology("d1", 9, 3);
  fixed.mutable_resource()->mutable_deployment_topology()->mutable_autoscaling()->set_min_replicas(
      4);
  fixed.mutable_resource()->mutable_deployment_topology()->mutable_autoscaling()->set_max_replicas(
      4);
  ASSERT_TRUE(plugin_->apply(fixed).ok());
  EXPECT_FALSE(object("autoscaling/v2", "HorizontalPodAutoscaler", "d-d1"));
  EXPECT_EQ((*object("apps/v1", "Deployment", "d-d1"))["spec"]["replicas"], 4);

  // No port: no Service, and the policy lets nothing in.
  auto portless = topology("d1", 1, 4);
  portless.mutable_resource()->mutable_deployment_topology()->set_port(0);
  portless.mutable_resource()->mutable_deployment_topology()->clear_healthcheck();
  portless.mutable_resource()->mutable_deployment_topology()->add_env()->set_name("MODE");
  ASSERT_TRUE(plugin_->apply(portless).ok());
  EXPECT_FALSE(object("v1", "Service", "d-d1"));
  const auto policy = object("networking.k8s.io/v1", "NetworkPolicy", "d-d1");
  ASSERT_TRUE(policy);
  EXPECT_FALSE((*policy)["spec"].contains("ingress"));
  const auto deployment = *object("apps/v1", "Deployment", "d-d1");
  EXPECT_GT(deployment["metadata"]["generation"].get<int64_t>(), generation);
  const json container = deployment["spec"]["template"]["spec"]["containers"][0];
  EXPECT_FALSE(container.contains("readinessProbe"));
  EXPECT_FALSE(container.contains("ports"));
  EXPECT_EQ(container["env"][0]["name"], "MODE");

  // Stopped: zero replicas, everything else stays.
  auto stopped = topology("d1", 3, 5);
  stopped.mutable_resource()->mutable_deployment_topology()->set_desired_status(
      cluster::v1::DESIRED_STATUS_STOPPED);
  ASSERT_TRUE(plugin_->apply(stopped).ok());
  EXPECT_EQ((*object("apps/v1", "Deployment", "d-d1"))["spec"]["replicas"], 0);
  EXPECT_TRUE(object("v1", "Service", "d-d1"));
}

TEST_F(DeploymentKubePluginTest, ACrashLoopIsReportedAsFailedWithTheExitCode) {
  ASSERT_TRUE(load(config()).ok());
  ASSERT_TRUE(plugin_->apply(topology("broken", 2, 3)).ok());
  ASSERT_TRUE(api_.makePodsCrashLoop(kNs, "d-broken", 6, 3).ok());
  ASSERT_TRUE(
      eventually([&] { return instances("broken", 2, cluster::v1::INSTANCE_STATUS_FAILED); }));
  const auto report = *latest("broken");
  for (const auto& i : report.instances().instances()) {
    EXPECT_THAT(i.failure_reason(), HasSubstr("CrashLoopBackOff: exit code 3, 6 restarts"));
    EXPECT_THAT(i.failure_reason(), HasSubstr("back-off"));
    EXPECT_THAT(i.address(), ::testing::EndsWith(":8080"));
  }
  // Fixed: the same deployment's pods become ready and the report says so.
  ASSERT_TRUE(api_.makePodsReady(kNs, "d-broken").ok());
  ASSERT_TRUE(
      eventually([&] { return instances("broken", 2, cluster::v1::INSTANCE_STATUS_RUNNING); }));
}

TEST_F(DeploymentKubePluginTest, AnImagePullFailureIsReportedAsFailedWithTheReason) {
  ASSERT_TRUE(load(config()).ok());
  ASSERT_TRUE(plugin_->apply(topology("nopull", 1, 3)).ok());
  ASSERT_TRUE(api_.makePodsFailImagePull(kNs, "d-nopull", "ErrImagePull").ok());
  ASSERT_TRUE(
      eventually([&] { return instances("nopull", 1, cluster::v1::INSTANCE_STATUS_FAILED); }));
  const auto i = latest("nopull")->instances().instances(0);
  EXPECT_THAT(i.failure_reason(), HasSubstr("ErrImagePull"));
  EXPECT_THAT(i.failure_reason(), HasSubstr("registry.example/app:v1"));
  EXPECT_EQ(i.address(), "") << "a pod that never started has no IP";

  ASSERT_TRUE(api_.makePodsFailImagePull(kNs, "d-nopull", "ImagePullBackOff").ok());
  ASSERT_TRUE(eventually([&] {
    auto r = latest("nopull");
    return r && r->instances().instances_size() == 1 &&
           r->instances().instances(0).failure_reason().find("ImagePullBackOff") == 0;
  }));
}

TEST_F(DeploymentKubePluginTest, DeleteRemovesEveryObjectAndReportsTheDeploymentDeleted) {
  ASSERT_TRUE(load(config()).ok());
  auto change = topology("d1", 2, 1);
  change.mutable_resource()->mutable_deployment_topology()->mutable_autoscaling()->set_min_replicas(
      1);
  change.mutable_resource()->mutable_deployment_topology()->mutable_autoscaling()->set_max_replicas(
      3);
  ASSERT_TRUE(plugin_->apply(change).ok());
  ASSERT_TRUE(plugin_->apply(topology("other", 1, 2)).ok());
  ASSERT_TRUE(api_.makePodsReady(kNs, "d-d1").ok());
  ASSERT_TRUE(eventually([&] { return instances("d1", 1, cluster::v1::INSTANCE_STATUS_RUNNING); }));

  ASSERT_TRUE(plugin_->remove(deletion("d1", 7)).ok());
  EXPECT_TRUE(latest("d1")->deleted());
  EXPECT_EQ(latest("d1")->applied_version(), 7u);
  EXPECT_EQ(latest("d1")->region(), "eu-west-1");
  EXPECT_FALSE(object("apps/v1", "Deployment", "d-d1"));
  EXPECT_FALSE(object("v1", "Service", "d-d1"));
  EXPECT_FALSE(object("autoscaling/v2", "HorizontalPodAutoscaler", "d-d1"));
  EXPECT_FALSE(object("networking.k8s.io/v1", "NetworkPolicy", "d-d1"));
  EXPECT_TRUE(api_.objects("v1", "Pod", kNs).empty()) << "the pods go with their Deployment";
  EXPECT_TRUE(object("apps/v1", "Deployment", "d-other")) << "another deployment is untouched";
  EXPECT_TRUE(api_.object("v1", "Namespace", "", kNs)) << "the workspace namespace stays";

  // The pods' deletion events do not bring the deployment back in the reports.
  const size_t reports = reportCount("d1");
  ASSERT_TRUE(plugin_->observe().ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(reportCount("d1"), reports);
  EXPECT_TRUE(latest("d1")->deleted());

  // Deleting what is already gone is fine.
  EXPECT_TRUE(plugin_->remove(deletion("d1", 8)).ok());
}

TEST_F(DeploymentKubePluginTest, AfterASyncExactlyTheObjectsOfUnlistedDeploymentsAreDeleted) {
  ASSERT_TRUE(load(config()).ok());
  ASSERT_TRUE(plugin_->apply(topology("keep", 1, 1)).ok());
  ASSERT_TRUE(plugin_->apply(topology("gone", 1, 2, "ws2")).ok());
  // Not the plugin's: another component of Krane, and an object nobody labelled.
  json foreign = *object("v1", "Service", "d-keep");
  foreign["metadata"] = {{"name", "sentinel-x"},
                         {"namespace", kNs},
                         {"labels",
                          {{"app.kubernetes.io/managed-by", "krane"},
                           {"app.kubernetes.io/component", "sentinel"},
                           {"krane.dev/deployment.id", "gone"}}}};
  api_.put(foreign);
  json unlabelled = *object("apps/v1", "Deployment", "d-gone", "ws-ws2");
  unlabelled["metadata"] = {{"name", "hand-made"}, {"namespace", "ws-ws2"}};
  api_.put(unlabelled);
  // Left by an earlier agent: labelled as the plugin's, for a deployment that is gone.
  json stale = *object("networking.k8s.io/v1", "NetworkPolicy", "d-keep");
  stale["metadata"]["name"] = "d-stale";
  stale["metadata"]["labels"]["krane.dev/deployment.id"] = "stale";
  stale["metadata"].erase("resourceVersion");
  stale["metadata"].erase("uid");
  api_.put(stale);

  plugin::v1::SyncEnd end;
  end.set_snapshot_version(9);
  auto* ids = end.add_resources();
  ids->set_resource_type("deployment_topology");
  ids->add_ids("keep");
  auto* other = end.add_resources();
  other->set_resource_type("sentinel");
  other->add_ids("gone");  // a sentinel's id keeps no deployment
  ASSERT_TRUE(plugin_->syncEnd(end).ok());

  EXPECT_TRUE(latest("gone")->deleted());
  EXPECT_EQ(latest("gone")->applied_version(), 9u);
  EXPECT_TRUE(latest("stale")->deleted());
  for (const auto& [api_version, kind] : std::vector<std::pair<std::string, std::string>>{
           {"apps/v1", "Deployment"},
           {"v1", "Service"},
           {"networking.k8s.io/v1", "NetworkPolicy"}}) {
    EXPECT_TRUE(object(api_version, kind, "d-keep")) << kind;
    EXPECT_FALSE(object(api_version, kind, "d-gone", "ws-ws2")) << kind;
  }
  EXPECT_FALSE(object("networking.k8s.io/v1", "NetworkPolicy", "d-stale"));
  EXPECT_TRUE(object("v1", "Service", "sentinel-x"));
  EXPECT_TRUE(object("apps/v1", "Deployment", "hand-made", "ws-ws2"));
  EXPECT_TRUE(api_.object("v1", "Namespace", "", "ws-ws2"));
}

TEST_F(DeploymentKubePluginTest, ANewPluginInstanceReportsThePodsItFinds) {
  ASSERT_TRUE(load(config()).ok());
  ASSERT_TRUE(plugin_->apply(topology("d1", 2, 4)).ok());
  ASSERT_TRUE(api_.makePodsReady(kNs, "d-d1").ok());
  ASSERT_TRUE(eventually([&] { return instances("d1", 2, cluster::v1::INSTANCE_STATUS_RUNNING); }));
  {
    std::lock_guard lock(mutex_);
    reports_.clear();
  }
  ASSERT_TRUE(load(config()).ok());  // a restarted host: nothing applied yet
  ASSERT_TRUE(eventually([&] { return instances("d1", 2, cluster::v1::INSTANCE_STATUS_RUNNING); }));
  EXPECT_EQ(latest("d1")->region(), "eu-west-1") << "from the pods' labels";
  // A delete after the restart still finds every object.
  ASSERT_TRUE(plugin_->remove(deletion("d1", 5)).ok());
  EXPECT_FALSE(object("apps/v1", "Deployment", "d-d1"));
  EXPECT_FALSE(object("v1", "Service", "d-d1"));
}

TEST_F(DeploymentKubePluginTest, TheWatchSurvivesAnExpiredVersion) {
  ASSERT_TRUE(load(config()).ok());
  ASSERT_TRUE(plugin_->apply(topology("d1", 1, 1)).ok());
  api_.compactHistory();
  ASSERT_TRUE(api_.makePodsReady(kNs, "d-d1").ok());
  ASSERT_TRUE(eventually([&] { return instances("d1", 1, cluster::v1::INSTANCE_STATUS_RUNNING); }));
}

TEST_F(DeploymentKubePluginTest, AnUnavailableApiServerIsARetryableFailure) {
  ASSERT_TRUE(load(config()).ok());
  api_.failNext(100, 503, -1, "PATCH");
  const auto st = plugin_->apply(topology("d1", 1, 1));
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_THAT(std::string(toStd(st.message())), HasSubstr("deployment_topology d1"));
  api_.failNext(0, 503);
  EXPECT_TRUE(plugin_->apply(topology("d1", 1, 1)).ok());
}

TEST_F(DeploymentKubePluginTest, BadConfigurationAndBadTopologiesAreRefusedByName) {
  const auto message = [&](const std::string& config) {
    return std::string(toStd(load(config).message()));
  };
  EXPECT_THAT(message(R"({"runtime": "kubernetes", "kubernetes": {"in_cluster": false}})"),
              HasSubstr("kubernetes: set exactly one of in_cluster: true"));
  EXPECT_THAT(message(json{{"runtime", "kubernetes"},
                           {"kubernetes", {{"kubeconfig", kubeconfig_}, {"qsp", 5}}}}
                          .dump()),
              HasSubstr("kubernetes.qsp: unknown key"));
  EXPECT_THAT(message(json{{"runtime", "kubernetes"},
                           {"kubernetes", {{"kubeconfig", kubeconfig_}, {"burst", 0}}}}
                          .dump()),
              HasSubstr("kubernetes.burst: must be a whole number between 1 and 100000, got 0"));
  EXPECT_THAT(message(R"({"runtime": "kubernetes", "kubernetes": {"kubeconfig": "/nonexistent"}})"),
              HasSubstr("/nonexistent"));
  EXPECT_THAT(message(R"({"runtime": "kubernetes"})"),
              HasSubstr("kubernetes: required with runtime kubernetes"));
  EXPECT_THAT(message(R"({"runtime": "kubernetes", "kubernets": {}})"),
              HasSubstr("kubernets: unknown key"));
  EXPECT_THAT(message(R"({"runtime": "nomad"})"), HasSubstr("runtime: \"nomad\" is not one of"));

  ASSERT_TRUE(load(config()).ok());
  api_.clearRequests();
  auto bad = topology("bad", 1, 1);
  bad.mutable_resource()->mutable_deployment_topology()->set_shutdown_signal("SIGNOPE");
  auto st = plugin_->apply(bad);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(toStd(st.message())),
              HasSubstr("deployment_topology bad: shutdown_signal: \"SIGNOPE\""));
  auto label = topology("label", 1, 1);
  (*label.mutable_resource()->mutable_deployment_topology()->mutable_labels())["team"] = "a b";
  st = plugin_->apply(label);
  EXPECT_THAT(std::string(toStd(st.message())), HasSubstr("labels[team]: \"a b\""));
  EXPECT_EQ(api_.countRequests("PATCH"), 0u) << "nothing of a refused topology is applied";
}

}  // namespace
}  // namespace krane
