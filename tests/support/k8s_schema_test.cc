#include "tests/support/k8s_schema.h"

#include <filesystem>
#include <fstream>

#include <catch2/catch.hpp>

#include "tests/support/matchers.h"

namespace krane::testing {
namespace {

using Json = nlohmann::json;

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

// The schemas are loaded once, by the first test case that needs them.
class CiliumSchema {
 protected:
  CiliumSchema() : schemas(&loaded()) {}

  static K8sSchemas& loaded() {
    static K8sSchemas once = [] {
      auto dir = K8sSchemas::defaultDir();
      REQUIRE_THAT(dir, IsOk());
      auto schemas = K8sSchemas::load(*dir);
      REQUIRE_THAT(schemas, IsOk());
      return std::move(*schemas);
    }();
    return once;
  }

  K8sSchemas* schemas;
};

TEST_CASE_METHOD(CiliumSchema, "the upstream crd is loaded", "[cilium-schema]") {
  CHECK(schemas->has("cilium.io/v2", "CiliumNetworkPolicy"));
  CHECK_FALSE(schemas->has("apps/v1", "Deployment"));
}

TEST_CASE_METHOD(CiliumSchema, "a valid policy passes", "[cilium-schema]") {
  CHECK(schemas->violations(gossipPolicy()).empty());
  CHECK_THAT(schemas->validate(gossipPolicy()), IsOk());
}

TEST_CASE_METHOD(CiliumSchema, "violations name their path", "[cilium-schema]") {
  Json bad_protocol = gossipPolicy();
  bad_protocol["spec"]["ingress"][0]["toPorts"][0]["ports"][0]["protocol"] = "TPC";
  CHECK_THAT(schemas->violations(bad_protocol),
             AnyElementContains("spec.ingress[0].toPorts[0].ports[0].protocol: must be one of"));

  Json numeric_port = gossipPolicy();
  numeric_port["spec"]["ingress"][0]["toPorts"][0]["ports"][1]["port"] = 7946;
  CHECK_THAT(schemas->violations(numeric_port),
             Catch::VectorContains(std::string(
                 "spec.ingress[0].toPorts[0].ports[1].port: must be of type string, got "
                 "integer")));

  Json typo = gossipPolicy();
  typo["spec"]["ingres"] = typo["spec"]["ingress"];
  typo["spec"].erase("ingress");
  const auto typo_errors = schemas->violations(typo);
  CHECK_THAT(typo_errors, Catch::VectorContains(std::string("spec.ingres: unknown field")));
  INFO("a rule needs one of ingress, egress, ...");
  CHECK_THAT(typo_errors, AnyElementContains("spec: matches none of the"));

  Json two_selectors = gossipPolicy();
  two_selectors["spec"]["nodeSelector"] = {{"matchLabels", {{"a", "b"}}}};
  CHECK_THAT(schemas->violations(two_selectors),
             AnyElementContains("spec: matches 2 of the oneOf alternatives"));

  const auto status = schemas->validate(bad_protocol);
  CHECK(absl::IsInvalidArgument(status));
  CHECK_THAT(std::string(status.message()),
             Catch::Contains("CiliumNetworkPolicy gossip-env1: spec."));
}

TEST_CASE_METHOD(CiliumSchema, "a kind without a schema is a violation", "[cilium-schema]") {
  CHECK_THAT(schemas->violations({{"apiVersion", "apps/v1"}, {"kind", "Deployment"}}),
             AnyElementContains("no schema for \"apps/v1 Deployment\""));
}

// The rules on a small OpenAPI v3 document of the shape the API server publishes.
TEST_CASE("refs nullable int or string lists and bounds", "[open-api-schema]") {
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
  REQUIRE_THAT(schemas, IsOk());
  REQUIRE(schemas->has("example.io/v1", "Widget"));

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
  CHECK(schemas->violations(good).empty());

  Json bad = good;
  bad["spec"]["replicas"] = 11;
  bad["spec"]["port"] = 1.5;
  bad["spec"]["note"] = "too long";
  bad["spec"]["tags"] = {"a", "a"};
  bad["spec"]["labels"]["n"] = 1;
  bad["spec"]["extra"]["known"] = "yes";
  const auto errors = schemas->violations(bad);
  CHECK_THAT(errors, Catch::VectorContains(std::string("spec.replicas: must be at most 10")));
  CHECK_THAT(errors, Catch::VectorContains(
                         std::string("spec.port: must be an integer or a string, got number")));
  CHECK_THAT(errors,
             Catch::VectorContains(std::string("spec.note: must be at most 5 characters, got 8")));
  CHECK_THAT(errors, Catch::VectorContains(std::string("spec.tags: duplicate entry \"a\"")));
  CHECK_THAT(errors, Catch::VectorContains(
                         std::string("spec.labels.n: must be of type string, got integer")));
  CHECK_THAT(errors, Catch::VectorContains(
                         std::string("spec.extra.known: must be of type boolean, got string")));
  CHECK(errors.size() == 6u);

  Json missing = good;
  missing.erase("spec");
  CHECK_THAT(schemas->violations(missing),
             Catch::VectorContains(std::string("spec: required field missing")));
}

TEST_CASE("unreadable files are named", "[open-api-schema]") {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/broken";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/bad.json") << "{ not json";
  auto schemas = K8sSchemas::load(dir);
  CHECK(absl::IsInvalidArgument(schemas.status()));
  CHECK_THAT(std::string(schemas.status().message()), Catch::Contains("bad.json: cannot parse"));
}

}  // namespace
}  // namespace krane::testing
