// plugins/cilium/policy.h: the object made from a stored policy, and every way a policy is
// refused (each error names the field).
#include <set>

#include <catch2/catch.hpp>

#include "common/strings.h"
#include "plugins/cilium/policy.h"
#include "tests/support/matchers.h"

namespace krane::cilium {
namespace {

using nlohmann::json;

json rule() {
  return {
      {"endpointSelector", {{"matchLabels", {{"app", "api"}}}}},
      {"ingress",
       json::array(
           {{{"fromEndpoints", json::array({{{"matchLabels", {{"app", "web"}}}}})},
             {"toPorts", json::array({{{"ports", json::array({{{"port", "8080"},
                                                               {"protocol", "TCP"}}})}}})}}})},
  };
}

cluster::v1::CiliumNetworkPolicy policy(const json& body) {
  cluster::v1::CiliumNetworkPolicy p;
  p.set_policy_id("pol_1");
  p.set_workspace_id("ws_Acme");
  p.set_project_id("proj1");
  p.set_environment_id("env1");
  p.set_region("eu-1");
  p.set_policy_json(body.dump());
  return p;
}

std::string error(const cluster::v1::CiliumNetworkPolicy& p, const std::string& ns = "") {
  auto object = policyObject(p, p.policy_id(), ns);
  INFO((object.ok() ? object->dump() : std::string("an error, as expected")));
  CHECK_FALSE(object.ok());
  CHECK(object.status().code() == absl::StatusCode::kInvalidArgument);
  return std::string(object.status().message());
}

TEST_CASE("just a spec becomes a whole object with kranes metadata", "[cilium-policy]") {
  auto object = policyObject(policy(rule()), "pol_1");
  REQUIRE_THAT(object, IsOk());
  CHECK((*object)["apiVersion"] == "cilium.io/v2");
  CHECK((*object)["kind"] == "CiliumNetworkPolicy");
  CHECK((*object)["spec"] == rule());
  const json& meta = (*object)["metadata"];
  CHECK(meta["name"] == dnsLabel("krane-policy", "pol_1"));
  CHECK(isDnsSubdomain(meta["name"]));
  CHECK(meta["namespace"] == workspaceNamespace("ws_Acme"));
  CHECK(isDnsLabel(meta["namespace"]));
  CHECK(meta["labels"]["app.kubernetes.io/managed-by"] == "krane");
  CHECK(meta["labels"]["app.kubernetes.io/component"] == "cilium-policy");
  CHECK(meta["labels"]["krane.dev/workspace.id"] == "ws_Acme");
  CHECK(meta["labels"]["krane.dev/project.id"] == "proj1");
  CHECK(meta["labels"]["krane.dev/environment.id"] == "env1");
  CHECK(meta["labels"]["krane.dev/policy.id"] == "pol_1");
  CHECK(meta["annotations"]["krane.dev/policy.id"] == "pol_1");
}

TEST_CASE("a whole object keeps its metadata but kranes labels win", "[cilium-policy]") {
  json body = {{"apiVersion", "cilium.io/v2"},
               {"kind", "CiliumNetworkPolicy"},
               {"metadata",
                {{"name", "allow-web"},
                 {"namespace", "shop"},
                 {"labels", {{"team", "web"}, {"app.kubernetes.io/managed-by", "someone"}}},
                 {"annotations", {{"note", "hi"}}},
                 {"resourceVersion", "42"},
                 {"uid", "u-1"}}},
               {"spec", rule()},
               {"status", {{"nodes", json::object()}}}};
  auto object = policyObject(policy(body), "pol_1");
  REQUIRE_THAT(object, IsOk());
  const json& meta = (*object)["metadata"];
  CHECK(meta["name"] == "allow-web");
  CHECK(meta["namespace"] == "shop");
  CHECK(meta["labels"]["team"] == "web");
  CHECK(meta["labels"]["app.kubernetes.io/managed-by"] == "krane");
  CHECK(meta["annotations"]["note"] == "hi");
  CHECK(meta["annotations"]["krane.dev/policy.id"] == "pol_1");
  CHECK_FALSE(meta.contains("resourceVersion"));
  CHECK_FALSE(meta.contains("uid"));
  INFO("status is Cilium's to write");
  CHECK_FALSE(object->contains("status"));
}

TEST_CASE("specs name and namespace choices", "[cilium-policy]") {
  json body = {
      {"specs",
       json::array({rule(), {{"nodeSelector", json::object()}, {"egress", json::array()}}})}};
  auto p = policy(body);
  p.set_name("named-by-the-message");
  auto object = policyObject(p, "pol_1", "fallback-ns");
  REQUIRE_THAT(object, IsOk());
  CHECK((*object)["specs"].size() == 2u);
  CHECK_FALSE(object->contains("spec"));
  CHECK((*object)["metadata"]["name"] == "named-by-the-message");
  CHECK((*object)["metadata"]["namespace"] == "fallback-ns");

  // The same name in the message and in the object is fine.
  json same = {{"metadata", {{"name", "named-by-the-message"}}}, {"spec", rule()}};
  p.set_policy_json(same.dump());
  CHECK_THAT(policyObject(p, "pol_1"), IsOk());

  // Ids that are not label values are still identified through the annotation.
  auto odd = policy(rule());
  auto object2 = policyObject(odd, "pol/with spaces");
  REQUIRE_THAT(object2, IsOk());
  CHECK_FALSE((*object2)["metadata"]["labels"].contains("krane.dev/policy.id"));
  CHECK((*object2)["metadata"]["annotations"]["krane.dev/policy.id"] == "pol/with spaces");
  CHECK(isDnsSubdomain((*object2)["metadata"]["name"]));
}

TEST_CASE("refuses what can never be applied", "[cilium-policy]") {
  auto p = policy(rule());
  p.set_policy_json("");
  CHECK_THAT(error(p), Catch::Contains("policy_json: required"));
  p.set_policy_json("{\"endpointSelector\": ");
  CHECK_THAT(error(p), Catch::Contains("policy_json: not valid JSON"));
  p.set_policy_json("[1]");
  CHECK_THAT(error(p), Catch::Contains("policy_json: must be a JSON object, got an array"));

  json wrong_kind = {{"kind", "NetworkPolicy"}, {"spec", rule()}};
  CHECK_THAT(
      error(policy(wrong_kind)),
      Catch::Contains("policy_json.kind: must be CiliumNetworkPolicy, got \"NetworkPolicy\""));
  json wrong_version = {{"apiVersion", "cilium.io/v1"}, {"spec", rule()}};
  CHECK_THAT(error(policy(wrong_version)),
             Catch::Contains("policy_json.apiVersion: must be cilium.io/v2"));
  json extra = {{"spec", rule()}, {"data", 1}};
  CHECK_THAT(error(policy(extra)), Catch::Contains("policy_json.data: unknown field"));
  json no_spec = {{"metadata", {{"name", "x"}}}};
  CHECK_THAT(error(policy(no_spec)), Catch::Contains("policy_json: spec required"));
  json empty_specs = {{"specs", json::array()}};
  CHECK_THAT(error(policy(empty_specs)), Catch::Contains("policy_json: spec required"));

  json typo = rule();
  typo["ingres"] = json::array();
  CHECK_THAT(error(policy(typo)), Catch::Contains("policy_json.ingres: unknown field"));
  json not_array = rule();
  not_array["ingress"] = json::object();
  CHECK_THAT(error(policy(not_array)),
             Catch::Contains("policy_json.ingress: must be an array, got an object"));
  json not_object = rule();
  not_object["egress"] = json::array({"x"});
  CHECK_THAT(error(policy({{"spec", not_object}})),
             Catch::Contains("policy_json.spec.egress[0]: must be an object, got a string"));
  json no_selector = {{"ingress", json::array()}};
  CHECK_THAT(error(policy(no_selector)), Catch::Contains("policy_json: endpointSelector required"));
  json both = rule();
  both["nodeSelector"] = json::object();
  CHECK_THAT(
      error(policy({{"specs", json::array({rule(), both})}})),
      Catch::Contains("policy_json.specs[1]: endpointSelector and nodeSelector are mutually"));

  json owner = {{"metadata", {{"ownerReferences", json::array()}}}, {"spec", rule()}};
  CHECK_THAT(error(policy(owner)),
             Catch::Contains("policy_json.metadata.ownerReferences: not supported"));
  json label_type = {{"metadata", {{"labels", {{"a", 1}}}}}, {"spec", rule()}};
  CHECK_THAT(error(policy(label_type)),
             Catch::Contains("policy_json.metadata.labels.a: must be a string"));

  json bad_name = {{"metadata", {{"name", "Allow_Web"}}}, {"spec", rule()}};
  CHECK_THAT(
      error(policy(bad_name)),
      Catch::Contains("policy_json.metadata.name: \"Allow_Web\" is not a valid object name"));
  auto mismatch = policy({{"metadata", {{"name", "a"}}}, {"spec", rule()}});
  mismatch.set_name("b");
  CHECK_THAT(error(mismatch), Catch::Contains("policy_json.metadata.name: \"a\" differs"));
  auto bad_message_name = policy(rule());
  bad_message_name.set_name("-x");
  CHECK_THAT(error(bad_message_name), Catch::Contains("name: \"-x\" is not a valid object name"));
  json bad_ns = {{"metadata", {{"namespace", "a.b"}}}, {"spec", rule()}};
  CHECK_THAT(error(policy(bad_ns)),
             Catch::Contains("policy_json.metadata.namespace: \"a.b\" is not a valid namespace"));
  auto no_workspace = policy(rule());
  no_workspace.clear_workspace_id();
  CHECK_THAT(error(no_workspace), Catch::Contains("workspace_id: required"));
  // ... unless the plugin is configured with a namespace.
  CHECK_THAT(policyObject(no_workspace, "pol_1", "policies"), IsOk());

  auto no_id = policy(rule());
  CHECK_FALSE(policyObject(no_id, "").ok());
}

TEST_CASE("dns labels are valid and distinct", "[cilium-policy]") {
  std::set<std::string> seen;
  for (const std::string& id :
       std::vector<std::string>{"abc", "ABC", "a_b", "a-b", "a.b", "_", "-a-", std::string(80, 'x'),
                                std::string(80, 'x') + "y", "ws_1", "ws-1"}) {
    const std::string label = dnsLabel("", id);
    INFO(id << " -> " << label);
    CHECK(isDnsLabel(label));
    INFO(id << " collides: " << label);
    CHECK(seen.insert(label).second);
    CHECK(isDnsLabel(dnsLabel("krane-policy", id)));
  }
  INFO("a clean id is kept as it is");
  CHECK(dnsLabel("", "abc") == "abc");
  CHECK_FALSE(isDnsLabel("a.b"));
  CHECK(isDnsSubdomain("a.b"));
  CHECK_FALSE(isDnsSubdomain("a..b"));
  CHECK(isLabelValue("Pol_1.x"));
  CHECK_FALSE(isLabelValue("pol 1"));
}

}  // namespace
}  // namespace krane::cilium
