// manifests/: every document validated with the kubernetes-models schemas (the validator of
// tools/schema), the agent's ConfigMap accepted by the real `krane check-config`, krane-ctrl's by
// its config loader, and the pieces that must agree with each other (mount paths and the
// configuration, RBAC and what the plugins use, the images and the plugin paths).
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <catch2/catch.hpp>
#include <yaml-cpp/yaml.h>

#include "common/strings.h"
#include "controlplane/config.h"
#include "nlohmann/json.hpp"
#include "tests/schema/node_validator.h"
#include "tests/support/matchers.h"
#include "tests/support/process.h"

namespace krane {
namespace {

using nlohmann::json;
using testing::runCommand;
using testing::runfile;

constexpr const char* kFiles[] = {"manifests/namespace.yaml", "manifests/agent.yaml",
                                  "manifests/krane-ctrl.yaml"};

json toJson(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map: {
      json out = json::object();
      for (const auto& kv : node) out[kv.first.as<std::string>()] = toJson(kv.second);
      return out;
    }
    case YAML::NodeType::Sequence: {
      json out = json::array();
      for (const auto& item : node) out.push_back(toJson(item));
      return out;
    }
    case YAML::NodeType::Scalar: {
      int64_t i = 0;
      bool b = false;
      if (node.Tag() != "!" && YAML::convert<int64_t>::decode(node, i)) return i;
      if (node.Tag() != "!" && YAML::convert<bool>::decode(node, b)) return b;
      return node.as<std::string>();
    }
    default:
      return nullptr;
  }
}

// Every document of every manifest, keyed "Kind namespace/name".
std::map<std::string, json> documents() {
  std::map<std::string, json> out;
  for (const char* file : kFiles) {
    for (const auto& doc : YAML::LoadAllFromFile(runfile(file))) {
      if (!doc.IsMap()) continue;
      json j = toJson(doc);
      const std::string key =
          strCat(j["kind"].get<std::string>(), " ", j["metadata"].value("namespace", ""), "/",
                 j["metadata"]["name"].get<std::string>());
      INFO(key << " twice");
      CHECK_FALSE(out.count(key));
      out[key] = j;
    }
  }
  return out;
}

std::string tmpFile(const std::string& name, const std::string& text) {
  const char* dir = std::getenv("TEST_TMPDIR");
  std::string path = strCat(dir ? dir : "/tmp", "/", name);
  std::ofstream(path) << text;
  return path;
}

const json& container(const json& workload, const std::string& name) {
  for (const auto& c : workload["spec"]["template"]["spec"]["containers"]) {
    if (c["name"] == name) return c;
  }
  static const json none;
  FAIL_CHECK("no container " << name);
  return none;
}

// Where volume `volume` is mounted in `c`.
std::string mountPath(const json& c, const std::string& volume) {
  for (const auto& m : c["volumeMounts"]) {
    if (m["name"] == volume) return m["mountPath"];
  }
  FAIL_CHECK("volume " << volume << " is not mounted");
  return "";
}

const json& volume(const json& workload, const std::string& name) {
  for (const auto& v : workload["spec"]["template"]["spec"]["volumes"]) {
    if (v["name"] == name) return v;
  }
  static const json none;
  FAIL_CHECK("no volume " << name);
  return none;
}

TEST_CASE("every document matches the upstream schemas", "[manifests]") {
  std::vector<std::string> files;
  for (const char* f : kFiles) files.push_back(runfile(f));
  auto result = schema::validateYamlFiles(files);
  REQUIRE_THAT(result, IsOk());
  INFO(result->output);
  CHECK(result->exit_code == 0);
  INFO(result->output);
  CHECK(result->violations.empty());
  CHECK_THAT(result->output,
             Catch::Contains(strCat("validate: ", documents().size(), " objects, 0 violations")));
}

TEST_CASE("the validator rejects a broken manifest", "[manifests]") {
  std::string text = testing::slurp(runfile("manifests/agent.yaml"));
  // A misspelt field and a wrong type, the mistakes a hand-edited manifest gets.
  const std::string mount = "          volumeMounts:";
  REQUIRE(text.find(mount) != std::string::npos);
  text.replace(text.find(mount), mount.size(), "          volumeMount:");
  const std::string unavailable = "maxUnavailable: 1";
  REQUIRE(text.find(unavailable) != std::string::npos);
  text.replace(text.find(unavailable), unavailable.size(), "maxUnavailable: [1]");
  auto result = schema::validateYamlFiles({tmpFile("broken-agent.yaml", text)});
  REQUIRE_THAT(result, IsOk());
  INFO(result->output);
  CHECK(result->exit_code == 1);
  CHECK_THAT(result->output,
             Catch::Contains("DaemonSet krane-system/krane-agent: "
                             "spec.template.spec.containers[0].volumeMount: unknown field"));
  CHECK_THAT(
      result->output,
      Catch::Contains(
          "DaemonSet krane-system/krane-agent: spec.updateStrategy.rollingUpdate.maxUnavailable"));
}

TEST_CASE("the agent config is accepted by krane and matches the daemon set", "[manifests]") {
  auto docs = documents();
  const json& cm = docs.at("ConfigMap krane-system/krane-agent");
  const std::string config_text = cm["data"]["agent.yaml"];
  const std::string config = tmpFile("agent.yaml", config_text);
  const auto checked = runCommand({runfile("agent/krane"), "check-config", "--config", config});
  INFO(checked.out << checked.err);
  CHECK(checked.exit_code == 0);
  CHECK_THAT(checked.out,
             Catch::Contains("valid (region eu-west-1, runtime kubernetes, leader lease, "
                             "plugins: deployment, sentinel, cilium)"));

  // The same loader refuses a mistake, naming the key.
  const auto bad = runCommand({runfile("agent/krane"), "check-config", "--config",
                               tmpFile("bad.yaml", config_text + "resync_intervall_s: 5\n")});
  CHECK(bad.exit_code == 1);
  CHECK_THAT(bad.err, Catch::Contains("resync_intervall_s"));

  const YAML::Node agent = YAML::Load(config_text);
  const json& ds = docs.at("DaemonSet krane-system/krane-agent");
  const json& krane = container(ds, "krane");
  CHECK(ds["spec"]["updateStrategy"]["type"] == "RollingUpdate");
  // The configuration is read from where the ConfigMap is mounted.
  CHECK(volume(ds, "config")["configMap"]["name"] == "krane-agent");
  const json args = krane["args"];
  const auto flag = std::find(args.begin(), args.end(), "--config");
  REQUIRE(flag != args.end());
  CHECK(*std::next(flag) == strCat(mountPath(krane, "config"), "/agent.yaml"));
  // The state directory is the node's, so a replaced pod on the node resumes from its cursors.
  CHECK(agent["state_dir"].as<std::string>() == mountPath(krane, "state"));
  CHECK(volume(ds, "state").contains("hostPath"));
  // The token is the mounted Secret.
  CHECK(agent["control_plane"]["token_file"].as<std::string>() ==
        strCat(mountPath(krane, "token"), "/token"));
  CHECK(volume(ds, "token")["secret"]["secretName"] == "krane-agent-token");
  // The control plane's address is its Service.
  CHECK(agent["control_plane"]["address"].as<std::string>() == "krane-ctrl.krane-system.svc:7070");
  CHECK(docs.count("Service krane-system/krane-ctrl"));

  // Every plugin the configuration loads is in the agent image.
  const std::string image = testing::slurp(runfile("manifests/images/krane.Containerfile"));
  for (const auto& plugin : agent["plugins"]) {
    const std::string path = plugin["path"].as<std::string>();
    const std::string file = path.substr(path.rfind('/') + 1);
    INFO(path);
    CHECK_THAT(image, Catch::Contains("plugins/" + file));
    INFO(path);
    CHECK(path.rfind("/usr/lib/krane/plugins/", 0) == 0u);
  }
  CHECK_THAT(image, Catch::Contains("FROM debian:12-slim"));
  CHECK_THAT(image, Catch::Contains("bin/krane-plugin-host"));
}

TEST_CASE("rbac grants what the plugins use and nothing more", "[manifests]") {
  auto docs = documents();
  const json& role = docs.at("ClusterRole /krane-agent");
  std::map<std::string, std::set<std::string>> grants;  // "group/resource" -> verbs
  for (const auto& rule : role["rules"]) {
    for (const auto& group : rule["apiGroups"]) {
      for (const auto& resource : rule["resources"]) {
        for (const auto& verb : rule["verbs"]) {
          CHECK(verb != "*");
          CHECK(resource != "*");
          grants[strCat(group.get<std::string>(), "/", resource.get<std::string>())].insert(verb);
        }
      }
    }
  }
  const std::set<std::string> write = {"get",    "list",  "watch", "create",
                                       "update", "patch", "delete"};
  const std::set<std::string> read = {"get", "list", "watch"};
  const std::map<std::string, std::set<std::string>> expected = {
      {"/namespaces", write},
      {"/services", write},
      {"/pods", read},
      {"apps/deployments", write},
      {"apps/replicasets", read},
      {"autoscaling/horizontalpodautoscalers", write},
      {"networking.k8s.io/networkpolicies", write},
      {"policy/poddisruptionbudgets", write},
      {"cilium.io/ciliumnetworkpolicies", write},
  };
  CHECK(grants == expected);

  // Leases only in the agents' namespace.
  const json& leader = docs.at("Role krane-system/krane-agent-leader");
  REQUIRE(leader["rules"].size() == 1u);
  CHECK(leader["rules"][0]["apiGroups"] == json::array({"coordination.k8s.io"}));
  CHECK(leader["rules"][0]["resources"] == json::array({"leases"}));

  // The bindings name the account the DaemonSet runs as.
  const std::string account = docs.at(
      "DaemonSet krane-system/krane-agent")["spec"]["template"]["spec"]["serviceAccountName"];
  CHECK(docs.count("ServiceAccount krane-system/" + account));
  for (const char* binding :
       {"ClusterRoleBinding /krane-agent", "RoleBinding krane-system/krane-agent-leader"}) {
    INFO(binding);
    CHECK(docs.at(binding)["subjects"][0]["name"] == account);
    INFO(binding);
    CHECK(docs.at(binding)["subjects"][0]["namespace"] == "krane-system");
  }
}

TEST_CASE("the ctrl config is accepted and matches its deployment", "[manifests]") {
  auto docs = documents();
  const std::string config_text = docs.at("ConfigMap krane-system/krane-ctrl")["data"]["ctrl.yaml"];
  auto config = ctrl::parseCtrlConfig(config_text, "ctrl.yaml");
  REQUIRE_THAT(config, IsOk());
  INFO("the DSN is a secret: $KRANE_DSN from the Secret");
  CHECK(config->database.dsn.empty());

  const json& deployment = docs.at("Deployment krane-system/krane-ctrl");
  REQUIRE(deployment["spec"]["template"]["spec"]["containers"].size() == 1u);
  const json& ctrl = container(deployment, "krane-ctrl");
  const json args = ctrl["args"];
  const auto flag = std::find(args.begin(), args.end(), "--config");
  REQUIRE(flag != args.end());
  CHECK(*std::next(flag) == strCat(mountPath(ctrl, "config"), "/ctrl.yaml"));
  CHECK(config->auth.operator_tokens_file ==
        strCat(mountPath(ctrl, "secrets"), "/operator-tokens"));
  CHECK(volume(deployment, "secrets")["secret"]["secretName"] == "krane-ctrl");
  bool dsn_from_secret = false;
  for (const auto& env : ctrl["env"]) {
    if (env["name"] == "KRANE_DSN") {
      dsn_from_secret = env["valueFrom"]["secretKeyRef"]["name"] == "krane-ctrl";
    }
  }
  CHECK(dsn_from_secret);

  // The Service's ports are the container's, and the config listens on them.
  std::set<std::string> ports;
  for (const auto& p : ctrl["ports"]) ports.insert(p["name"]);
  for (const auto& p : docs.at("Service krane-system/krane-ctrl")["spec"]["ports"]) {
    INFO(p.dump());
    CHECK(ports.count(p["targetPort"]));
  }
  CHECK(config->listen == "0.0.0.0:7070");
  CHECK(config->http_listen == "0.0.0.0:7071");
  CHECK_THAT(testing::slurp(runfile("manifests/images/krane-ctrl.Containerfile")),
             Catch::Contains("COPY bin/krane-ctrl /usr/bin/"));
}

}  // namespace
}  // namespace krane
