// The sentinel's Kubernetes objects: exactly the five of the specification, with every setting
// it names, Krane's labels, separate liveness and readiness endpoints on the proxy's health port,
// a grace period that covers its drain, and valid names.
#include <regex>

#include <catch2/catch.hpp>

#include "common/strings.h"
#include "plugins/sentinel/proxy/proxy.h"
#include "plugins/sentinel/sentinel.h"
#include "tests/support/matchers.h"

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
  FAIL_CHECK("no " << kind);
  return none;
}

TEST_CASE("exactly five objects in the sentinel namespace", "[sentinel-objects]") {
  const auto mine = sentinelObjects(sentinel());
  const auto shared = environmentObjects(sentinel());
  std::vector<std::string> kinds;
  kinds.reserve(mine.size() + shared.size());
  for (const auto& o : mine) kinds.push_back(o["kind"]);
  for (const auto& o : shared) kinds.push_back(o["kind"]);
  CHECK(kinds == std::vector<std::string>{"Deployment", "Service", "PodDisruptionBudget", "Service",
                                          "CiliumNetworkPolicy"});
  const std::regex dns_label("[a-z]([-a-z0-9]{0,61}[a-z0-9])?");
  for (const auto* group : {&mine, &shared}) {
    for (const auto& o : *group) {
      CHECK(o["metadata"]["namespace"] == "sentinel");
      const std::string name = o["metadata"]["name"];
      INFO(name);
      CHECK(std::regex_match(name, dns_label));
      const json& labels = o["metadata"]["labels"];
      CHECK(labels["app.kubernetes.io/managed-by"] == "krane");
      CHECK(labels["app.kubernetes.io/component"] == "sentinel");
      CHECK(labels["krane.dev/workspace.id"] == "ws_1");
      CHECK(labels["krane.dev/project.id"] == "proj_1");
      CHECK(labels["krane.dev/app.id"] == "app_1");
      CHECK(labels["krane.dev/environment.id"] == "env_prod");
    }
  }
  for (const auto& o : mine) {
    CHECK(o["metadata"]["labels"]["krane.dev/sentinel.id"] == "snt_01HXYZ");
  }
  for (const auto& o : shared) {
    CHECK_FALSE(o["metadata"]["labels"].contains("krane.dev/sentinel.id"));
  }
}

TEST_CASE("the deployment has every setting of the specification", "[sentinel-objects]") {
  const json d = find(sentinelObjects(sentinel()), "Deployment");
  const json& spec = d["spec"];
  CHECK(spec["replicas"] == 3);
  CHECK(spec["strategy"]["type"] == "RollingUpdate");
  CHECK(spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0);
  CHECK(spec["strategy"]["rollingUpdate"]["maxSurge"] == 1);
  CHECK(spec["minReadySeconds"] == 5);
  const json& pod = spec["template"]["spec"];
  const json& spread = pod["topologySpreadConstraints"][0];
  CHECK(spread["maxSkew"] == 1);
  CHECK(spread["topologyKey"] == "topology.kubernetes.io/zone");
  CHECK(spread["whenUnsatisfiable"] == "ScheduleAnyway");
  CHECK(pod["tolerations"][0] == json({{"key", "node-class"},
                                       {"operator", "Equal"},
                                       {"value", "sentinel"},
                                       {"effect", "NoSchedule"}}));
  const json& c = pod["containers"][0];
  CHECK(c["image"] == "ghcr.io/krane/sentinel:1.4.2");
  std::vector<std::string> ports;
  for (const auto& p : c["ports"]) {
    ports.push_back(strCat(p["containerPort"].get<int>(), "/", p["protocol"].get<std::string>()));
  }
  CHECK(ports == std::vector<std::string>{"8040/TCP", "8041/TCP", "7946/TCP", "7946/UDP"});
  // Separate endpoints: liveness only says the process is alive, readiness that it can serve.
  CHECK(c["livenessProbe"]["httpGet"]["path"] == "/healthz/live");
  CHECK(c["readinessProbe"]["httpGet"]["path"] == "/healthz/ready");
  CHECK(c["readinessProbe"]["failureThreshold"] == 2);
  CHECK(c["resources"]["requests"]["cpu"] == "500m");
  CHECK(c["resources"]["limits"]["memory"] == "256Mi");
  bool config = false;
  for (const auto& e : c["env"]) {
    config |= e["name"] == "KRANE_SENTINEL_CONFIG" && e["value"] == sentinel().config_json();
  }
  INFO("the sentinel's configuration is passed unchanged");
  CHECK(config);
  // The selector matches the pod template's labels.
  for (const auto& [k, v] : spec["selector"]["matchLabels"].items()) {
    INFO(k);
    CHECK(spec["template"]["metadata"]["labels"][k] == v);
  }
}

// The value of env var `name` in a container, or nullptr.
const json* envOf(const json& container, const std::string& name) {
  for (const auto& e : container["env"]) {
    if (e["name"] == name) return &e;
  }
  return nullptr;
}

TEST_CASE("sentinels run only on the sentinel node class by default", "[sentinel-objects]") {
  const json pod = find(sentinelObjects(sentinel()), "Deployment")["spec"]["template"]["spec"];
  CHECK(pod["nodeSelector"] == json({{"node-class", "sentinel"}}));
  CHECK(pod["tolerations"] == json::array({{{"key", "node-class"},
                                            {"operator", "Equal"},
                                            {"value", "sentinel"},
                                            {"effect", "NoSchedule"}}}));
}

TEST_CASE("node selector, tolerations and credentials come from the plugin configuration",
          "[sentinel-objects]") {
  auto pod = podOptionsFromJson(json::parse(R"({
      "node_selector": {"pool": "edge"},
      "tolerations": [{"key": "pool", "operator": "Exists", "effect": "NoSchedule"}],
      "secret_env": [{"name": "DATABASE_URL", "secret": "sentinel-db", "key": "url"}],
      "env_from_secrets": ["sentinel-redis"]})"),
                                "kubernetes");
  REQUIRE_THAT(pod, IsOk());
  const json d = find(sentinelObjects(sentinel(), *pod), "Deployment");
  const json& spec = d["spec"]["template"]["spec"];
  CHECK(spec["nodeSelector"] == json({{"pool", "edge"}}));
  CHECK(spec["tolerations"] ==
        json::array({{{"key", "pool"}, {"operator", "Exists"}, {"effect", "NoSchedule"}}}));
  const json& c = spec["containers"][0];
  const json* db = envOf(c, "DATABASE_URL");
  REQUIRE(db != nullptr);
  INFO("a credential is a reference to a Secret, never a value");
  CHECK_FALSE(db->contains("value"));
  CHECK((*db)["valueFrom"] == json({{"secretKeyRef", {{"name", "sentinel-db"}, {"key", "url"}}}}));
  CHECK(c["envFrom"] == json::array({{{"secretRef", {{"name", "sentinel-redis"}}}}}));

  // Both can be turned off.
  auto anywhere =
      podOptionsFromJson(json::parse(R"({"node_selector": {}, "tolerations": []})"), "kubernetes");
  REQUIRE_THAT(anywhere, IsOk());
  const json open = find(sentinelObjects(sentinel(), *anywhere), "Deployment");
  CHECK_FALSE(open["spec"]["template"]["spec"].contains("nodeSelector"));
  CHECK_FALSE(open["spec"]["template"]["spec"].contains("tolerations"));
  CHECK_FALSE(open["spec"]["template"]["spec"]["containers"][0].contains("envFrom"));
}

TEST_CASE("bad pod options are refused naming the key", "[sentinel-objects]") {
  const auto refused = [](const char* text) {
    auto pod = podOptionsFromJson(json::parse(text), "kubernetes");
    return pod.ok() ? std::string("accepted") : std::string(toStd(pod.status().message()));
  };
  CHECK_THAT(refused(R"({"node_selector": ["node-class"]})"),
             Catch::Contains("kubernetes.node_selector: must be a mapping"));
  CHECK_THAT(refused(R"({"node_selector": {"node-class": "not a value"}})"),
             Catch::Contains("kubernetes.node_selector.node-class: must be a label value"));
  CHECK_THAT(refused(R"({"tolerations": [{"key": "a", "operator": "In"}]})"),
             Catch::Contains("kubernetes.tolerations[0].operator: Equal or Exists"));
  CHECK_THAT(refused(R"({"tolerations": [{"key": "a", "effect": "Never"}]})"),
             Catch::Contains("kubernetes.tolerations[0].effect"));
  CHECK_THAT(refused(R"({"tolerations": [{"key": "a", "valu": "b"}]})"),
             Catch::Contains("kubernetes.tolerations[0].valu: unknown key"));
  CHECK_THAT(refused(R"({"secret_env": [{"name": "DB", "secret": "db"}]})"),
             Catch::Contains("kubernetes.secret_env[0].key: required"));
  CHECK_THAT(refused(R"({"secret_env": [{"name": "DB", "secret": "DB_Secret", "key": "k"}]})"),
             Catch::Contains("kubernetes.secret_env[0].secret: not a Secret name"));
  CHECK_THAT(refused(R"({"secret_env": [{"name": "DB", "value": "hunter2"}]})"),
             Catch::Contains("kubernetes.secret_env[0].value: unknown key"));
  CHECK_THAT(refused(R"({"env_from_secrets": [""]})"),
             Catch::Contains("kubernetes.env_from_secrets[0]: not a Secret name"));
}

TEST_CASE("probes come from the resource with documented defaults", "[sentinel-objects]") {
  const json c0 =
      find(sentinelObjects(sentinel()), "Deployment")["spec"]["template"]["spec"]["containers"][0];
  CHECK(c0["livenessProbe"] == json({{"httpGet", {{"path", "/healthz/live"}, {"port", "health"}}},
                                     {"periodSeconds", 10},
                                     {"timeoutSeconds", 2},
                                     {"failureThreshold", 3},
                                     {"successThreshold", 1}}));
  CHECK(c0["readinessProbe"] == json({{"httpGet", {{"path", "/healthz/ready"}, {"port", "health"}}},
                                      {"periodSeconds", 5},
                                      {"timeoutSeconds", 2},
                                      {"failureThreshold", 2},
                                      {"successThreshold", 1}}));

  auto s = sentinel();
  s.mutable_healthcheck()->mutable_liveness()->set_path("/_live");
  s.mutable_healthcheck()->mutable_liveness()->set_initial_delay_seconds(7);
  s.mutable_healthcheck()->mutable_readiness()->set_path("/_ready");
  s.mutable_healthcheck()->mutable_readiness()->set_period_seconds(3);
  const json c =
      find(sentinelObjects(s), "Deployment")["spec"]["template"]["spec"]["containers"][0];
  CHECK(c["livenessProbe"]["httpGet"]["path"] == "/_live");
  CHECK(c["livenessProbe"]["initialDelaySeconds"] == 7);
  CHECK(c["readinessProbe"]["httpGet"]["path"] == "/_ready");
  CHECK(c["readinessProbe"]["periodSeconds"] == 3);
  INFO("the proxy serves the same paths");
  CHECK((*envOf(c, "KRANE_LIVENESS_PATH"))["value"] == "/_live");
  CHECK((*envOf(c, "KRANE_READINESS_PATH"))["value"] == "/_ready");
  const auto w = toWorkload(s, s.sentinel_id());
  CHECK(w.liveness.path == "/_live");
  CHECK(w.readiness.path == "/_ready");
  CHECK(w.readiness.interval == std::chrono::seconds(3));
  CHECK(w.env.at("KRANE_READINESS_PATH") == "/_ready");

  s.mutable_healthcheck()->mutable_readiness()->set_path("/_live");
  CHECK_THAT(
      std::string(toStd(validate(s).message())),
      Catch::Contains("sentinel.healthcheck.readiness.path: \"/_live\" is the liveness path"));
}

// Probes on a listener whose threads requests cannot take; and on SIGTERM, the proxy's drain and
// then its requests in flight before the kubelet kills it.
TEST_CASE("probes go to the health port, and the grace period covers the drain",
          "[sentinel-objects]") {
  const json pod = find(sentinelObjects(sentinel()), "Deployment")["spec"]["template"]["spec"];
  const json& c = pod["containers"][0];
  json health;
  for (const auto& p : c["ports"]) {
    if (p["name"] == "health") health = p;
  }
  CHECK(health == json({{"name", "health"}, {"containerPort", 8041}, {"protocol", "TCP"}}));
  CHECK(c["livenessProbe"]["httpGet"]["port"] == "health");
  CHECK(c["readinessProbe"]["httpGet"]["port"] == "health");
  const auto value = [&](const std::string& name) {
    const json* e = envOf(c, name);
    return e != nullptr ? (*e)["value"].get<std::string>() : std::string("(none)");
  };
  CHECK(value("KRANE_HEALTH_PORT") == "8041");
  CHECK(value("KRANE_DRAIN_SECONDS") == "5");
  const auto upstream =
      std::chrono::duration_cast<std::chrono::seconds>(ProxyOptions().upstream_timeout);
  // Kubernetes' default is 30 s.
  CHECK(pod.value("terminationGracePeriodSeconds", 30) > 5 + upstream.count());
  INFO("the Service sends traffic to the main port only");
  CHECK(find(sentinelObjects(sentinel()), "Service")["spec"]["ports"].size() == 1u);

  INFO("a probe port the resource names (the main port answers probes too) is kept");
  auto s = sentinel();
  s.mutable_healthcheck()->mutable_liveness()->set_port(8040);
  const json named =
      find(sentinelObjects(s), "Deployment")["spec"]["template"]["spec"]["containers"][0];
  CHECK(named["livenessProbe"]["httpGet"]["port"] == 8040);
  CHECK(named["readinessProbe"]["httpGet"]["port"] == "health");

  INFO(
      "the process runtime: probes on a health port of each instance's own, no drain (it"
      " withdraws the endpoint first)");
  const auto w = toWorkload(sentinel(), "snt_01HXYZ");
  CHECK(w.health_port_env == "KRANE_HEALTH_PORT");
  CHECK(w.env.count("KRANE_HEALTH_PORT") == 0u);  // the runtime sets it, per instance
  CHECK(w.env.at("KRANE_DRAIN_SECONDS") == "0");
  CHECK(w.grace > ProxyOptions().upstream_timeout);
}

TEST_CASE("service budget and gossip objects", "[sentinel-objects]") {
  const auto mine = sentinelObjects(sentinel());
  const json svc = find(mine, "Service");
  CHECK(svc["spec"]["type"] == "ClusterIP");
  CHECK(svc["spec"]["ports"][0]["port"] == 8040);
  CHECK(find(mine, "PodDisruptionBudget")["spec"]["minAvailable"] == 1);
  const auto shared = environmentObjects(sentinel());
  const json headless = find(shared, "Service");
  CHECK(headless["spec"]["clusterIP"] == "None");
  CHECK(headless["spec"]["ports"].size() == 2u);
  CHECK(headless["spec"]["ports"][0]["port"] == 7946);
  const json policy = find(shared, "CiliumNetworkPolicy");
  CHECK(policy["apiVersion"] == "cilium.io/v2");
  CHECK(policy["spec"]["endpointSelector"]["matchLabels"]["krane.dev/environment.id"] ==
        "env_prod");
  CHECK(policy["spec"]["ingress"][0]["toPorts"][0]["ports"][1]["protocol"] == "UDP");
  // Another sentinel of the same environment shares the environment's objects.
  auto other = sentinel();
  other.set_sentinel_id("snt_other");
  CHECK(environmentObjects(other) == shared);
  CHECK(sentinelObjects(other)[0]["metadata"]["name"] != mine[0]["metadata"]["name"]);
}

TEST_CASE("standby scales to zero", "[sentinel-objects]") {
  auto s = sentinel();
  s.set_desired_state(cluster::v1::SENTINEL_DESIRED_STATE_STANDBY);
  CHECK(find(sentinelObjects(s), "Deployment")["spec"]["replicas"] == 0);
  CHECK(toWorkload(s, s.sentinel_id()).replicas == 0);
}

TEST_CASE("names are valid and distinct for any id", "[sentinel-objects]") {
  CHECK(objectName("sentinel", "abc") == "sentinel-abc");
  CHECK(objectName("sentinel", "a_b") != objectName("sentinel", "a-b"));
  const std::string long_name = objectName("sentinel", std::string(100, 'x'));
  CHECK(long_name.size() <= 63u);
  CHECK(long_name != objectName("sentinel", std::string(101, 'x')));
}

TEST_CASE("bad sentinels are refused naming the field", "[sentinel-objects]") {
  auto s = sentinel();
  s.clear_environment_id();
  CHECK_THAT(std::string(toStd(validate(s).message())),
             Catch::Contains("sentinel.environment_id: required"));
  s = sentinel();
  s.set_app_id("-bad-");
  CHECK_THAT(std::string(toStd(validate(s).message())),
             Catch::Contains("sentinel.app_id: \"-bad-\""));
  s = sentinel();
  s.set_config_json("{nope");
  CHECK_THAT(std::string(toStd(validate(s).message())), Catch::Contains("sentinel.config_json"));
  CHECK_THAT(validate(sentinel()), IsOk());
}

TEST_CASE("a rollout converges only when every pod is current and available", "[sentinel-status]") {
  json d = sentinelObjects(sentinel())[0];
  d["metadata"]["generation"] = 4;
  d["status"] = {{"observedGeneration", 4},
                 {"replicas", 3},
                 {"updatedReplicas", 3},
                 {"readyReplicas", 3},
                 {"availableReplicas", 3}};
  Observed o = observeDeployment(d);
  CHECK(o.converged);
  CHECK(o.image == "ghcr.io/krane/sentinel:1.4.2");
  CHECK(o.observed_generation == 4);
  auto r = sentinelReport(o, "snt_01HXYZ", o.image, 9);
  CHECK(r.health() == cluster::v1::SENTINEL_HEALTH_HEALTHY);
  CHECK(r.available_replicas() == 3u);
  CHECK(r.applied_version() == 9u);

  d["status"]["replicas"] = 4;  // an old pod is still there (surge)
  CHECK_FALSE(observeDeployment(d).converged);
  d["status"]["replicas"] = 3;
  d["status"]["observedGeneration"] = 3;  // the controller has not seen the new spec
  CHECK_FALSE(observeDeployment(d).converged);
  d["status"] = {{"observedGeneration", 4},
                 {"replicas", 3},
                 {"updatedReplicas", 3},
                 {"readyReplicas", 3}};  // ready, not yet for minReadySeconds
  o = observeDeployment(d);
  CHECK_FALSE(o.converged);
  CHECK(sentinelReport(o, "s", "", 1).health() == cluster::v1::SENTINEL_HEALTH_UNHEALTHY);

  d["spec"]["replicas"] = 0;
  d["status"] = {{"observedGeneration", 4}};  // zero counts are omitted
  o = observeDeployment(d);
  CHECK(o.converged);
  CHECK(sentinelReport(o, "s", "", 1).health() == cluster::v1::SENTINEL_HEALTH_PAUSED);
}

}  // namespace
}  // namespace krane::sentinel
