// The sentinel's Kubernetes objects: exactly the five of the specification, with every setting
// it names, Krane's labels, separate liveness and readiness endpoints, and valid names.
#include <regex>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/strings.h"
#include "plugins/sentinel/sentinel.h"

namespace krane::sentinel {
namespace {

using nlohmann::json;

cluster::v1::Sentinel sentinel() {
  cluster::v1::Sentinel s;
  s.set_sentinel_id("snt_01HXYZ");
  s.set_workspace_id("ws_1");
  s.set_project_id("proj_1");
  s.set_app_id("app_1");
  s.set_environment_id("env_prod");
  s.set_region("eu-west-1");
  s.set_image("ghcr.io/krane/sentinel:1.4.2");
  s.set_replicas(3);
  s.set_cpu_millicores(500);
  s.set_memory_mib(256);
  s.set_desired_state(cluster::v1::SENTINEL_DESIRED_STATE_RUNNING);
  s.set_config_json(R"({"cache": {"ttl_s": 30}})");
  return s;
}

const json& find(const std::vector<json>& objects, const std::string& kind) {
  for (const auto& o : objects) {
    if (o["kind"] == kind) return o;
  }
  static const json none;
  ADD_FAILURE() << "no " << kind;
  return none;
}

TEST(SentinelObjects, ExactlyFiveObjectsInTheSentinelNamespace) {
  const auto mine = sentinelObjects(sentinel());
  const auto shared = environmentObjects(sentinel());
  std::vector<std::string> kinds;
  kinds.reserve(mine.size() + shared.size());
  for (const auto& o : mine) kinds.push_back(o["kind"]);
  for (const auto& o : shared) kinds.push_back(o["kind"]);
  EXPECT_THAT(kinds, ::testing::ElementsAre("Deployment", "Service", "PodDisruptionBudget",
                                            "Service", "CiliumNetworkPolicy"));
  const std::regex dns_label("[a-z]([-a-z0-9]{0,61}[a-z0-9])?");
  for (const auto* group : {&mine, &shared}) {
    for (const auto& o : *group) {
      EXPECT_EQ(o["metadata"]["namespace"], "sentinel");
      const std::string name = o["metadata"]["name"];
      EXPECT_TRUE(std::regex_match(name, dns_label)) << name;
      const json& labels = o["metadata"]["labels"];
      EXPECT_EQ(labels["app.kubernetes.io/managed-by"], "krane");
      EXPECT_EQ(labels["app.kubernetes.io/component"], "sentinel");
      EXPECT_EQ(labels["krane.dev/workspace.id"], "ws_1");
      EXPECT_EQ(labels["krane.dev/project.id"], "proj_1");
      EXPECT_EQ(labels["krane.dev/app.id"], "app_1");
      EXPECT_EQ(labels["krane.dev/environment.id"], "env_prod");
    }
  }
  for (const auto& o : mine) {
    EXPECT_EQ(o["metadata"]["labels"]["krane.dev/sentinel.id"], "snt_01HXYZ");
  }
  for (const auto& o : shared) {
    EXPECT_FALSE(o["metadata"]["labels"].contains("krane.dev/sentinel.id"));
  }
}

TEST(SentinelObjects, TheDeploymentHasEverySettingOfTheSpecification) {
  const json d = find(sentinelObjects(sentinel()), "Deployment");
  const json& spec = d["spec"];
  EXPECT_EQ(spec["replicas"], 3);
  EXPECT_EQ(spec["strategy"]["type"], "RollingUpdate");
  EXPECT_EQ(spec["strategy"]["rollingUpdate"]["maxUnavailable"], 0);
  EXPECT_EQ(spec["strategy"]["rollingUpdate"]["maxSurge"], 1);
  EXPECT_EQ(spec["minReadySeconds"], 5);
  const json& pod = spec["template"]["spec"];
  const json& spread = pod["topologySpreadConstraints"][0];
  EXPECT_EQ(spread["maxSkew"], 1);
  EXPECT_EQ(spread["topologyKey"], "topology.kubernetes.io/zone");
  EXPECT_EQ(spread["whenUnsatisfiable"], "ScheduleAnyway");
  EXPECT_EQ(pod["tolerations"][0], json({{"key", "node-class"},
                                         {"operator", "Equal"},
                                         {"value", "sentinel"},
                                         {"effect", "NoSchedule"}}));
  const json& c = pod["containers"][0];
  EXPECT_EQ(c["image"], "ghcr.io/krane/sentinel:1.4.2");
  std::vector<std::string> ports;
  for (const auto& p : c["ports"]) {
    ports.push_back(strCat(p["containerPort"].get<int>(), "/", p["protocol"].get<std::string>()));
  }
  EXPECT_THAT(ports, ::testing::ElementsAre("8040/TCP", "7946/TCP", "7946/UDP"));
  // Separate endpoints: liveness only says the process is alive, readiness that it can serve.
  EXPECT_EQ(c["livenessProbe"]["httpGet"]["path"], "/healthz/live");
  EXPECT_EQ(c["readinessProbe"]["httpGet"]["path"], "/healthz/ready");
  EXPECT_EQ(c["readinessProbe"]["failureThreshold"], 2);
  EXPECT_EQ(c["resources"]["requests"]["cpu"], "500m");
  EXPECT_EQ(c["resources"]["limits"]["memory"], "256Mi");
  bool config = false;
  for (const auto& e : c["env"]) {
    config |= e["name"] == "KRANE_SENTINEL_CONFIG" && e["value"] == sentinel().config_json();
  }
  EXPECT_TRUE(config) << "the sentinel's configuration is passed unchanged";
  // The selector matches the pod template's labels.
  for (const auto& [k, v] : spec["selector"]["matchLabels"].items()) {
    EXPECT_EQ(spec["template"]["metadata"]["labels"][k], v) << k;
  }
}

TEST(SentinelObjects, ServiceBudgetAndGossipObjects) {
  const auto mine = sentinelObjects(sentinel());
  const json svc = find(mine, "Service");
  EXPECT_EQ(svc["spec"]["type"], "ClusterIP");
  EXPECT_EQ(svc["spec"]["ports"][0]["port"], 8040);
  EXPECT_EQ(find(mine, "PodDisruptionBudget")["spec"]["minAvailable"], 1);
  const auto shared = environmentObjects(sentinel());
  const json headless = find(shared, "Service");
  EXPECT_EQ(headless["spec"]["clusterIP"], "None");
  EXPECT_EQ(headless["spec"]["ports"].size(), 2u);
  EXPECT_EQ(headless["spec"]["ports"][0]["port"], 7946);
  const json policy = find(shared, "CiliumNetworkPolicy");
  EXPECT_EQ(policy["apiVersion"], "cilium.io/v2");
  EXPECT_EQ(policy["spec"]["endpointSelector"]["matchLabels"]["krane.dev/environment.id"],
            "env_prod");
  EXPECT_EQ(policy["spec"]["ingress"][0]["toPorts"][0]["ports"][1]["protocol"], "UDP");
  // Another sentinel of the same environment shares the environment's objects.
  auto other = sentinel();
  other.set_sentinel_id("snt_other");
  EXPECT_EQ(environmentObjects(other), shared);
  EXPECT_NE(sentinelObjects(other)[0]["metadata"]["name"], mine[0]["metadata"]["name"]);
}

TEST(SentinelObjects, StandbyScalesToZero) {
  auto s = sentinel();
  s.set_desired_state(cluster::v1::SENTINEL_DESIRED_STATE_STANDBY);
  EXPECT_EQ(find(sentinelObjects(s), "Deployment")["spec"]["replicas"], 0);
  EXPECT_EQ(toWorkload(s, s.sentinel_id()).replicas, 0);
}

TEST(SentinelObjects, NamesAreValidAndDistinctForAnyId) {
  EXPECT_EQ(objectName("sentinel", "abc"), "sentinel-abc");
  EXPECT_NE(objectName("sentinel", "a_b"), objectName("sentinel", "a-b"));
  const std::string long_name = objectName("sentinel", std::string(100, 'x'));
  EXPECT_LE(long_name.size(), 63u);
  EXPECT_NE(long_name, objectName("sentinel", std::string(101, 'x')));
}

TEST(SentinelObjects, BadSentinelsAreRefusedNamingTheField) {
  auto s = sentinel();
  s.clear_environment_id();
  EXPECT_THAT(std::string(toStd(validate(s).message())),
              ::testing::HasSubstr("sentinel.environment_id: required"));
  s = sentinel();
  s.set_app_id("-bad-");
  EXPECT_THAT(std::string(toStd(validate(s).message())),
              ::testing::HasSubstr("sentinel.app_id: \"-bad-\""));
  s = sentinel();
  s.set_config_json("{nope");
  EXPECT_THAT(std::string(toStd(validate(s).message())),
              ::testing::HasSubstr("sentinel.config_json"));
  EXPECT_TRUE(validate(sentinel()).ok());
}

TEST(SentinelStatus, ARolloutConvergesOnlyWhenEveryPodIsCurrentAndAvailable) {
  json d = sentinelObjects(sentinel())[0];
  d["metadata"]["generation"] = 4;
  d["status"] = {{"observedGeneration", 4},
                 {"replicas", 3},
                 {"updatedReplicas", 3},
                 {"readyReplicas", 3},
                 {"availableReplicas", 3}};
  Observed o = observeDeployment(d);
  EXPECT_TRUE(o.converged);
  EXPECT_EQ(o.image, "ghcr.io/krane/sentinel:1.4.2");
  EXPECT_EQ(o.observed_generation, 4);
  auto r = sentinelReport(o, "snt_01HXYZ", o.image, 9);
  EXPECT_EQ(r.health(), cluster::v1::SENTINEL_HEALTH_HEALTHY);
  EXPECT_EQ(r.available_replicas(), 3u);
  EXPECT_EQ(r.applied_version(), 9u);

  d["status"]["replicas"] = 4;  // an old pod is still there (surge)
  EXPECT_FALSE(observeDeployment(d).converged);
  d["status"]["replicas"] = 3;
  d["status"]["observedGeneration"] = 3;  // the controller has not seen the new spec
  EXPECT_FALSE(observeDeployment(d).converged);
  d["status"] = {{"observedGeneration", 4},
                 {"replicas", 3},
                 {"updatedReplicas", 3},
                 {"readyReplicas", 3}};  // ready, not yet for minReadySeconds
  o = observeDeployment(d);
  EXPECT_FALSE(o.converged);
  EXPECT_EQ(sentinelReport(o, "s", "", 1).health(), cluster::v1::SENTINEL_HEALTH_UNHEALTHY);

  d["spec"]["replicas"] = 0;
  d["status"] = {{"observedGeneration", 4}};  // zero counts are omitted
  o = observeDeployment(d);
  EXPECT_TRUE(o.converged);
  EXPECT_EQ(sentinelReport(o, "s", "", 1).health(), cluster::v1::SENTINEL_HEALTH_PAUSED);
}

}  // namespace
}  // namespace krane::sentinel
