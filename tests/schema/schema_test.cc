// Every object the plugins generate (generators.h), validated against the upstream schemas:
// Kubernetes' own kinds with the kubernetes-models npm package (tools/schema/validate.mjs), the
// Cilium policies with the upstream CiliumNetworkPolicy CRD (tests/support/k8s_schema.h). Any
// violation fails. The negative tests prove the validators reject what is broken, so the
// positive test cannot pass by checking nothing.
#include <stdlib.h>

#include <map>
#include <set>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/strings.h"
#include "tests/schema/generators.h"
#include "tests/schema/node_validator.h"
#include "tests/support/k8s_schema.h"

namespace krane::schema {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

bool isCilium(const json& object) {
  return object.value("apiVersion", "").rfind("cilium.io/", 0) == 0;
}

std::string tmpDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir ? dir : "/tmp";
}

testing::K8sSchemas crdSchemas() {
  auto dir = testing::K8sSchemas::defaultDir();
  EXPECT_TRUE(dir.ok()) << dir.status();
  auto schemas = testing::K8sSchemas::load(dir.ok() ? *dir : "/nonexistent");
  EXPECT_TRUE(schemas.ok()) << schemas.status();
  return schemas.ok() ? *std::move(schemas) : testing::K8sSchemas();
}

std::string joined(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& l : lines) strAppend(&out, l, "\n");
  return out;
}

TEST(Schema, EveryGeneratedObjectMatchesTheUpstreamSchemas) {
  std::vector<json> kube;
  std::vector<GeneratedObject> cilium;
  std::map<std::string, int> per_plugin;
  std::set<std::string> kinds;
  for (const auto& generator : generators()) {
    for (auto& generated : generator.render()) {
      ASSERT_FALSE(generated.object.is_null()) << generated.origin;
      ++per_plugin[generator.plugin];
      kinds.insert(strCat(generated.object["apiVersion"].get<std::string>(), " ",
                          generated.object["kind"].get<std::string>()));
      if (isCilium(generated.object)) {
        cilium.push_back(std::move(generated));
      } else {
        kube.push_back(std::move(generated.object));
      }
    }
  }
  for (const auto& generator : generators()) {
    EXPECT_GT(per_plugin[generator.plugin], 0) << generator.plugin << " generated nothing";
  }
  // What the plugins are known to make; a kind missing here means a generator lost its objects.
  for (const std::string kind :
       {"apps/v1 Deployment", "v1 Service", "policy/v1 PodDisruptionBudget",
        "cilium.io/v2 CiliumNetworkPolicy"}) {
    EXPECT_TRUE(kinds.count(kind)) << kind;
  }

  auto result = validateObjects(kube, tmpDir());
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->exit_code, 0) << result->output;
  EXPECT_THAT(result->violations, IsEmpty()) << joined(result->violations);
  EXPECT_THAT(result->output,
              HasSubstr(strCat("validate: ", kube.size(), " objects, 0 violations")));

  const auto schemas = crdSchemas();
  ASSERT_TRUE(schemas.has("cilium.io/v2", "CiliumNetworkPolicy"));
  for (const auto& generated : cilium) {
    EXPECT_THAT(schemas.violations(generated.object), IsEmpty()) << generated.origin << "\n"
                                                                 << generated.object.dump(2);
  }
}

// A Deployment of the sentinel plugin, renamed.
json sentinelDeployment(const std::string& name) {
  for (const auto& generated : sentinelObjects()) {
    if (generated.object["kind"] == "Deployment") {
      json copy = generated.object;
      copy["metadata"]["name"] = name;
      return copy;
    }
  }
  ADD_FAILURE() << "the sentinel generator made no Deployment";
  return json::object();
}

TEST(Schema, TheValidatorRejectsBrokenObjectsNamingKindNameAndPath) {
  json good = sentinelDeployment("good");
  json wrong_type = sentinelDeployment("wrong-type");
  wrong_type["spec"]["replicas"] = "3";
  json unknown_field = sentinelDeployment("unknown-field");
  unknown_field["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always";
  unknown_field["spec"]["strategy"]["rollingUpdate"]["maxSurges"] = 1;
  json missing = sentinelDeployment("missing");
  missing["spec"].erase("selector");
  json bad_enum = sentinelDeployment("bad-enum");
  bad_enum["spec"]["template"]["spec"]["containers"][0]["ports"][0]["protocol"] = "HTTP";
  json unknown_kind = {
      {"apiVersion", "apps/v1"}, {"kind", "Deploymint"}, {"metadata", {{"name", "k"}}}};
  json foreign_group = {
      {"apiVersion", "example.com/v1"}, {"kind", "Widget"}, {"metadata", {{"name", "w"}}}};

  auto result = validateObjects(
      {good, wrong_type, unknown_field, missing, bad_enum, unknown_kind, foreign_group}, tmpDir());
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->exit_code, 1) << result->output;
  const std::string out = joined(result->violations);
  EXPECT_THAT(out, HasSubstr("Deployment sentinel/wrong-type: spec.replicas: must be integer"));
  EXPECT_THAT(out, HasSubstr("Deployment sentinel/unknown-field: "
                             "spec.template.spec.containers[0].imagePullPolicyy: unknown field"));
  EXPECT_THAT(out, HasSubstr("Deployment sentinel/unknown-field: "
                             "spec.strategy.rollingUpdate.maxSurges: unknown field"));
  EXPECT_THAT(out, HasSubstr("Deployment sentinel/missing: spec.selector: required"));
  EXPECT_THAT(out, HasSubstr("Deployment sentinel/bad-enum: "
                             "spec.template.spec.containers[0].ports[0].protocol:"));
  EXPECT_THAT(out, HasSubstr("Deploymint k: apps/v1 Deploymint: no such kind"));
  EXPECT_THAT(out, HasSubstr("Widget w: example.com/v1 Widget: not a kind this validator knows"));
  EXPECT_THAT(out, ::testing::Not(HasSubstr("sentinel/good"))) << "the valid one passes";
  EXPECT_EQ(result->violations.size(), 7u) << out;
}

TEST(Schema, TheCiliumSchemaRejectsABrokenPolicy) {
  const auto schemas = crdSchemas();
  json policy;
  for (const auto& generated : ciliumObjects()) {
    if (generated.object.contains("spec") && generated.object["spec"].contains("ingress")) {
      policy = generated.object;
      break;
    }
  }
  ASSERT_FALSE(policy.is_null());
  EXPECT_THAT(schemas.violations(policy), IsEmpty());
  policy["spec"]["ingress"][0]["toPorts"][0]["ports"][0]["protocol"] = "HTTP";
  policy["spec"]["ingress"][0]["fromEndpointz"] = json::array();
  const std::string out = joined(schemas.violations(policy));
  EXPECT_THAT(out, HasSubstr("spec.ingress[0].toPorts[0].ports[0].protocol"));
  EXPECT_THAT(out, HasSubstr("spec.ingress[0].fromEndpointz"));
}

}  // namespace
}  // namespace krane::schema
