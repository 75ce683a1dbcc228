// The Cilium plugin's objects for the policy shapes that matter: just a spec, a whole object with
// its own metadata, several rules (specs), egress to CIDRs / FQDNs / entities, deny rules, a
// node selector, default-deny settings, ids that are not label values.
#include "common/strings.h"
#include "controlplane/services/deploy/environment_resources.h"
#include "plugins/cilium/policy.h"
#include "tests/schema/generators.h"

namespace krane::schema {
namespace {

using nlohmann::json;

json ingressFromSentinels() {
  return {
      {"endpointSelector", {{"matchLabels", {{"krane.dev/deployment.id", "dep_1"}}}}},
      {"ingress",
       json::array(
           {{{"fromEndpoints",
              json::array({{{"matchLabels", {{"k8s:io.kubernetes.pod.namespace", "sentinel"}}}}})},
             {"toPorts", json::array({{{"ports", json::array({{{"port", "8080"},
                                                               {"protocol", "TCP"}}})}}})}}})},
  };
}

json egress() {
  return {
      {"endpointSelector", json::object()},
      {"egress",
       json::array({
           {{"toEntities", json::array({"world"})},
            {"toPorts",
             json::array({{{"ports", json::array({{{"port", "443"}, {"protocol", "TCP"}}})}}})}},
           {{"toCIDRSet",
             json::array({{{"cidr", "0.0.0.0/0"},
                           {"except", json::array({"10.0.0.0/8", "192.168.0.0/16"})}}})}},
           {{"toFQDNs", json::array({{{"matchName", "api.example.com"}},
                                     {{"matchPattern", "*.example.org"}}})}},
           {{"toEndpoints", json::array({{{"matchLabels",
                                           {{"k8s:io.kubernetes.pod.namespace", "kube-system"},
                                            {"k8s-app", "kube-dns"}}}}})},
            {"toPorts",
             json::array({{{"ports", json::array({{{"port", "53"}, {"protocol", "ANY"}}})},
                           {"rules", {{"dns", json::array({{{"matchPattern", "*"}}})}}}}})}},
       })},
      {"egressDeny", json::array({{{"toCIDR", json::array({"169.254.169.254/32"})}}})},
      {"enableDefaultDeny", {{"ingress", true}, {"egress", false}}},
      {"description", "egress to the world except private ranges"},
  };
}

cluster::v1::CiliumNetworkPolicy policy(const std::string& id, const json& body) {
  cluster::v1::CiliumNetworkPolicy p;
  p.set_policy_id(id);
  p.set_workspace_id("ws_1");
  p.set_project_id("proj_1");
  p.set_environment_id("env_prod");
  p.set_region("eu-west-1");
  p.set_policy_json(body.dump());
  return p;
}

}  // namespace

std::vector<GeneratedObject> ciliumObjects() {
  std::vector<std::pair<std::string, cluster::v1::CiliumNetworkPolicy>> variants;
  variants.emplace_back("just a spec", policy("pol_1", ingressFromSentinels()));
  json whole = {{"apiVersion", "cilium.io/v2"},
                {"kind", "CiliumNetworkPolicy"},
                {"metadata",
                 {{"name", "allow-sentinels"},
                  {"namespace", "shop"},
                  {"labels", {{"team", "web"}}},
                  {"annotations", {{"owner", "web@example.com"}}},
                  {"resourceVersion", "17"}}},
                {"spec", ingressFromSentinels()},
                {"status", json::object()}};
  variants.emplace_back("a whole object", policy("pol_2", whole));
  variants.emplace_back("egress, deny, default deny", policy("pol_3", egress()));
  json specs = {{"specs", json::array({ingressFromSentinels(), egress()})}};
  variants.emplace_back("several rules", policy("pol_4", specs));
  json node = {{"nodeSelector", {{"matchLabels", {{"node-class", "edge"}}}}},
               {"ingressDeny", json::array({{{"fromEntities", json::array({"world"})}}})}};
  variants.emplace_back("node selector, ingress deny", policy("pol_5", node));
  auto named = policy("Pol With Spaces/and slashes", ingressFromSentinels());
  named.set_name("named.by.the.control-plane");
  variants.emplace_back("odd id, explicit name", named);
  services::v1::DeploymentInfo info;
  info.set_workspace_id("ws_1");
  info.set_project_id("proj_1");
  info.set_app_id("app_1");
  info.set_environment_id("env_prod");
  variants.emplace_back(
      "the environment policy a deploy writes",
      services::deploy::environmentPolicy(info, "eu-west-1", "cnp_0123456789abcdef")
          .cilium_network_policy());

  std::vector<GeneratedObject> out;
  for (const auto& [variant, p] : variants) {
    auto object = cilium::policyObject(p, p.policy_id());
    if (!object.ok()) {
      // An object the plugin refuses is not generated; say so through a marker the test reports.
      out.push_back(
          {strCat("cilium ", variant, ": refused: ", object.status().message()), nlohmann::json()});
      continue;
    }
    out.push_back({strCat("cilium ", variant), *object});
  }
  return out;
}

}  // namespace krane::schema
