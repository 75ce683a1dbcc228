#include "cli/manifest.h"

#include <catch2/catch.hpp>

#include "tests/support/matchers.h"

namespace krane::cli {
namespace {

std::string errorOf(const std::string& yaml) {
  auto parsed = parseManifests(yaml, "app.yaml");
  CHECK_FALSE(parsed.ok());
  return parsed.ok() ? "" : std::string(parsed.status().message());
}

constexpr char kDeployment[] = R"(kind: Deployment
id: demo
regions: [eu-1, eu-2]
spec:
  workspaceId: ws
  image: krane.dev/demo-app:v1
  command: [/bin/app, serve]
  replicas: 3
  env:
    - {name: A, value: "1"}
  healthcheck:
    readiness: {path: /ready, periodSeconds: 2}
  labels: {team: web}
)";

TEST_CASE("a deployment fans out to its regions with id and region filled in", "[manifest]") {
  auto parsed = parseManifests(kDeployment, "app.yaml");
  REQUIRE_THAT(parsed, IsOk());
  REQUIRE(parsed->size() == 2u);
  const auto& first = (*parsed)[0].resource;
  CHECK(first.type() == "deployment_topology");
  CHECK(first.id() == "demo");
  CHECK(first.region() == "eu-1");
  const auto& d = first.deployment_topology();
  CHECK(d.deployment_id() == "demo");
  CHECK(d.region() == "eu-1");
  CHECK(d.command_size() == 2);
  CHECK(d.replicas() == 3u);
  CHECK(d.env(0).value() == "1");
  CHECK(d.healthcheck().readiness().period_seconds() == 2u);
  CHECK(d.labels().at("team") == "web");
  CHECK((*parsed)[1].resource.deployment_topology().region() == "eu-2");
  CHECK_THAT((*parsed)[1].origin, Catch::Contains("document 1 (Deployment demo) in eu-2"));
}

TEST_CASE("sentinels policies and plugin types", "[manifest]") {
  auto parsed = parseManifests(R"(kind: Sentinel
id: s1
region: eu-1
spec: {image: sentinel:1, replicas: 2, desiredState: SENTINEL_DESIRED_STATE_STANDBY}
---
---
kind: CiliumNetworkPolicy
id: p1
region: eu-1
spec:
  policy:
    endpointSelector: {matchLabels: {app: web}}
---
kind: Resource
type: example.krane.dev/site
id: home
region: eu-1
spec:
  files: {index.html: "<h1>hi</h1>"}
  size: 3
)",
                               "all.yaml");
  REQUIRE_THAT(parsed, IsOk());
  REQUIRE(parsed->size() == 3u);
  CHECK((*parsed)[0].resource.sentinel().desired_state() ==
        cluster::v1::SENTINEL_DESIRED_STATE_STANDBY);
  CHECK((*parsed)[0].resource.sentinel().sentinel_id() == "s1");
  CHECK((*parsed)[1].resource.cilium_network_policy().policy_json() ==
        R"({"endpointSelector":{"matchLabels":{"app":"web"}}})");
  const auto& g = (*parsed)[2].resource.generic();
  CHECK(g.type() == "example.krane.dev/site");
  CHECK(g.content_type() == "application/json");
  CHECK(g.spec() == R"({"files":{"index.html":"<h1>hi</h1>"},"size":3})");
}

TEST_CASE("errors name the document and the field", "[manifest]") {
  CHECK_THAT(errorOf("kind: Deployment\nid: d\nregion: eu-1\nspec:\n  replicaz: 3\n"),
             Catch::Contains("app.yaml: document 1 (Deployment d): spec: "));
  CHECK_THAT(errorOf("kind: Deployment\nid: d\nregion: eu-1\nspec:\n  replicaz: 3\n"),
             Catch::Contains("replicaz"));
  CHECK_THAT(errorOf("kind: Deployment\nid: d\nregion: eu-1\nspec:\n  replicas: lots\n"),
             Catch::Contains("replicas"));
  CHECK_THAT(errorOf(std::string(kDeployment) + "---\nkind: Pod\nid: x\nregion: eu-1\nspec: {}\n"),
             Catch::Contains("app.yaml: document 2: kind: \"Pod\" is not one of"));
  CHECK_THAT(errorOf("kind: Sentinel\nregion: eu-1\nspec: {}\n"),
             Catch::Contains("document 1: id: required"));
  CHECK_THAT(errorOf("kind: Sentinel\nid: s\nspec: {}\n"),
             Catch::Contains("(Sentinel s): region: required"));
  CHECK_THAT(errorOf("kind: Sentinel\nid: s\nregion: eu-1\nspec: {}\nextra: 1\n"),
             Catch::Contains("extra: unknown key"));
  CHECK_THAT(errorOf("kind: Resource\nid: s\nregion: eu-1\nspec: {}\n"),
             Catch::Contains("type: required for kind Resource"));
  CHECK_THAT(errorOf("kind: Deployment\nid: d\nregion: eu-1\nspec:\n  region: eu-2\n"),
             Catch::Contains("spec.region: is \"eu-2\" but the document's region is \"eu-1\""));
  CHECK_THAT(errorOf("kind: Deployment\nid: d\nregion: eu-1\nspec: [1]\n"),
             Catch::Contains("spec: required, a mapping"));
  CHECK_THAT(errorOf("kind: Deployment\nid: [d\n"), Catch::Contains("app.yaml: line "));
  CHECK_THAT(errorOf(""), Catch::Contains("app.yaml: no documents"));
}

TEST_CASE("type aliases", "[manifest]") {
  CHECK(resourceType("deployments") == "deployment_topology");
  CHECK(resourceType("deploy") == "deployment_topology");
  CHECK(resourceType("Sentinels") == "sentinel");
  CHECK(resourceType("cnp") == "cilium_network_policy");
  CHECK(resourceType("example.krane.dev/site") == "example.krane.dev/site");
}

}  // namespace
}  // namespace krane::cli
