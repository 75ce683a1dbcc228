// libdeployment.so on the Kubernetes runtime, loaded as the agent loads it, against the fake API
// server: the objects applied, updates (autoscaler and Service come and go), pods reported as
// instances (ready, crash-looping, failing to pull), delete, garbage collection after a sync,
// adoption by a new plugin instance, configuration and topology errors.
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <mutex>

#include <catch2/catch.hpp>

#include "agent/plugin_loader.h"
#include "common/strings.h"
#include "nlohmann/json.hpp"
#include "tests/support/fake_kube_api.h"
#include "tests/support/matchers.h"
#include "tests/support/process.h"
#include "tests/support/wait.h"

namespace krane {
namespace {

using krane::testing::eventually;
using krane::testing::FakeKubeApi;
using krane::testing::runfile;
using nlohmann::json;
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

class DeploymentKubePluginTest {
 protected:
  DeploymentKubePluginTest() {
    char pattern[] = "/tmp/krane-dk-XXXXXX";
    dir_ = ::mkdtemp(pattern);
    kubeconfig_ = dir_ + "/kubeconfig";
    std::ofstream(kubeconfig_) << api_.kubeconfigYaml();
  }

  ~DeploymentKubePluginTest() {
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

TEST_CASE_METHOD(DeploymentKubePluginTest,
                 "applies the objects and reports ready pods as running instances",
                 "[deployment-kube-plugin]") {
  REQUIRE_THAT(load(config()), IsOk());
  CHECK(plugin_->resourceTypes() == std::vector<std::string>{"deployment_topology"});
  auto change = topology("d1", 3, 5);
  change.mutable_resource()->mutable_deployment_topology()->add_command("/srv/app");
  REQUIRE_THAT(plugin_->apply(change), IsOk());

  const auto ns = api_.object("v1", "Namespace", "", kNs);
  REQUIRE(ns);
  CHECK((*ns)["metadata"]["labels"]["krane.dev/workspace.id"] == "ws1");
  const auto deployment = object("apps/v1", "Deployment", "d-d1");
  REQUIRE(deployment);
  CHECK((*deployment)["spec"]["replicas"] == 3);
  CHECK((*deployment)["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "krane");
  CHECK((*deployment)["spec"]["template"]["spec"]["containers"][0]["command"][0] == "/srv/app");
  CHECK(object("v1", "Service", "d-d1"));
  CHECK(object("networking.k8s.io/v1", "NetworkPolicy", "d-d1"));
  CHECK_FALSE(object("autoscaling/v2", "HorizontalPodAutoscaler", "d-d1"));
  // Every write is a server-side apply by field manager krane.
  for (const auto& r : api_.requests()) {
    if (r.method == "PATCH") {
      CHECK(r.content_type == "application/apply-patch+yaml");
      CHECK_THAT(r.query, Catch::Contains("fieldManager=krane"));
    }
  }

  // Applied, no pods yet: an empty instance set at the applied version.
  REQUIRE(eventually([&] { return instances("d1", 0, cluster::v1::INSTANCE_STATUS_RUNNING); }));
  CHECK(latest("d1")->applied_version() == 5u);

  REQUIRE_THAT(api_.makePodsReady(kNs, "d-d1"), IsOk());
  REQUIRE(eventually([&] { return instances("d1", 3, cluster::v1::INSTANCE_STATUS_RUNNING); }));
  const auto report = *latest("d1");
  CHECK(report.region() == "eu-west-1");
  CHECK(report.applied_version() == 5u);
  for (const auto& i : report.instances().instances()) {
    CHECK_THAT(i.address(), Catch::Matches("10\\.244\\.[0-9]+\\.[0-9]+:8080"));
    CHECK_THAT(i.id(), Catch::StartsWith("d-d1-"));
  }

  // The same change again changes nothing in the cluster.
  const uint64_t rv = api_.resourceVersion();
  REQUIRE_THAT(plugin_->apply(change), IsOk());
  CHECK(api_.resourceVersion() == rv);
}

TEST_CASE_METHOD(DeploymentKubePluginTest, "updates add and remove the autoscaler and the service",
                 "[deployment-kube-plugin]") {
  REQUIRE_THAT(load(config()), IsOk());
  REQUIRE_THAT(plugin_->apply(topology("d1", 2, 1)), IsOk());
  const int64_t generation = (*object("apps/v1", "Deployment", "d-d1"))["metadata"]["generation"];

  // min != max: an autoscaler owns the replica count.
  auto scaled = topology("d1", 2, 2);
  auto* as = scaled.mutable_resource()->mutable_deployment_topology()->mutable_autoscaling();
  as->set_min_replicas(2);
  as->set_max_replicas(6);
  as->set_target_cpu_percent(65);
  REQUIRE_THAT(plugin_->apply(scaled), IsOk());
  const auto hpa = object("autoscaling/v2", "HorizontalPodAutoscaler", "d-d1");
  REQUIRE(hpa);
  CHECK((*hpa)["spec"]["minReplicas"] == 2);
  CHECK((*hpa)["spec"]["maxReplicas"] == 6);
  CHECK((*hpa)["spec"]["scaleTargetRef"]["name"] == "d-d1");
  CHECK((*hpa)["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"] == 65);
  CHECK_FALSE((*object("apps/v1", "Deployment", "d-d1"))["spec"].contains("replicas"));

  // min == max again: the autoscaler goes, the count is fixed.
  auto fixed = topology("d1", 9, 3);
  fixed.mutable_resource()->mutable_deployment_topology()->mutable_autoscaling()->set_min_replicas(
      4);
  fixed.mutable_resource()->mutable_deployment_topology()->mutable_autoscaling()->set_max_replicas(
      4);
  REQUIRE_THAT(plugin_->apply(fixed), IsOk());
  CHECK_FALSE(object("autoscaling/v2", "HorizontalPodAutoscaler", "d-d1"));
  CHECK((*object("apps/v1", "Deployment", "d-d1"))["spec"]["replicas"] == 4);

  // No port: no Service, and the policy lets nothing in.
  auto portless = topology("d1", 1, 4);
  portless.mutable_resource()->mutable_deployment_topology()->set_port(0);
  portless.mutable_resource()->mutable_deployment_topology()->clear_healthcheck();
  portless.mutable_resource()->mutable_deployment_topology()->add_env()->set_name("MODE");
  REQUIRE_THAT(plugin_->apply(portless), IsOk());
  CHECK_FALSE(object("v1", "Service", "d-d1"));
  const auto policy = object("networking.k8s.io/v1", "NetworkPolicy", "d-d1");
  REQUIRE(policy);
  CHECK_FALSE((*policy)["spec"].contains("ingress"));
  const auto deployment = *object("apps/v1", "Deployment", "d-d1");
  CHECK(deployment["metadata"]["generation"].get<int64_t>() > generation);
  const json container = deployment["spec"]["template"]["spec"]["containers"][0];
  CHECK_FALSE(container.contains("readinessProbe"));
  CHECK_FALSE(container.contains("ports"));
  CHECK(container["env"][0]["name"] == "MODE");

  // Stopped: zero replicas, everything else stays.
  auto stopped = topology("d1", 3, 5);
  stopped.mutable_resource()->mutable_deployment_topology()->set_desired_status(
      cluster::v1::DESIRED_STATUS_STOPPED);
  REQUIRE_THAT(plugin_->apply(stopped), IsOk());
  CHECK((*object("apps/v1", "Deployment", "d-d1"))["spec"]["replicas"] == 0);
  CHECK(object("v1", "Service", "d-d1"));
}

TEST_CASE_METHOD(DeploymentKubePluginTest, "a crash loop is reported as failed with the exit code",
                 "[deployment-kube-plugin]") {
  REQUIRE_THAT(load(config()), IsOk());
  REQUIRE_THAT(plugin_->apply(topology("broken", 2, 3)), IsOk());
  REQUIRE_THAT(api_.makePodsCrashLoop(kNs, "d-broken", 6, 3), IsOk());
  REQUIRE(eventually([&] { return instances("broken", 2, cluster::v1::INSTANCE_STATUS_FAILED); }));
  const auto report = *latest("broken");
  for (const auto& i : report.instances().instances()) {
    CHECK_THAT(i.failure_reason(), Catch::Contains("CrashLoopBackOff: exit code 3, 6 restarts"));
    CHECK_THAT(i.failure_reason(), Catch::Contains("back-off"));
    CHECK_THAT(i.address(), Catch::EndsWith(":8080"));
  }
  // Fixed: the same deployment's pods become ready and the report says so.
  REQUIRE_THAT(api_.makePodsReady(kNs, "d-broken"), IsOk());
  REQUIRE(eventually([&] { return instances("broken", 2, cluster::v1::INSTANCE_STATUS_RUNNING); }));
}

TEST_CASE_METHOD(DeploymentKubePluginTest,
                 "an image pull failure is reported as failed with the reason",
                 "[deployment-kube-plugin]") {
  REQUIRE_THAT(load(config()), IsOk());
  REQUIRE_THAT(plugin_->apply(topology("nopull", 1, 3)), IsOk());
  REQUIRE_THAT(api_.makePodsFailImagePull(kNs, "d-nopull", "ErrImagePull"), IsOk());
  REQUIRE(eventually([&] { return instances("nopull", 1, cluster::v1::INSTANCE_STATUS_FAILED); }));
  const auto i = latest("nopull")->instances().instances(0);
  CHECK_THAT(i.failure_reason(), Catch::Contains("ErrImagePull"));
  CHECK_THAT(i.failure_reason(), Catch::Contains("registry.example/app:v1"));
  INFO("a pod that never started has no IP");
  CHECK(i.address() == "");

  REQUIRE_THAT(api_.makePodsFailImagePull(kNs, "d-nopull", "ImagePullBackOff"), IsOk());
  REQUIRE(eventually([&] {
    auto r = latest("nopull");
    return r && r->instances().instances_size() == 1 &&
           r->instances().instances(0).failure_reason().find("ImagePullBackOff") == 0;
  }));
}

TEST_CASE_METHOD(DeploymentKubePluginTest,
                 "delete removes every object and reports the deployment deleted",
                 "[deployment-kube-plugin]") {
  REQUIRE_THAT(load(config()), IsOk());
  auto change = topology("d1", 2, 1);
  change.mutable_resource()->mutable_deployment_topology()->mutable_autoscaling()->set_min_replicas(
      1);
  change.mutable_resource()->mutable_deployment_topology()->mutable_autoscaling()->set_max_replicas(
      3);
  REQUIRE_THAT(plugin_->apply(change), IsOk());
  REQUIRE_THAT(plugin_->apply(topology("other", 1, 2)), IsOk());
  REQUIRE_THAT(api_.makePodsReady(kNs, "d-d1"), IsOk());
  REQUIRE(eventually([&] { return instances("d1", 1, cluster::v1::INSTANCE_STATUS_RUNNING); }));

  REQUIRE_THAT(plugin_->remove(deletion("d1", 7)), IsOk());
  CHECK(latest("d1")->deleted());
  CHECK(latest("d1")->applied_version() == 7u);
  CHECK(latest("d1")->region() == "eu-west-1");
  CHECK_FALSE(object("apps/v1", "Deployment", "d-d1"));
  CHECK_FALSE(object("v1", "Service", "d-d1"));
  CHECK_FALSE(object("autoscaling/v2", "HorizontalPodAutoscaler", "d-d1"));
  CHECK_FALSE(object("networking.k8s.io/v1", "NetworkPolicy", "d-d1"));
  INFO("the pods go with their Deployment");
  CHECK(api_.objects("v1", "Pod", kNs).empty());
  INFO("another deployment is untouched");
  CHECK(object("apps/v1", "Deployment", "d-other"));
  INFO("the workspace namespace stays");
  CHECK(api_.object("v1", "Namespace", "", kNs));

  // The pods' deletion events do not bring the deployment back in the reports.
  const size_t reports = reportCount("d1");
  REQUIRE_THAT(plugin_->observe(), IsOk());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  CHECK(reportCount("d1") == reports);
  CHECK(latest("d1")->deleted());

  // Deleting what is already gone is fine.
  CHECK_THAT(plugin_->remove(deletion("d1", 8)), IsOk());
}

TEST_CASE_METHOD(DeploymentKubePluginTest,
                 "after a sync exactly the objects of unlisted deployments are deleted",
                 "[deployment-kube-plugin]") {
  REQUIRE_THAT(load(config()), IsOk());
  REQUIRE_THAT(plugin_->apply(topology("keep", 1, 1)), IsOk());
  REQUIRE_THAT(plugin_->apply(topology("gone", 1, 2, "ws2")), IsOk());
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

  // Another region's agent shares this cluster: its deployment is not this sync's business.
  auto elsewhere = topology("elsewhere", 1, 3);
  elsewhere.mutable_resource()->set_region("us-east-1");
  elsewhere.mutable_resource()->mutable_deployment_topology()->set_region("us-east-1");
  REQUIRE_THAT(plugin_->apply(elsewhere), IsOk());

  plugin::v1::SyncEnd end;
  end.set_snapshot_version(9);
  end.set_region("eu-west-1");
  auto* ids = end.add_resources();
  ids->set_resource_type("deployment_topology");
  ids->add_ids("keep");
  auto* other = end.add_resources();
  other->set_resource_type("sentinel");
  other->add_ids("gone");  // a sentinel's id keeps no deployment
  REQUIRE_THAT(plugin_->syncEnd(end), IsOk());

  CHECK(latest("gone")->deleted());
  CHECK(latest("gone")->applied_version() == 9u);
  CHECK(latest("stale")->deleted());
  for (const auto& [api_version, kind] : std::vector<std::pair<std::string, std::string>>{
           {"apps/v1", "Deployment"},
           {"v1", "Service"},
           {"networking.k8s.io/v1", "NetworkPolicy"}}) {
    INFO(kind);
    CHECK(object(api_version, kind, "d-keep"));
    INFO(kind);
    CHECK_FALSE(object(api_version, kind, "d-gone", "ws-ws2"));
  }
  CHECK_FALSE(object("networking.k8s.io/v1", "NetworkPolicy", "d-stale"));
  INFO("another region's deployment in the same cluster stays");
  CHECK(object("apps/v1", "Deployment", "d-elsewhere"));
  CHECK(object("v1", "Service", "d-elsewhere"));
  CHECK(object("v1", "Service", "sentinel-x"));
  CHECK(object("apps/v1", "Deployment", "hand-made", "ws-ws2"));
  CHECK(api_.object("v1", "Namespace", "", "ws-ws2"));
}

TEST_CASE_METHOD(DeploymentKubePluginTest, "a new plugin instance reports the pods it finds",
                 "[deployment-kube-plugin]") {
  REQUIRE_THAT(load(config()), IsOk());
  REQUIRE_THAT(plugin_->apply(topology("d1", 2, 4)), IsOk());
  REQUIRE_THAT(api_.makePodsReady(kNs, "d-d1"), IsOk());
  REQUIRE(eventually([&] { return instances("d1", 2, cluster::v1::INSTANCE_STATUS_RUNNING); }));
  const int64_t generation =
      object("apps/v1", "Deployment", "d-d1")->at("metadata").value("generation", int64_t{0});
  INFO("a new version of the same topology is recorded without a rollout");
  REQUIRE_THAT(plugin_->apply(topology("d1", 2, 5)), IsOk());
  const auto d = *object("apps/v1", "Deployment", "d-d1");
  CHECK(d["metadata"].value("annotations", json::object()).value("krane.dev/applied-version", "") ==
        "5");
  CHECK(d["metadata"].value("generation", int64_t{0}) == generation);
  {
    std::lock_guard lock(mutex_);
    reports_.clear();
  }
  REQUIRE_THAT(load(config()), IsOk());  // a restarted host: nothing applied yet
  INFO("the control plane drops reports older than the ones it stored: the new instance goes");
  INFO("on from the version its Deployment records, not from 0");
  REQUIRE(eventually([&] {
    return instances("d1", 2, cluster::v1::INSTANCE_STATUS_RUNNING) &&
           latest("d1")->applied_version() == 5u;
  }));
  CHECK(latest("d1")->region() == "eu-west-1");
  // A delete after the restart still finds every object.
  REQUIRE_THAT(plugin_->remove(deletion("d1", 5)), IsOk());
  CHECK_FALSE(object("apps/v1", "Deployment", "d-d1"));
  CHECK_FALSE(object("v1", "Service", "d-d1"));
}

TEST_CASE_METHOD(DeploymentKubePluginTest, "the watch survives an expired version",
                 "[deployment-kube-plugin]") {
  REQUIRE_THAT(load(config()), IsOk());
  REQUIRE_THAT(plugin_->apply(topology("d1", 1, 1)), IsOk());
  api_.compactHistory();
  REQUIRE_THAT(api_.makePodsReady(kNs, "d-d1"), IsOk());
  REQUIRE(eventually([&] { return instances("d1", 1, cluster::v1::INSTANCE_STATUS_RUNNING); }));
}

TEST_CASE_METHOD(DeploymentKubePluginTest, "an unavailable api server is a retryable failure",
                 "[deployment-kube-plugin]") {
  REQUIRE_THAT(load(config()), IsOk());
  api_.failNext(100, 503, -1, "PATCH");
  const auto st = plugin_->apply(topology("d1", 1, 1));
  INFO(st);
  CHECK(st.code() == absl::StatusCode::kUnavailable);
  CHECK_THAT(std::string(toStd(st.message())), Catch::Contains("deployment_topology d1"));
  api_.failNext(0, 503);
  CHECK_THAT(plugin_->apply(topology("d1", 1, 1)), IsOk());
}

TEST_CASE_METHOD(DeploymentKubePluginTest,
                 "bad configuration and bad topologies are refused by name",
                 "[deployment-kube-plugin]") {
  const auto message = [&](const std::string& config) {
    return std::string(toStd(load(config).message()));
  };
  CHECK_THAT(message(R"({"runtime": "kubernetes", "kubernetes": {"in_cluster": false}})"),
             Catch::Contains("kubernetes: set exactly one of in_cluster: true"));
  CHECK_THAT(message(json{{"runtime", "kubernetes"},
                          {"kubernetes", {{"kubeconfig", kubeconfig_}, {"qsp", 5}}}}
                         .dump()),
             Catch::Contains("kubernetes.qsp: unknown key"));
  CHECK_THAT(
      message(json{{"runtime", "kubernetes"},
                   {"kubernetes", {{"kubeconfig", kubeconfig_}, {"burst", 0}}}}
                  .dump()),
      Catch::Contains("kubernetes.burst: must be a whole number between 1 and 100000, got 0"));
  CHECK_THAT(message(R"({"runtime": "kubernetes", "kubernetes": {"kubeconfig": "/nonexistent"}})"),
             Catch::Contains("/nonexistent"));
  CHECK_THAT(message(R"({"runtime": "kubernetes"})"),
             Catch::Contains("kubernetes: required with runtime kubernetes"));
  CHECK_THAT(message(R"({"runtime": "kubernetes", "kubernets": {}})"),
             Catch::Contains("kubernets: unknown key"));
  CHECK_THAT(message(R"({"runtime": "nomad"})"),
             Catch::Contains("runtime: \"nomad\" is not one of"));

  REQUIRE_THAT(load(config()), IsOk());
  api_.clearRequests();
  auto bad = topology("bad", 1, 1);
  bad.mutable_resource()->mutable_deployment_topology()->set_shutdown_signal("SIGNOPE");
  auto st = plugin_->apply(bad);
  CHECK(st.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(toStd(st.message())),
             Catch::Contains("deployment_topology bad: shutdown_signal: \"SIGNOPE\""));
  auto label = topology("label", 1, 1);
  (*label.mutable_resource()->mutable_deployment_topology()->mutable_labels())["team"] = "a b";
  st = plugin_->apply(label);
  CHECK_THAT(std::string(toStd(st.message())), Catch::Contains("labels[team]: \"a b\""));
  INFO("nothing of a refused topology is applied");
  CHECK(api_.countRequests("PATCH") == 0u);
}

}  // namespace
}  // namespace krane
