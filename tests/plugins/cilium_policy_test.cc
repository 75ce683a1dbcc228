// plugins/cilium/policy.h: the object made from a stored policy, and every way a policy is
// refused (each error names the field).
#include <set>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/strings.h"
#include "plugins/cilium/policy.h"

namespace krane::cilium {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

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
  EXPECT_FALSE(object.ok()) << object->dump();
  EXPECT_EQ(object.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(object.status().message());
}

TEST(CiliumPolicy, JustASpecBecomesAWholeObjectWithKranesMetadata) {
  auto object = policyObject(policy(rule()), "pol_1");
  ASSERT_TRUE(object.ok()) << object.status();
  EXPECT_EQ((*object)["apiVersion"], "cilium.io/v2");
  EXPECT_EQ((*object)["kind"], "CiliumNetworkPolicy");
  EXPECT_EQ((*object)["spec"], rule());
  const json& meta = (*object)["metadata"];
  EXPECT_EQ(meta["name"], dnsLabel("krane-policy", "pol_1"));
  EXPECT_TRUE(isDnsSubdomain(meta["name"]));
  EXPECT_EQ(meta["namespace"], workspaceNamespace("ws_Acme"));
  EXPECT_TRUE(isDnsLabel(meta["namespace"]));
  EXPECT_EQ(meta["labels"]["app.kubernetes.io/managed-by"], "krane");
  EXPECT_EQ(meta["labels"]["app.kubernetes.io/component"], "cilium-policy");
  EXPECT_EQ(meta["labels"]["krane.dev/workspace.id"], "ws_Acme");
  EXPECT_EQ(meta["labels"]["krane.dev/project.id"], "proj1");
  EXPECT_EQ(meta["labels"]["krane.dev/environment.id"], "env1");
  EXPECT_EQ(meta["labels"]["krane.dev/policy.id"], "pol_1");
  EXPECT_EQ(meta["annotations"]["krane.dev/policy.id"], "pol_1");
}

TEST(CiliumPolicy, AWholeObjectKeepsItsMetadataButKranesLabelsWin) {
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
  ASSERT_TRUE(object.ok()) << object.status();
  const json& meta = (*object)["metadata"];
  EXPECT_EQ(meta["name"], "allow-web");
  EXPECT_EQ(meta["namespace"], "shop");
  EXPECT_EQ(meta["labels"]["team"], "web");
  EXPECT_EQ(meta["labels"]["app.kubernetes.io/managed-by"], "krane");
  EXPECT_EQ(meta["annotations"]["note"], "hi");
  EXPECT_EQ(meta["annotations"]["krane.dev/policy.id"], "pol_1");
  EXPECT_FALSE(meta.contains("resourceVersion"));
  EXPECT_FALSE(meta.contains("uid"));
  EXPECT_FALSE(object->contains("status")) << "status is Cilium's to write";
}

TEST(CiliumPolicy, SpecsNameAndNamespaceChoices) {
  json body = {
      {"specs",
       json::array({rule(), {{"nodeSelector", json::object()}, {"egress", json::array()}}})}};
  auto p = policy(body);
  p.set_name("named-by-the-message");
  auto object = policyObject(p, "pol_1", "fallback-ns");
  ASSERT_TRUE(object.ok()) << object.status();
  EXPECT_EQ((*object)["specs"].size(), 2u);
  EXPECT_FALSE(object->contains("spec"));
  EXPECT_EQ((*object)["metadata"]["name"], "named-by-the-message");
  EXPECT_EQ((*object)["metadata"]["namespace"], "fallback-ns");

  // The same name in the message and in the object is fine.
  json same = {{"metadata", {{"name", "named-by-the-message"}}}, {"spec", rule()}};
  p.set_policy_json(same.dump());
  EXPECT_TRUE(policyObject(p, "pol_1").ok());

  // Ids that are not label values are still identified through the annotation.
  auto odd = policy(rule());
  auto object2 = policyObject(odd, "pol/with spaces");
  ASSERT_TRUE(object2.ok()) << object2.status();
  EXPECT_FALSE((*object2)["metadata"]["labels"].contains("krane.dev/policy.id"));
  EXPECT_EQ((*object2)["metadata"]["annotations"]["krane.dev/policy.id"], "pol/with spaces");
  EXPECT_TRUE(isDnsSubdomain((*object2)["metadata"]["name"]));
}

TEST(CiliumPolicy, RefusesWhatCanNeverBeApplied) {
  auto p = policy(rule());
  p.set_policy_json("");
  EXPECT_THAT(error(p), HasSubstr("policy_json: required"));
  p.set_policy_json("{\"endpointSelector\": ");
  EXPECT_THAT(error(p), HasSubstr("policy_json: not valid JSON"));
  p.set_policy_json("[1]");
  EXPECT_THAT(error(p), HasSubstr("policy_json: must be a JSON object, got an array"));

  json wrong_kind = {{"kind", "NetworkPolicy"}, {"spec", rule()}};
  EXPECT_THAT(error(policy(wrong_kind)),
              HasSubstr("policy_json.kind: must be CiliumNetworkPolicy, got \"NetworkPolicy\""));
  json wrong_version = {{"apiVersion", "cilium.io/v1"}, {"spec", rule()}};
  EXPECT_THAT(error(policy(wrong_version)),
              HasSubstr("policy_json.apiVersion: must be cilium.io/v2"));
  json extra = {{"spec", rule()}, {"data", 1}};
  EXPECT_THAT(error(policy(extra)), HasSubstr("policy_json.data: unknown field"));
  json no_spec = {{"metadata", {{"name", "x"}}}};
  EXPECT_THAT(error(policy(no_spec)), HasSubstr("policy_json: spec required"));
  json empty_specs = {{"specs", json::array()}};
  EXPECT_THAT(error(policy(empty_specs)), HasSubstr("policy_json: spec required"));

  json typo = rule();
  typo["ingres"] = json::array();
  EXPECT_THAT(error(policy(typo)), HasSubstr("policy_json.ingres: unknown field"));
  json not_array = rule();
  not_array["ingress"] = json::object();
  EXPECT_THAT(error(policy(not_array)),
              HasSubstr("policy_json.ingress: must be an array, got an object"));
  json not_object = rule();
  not_object["egress"] = json::array({"x"});
  EXPECT_THAT(error(policy({{"spec", not_object}})),
              HasSubstr("policy_json.spec.egress[0]: must be an object, got a string"));
  json no_selector = {{"ingress", json::array()}};
  EXPECT_THAT(error(policy(no_selector)), HasSubstr("policy_json: endpointSelector required"));
  json both = rule();
  both["nodeSelector"] = json::object();
  EXPECT_THAT(error(policy({{"specs", json::array({rule(), both})}})),
              HasSubstr("policy_json.specs[1]: endpointSelector and nodeSelector are mutually"));

  json owner = {{"metadata", {{"ownerReferences", json::array()}}}, {"spec", rule()}};
  EXPECT_THAT(error(policy(owner)),
              HasSubstr("policy_json.metadata.ownerReferences: not supported"));
  json label_type = {{"metadata", {{"labels", {{"a", 1}}}}}, {"spec", rule()}};
  EXPECT_THAT(error(policy(label_type)),
              HasSubstr("policy_json.metadata.labels.a: must be a string"));

  json bad_name = {{"metadata", {{"name", "Allow_Web"}}}, {"spec", rule()}};
  EXPECT_THAT(error(policy(bad_name)),
              HasSubstr("policy_json.metadata.name: \"Allow_Web\" is not a valid object name"));
  auto mismatch = policy({{"metadata", {{"name", "a"}}}, {"spec", rule()}});
  mismatch.set_name("b");
  EXPECT_THAT(error(mismatch), HasSubstr("policy_json.metadata.name: \"a\" differs"));
  auto bad_message_name = policy(rule());
  bad_message_name.set_name("-x");
  EXPECT_THAT(error(bad_message_name), HasSubstr("name: \"-x\" is not a valid object name"));
  json bad_ns = {{"metadata", {{"namespace", "a.b"}}}, {"spec", rule()}};
  EXPECT_THAT(error(policy(bad_ns)),
              HasSubstr("policy_json.metadata.namespace: \"a.b\" is not a valid namespace"));
  auto no_workspace = policy(rule());
  no_workspace.clear_workspace_id();
  EXPECT_THAT(error(no_workspace), HasSubstr("workspace_id: required"));
  // ... unless the plugin is configured with a namespace.
  EXPECT_TRUE(policyObject(no_workspace, "pol_1", "policies").ok());

  auto no_id = policy(rule());
  EXPECT_FALSE(policyObject(no_id, "").ok());
}

TEST(CiliumPolicy, DnsLabelsAreValidAndDistinct) {
  std::set<std::string> seen;
  for (const std::string& id :
       std::vector<std::string>{"abc", "ABC", "a_b", "a-b", "a.b", "_", "-a-", std::string(80, 'x'),
                                std::string(80, 'x') + "y", "ws_1", "ws-1"}) {
    const std::string label = dnsLabel("", id);
    EXPECT_TRUE(isDnsLabel(label)) << id << " -> " << label;
    EXPECT_TRUE(seen.insert(label).second) << id << " collides: " << label;
    EXPECT_TRUE(isDnsLabel(dnsLabel("krane-policy", id)));
  }
  EXPECT_EQ(dnsLabel("", "abc"), "abc") << "a clean id is kept as it is";
  EXPECT_FALSE(isDnsLabel("a.b"));
  EXPECT_TRUE(isDnsSubdomain("a.b"));
  EXPECT_FALSE(isDnsSubdomain("a..b"));
  EXPECT_TRUE(isLabelValue("Pol_1.x"));
  EXPECT_FALSE(isLabelValue("pol 1"));
}

}  // namespace
}  // namespace krane::cilium
