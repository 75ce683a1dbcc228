#include "cli/manifest.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace krane::cli {
namespace {

using ::testing::HasSubstr;

std::string errorOf(const std::string& yaml) {
  auto parsed = parseManifests(yaml, "app.yaml");
  EXPECT_FALSE(parsed.ok());
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

TEST(Manifest, ADeploymentFansOutToItsRegionsWithIdAndRegionFilledIn) {
  auto parsed = parseManifests(kDeployment, "app.yaml");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->size(), 2u);
  const auto& first = (*parsed)[0].resource;
  EXPECT_EQ(first.type(), "deployment_topology");
  EXPECT_EQ(first.id(), "demo");
  EXPECT_EQ(first.region(), "eu-1");
  const auto& d = first.deployment_topology();
  EXPECT_EQ(d.deployment_id(), "demo");
  EXPECT_EQ(d.region(), "eu-1");
  EXPECT_EQ(d.command_size(), 2);
  EXPECT_EQ(d.replicas(), 3u);
  EXPECT_EQ(d.env(0).value(), "1");
  EXPECT_EQ(d.healthcheck().readiness().period_seconds(), 2u);
  EXPECT_EQ(d.labels().at("team"), "web");
  EXPECT_EQ((*parsed)[1].resource.deployment_topology().region(), "eu-2");
  EXPECT_THAT((*parsed)[1].origin, HasSubstr("document 1 (Deployment demo) in eu-2"));
}

TEST(Manifest, SentinelsPoliciesAndPluginTypes) {
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
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->size(), 3u);
  EXPECT_EQ((*parsed)[0].resource.sentinel().desired_state(),
            cluster::v1::SENTINEL_DESIRED_STATE_STANDBY);
  EXPECT_EQ((*parsed)[0].resource.sentinel().sentinel_id(), "s1");
  EXPECT_EQ((*parsed)[1].resource.cilium_network_policy().policy_json(),
            R"({"endpointSelector":{"matchLabels":{"app":"web"}}})");
  const auto& g = (*parsed)[2].resource.generic();
  EXPECT_EQ(g.type(), "example.krane.dev/site");
  EXPECT_EQ(g.content_type(), "application/json");
  EXPECT_EQ(g.spec(), R"({"files":{"index.html":"<h1>hi</h1>"},"size":3})");
}

TEST(Manifest, ErrorsNameTheDocumentAndTheField) {
  EXPECT_THAT(errorOf("kind: Deployment\nid: d\nregion: eu-1\nspec:\n  replicaz: 3\n"),
              HasSubstr("app.yaml: document 1 (Deployment d): spec: "));
  EXPECT_THAT(errorOf("kind: Deployment\nid: d\nregion: eu-1\nspec:\n  replicaz: 3\n"),
              HasSubstr("replicaz"));
  EXPECT_THAT(errorOf("kind: Deployment\nid: d\nregion: eu-1\nspec:\n  replicas: lots\n"),
              HasSubstr("replicas"));
  EXPECT_THAT(errorOf(std::string(kDeployment) + "---\nkind: Pod\nid: x\nregion: eu-1\nspec: {}\n"),
              HasSubstr("app.yaml: document 2: kind: \"Pod\" is not one of"));
  EXPECT_THAT(errorOf("kind: Sentinel\nregion: eu-1\nspec: {}\n"),
              HasSubstr("document 1: id: required"));
  EXPECT_THAT(errorOf("kind: Sentinel\nid: s\nspec: {}\n"),
              HasSubstr("(Sentinel s): region: required"));
  EXPECT_THAT(errorOf("kind: Sentinel\nid: s\nregion: eu-1\nspec: {}\nextra: 1\n"),
              HasSubstr("extra: unknown key"));
  EXPECT_THAT(errorOf("kind: Resource\nid: s\nregion: eu-1\nspec: {}\n"),
              HasSubstr("type: required for kind Resource"));
  EXPECT_THAT(errorOf("kind: Deployment\nid: d\nregion: eu-1\nspec:\n  region: eu-2\n"),
              HasSubstr("spec.region: is \"eu-2\" but the document's region is \"eu-1\""));
  EXPECT_THAT(errorOf("kind: Deployment\nid: d\nregion: eu-1\nspec: [1]\n"),
              HasSubstr("spec: required, a mapping"));
  EXPECT_THAT(errorOf("kind: Deployment\nid: [d\n"), HasSubstr("app.yaml: line "));
  EXPECT_THAT(errorOf(""), HasSubstr("app.yaml: no documents"));
}

TEST(Manifest, TypeAliases) {
  EXPECT_EQ(resourceType("deployments"), "deployment_topology");
  EXPECT_EQ(resourceType("deploy"), "deployment_topology");
  EXPECT_EQ(resourceType("Sentinels"), "sentinel");
  EXPECT_EQ(resourceType("cnp"), "cilium_network_policy");
  EXPECT_EQ(resourceType("example.krane.dev/site"), "example.krane.dev/site");
}

}  // namespace
}  // namespace krane::cli
