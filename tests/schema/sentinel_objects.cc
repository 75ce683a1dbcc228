// The sentinel plugin's six objects for the variants that change them: running or standby (zero
// replicas), with and without resources and configuration, ids that need a hashed name, probes
// from the resource, and the pod options of the plugin's configuration (node selector and
// tolerations: default, custom, none; credentials as Secret references).
#include "common/strings.h"
#include "controlplane/services/deploy/environment_resources.h"
#include "plugins/sentinel/sentinel.h"
#include "tests/schema/generators.h"

namespace krane::schema {
namespace {

cluster::v1::Sentinel base() {
  cluster::v1::Sentinel s;
  s.set_sentinel_id("snt_abc123");
  s.set_workspace_id("ws_1");
  s.set_project_id("proj_1");
  s.set_app_id("app_1");
  s.set_environment_id("env_prod");
  s.set_region("eu-west-1");
  s.set_image("registry.example.com/sentinel:v1.2.3");
  s.set_replicas(3);
  s.set_cpu_millicores(500);
  s.set_memory_mib(256);
  s.set_desired_state(cluster::v1::SENTINEL_DESIRED_STATE_RUNNING);
  s.set_config_json(R"({"routes":[{"host":"a.example.com"}]})");
  return s;
}

}  // namespace

std::vector<GeneratedObject> sentinelObjects() {
  std::vector<std::pair<std::string, cluster::v1::Sentinel>> variants;
  variants.emplace_back("running", base());
  auto standby = base();
  standby.set_desired_state(cluster::v1::SENTINEL_DESIRED_STATE_STANDBY);
  variants.emplace_back("standby", standby);
  auto bare = base();
  bare.clear_cpu_millicores();
  bare.clear_memory_mib();
  bare.clear_config_json();
  bare.set_replicas(1);
  variants.emplace_back("no resources, no config", bare);
  auto cpu_only = base();
  cpu_only.clear_memory_mib();
  variants.emplace_back("cpu only", cpu_only);
  auto odd = base();
  odd.set_sentinel_id("Sentinel_With.A-Very-Long-Identifier-That-Does-Not-Fit-In-A-Dns-Label-0123");
  odd.set_environment_id("Env.Staging_2");
  variants.emplace_back("ids needing hashed names", odd);
  services::v1::DeploymentInfo info;
  info.set_workspace_id("ws_1");
  info.set_project_id("proj_1");
  info.set_app_id("app_1");
  info.set_environment_id("env_prod");
  variants.emplace_back(
      "as a deploy creates it",
      services::deploy::newSentinel(info, "eu-west-1", "sen_0123456789abcdef",
                                    services::deploy::EnvironmentResourceOptions{})
          .sentinel());

  auto probes = base();
  probes.set_live_deployment_id("dep_123");
  auto* live = probes.mutable_healthcheck()->mutable_liveness();
  live->set_path("/_krane/live");
  live->set_initial_delay_seconds(3);
  live->set_period_seconds(15);
  live->set_timeout_seconds(4);
  live->set_failure_threshold(5);
  auto* ready = probes.mutable_healthcheck()->mutable_readiness();
  ready->set_path("/_krane/ready");
  ready->set_port(8040);  // a port number (the defaults probe the named health port)
  ready->set_success_threshold(2);
  variants.emplace_back("probes from the resource", probes);

  // Pod options of the plugin's configuration, applied to the base sentinel.
  std::vector<std::pair<std::string, sentinel::PodOptions>> pods;
  pods.emplace_back("default pod", sentinel::PodOptions{});
  auto custom = sentinel::podOptionsFromJson(nlohmann::json::parse(R"({
        "node_selector": {"node-class": "sentinel", "topology.kubernetes.io/zone": "eu-west-1a"},
        "tolerations": [
          {"key": "node-class", "operator": "Equal", "value": "sentinel", "effect": "NoSchedule"},
          {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
           "tolerationSeconds": 30}],
        "secret_env": [{"name": "DATABASE_URL", "secret": "sentinel-database", "key": "url"},
                       {"name": "REDIS_PASSWORD", "secret": "sentinel-redis", "key": "password"}],
        "env_from_secrets": ["sentinel-clickhouse"]})"),
                                             "kubernetes");
  if (custom.ok()) pods.emplace_back("custom pod and credentials", *custom);
  auto none = sentinel::podOptionsFromJson(
      nlohmann::json::parse(R"({"node_selector": {}, "tolerations": []})"), "kubernetes");
  if (none.ok()) pods.emplace_back("no node class", *none);

  std::vector<GeneratedObject> out;
  for (const auto& [variant, pod] : pods) {
    for (auto& o : sentinel::sentinelObjects(base(), pod)) {
      out.push_back({strCat("sentinel ", variant, ": ", o["kind"].get<std::string>()), o});
    }
  }
  for (const auto& [variant, s] : variants) {
    for (auto& o : sentinel::sentinelObjects(s)) {
      out.push_back({strCat("sentinel ", variant, ": ", o["kind"].get<std::string>()), o});
    }
    sentinel::Routes routes;
    routes.deployment_id = "dep_123";
    routes.endpoints.push_back({"dep-123.ws-ws-1.svc", 8080});
    routes.endpoints.push_back({"dep-124.ws-ws-1.svc", 8080});
    auto config_map = sentinel::routesConfigMap(s, routes);
    out.push_back({strCat("sentinel ", variant, ": routes ConfigMap"), config_map});
    for (auto& o : sentinel::environmentObjects(s)) {
      out.push_back(
          {strCat("sentinel ", variant, ": environment ", o["kind"].get<std::string>()), o});
    }
  }
  return out;
}

}  // namespace krane::schema
