// libsentinel.so on the Kubernetes runtime, against the fake API server: the six objects, the
// status flow (replicas, observed generation, the running image only once a rollout converged,
// health), standby, crash loops and image-pull failures, the environment's gossip objects going
// with its last sentinel, archive, garbage collection after a sync, configuration errors, and the
// routes ConfigMap following the live deployment's Service across promote, rolling and restarts.
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include <catch2/catch.hpp>

#include "agent/plugin_loader.h"
#include "common/strings.h"
#include "nlohmann/json.hpp"
#include "plugins/deployment/kube_objects.h"
#include "plugins/sentinel/proxy/routes.h"
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

constexpr char kNs[] = "sentinel";

cluster::v1::Change sentinelChange(
    const std::string& id, const std::string& tag, uint32_t replicas, uint64_t version,
    const std::string& environment = "e1",
    cluster::v1::SentinelDesiredState state = cluster::v1::SENTINEL_DESIRED_STATE_RUNNING) {
  cluster::v1::Change c;
  c.set_op(cluster::v1::CHANGE_OP_APPLY);
  c.set_version(version);
  auto* r = c.mutable_resource();
  r->set_type("sentinel");
  r->set_id(id);
  r->set_region("eu-west-1");
  auto* s = r->mutable_sentinel();
  s->set_sentinel_id(id);
  s->set_workspace_id("ws1");
  s->set_project_id("p1");
  s->set_app_id("a1");
  s->set_environment_id(environment);
  s->set_region("eu-west-1");
  s->set_image("registry.example/sentinel:" + tag);
  s->set_replicas(replicas);
  s->set_desired_state(state);
  return c;
}

cluster::v1::Change deletion(const std::string& id, uint64_t version) {
  cluster::v1::Change c;
  c.set_op(cluster::v1::CHANGE_OP_DELETE);
  c.set_version(version);
  c.mutable_resource()->set_type("sentinel");
  c.mutable_resource()->set_id(id);
  return c;
}

class SentinelKubePluginTest {
 protected:
  SentinelKubePluginTest() {
    char pattern[] = "/tmp/krane-sk-XXXXXX";
    dir_ = ::mkdtemp(pattern);
    kubeconfig_ = dir_ + "/kubeconfig";
    std::ofstream(kubeconfig_) << api_.kubeconfigYaml();
    // The cluster's manifests create the namespace.
    api_.put({{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", kNs}}}});
  }

  ~SentinelKubePluginTest() {
    plugin_.reset();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  absl::Status load(const std::string& config_json) {
    agent::HostCallbacks callbacks;
    callbacks.report_status = [this](const plugin::v1::StatusReport& r) {
      std::lock_guard lock(mutex_);
      if (r.has_sentinel()) reports_.push_back(r.sentinel());
    };
    plugin_.reset();
    auto loaded =
        agent::loadPlugin(runfile("plugins/sentinel/libsentinel.so"), config_json, callbacks);
    if (!loaded.ok()) return loaded.status();
    plugin_ = *std::move(loaded);
    return absl::OkStatus();
  }

  absl::Status load() {
    return load(
        json{{"runtime", "kubernetes"}, {"kubernetes", {{"kubeconfig", kubeconfig_}}}}.dump());
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

  std::optional<json> object(const std::string& api_version, const std::string& kind,
                             const std::string& name) {
    return api_.object(api_version, kind, kNs, name);
  }

  bool hasSentinel(const std::string& id) {
    const std::string name = "sentinel-" + id;
    return object("apps/v1", "Deployment", name) && object("v1", "Service", name) &&
           object("policy/v1", "PodDisruptionBudget", name);
  }
  bool noSentinel(const std::string& id) {
    const std::string name = "sentinel-" + id;
    return !object("apps/v1", "Deployment", name) && !object("v1", "Service", name) &&
           !object("policy/v1", "PodDisruptionBudget", name) &&
           !object("v1", "ConfigMap", "sentinel-routes-" + id);
  }
  bool hasGossip(const std::string& env) {
    return object("v1", "Service", "sentinel-gossip-" + env) &&
           object("cilium.io/v2", "CiliumNetworkPolicy", "sentinel-gossip-" + env);
  }
  bool noGossip(const std::string& env) {
    return !object("v1", "Service", "sentinel-gossip-" + env) &&
           !object("cilium.io/v2", "CiliumNetworkPolicy", "sentinel-gossip-" + env);
  }

  // A deployment as the deployment plugin applies it: its Deployment and Service on `port`.
  void putDeployment(const std::string& id, int port = 8080) {
    cluster::v1::DeploymentTopology t;
    t.set_workspace_id("ws1");
    t.set_project_id("p1");
    t.set_app_id("a1");
    t.set_environment_id("e1");
    t.set_region("eu-west-1");
    t.set_image("registry.example/app:" + id);
    t.set_replicas(1);
    t.set_port(port);
    auto objects = deployment::kubeObjects(t, id);
    REQUIRE_THAT(objects.status(), IsOk());
    for (const auto& o : *objects) api_.put(o);
  }
  std::string workspaceNs() { return deployment::workspaceNamespace("ws1", {}); }
  // The address the routes give for a deployment: its Service's DNS name and port.
  std::string serviceOf(const std::string& id, int port = 8080) {
    return strCat(deployment::objectName(id), ".", workspaceNs(), ".svc:", port);
  }
  // What sentinel `id`'s routes ConfigMap says, as "<deployment> [<endpoint> ...]".
  std::string routesOf(const std::string& id) {
    auto cm = object("v1", "ConfigMap", "sentinel-routes-" + id);
    if (!cm) return "(none)";
    auto routes = sentinel::parseRoutes((*cm)["data"]["routes.json"].get<std::string>());
    if (!routes.ok()) return std::string(routes.status().message());
    std::string out = routes->deployment_id.empty() ? "-" : routes->deployment_id;
    for (const auto& e : routes->endpoints) out += " " + e.address();
    return out;
  }
  bool routesAre(const std::string& id, const std::string& want) {
    return eventually([&] { return routesOf(id) == want; }, std::chrono::seconds(10));
  }

  FakeKubeApi api_;
  std::string dir_;
  std::string kubeconfig_;
  std::unique_ptr<agent::LoadedPlugin> plugin_;
  std::mutex mutex_;
  std::vector<cluster::v1::ReportSentinelStatusRequest> reports_;
};

TEST_CASE_METHOD(SentinelKubePluginTest,
                 "applies five objects and reports the rollout as it converges",
                 "[sentinel-kube-plugin]") {
  REQUIRE_THAT(load(), IsOk());
  CHECK(plugin_->resourceTypes() == std::vector<std::string>{"sentinel"});
  REQUIRE_THAT(plugin_->apply(sentinelChange("s1", "v1", 2, 3)), IsOk());
  CHECK(hasSentinel("s1"));
  CHECK(hasGossip("e1"));
  const auto d = *object("apps/v1", "Deployment", "sentinel-s1");
  CHECK(d["spec"]["replicas"] == 2);
  CHECK(d["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.example/sentinel:v1");
  CHECK((api_.objects("apps/v1", "Deployment", kNs).size() +
         api_.objects("v1", "Service", kNs).size() +
         api_.objects("policy/v1", "PodDisruptionBudget", kNs).size() +
         api_.objects("cilium.io/v2", "CiliumNetworkPolicy", kNs).size()) == 5u);

  // Applied, no pod ready: unhealthy, and no image runs yet.
  REQUIRE(eventually([&] { return latest("s1").has_value(); }));
  auto r = *latest("s1");
  CHECK(r.health() == cluster::v1::SENTINEL_HEALTH_UNHEALTHY);
  CHECK(r.running_image() == "");
  CHECK(r.available_replicas() == 0u);

  REQUIRE_THAT(api_.makePodsReady(kNs, "sentinel-s1"), IsOk());
  REQUIRE(eventually([&] {
    auto x = latest("s1");
    return x && x->running_image() == "registry.example/sentinel:v1";
  }));
  r = *latest("s1");
  CHECK(r.health() == cluster::v1::SENTINEL_HEALTH_HEALTHY);
  CHECK(r.available_replicas() == 2u);
  CHECK(r.updated_replicas() == 2u);
  CHECK(r.ready_replicas() == 2u);
  CHECK(r.observed_generation() == 1);
  CHECK(r.applied_version() == 3u);
  CHECK(r.region() == "eu-west-1");

  // A new image: until the controller rolled it out, the old image is what runs.
  REQUIRE_THAT(plugin_->apply(sentinelChange("s1", "v2", 2, 4)), IsOk());
  const int64_t generation =
      (*object("apps/v1", "Deployment", "sentinel-s1"))["metadata"]["generation"];
  CHECK(generation == 2);
  REQUIRE(eventually([&] { return latest("s1")->applied_version() == 4u; }));
  CHECK(latest("s1")->running_image() == "registry.example/sentinel:v1");
  CHECK(latest("s1")->observed_generation() == 1);
  REQUIRE_THAT(api_.makePodsReady(kNs, "sentinel-s1"), IsOk());
  REQUIRE(eventually([&] {
    auto x = latest("s1");
    return x->running_image() == "registry.example/sentinel:v2" && x->observed_generation() == 2;
  }));
  for (const auto& report : all("s1")) {
    if (report.running_image() == "registry.example/sentinel:v2") {
      INFO("never before the rollout converged");
      CHECK(report.observed_generation() == 2);
    }
  }
}

TEST_CASE_METHOD(SentinelKubePluginTest, "standby is paused at zero replicas",
                 "[sentinel-kube-plugin]") {
  REQUIRE_THAT(load(), IsOk());
  REQUIRE_THAT(plugin_->apply(sentinelChange("s1", "v1", 2, 1)), IsOk());
  REQUIRE_THAT(api_.makePodsReady(kNs, "sentinel-s1"), IsOk());
  REQUIRE(
      eventually([&] { return latest("s1")->health() == cluster::v1::SENTINEL_HEALTH_HEALTHY; }));
  REQUIRE_THAT(plugin_->apply(sentinelChange("s1", "v1", 2, 2, "e1",
                                             cluster::v1::SENTINEL_DESIRED_STATE_STANDBY)),
               IsOk());
  CHECK((*object("apps/v1", "Deployment", "sentinel-s1"))["spec"]["replicas"] == 0);
  REQUIRE_THAT(api_.makePodsReady(kNs, "sentinel-s1"), IsOk());
  REQUIRE(eventually([&] {
    auto r = latest("s1");
    return r->health() == cluster::v1::SENTINEL_HEALTH_PAUSED && r->available_replicas() == 0;
  }));
  INFO("standby keeps the objects");
  CHECK(hasSentinel("s1"));
}

TEST_CASE_METHOD(SentinelKubePluginTest,
                 "crash loops and image pull failures are unhealthy and keep the old image",
                 "[sentinel-kube-plugin]") {
  REQUIRE_THAT(load(), IsOk());
  REQUIRE_THAT(plugin_->apply(sentinelChange("s1", "v1", 1, 1)), IsOk());
  REQUIRE_THAT(api_.makePodsReady(kNs, "sentinel-s1"), IsOk());
  REQUIRE(
      eventually([&] { return latest("s1")->running_image() == "registry.example/sentinel:v1"; }));

  REQUIRE_THAT(plugin_->apply(sentinelChange("s1", "v2", 1, 2)), IsOk());
  REQUIRE_THAT(api_.makePodsCrashLoop(kNs, "sentinel-s1"), IsOk());
  REQUIRE(
      eventually([&] { return latest("s1")->health() == cluster::v1::SENTINEL_HEALTH_UNHEALTHY; }));
  auto r = *latest("s1");
  CHECK(r.available_replicas() == 0u);
  INFO("v2 never converged");
  CHECK(r.running_image() == "registry.example/sentinel:v1");

  REQUIRE_THAT(plugin_->apply(sentinelChange("s1", "v3", 1, 3)), IsOk());
  REQUIRE_THAT(api_.makePodsFailImagePull(kNs, "sentinel-s1"), IsOk());
  REQUIRE(eventually([&] {
    auto x = latest("s1");
    return x->applied_version() == 3u && x->observed_generation() == 3 &&
           x->health() == cluster::v1::SENTINEL_HEALTH_UNHEALTHY;
  }));
  CHECK(latest("s1")->running_image() == "registry.example/sentinel:v1");
}

TEST_CASE_METHOD(SentinelKubePluginTest,
                 "the gossip objects go with the last sentinel of the environment",
                 "[sentinel-kube-plugin]") {
  REQUIRE_THAT(load(), IsOk());
  REQUIRE_THAT(plugin_->apply(sentinelChange("s1", "v1", 1, 1)), IsOk());
  REQUIRE_THAT(plugin_->apply(sentinelChange("s2", "v1", 1, 2)), IsOk());
  REQUIRE_THAT(plugin_->apply(sentinelChange("s3", "v1", 1, 3, "e2")), IsOk());
  REQUIRE_THAT(plugin_->remove(deletion("s1", 4)), IsOk());
  CHECK(noSentinel("s1"));
  CHECK(hasSentinel("s2"));
  INFO("s2 still gossips in e1");
  CHECK(hasGossip("e1"));
  auto r = *latest("s1");
  CHECK(r.health() == cluster::v1::SENTINEL_HEALTH_PAUSED);
  CHECK(r.applied_version() == 4u);
  CHECK(r.region() == "eu-west-1");

  // Archived is removed, as deleted; e1's last sentinel takes the gossip objects with it.
  REQUIRE_THAT(plugin_->apply(sentinelChange("s2", "v1", 1, 5, "e1",
                                             cluster::v1::SENTINEL_DESIRED_STATE_ARCHIVED)),
               IsOk());
  CHECK(noSentinel("s2"));
  CHECK(noGossip("e1"));
  CHECK(hasGossip("e2"));
  CHECK(latest("s2")->health() == cluster::v1::SENTINEL_HEALTH_PAUSED);

  // After a restart (nothing remembered) a delete still finds the environment.
  REQUIRE_THAT(load(), IsOk());
  REQUIRE_THAT(plugin_->remove(deletion("s3", 6)), IsOk());
  CHECK(noSentinel("s3"));
  CHECK(noGossip("e2"));
  // And deleting what is gone is fine.
  CHECK_THAT(plugin_->remove(deletion("s3", 7)), IsOk());
}

TEST_CASE_METHOD(SentinelKubePluginTest,
                 "after a sync unlisted sentinels and empty environments are deleted",
                 "[sentinel-kube-plugin]") {
  REQUIRE_THAT(load(), IsOk());
  REQUIRE_THAT(plugin_->apply(sentinelChange("keep", "v1", 1, 1)), IsOk());
  REQUIRE_THAT(plugin_->apply(sentinelChange("gone", "v1", 1, 2)), IsOk());
  REQUIRE_THAT(plugin_->apply(sentinelChange("other", "v1", 1, 3, "e2")), IsOk());
  // Not the plugin's: a deployment's Service that happens to live here.
  api_.put({{"apiVersion", "v1"},
            {"kind", "Service"},
            {"metadata",
             {{"name", "foreign"},
              {"namespace", kNs},
              {"labels",
               {{"app.kubernetes.io/managed-by", "krane"},
                {"app.kubernetes.io/component", "deployment"},
                {"krane.dev/environment.id", "e2"}}}}},
            {"spec", {{"ports", json::array({{{"port", 80}}})}}}});
  // Another region's agent shares this cluster: its sentinel (of environment e3) stays, and so
  // does e3's gossip, which its sentinel still needs.
  auto elsewhere = sentinelChange("elsewhere", "v1", 1, 4, "e3");
  elsewhere.mutable_resource()->set_region("us-east-1");
  elsewhere.mutable_resource()->mutable_sentinel()->set_region("us-east-1");
  REQUIRE_THAT(plugin_->apply(elsewhere), IsOk());

  plugin::v1::SyncEnd end;
  end.set_snapshot_version(11);
  end.set_region("eu-west-1");
  auto* ids = end.add_resources();
  ids->set_resource_type("sentinel");
  ids->add_ids("keep");
  REQUIRE_THAT(plugin_->syncEnd(end), IsOk());
  CHECK(hasSentinel("keep"));
  CHECK(hasGossip("e1"));
  CHECK(noSentinel("gone"));
  CHECK(noSentinel("other"));
  CHECK(noGossip("e2"));
  CHECK(object("v1", "Service", "foreign"));
  INFO("another region's sentinel in the same cluster stays");
  CHECK(hasSentinel("elsewhere"));
  CHECK(hasGossip("e3"));
  CHECK(latest("gone")->health() == cluster::v1::SENTINEL_HEALTH_PAUSED);
  CHECK(latest("gone")->applied_version() == 11u);
  CHECK(latest("other")->applied_version() == 11u);
}

TEST_CASE_METHOD(SentinelKubePluginTest, "a new plugin instance reports the deployments it finds",
                 "[sentinel-kube-plugin]") {
  REQUIRE_THAT(load(), IsOk());
  REQUIRE_THAT(plugin_->apply(sentinelChange("s1", "v1", 2, 7)), IsOk());
  REQUIRE_THAT(api_.makePodsReady(kNs, "sentinel-s1"), IsOk());
  const auto d = *object("apps/v1", "Deployment", "sentinel-s1");
  INFO("the version is recorded on the Deployment, not on its pods (which it would restart)");
  CHECK(d["metadata"].value("annotations", json::object()).value("krane.dev/applied-version", "") ==
        "7");
  CHECK_FALSE(d["spec"]["template"]["metadata"].contains("annotations"));
  {
    std::lock_guard lock(mutex_);
    reports_.clear();
  }
  REQUIRE_THAT(load(), IsOk());
  INFO("the control plane drops reports older than the ones it stored: a new plugin instance");
  INFO("goes on from the applied version and region, not from 0");
  REQUIRE(eventually([&] {
    auto r = latest("s1");
    return r && r->health() == cluster::v1::SENTINEL_HEALTH_HEALTHY &&
           r->running_image() == "registry.example/sentinel:v1" && r->available_replicas() == 2 &&
           r->applied_version() == 7u && r->region() == "eu-west-1";
  }));
}

TEST_CASE_METHOD(SentinelKubePluginTest,
                 "the pods get the configured node class, separate probes and Secret references",
                 "[sentinel-kube-plugin]") {
  REQUIRE_THAT(load(json{{"runtime", "kubernetes"},
                         {"kubernetes",
                          {{"kubeconfig", kubeconfig_},
                           {"node_selector", {{"node-class", "sentinel-edge"}}},
                           {"tolerations", json::array({{{"key", "node-class"},
                                                         {"operator", "Equal"},
                                                         {"value", "sentinel-edge"},
                                                         {"effect", "NoSchedule"}}})},
                           {"secret_env", json::array({{{"name", "DATABASE_URL"},
                                                        {"secret", "sentinel-database"},
                                                        {"key", "url"}}})},
                           {"env_from_secrets", json::array({"sentinel-clickhouse"})}}}}
                        .dump()),
               IsOk());
  auto change = sentinelChange("s1", "v1", 2, 3);
  change.mutable_resource()
      ->mutable_sentinel()
      ->mutable_healthcheck()
      ->mutable_readiness()
      ->set_path("/_krane/ready");
  REQUIRE_THAT(plugin_->apply(change), IsOk());
  const auto d = *object("apps/v1", "Deployment", "sentinel-s1");
  const json& pod = d["spec"]["template"]["spec"];
  CHECK(pod["nodeSelector"] == json({{"node-class", "sentinel-edge"}}));
  CHECK(pod["tolerations"][0]["value"] == "sentinel-edge");
  const json& c = pod["containers"][0];
  CHECK(c["livenessProbe"]["httpGet"]["path"] == "/healthz/live");
  CHECK(c["readinessProbe"]["httpGet"]["path"] == "/_krane/ready");
  CHECK(c["envFrom"][0]["secretRef"]["name"] == "sentinel-clickhouse");
  bool referenced = false;
  for (const auto& e : c["env"]) {
    if (e["name"] != "DATABASE_URL") continue;
    referenced =
        e["valueFrom"]["secretKeyRef"] == json({{"name", "sentinel-database"}, {"key", "url"}});
    CHECK_FALSE(e.contains("value"));
  }
  CHECK(referenced);

  // The defaults: the sentinel node class and its NoSchedule taint.
  REQUIRE_THAT(load(), IsOk());
  REQUIRE_THAT(plugin_->apply(sentinelChange("s2", "v1", 1, 4)), IsOk());
  const auto d2 = *object("apps/v1", "Deployment", "sentinel-s2");
  CHECK(d2["spec"]["template"]["spec"]["nodeSelector"] == json({{"node-class", "sentinel"}}));
  CHECK(d2["spec"]["template"]["spec"]["tolerations"][0]["effect"] == "NoSchedule");

  CHECK_THAT(
      std::string(
          toStd(load(json{{"runtime", "kubernetes"},
                          {"kubernetes",
                           {{"kubeconfig", kubeconfig_},
                            {"secret_env", json::array({{{"name", "DB"}, {"value", "hunter2"}}})}}}}
                         .dump())
                    .message())),
      Catch::Contains("sentinel plugin config: kubernetes.secret_env[0].value: unknown key"));
}

TEST_CASE_METHOD(SentinelKubePluginTest,
                 "the routes ConfigMap follows the live deployment once it is ready",
                 "[sentinel-kube-plugin]") {
  REQUIRE_THAT(load(), IsOk());
  putDeployment("dep_a");
  auto change = sentinelChange("s1", "v1", 1, 1);
  change.mutable_resource()->mutable_sentinel()->set_live_deployment_id("dep_a");
  REQUIRE_THAT(plugin_->apply(change), IsOk());
  // The proxy follows the ConfigMap with the pod's service account.
  const json pod = (*object("apps/v1", "Deployment", "sentinel-s1"))["spec"]["template"]["spec"];
  CHECK(pod["serviceAccountName"] == "krane-sentinel");
  bool env_set = false;
  for (const auto& e : pod["containers"][0]["env"]) {
    if (e["name"] == "KRANE_ROUTES_CONFIGMAP") {
      env_set = e["value"] == "sentinel/sentinel-routes-s1";
    }
  }
  CHECK(env_set);

  INFO("the live deployment has no ready pod yet: named, with no endpoint");
  REQUIRE(routesAre("s1", "dep_a"));
  REQUIRE_THAT(api_.makePodsReady(workspaceNs(), deployment::objectName("dep_a")), IsOk());
  REQUIRE(routesAre("s1", "dep_a " + serviceOf("dep_a")));
  const auto d_version =
      (*object("apps/v1", "Deployment", "sentinel-s1"))["metadata"]["generation"];

  INFO("promote: the routes keep the old deployment until the new one is ready");
  putDeployment("dep_b", 9090);
  change = sentinelChange("s1", "v1", 1, 2);
  change.mutable_resource()->mutable_sentinel()->set_live_deployment_id("dep_b");
  REQUIRE_THAT(plugin_->apply(change), IsOk());
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  CHECK(routesOf("s1") == "dep_a " + serviceOf("dep_a"));
  REQUIRE_THAT(api_.makePodsReady(workspaceNs(), deployment::objectName("dep_b")), IsOk());
  REQUIRE(routesAre("s1", "dep_b " + serviceOf("dep_b", 9090)));
  // A new live deployment is not a new pod spec: the proxies are not restarted.
  CHECK((*object("apps/v1", "Deployment", "sentinel-s1"))["metadata"]["generation"] == d_version);

  INFO("a rolling deploy: both deployments' Services");
  putDeployment("dep_c");
  REQUIRE_THAT(api_.makePodsReady(workspaceNs(), deployment::objectName("dep_c")), IsOk());
  change = sentinelChange("s1", "v1", 1, 3);
  change.mutable_resource()->mutable_sentinel()->set_live_deployment_id("dep_b");
  change.mutable_resource()->mutable_sentinel()->set_rolling_deployment_id("dep_c");
  REQUIRE_THAT(plugin_->apply(change), IsOk());
  REQUIRE(routesAre("s1", "dep_b " + serviceOf("dep_b", 9090) + " " + serviceOf("dep_c")));

  INFO("a new plugin instance in the middle of a switch starts from the ConfigMap it finds");
  REQUIRE_THAT(load(), IsOk());
  putDeployment("dep_d");
  change = sentinelChange("s1", "v1", 1, 4);
  change.mutable_resource()->mutable_sentinel()->set_live_deployment_id("dep_d");
  REQUIRE_THAT(plugin_->apply(change), IsOk());
  REQUIRE(routesAre("s1", "dep_b " + serviceOf("dep_b", 9090)));
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  CHECK(routesOf("s1") == "dep_b " + serviceOf("dep_b", 9090));

  INFO("once ready, the new live deployment takes over");
  REQUIRE_THAT(api_.makePodsReady(workspaceNs(), deployment::objectName("dep_d")), IsOk());
  REQUIRE(routesAre("s1", "dep_d " + serviceOf("dep_d")));

  INFO("the sentinel's removal takes its ConfigMap");
  REQUIRE_THAT(plugin_->remove(deletion("s1", 5)), IsOk());
  CHECK(noSentinel("s1"));
}

TEST_CASE_METHOD(SentinelKubePluginTest,
                 "a routes ConfigMap the API server refused is applied at a later round",
                 "[sentinel-kube-plugin]") {
  REQUIRE_THAT(load(), IsOk());
  putDeployment("dep_a");
  auto change = sentinelChange("s1", "v1", 1, 1);
  change.mutable_resource()->mutable_sentinel()->set_live_deployment_id("dep_a");
  REQUIRE_THAT(plugin_->apply(change), IsOk());
  REQUIRE(routesAre("s1", "dep_a"));
  // The next write (the ConfigMap naming dep_a's Service) is refused, and not retried by the
  // client (403); nothing else changes in the cluster afterwards.
  api_.failNext(1, 403, -1, "PATCH");
  REQUIRE_THAT(api_.makePodsReady(workspaceNs(), deployment::objectName("dep_a")), IsOk());
  REQUIRE(routesAre("s1", "dep_a " + serviceOf("dep_a")));
  CHECK(api_.countRequests("PATCH", "/configmaps/sentinel-routes-s1") >= 3);
}

TEST_CASE_METHOD(SentinelKubePluginTest, "errors name the field", "[sentinel-kube-plugin]") {
  CHECK_THAT(std::string(toStd(load(R"({"runtime": "kubernetes", "kubernetes": {
        "in_cluster": true, "kubeconfig": "/k"}})")
                                   .message())),
             Catch::Contains("sentinel plugin config: kubernetes: set exactly one of"));
  CHECK_THAT(std::string(toStd(
                 load(json{{"runtime", "kubernetes"},
                           {"kubernetes", {{"kubeconfig", kubeconfig_}, {"namespace_prefix", "x"}}}}
                          .dump())
                     .message())),
             Catch::Contains("kubernetes.namespace_prefix: unknown key"));
  REQUIRE_THAT(load(), IsOk());
  auto bad = sentinelChange("s1", "v1", 1, 1);
  bad.mutable_resource()->mutable_sentinel()->clear_image();
  auto st = plugin_->apply(bad);
  CHECK(st.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(toStd(st.message())),
             Catch::Contains("sentinel s1: sentinel.image: required"));
  CHECK(noSentinel("s1"));
  // The API server refusing an object is final, with its message.
  api_.failNext(1, 422, -1, "PATCH");
  st = plugin_->apply(sentinelChange("s1", "v1", 1, 1));
  CHECK(st.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(toStd(st.message())),
             Catch::Contains("sentinel s1: environment e1: Service"));
}

}  // namespace
}  // namespace krane
