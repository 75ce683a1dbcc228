#include "tests/support/k8s_schema.h"

#include <filesystem>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace krane::testing {
namespace {

using Json = nlohmann::json;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

Json gossipPolicy() {
  return {
      {"apiVersion", "cilium.io/v2"},
      {"kind", "CiliumNetworkPolicy"},
      {"metadata", {{"name", "gossip-env1"}, {"namespace", "sentinel"}}},
      {"spec",
       {{"endpointSelector", {{"matchLabels", {{"krane.dev/environment-id", "env1"}}}}},
        {"ingress",
         Json::array(
             {{{"fromEndpoints",
                Json::array({{{"matchLabels", {{"krane.dev/environment-id", "env1"}}}}})},
               {"toPorts",
                Json::array(
                    {{{"ports", Json::array({{{"port", "7946"}, {"protocol", "TCP"}},
                                             {{"port", "7946"}, {"protocol", "UDP"}}})}}})}}})}}}};
}

class CiliumSchema : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto dir = K8sSchemas::defaultDir();
    ASSERT_TRUE(dir.ok()) << dir.status();
    auto loaded = K8sSchemas::load(*dir);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    schemas = new K8sSchemas(std::move(*loaded));
  }
  static void TearDownTestSuite() { delete schemas; }
  static K8sSchemas* schemas;
};
K8sSchemas* CiliumSchema::schemas = nullptr;

TEST_F(CiliumSchema, TheUpstreamCrdIsLoaded) {
  EXPECT_TRUE(schemas->has("cilium.io/v2", "CiliumNetworkPolicy"));
  EXPECT_FALSE(schemas->has("apps/v1", "Deployment"));
}

TEST_F(CiliumSchema, AValidPolicyPasses) {
  EXPECT_THAT(schemas->violations(gossipPolicy()), IsEmpty());
  EXPECT_TRUE(schemas->validate(gossipPolicy()).ok());
}

TEST_F(CiliumSchema, ViolationsNameTheirPath) {
  Json bad_protocol = gossipPolicy();
  bad_protocol["spec"]["ingress"][0]["toPorts"][0]["ports"][0]["protocol"] = "TPC";
  EXPECT_THAT(schemas->violations(bad_protocol),
              Contains(HasSubstr("spec.ingress[0].toPorts[0].ports[0].protocol: must be one of")));

  Json numeric_port = gossipPolicy();
  numeric_port["spec"]["ingress"][0]["toPorts"][0]["ports"][1]["port"] = 7946;
  EXPECT_THAT(schemas->violations(numeric_port),
              Contains("spec.ingress[0].toPorts[0].ports[1].port: must be of type string, got "
                       "integer"));

  Json typo = gossipPolicy();
  typo["spec"]["ingres"] = typo["spec"]["ingress"];
  typo["spec"].erase("ingress");
  const auto typo_errors = schemas->violations(typo);
  EXPECT_THAT(typo_errors, Contains("spec.ingres: unknown field"));
  EXPECT_THAT(typo_errors, Contains(HasSubstr("spec: matches none of the")))
      << "a rule needs one of ingress, egress, ...";

  Json two_selectors = gossipPolicy();
  two_selectors["spec"]["nodeSelector"] = {{"matchLabels", {{"a", "b"}}}};
  EXPECT_THAT(schemas->violations(two_selectors),
              Contains(HasSubstr("spec: matches 2 of the oneOf alternatives")));

  const auto status = schemas->validate(bad_protocol);
  EXPECT_TRUE(absl::IsInvalidArgument(status));
  EXPECT_THAT(std::string(status.message()), HasSubstr("CiliumNetworkPolicy gossip-env1: spec."));
}

TEST_F(CiliumSchema, AKindWithoutASchemaIsAViolation) {
  EXPECT_THAT(schemas->violations({{"apiVersion", "apps/v1"}, {"kind", "Deployment"}}),
              Contains(HasSubstr("no schema for \"apps/v1 Deployment\"")));
}

// The rules on a small OpenAPI v3 document of the shape the API server publishes.
TEST(OpenApiSchema, RefsNullableIntOrStringListsAndBounds) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/openapi";
  std::filesystem::create_directories(dir);
  const Json doc = {
      {"openapi", "3.0.0"},
      {"components",
       {{"schemas",
         {{"io.example.v1.Widget",
           {{"type", "object"},
            {"x-kubernetes-group-version-kind",
             Json::array({{{"group", "example.io"}, {"version", "v1"}, {"kind", "Widget"}}})},
            {"required", Json::array({"spec"})},
            {"properties",
             {{"apiVersion", {{"type", "string"}}},
              {"kind", {{"type", "string"}}},
              {"metadata", {{"type", "object"}}},
              {"spec", {{"$ref", "#/components/schemas/io.example.v1.WidgetSpec"}}}}}}},
          {"io.example.v1.WidgetSpec",
           {{"type", "object"},
            {"properties",
             {{"replicas", {{"type", "integer"}, {"minimum", 0}, {"maximum", 10}}},
              {"port", {{"x-kubernetes-int-or-string", true}}},
              {"note", {{"type", "string"}, {"nullable", true}, {"maxLength", 5}}},
              {"tags",
               {{"type", "array"},
                {"items", {{"type", "string"}}},
                {"x-kubernetes-list-type", "set"}}},
              {"labels", {{"type", "object"}, {"additionalProperties", {{"type", "string"}}}}},
              {"extra",
               {{"type", "object"},
                {"x-kubernetes-preserve-unknown-fields", true},
                {"properties", {{"known", {{"type", "boolean"}}}}}}}}}}}}}}}};
  std::ofstream(dir + "/widget.json") << doc.dump();
  auto schemas = K8sSchemas::load(dir);
  ASSERT_TRUE(schemas.ok()) << schemas.status();
  ASSERT_TRUE(schemas->has("example.io/v1", "Widget"));

  Json good = {{"apiVersion", "example.io/v1"},
               {"kind", "Widget"},
               {"metadata", {{"name", "w"}}},
               {"spec",
                {{"replicas", 3},
                 {"port", "http"},
                 {"note", nullptr},
                 {"tags", {"a", "b"}},
                 {"labels", {{"x", "y"}}},
                 {"extra", {{"known", true}, {"anything", {1, 2}}}}}}};
  EXPECT_THAT(schemas->violations(good), IsEmpty());

  Json bad = good;
  bad["spec"]["replicas"] = 11;
  bad["spec"]["port"] = 1.5;
  bad["spec"]["note"] = "too long";
  bad["spec"]["tags"] = {"a", "a"};
  bad["spec"]["labels"]["n"] = 1;
  bad["spec"]["extra"]["known"] = "yes";
  const auto errors = schemas->violations(bad);
  EXPECT_THAT(errors, Contains("spec.replicas: must be at most 10"));
  EXPECT_THAT(errors, Contains("spec.port: must be an integer or a string, got number"));
  EXPECT_THAT(errors, Contains("spec.note: must be at most 5 characters, got 8"));
  EXPECT_THAT(errors, Contains("spec.tags: duplicate entry \"a\""));
  EXPECT_THAT(errors, Contains("spec.labels.n: must be of type string, got integer"));
  EXPECT_THAT(errors, Contains("spec.extra.known: must be of type boolean, got string"));
  EXPECT_EQ(errors.size(), 6u);

  Json missing = good;
  missing.erase("spec");
  EXPECT_THAT(schemas->violations(missing), Contains("spec: required field missing"));
}

TEST(OpenApiSchema, UnreadableFilesAreNamed) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/broken";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/bad.json") << "{ not json";
  auto schemas = K8sSchemas::load(dir);
  EXPECT_TRUE(absl::IsInvalidArgument(schemas.status()));
  EXPECT_THAT(std::string(schemas.status().message()), HasSubstr("bad.json: cannot parse"));
}

}  // namespace
}  // namespace krane::testing
