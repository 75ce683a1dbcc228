// Every object the plugins generate (generators.h), validated against the upstream schemas:
// Kubernetes' own kinds with the kubernetes-models npm package (tools/schema/validate.mjs), the
// Cilium policies with the upstream CiliumNetworkPolicy CRD (tests/support/k8s_schema.h). Any
// violation fails. The negative tests prove the validators reject what is broken, so the
// positive test cannot pass by checking nothing.
#include <stdlib.h>

#include <map>
#include <set>

#include <catch2/catch.hpp>

#include "common/strings.h"
#include "tests/schema/generators.h"
#include "tests/schema/node_validator.h"
#include "tests/support/k8s_schema.h"
#include "tests/support/matchers.h"

namespace krane::schema {
namespace {

using nlohmann::json;

bool isCilium(const json& object) {
  return object.value("apiVersion", "").rfind("cilium.io/", 0) == 0;
}

std::string tmpDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir ? dir : "/tmp";
}

testing::K8sSchemas crdSchemas() {
  auto dir = testing::K8sSchemas::defaultDir();
  CHECK_THAT(dir, IsOk());
  auto schemas = testing::K8sSchemas::load(dir.ok() ? *dir : "/nonexistent");
  CHECK_THAT(schemas, IsOk());
  return schemas.ok() ? *std::move(schemas) : testing::K8sSchemas();
}

std::string joined(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& l : lines) strAppend(&out, l, "\n");
  return out;
}

TEST_CASE("every generated object matches the upstream schemas", "[schema]") {
  std::vector<json> kube;
  std::vector<GeneratedObject> cilium;
  std::map<std::string, int> per_plugin;
  std::set<std::string> kinds;
  for (const auto& generator : generators()) {
    for (auto& generated : generator.render()) {
      INFO(generated.origin);
      REQUIRE_FALSE(generated.object.is_null());
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
    INFO(generator.plugin << " generated nothing");
    CHECK(per_plugin[generator.plugin] > 0);
  }
  // What the plugins are known to make; a kind missing here means a generator lost its objects.
  for (const std::string kind :
       {"apps/v1 Deployment", "v1 Service", "policy/v1 PodDisruptionBudget",
        "cilium.io/v2 CiliumNetworkPolicy"}) {
    INFO(kind);
    CHECK(kinds.count(kind));
  }

  auto result = validateObjects(kube, tmpDir());
  REQUIRE_THAT(result, IsOk());
  INFO(result->output);
  CHECK(result->exit_code == 0);
  INFO(joined(result->violations));
  CHECK(result->violations.empty());
  CHECK_THAT(result->output,
             Catch::Contains(strCat("validate: ", kube.size(), " objects, 0 violations")));

  const auto schemas = crdSchemas();
  REQUIRE(schemas.has("cilium.io/v2", "CiliumNetworkPolicy"));
  for (const auto& generated : cilium) {
    INFO(generated.origin << "\n" << generated.object.dump(2));
    CHECK(schemas.violations(generated.object).empty());
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
  FAIL_CHECK("the sentinel generator made no Deployment");
  return json::object();
}

TEST_CASE("the validator rejects broken objects naming kind name and path", "[schema]") {
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
  REQUIRE_THAT(result, IsOk());
  INFO(result->output);
  CHECK(result->exit_code == 1);
  const std::string out = joined(result->violations);
  CHECK_THAT(out,
             Catch::Contains("Deployment sentinel/wrong-type: spec.replicas: must be integer"));
  CHECK_THAT(out,
             Catch::Contains("Deployment sentinel/unknown-field: "
                             "spec.template.spec.containers[0].imagePullPolicyy: unknown field"));
  CHECK_THAT(out, Catch::Contains("Deployment sentinel/unknown-field: "
                                  "spec.strategy.rollingUpdate.maxSurges: unknown field"));
  CHECK_THAT(out, Catch::Contains("Deployment sentinel/missing: spec.selector: required"));
  CHECK_THAT(out, Catch::Contains("Deployment sentinel/bad-enum: "
                                  "spec.template.spec.containers[0].ports[0].protocol:"));
  CHECK_THAT(out, Catch::Contains("Deploymint k: apps/v1 Deploymint: no such kind"));
  CHECK_THAT(out,
             Catch::Contains("Widget w: example.com/v1 Widget: not a kind this validator knows"));
  INFO("the valid one passes");
  CHECK_THAT(out, !Catch::Contains("sentinel/good"));
  INFO(out);
  CHECK(result->violations.size() == 7u);
}

// The sentinel Deployment whose pod has the configured node class and credentials.
json sentinelWithCredentials(const std::string& name) {
  for (const auto& generated : sentinelObjects()) {
    if (generated.object["kind"] == "Deployment" &&
        generated.origin.find("custom pod and credentials") != std::string::npos) {
      json copy = generated.object;
      copy["metadata"]["name"] = name;
      return copy;
    }
  }
  FAIL_CHECK("the sentinel generator made no Deployment with credentials");
  return json::object();
}

TEST_CASE("sentinel scheduling, probes and credentials are in the schema checks", "[schema]") {
  const json good = sentinelWithCredentials("good");
  const json& pod = good["spec"]["template"]["spec"];
  const json& container = pod["containers"][0];
  // What the generator must have made for the checks below to mean something.
  REQUIRE(pod["nodeSelector"]["node-class"] == "sentinel");
  REQUIRE(pod["tolerations"][0]["effect"] == "NoSchedule");
  REQUIRE(container["livenessProbe"]["httpGet"]["path"] !=
          container["readinessProbe"]["httpGet"]["path"]);
  int secret_ref = -1;  // the first env var from a Secret
  for (size_t i = 0; i < container["env"].size(); ++i) {
    const json& e = container["env"][i];
    INFO(e.dump());
    if (e.contains("valueFrom")) {
      if (secret_ref < 0) secret_ref = static_cast<int>(i);
      CHECK_FALSE(e.contains("value"));
    }
  }
  REQUIRE(secret_ref >= 0);
  REQUIRE(container["envFrom"][0]["secretRef"]["name"] == "sentinel-clickhouse");

  json toleration = sentinelWithCredentials("toleration");
  toleration["spec"]["template"]["spec"]["tolerations"][0]["tolerationSecond"] = 5;
  json selector = sentinelWithCredentials("selector");
  selector["spec"]["template"]["spec"]["nodeSelector"]["node-class"] = 1;
  json secret = sentinelWithCredentials("secret");
  for (auto& e : secret["spec"]["template"]["spec"]["containers"][0]["env"]) {
    if (e.contains("valueFrom")) e["valueFrom"]["secretKeyRef"].erase("key");
  }
  json probe = sentinelWithCredentials("probe");
  probe["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["port"] = true;

  auto result = validateObjects({good, toleration, selector, secret, probe}, tmpDir());
  REQUIRE_THAT(result, IsOk());
  INFO(result->output);
  CHECK(result->exit_code == 1);
  const std::string out = joined(result->violations);
  INFO(out);
  CHECK_THAT(out, Catch::Contains("Deployment sentinel/toleration: "
                                  "spec.template.spec.tolerations[0].tolerationSecond"));
  CHECK_THAT(out, Catch::Contains("Deployment sentinel/selector: "
                                  "spec.template.spec.nodeSelector.node-class"));
  CHECK_THAT(out, Catch::Contains(strCat("Deployment sentinel/secret: spec.template.spec"
                                         ".containers[0].env[",
                                         secret_ref, "].valueFrom.secretKeyRef.key: required")));
  CHECK_THAT(out, Catch::Contains("Deployment sentinel/probe: spec.template.spec.containers[0]"
                                  ".readinessProbe.httpGet.port"));
  CHECK_THAT(out, !Catch::Contains("sentinel/good"));
}

TEST_CASE("the cilium schema rejects a broken policy", "[schema]") {
  const auto schemas = crdSchemas();
  json policy;
  for (const auto& generated : ciliumObjects()) {
    if (generated.object.contains("spec") && generated.object["spec"].contains("ingress")) {
      policy = generated.object;
      break;
    }
  }
  REQUIRE_FALSE(policy.is_null());
  CHECK(schemas.violations(policy).empty());
  policy["spec"]["ingress"][0]["toPorts"][0]["ports"][0]["protocol"] = "HTTP";
  policy["spec"]["ingress"][0]["fromEndpointz"] = json::array();
  const std::string out = joined(schemas.violations(policy));
  CHECK_THAT(out, Catch::Contains("spec.ingress[0].toPorts[0].ports[0].protocol"));
  CHECK_THAT(out, Catch::Contains("spec.ingress[0].fromEndpointz"));
}

}  // namespace
}  // namespace krane::schema
