// manifests/: every document validated with the kubernetes-models schemas (the validator of
// tools/schema), the agent's ConfigMap accepted by the real `krane check-config`, krane-ctrl's by
// its config loader, and the pieces that must agree with each other (mount paths and the
// configuration, the agent's RBAC and the table of docs/plugins.md, the images and the plugin
// paths). Least privilege is checked as such, on the manifests and on copies with the mistakes it
// rules out: no namespace delete, no cluster-wide PodDisruptionBudgets, no Secrets or wildcards;
// every container non-root, read-only, without privilege escalation or capabilities, with probes.
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <catch2/catch.hpp>
#include <yaml-cpp/yaml.h>

#include "common/strings.h"
#include "controlplane/config.h"
#include "ipc/cursor_store.h"
#include "nlohmann/json.hpp"
#include "plugins/sentinel/sentinel.h"
#include "tests/schema/node_validator.h"
#include "tests/support/matchers.h"
#include "tests/support/process.h"

namespace krane {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::runCommand;
using testing::runfile;

constexpr const char* kFiles[] = {"manifests/namespace.yaml", "manifests/agent.yaml",
                                  "manifests/krane-ctrl.yaml", "manifests/sentinel.yaml"};

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
  const auto at = text.find(mount, text.find("      containers:\n"));
  REQUIRE(at != std::string::npos);
  text.replace(at, mount.size(), "          volumeMount:");
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

// What the agent's service account may do: "<scope> <group>/<resource>" -> verbs, where scope is
// "cluster" for a ClusterRoleBinding and the namespace for a RoleBinding (of a Role or a
// ClusterRole). Every binding of the account counts, whichever file holds it.
using Grants = std::map<std::string, std::set<std::string>>;

constexpr char kAgentAccount[] = "krane-agent";

Grants grantsOf(const std::map<std::string, json>& docs, const std::string& account,
                const std::string& account_ns) {
  Grants out;
  for (const auto& [key, doc] : docs) {
    const std::string kind = doc["kind"];
    if (kind != "ClusterRoleBinding" && kind != "RoleBinding") continue;
    bool bound = false;
    for (const auto& subject : doc.value("subjects", json::array())) {
      bound |= subject.value("kind", "") == "ServiceAccount" &&
               subject.value("name", "") == account && subject.value("namespace", "") == account_ns;
    }
    if (!bound) continue;
    const std::string ns = doc["metadata"].value("namespace", "");
    const json& ref = doc["roleRef"];
    const std::string role = ref["kind"] == "ClusterRole"
                                 ? strCat("ClusterRole /", ref["name"].get<std::string>())
                                 : strCat("Role ", ns, "/", ref["name"].get<std::string>());
    const auto found = docs.find(role);
    if (found == docs.end()) {
      FAIL_CHECK(key << " binds " << role << ", which is not in the manifests");
      continue;
    }
    const std::string scope = kind == "ClusterRoleBinding" ? "cluster" : ns;
    for (const auto& rule : found->second.value("rules", json::array())) {
      for (const auto& group : rule.value("apiGroups", json::array({"*"}))) {
        for (const auto& resource : rule.value("resources", json::array({"*"}))) {
          for (const auto& verb : rule["verbs"]) {
            out[strCat(scope, " ", group.get<std::string>(), "/", resource.get<std::string>())]
                .insert(verb.get<std::string>());
          }
        }
      }
    }
  }
  return out;
}

Grants agentGrants(const std::map<std::string, json>& docs) {
  return grantsOf(docs, kAgentAccount, "krane-system");
}

// What least privilege rules out, whatever the plugins' table says.
std::vector<std::string> rbacProblems(const Grants& grants) {
  std::vector<std::string> out;
  for (const auto& [key, verbs] : grants) {
    const std::string scope = key.substr(0, key.find(' '));
    const std::string what = key.substr(key.find(' ') + 1);
    if (key.find('*') != std::string::npos || verbs.count("*") > 0) {
      out.push_back(strCat("wildcard: ", key));
    }
    if (what == "/namespaces" &&
        (verbs.count("delete") > 0 || verbs.count("deletecollection") > 0)) {
      out.push_back(strCat("namespace delete: ", key));
    }
    if (scope == "cluster" && what == "policy/poddisruptionbudgets") {
      out.push_back(strCat("cluster-wide PodDisruptionBudgets: ", key));
    }
    if (what == "/secrets") out.push_back(strCat("Secrets: ", key));
    for (const char* verb : {"escalate", "bind", "impersonate", "deletecollection"}) {
      if (verbs.count(verb) > 0) out.push_back(strCat(verb, ": ", key));
    }
  }
  return out;
}

std::string render(const Grants& grants) {
  std::string out;
  for (const auto& [key, verbs] : grants) {
    strAppend(&out, key, ":");
    for (const auto& v : verbs) strAppend(&out, " ", v);
    out += "\n";
  }
  return out;
}

std::vector<std::string> splitList(const std::string& cell) {
  std::vector<std::string> out;
  std::string item;
  for (char c : cell + ",") {
    if (c == ',') {
      while (!item.empty() && item.front() == ' ') item.erase(0, 1);
      while (!item.empty() && item.back() == ' ') item.pop_back();
      if (item == "\"\"") item.clear();
      out.push_back(item);
      item.clear();
    } else if (c != '`') {
      item += c;
    }
  }
  return out;
}

// The table "| who | scope | API group | resources | verbs |" of docs/plugins.md's RBAC section.
Grants documentedGrants(const std::string& markdown) {
  Grants out;
  const auto section = markdown.find("### RBAC\n");
  REQUIRE(section != std::string::npos);
  std::istringstream lines(
      markdown.substr(section, markdown.find("\n### ", section + 1) - section));
  std::string line;
  int rows = 0;
  while (std::getline(lines, line)) {
    if (line.rfind("| ", 0) != 0) continue;
    std::vector<std::string> cells;
    std::string cell;
    for (char c : line.substr(1)) {
      if (c == '|') {
        cells.push_back(cell);
        cell.clear();
      } else {
        cell += c;
      }
    }
    INFO(line);
    REQUIRE(cells.size() == 5u);
    if (cells[0] == " who ") continue;  // the header
    std::string scope = splitList(cells[1]).at(0);
    const std::string group = splitList(cells[2]).at(0);
    for (const auto& resource : splitList(cells[3])) {
      for (const auto& verb : splitList(cells[4])) {
        out[strCat(scope, " ", group, "/", resource)].insert(verb);
      }
    }
    ++rows;
  }
  CHECK(rows > 0);
  return out;
}

TEST_CASE("rbac grants the agent exactly the table of docs/plugins.md", "[manifests]") {
  const Grants granted = agentGrants(documents());
  const Grants documented = documentedGrants(testing::slurp(runfile("docs/plugins.md")));
  INFO("manifests:\n" << render(granted) << "docs/plugins.md:\n" << render(documented));
  CHECK(granted == documented);
  // The table itself: the sentinel plugin only in its namespace, the Lease only next to the
  // agents, pods only read.
  CHECK(documented.count("sentinel policy/poddisruptionbudgets") == 1u);
  CHECK(documented.count("krane-system coordination.k8s.io/leases") == 1u);
  CHECK(documented.at("cluster /pods") == std::set<std::string>{"list", "watch"});

  // The bindings name the account the DaemonSet runs as, and the namespaces they need exist.
  auto docs = documents();
  CHECK(
      docs.at(
          "DaemonSet krane-system/krane-agent")["spec"]["template"]["spec"]["serviceAccountName"] ==
      kAgentAccount);
  CHECK(docs.count(strCat("ServiceAccount krane-system/", kAgentAccount)) == 1u);
  for (const auto& [key, doc] : docs) {
    if (doc["kind"] != "Role" && doc["kind"] != "RoleBinding") continue;
    INFO(key);
    CHECK(docs.count(strCat("Namespace /", doc["metadata"]["namespace"].get<std::string>())) == 1u);
  }
}

TEST_CASE("the sentinel pods' account may only read ConfigMaps in namespace sentinel",
          "[manifests]") {
  const auto docs = documents();
  const Grants granted = grantsOf(docs, sentinel::kServiceAccount, sentinel::kNamespace);
  INFO(render(granted));
  CHECK(granted == Grants{{"sentinel /configmaps", {"get", "list", "watch"}}});
  CHECK(docs.count(strCat("ServiceAccount sentinel/", sentinel::kServiceAccount)) == 1u);
  // The account the plugin's sentinel Deployments run as.
  cluster::v1::Sentinel s;
  s.set_sentinel_id("s1");
  s.set_environment_id("e1");
  s.set_image("registry.example/sentinel:1");
  for (const auto& object : sentinel::sentinelObjects(s)) {
    if (object["kind"] != "Deployment") continue;
    CHECK(object["spec"]["template"]["spec"]["serviceAccountName"] == sentinel::kServiceAccount);
  }
}

TEST_CASE(
    "rbac never grants a namespace delete, cluster-wide PodDisruptionBudgets, Secrets or "
    "a wildcard",
    "[manifests]") {
  const auto docs = documents();
  INFO(render(agentGrants(docs)));
  CHECK(rbacProblems(agentGrants(docs)).empty());

  // The same check on manifests with each of those mistakes.
  struct Mistake {
    std::string what;
    std::string role;  // the document that gets the rule
    json rule;
    std::string problem;
  };
  auto mistake = GENERATE(
      Mistake{"namespaces deletable",
              "ClusterRole /krane-agent",
              {{"apiGroups", {""}}, {"resources", {"namespaces"}}, {"verbs", {"delete"}}},
              "namespace delete: cluster /namespaces"},
      Mistake{
          "PodDisruptionBudgets cluster-wide",
          "ClusterRole /krane-agent",
          {{"apiGroups", {"policy"}}, {"resources", {"poddisruptionbudgets"}}, {"verbs", {"list"}}},
          "cluster-wide PodDisruptionBudgets: cluster policy/poddisruptionbudgets"},
      Mistake{"namespaces deletable in one namespace",
              "Role sentinel/krane-agent-sentinel",
              {{"apiGroups", {""}}, {"resources", {"namespaces"}}, {"verbs", {"delete"}}},
              "namespace delete: sentinel /namespaces"},
      Mistake{"a wildcard verb",
              "Role krane-system/krane-agent-leader",
              {{"apiGroups", {"coordination.k8s.io"}}, {"resources", {"leases"}}, {"verbs", {"*"}}},
              "wildcard: krane-system coordination.k8s.io/leases"},
      Mistake{"a wildcard resource",
              "ClusterRole /krane-agent",
              {{"apiGroups", {"apps"}}, {"resources", {"*"}}, {"verbs", {"get"}}},
              "wildcard: cluster apps/*"},
      Mistake{"Secrets readable",
              "Role sentinel/krane-agent-sentinel",
              {{"apiGroups", {""}}, {"resources", {"secrets"}}, {"verbs", {"get"}}},
              "Secrets: sentinel /secrets"});
  auto changed = docs;
  changed.at(mistake.role)["rules"].push_back(mistake.rule);
  INFO(mistake.what);
  CHECK_THAT(rbacProblems(agentGrants(changed)), Catch::Matchers::VectorContains(mistake.problem));
}

// Least privilege for the processes of a pod: every container with probes (init containers
// excepted) runs as a non-root user set in the manifest, with a read-only root filesystem, no
// privilege escalation and every capability dropped. An init container may run as root only with
// the capabilities to hand a directory to another user.
std::vector<std::string> podProblems(const json& workload) {
  std::vector<std::string> out;
  const json& pod = workload["spec"]["template"]["spec"];
  const json pod_context = pod.value("securityContext", json::object());
  for (const char* shared : {"hostNetwork", "hostPID", "hostIPC"}) {
    if (pod.value(shared, false)) out.push_back(strCat("pod: ", shared));
  }
  const std::set<std::string> chown_caps = {"CHOWN", "DAC_READ_SEARCH", "FOWNER"};
  const auto check = [&](const json& c, bool init) {
    const std::string name = strCat(init ? "init container " : "container ", c.value("name", ""));
    const json context = c.value("securityContext", json::object());
    const auto setting = [&](const char* key) -> json {
      if (context.contains(key)) return context[key];
      return pod_context.contains(key) ? pod_context[key] : json();
    };
    if (context.value("privileged", false)) out.push_back(name + ": privileged");
    if (context.value("allowPrivilegeEscalation", true)) {
      out.push_back(name + ": allowPrivilegeEscalation is not false");
    }
    if (!context.value("readOnlyRootFilesystem", false)) {
      out.push_back(name + ": readOnlyRootFilesystem is not true");
    }
    const json caps = context.value("capabilities", json::object());
    const json drop = caps.value("drop", json::array());
    if (std::find(drop.begin(), drop.end(), "ALL") == drop.end()) {
      out.push_back(name + ": capabilities do not drop ALL");
    }
    const json user = setting("runAsUser");
    const bool non_root = setting("runAsNonRoot") == true && user.is_number() && user != 0;
    for (const auto& cap : caps.value("add", json::array())) {
      if (non_root || !init || chown_caps.count(cap.get<std::string>()) == 0) {
        out.push_back(strCat(name, ": adds capability ", cap.get<std::string>()));
      }
    }
    if (init) return;
    if (!non_root) out.push_back(name + ": not runAsNonRoot with a non-zero runAsUser");
    for (const char* probe : {"readinessProbe", "livenessProbe"}) {
      const json p = c.value(probe, json::object());
      if (!p.contains("exec") && !p.contains("httpGet") && !p.contains("tcpSocket") &&
          !p.contains("grpc")) {
        out.push_back(strCat(name, ": no ", probe));
      }
    }
  };
  for (const auto& c : pod.value("initContainers", json::array())) check(c, true);
  for (const auto& c : pod.value("containers", json::array())) check(c, false);
  return out;
}

TEST_CASE("the agent and krane-ctrl run as non-root with probes", "[manifests]") {
  const auto docs = documents();
  for (const char* workload :
       {"DaemonSet krane-system/krane-agent", "Deployment krane-system/krane-ctrl"}) {
    INFO(workload);
    CHECK(podProblems(docs.at(workload)).empty());
  }

  // The same check on the agent's DaemonSet with each of those mistakes.
  struct Mistake {
    std::string pointer;  // JSON pointer into the DaemonSet
    json value;           // null: removed
    std::string problem;
  };
  const std::string krane = "/spec/template/spec/containers/0";
  const std::string init = "/spec/template/spec/initContainers/0";
  auto mistake = GENERATE_COPY(
      Mistake{krane + "/livenessProbe", nullptr, "container krane: no livenessProbe"},
      Mistake{krane + "/readinessProbe", nullptr, "container krane: no readinessProbe"},
      Mistake{krane + "/securityContext/runAsNonRoot", false,
              "container krane: not runAsNonRoot with a non-zero runAsUser"},
      Mistake{krane + "/securityContext/runAsUser", 0,
              "container krane: not runAsNonRoot with a non-zero runAsUser"},
      Mistake{"/spec/template/spec/securityContext/runAsUser", nullptr, ""},  // set on both
      Mistake{krane + "/securityContext/readOnlyRootFilesystem", nullptr,
              "container krane: readOnlyRootFilesystem is not true"},
      Mistake{krane + "/securityContext/allowPrivilegeEscalation", true,
              "container krane: allowPrivilegeEscalation is not false"},
      Mistake{krane + "/securityContext/capabilities/drop", json::array({"NET_RAW"}),
              "container krane: capabilities do not drop ALL"},
      Mistake{krane + "/securityContext/capabilities/add", json::array({"CHOWN"}),
              "container krane: adds capability CHOWN"},
      Mistake{init + "/securityContext/capabilities/add", json::array({"SYS_ADMIN"}),
              "init container state-dir: adds capability SYS_ADMIN"},
      Mistake{init + "/securityContext/allowPrivilegeEscalation", nullptr,
              "init container state-dir: allowPrivilegeEscalation is not false"});
  json ds = docs.at("DaemonSet krane-system/krane-agent");
  const json::json_pointer at(mistake.pointer);
  if (mistake.value.is_null()) {
    ds[at.parent_pointer()].erase(at.back());
  } else {
    ds[at] = mistake.value;
  }
  INFO(mistake.pointer);
  if (mistake.problem.empty()) {
    CHECK(podProblems(ds).empty());
  } else {
    CHECK_THAT(podProblems(ds), Catch::Matchers::VectorContains(mistake.problem));
  }
}

TEST_CASE(
    "the agent's probes check its state directory, and the image and the init container "
    "agree on its user",
    "[manifests]") {
  const auto docs = documents();
  const json& ds = docs.at("DaemonSet krane-system/krane-agent");
  const json& krane = container(ds, "krane");
  const std::string state = mountPath(krane, "state");
  const YAML::Node agent = YAML::Load(
      docs.at("ConfigMap krane-system/krane-agent")["data"]["agent.yaml"].get<std::string>());
  CHECK(agent["state_dir"].as<std::string>() == state);
  const json& readiness = krane["readinessProbe"]["exec"]["command"];
  CHECK(krane["livenessProbe"]["exec"]["command"] == readiness);
  REQUIRE(readiness.size() == 3u);
  CHECK(readiness[0] == "/bin/sh");
  const std::string script = readiness[2];
  CHECK_THAT(script, Catch::Contains(strCat("/usr/bin/krane inspect --state-dir ", state)));

  // The probe for real, with this build's krane and a state directory of the test's: healthy
  // without a store (a standby), and with a store the agent wrote; failing with a damaged one.
  const std::string dir = strCat(std::getenv("TEST_TMPDIR"), "/probe-state");
  fs::create_directories(dir);
  auto localized = [&](std::string text) {
    for (auto at = text.find("/usr/bin/krane"); at != std::string::npos;
         at = text.find("/usr/bin/krane", at + 1)) {
      text.replace(at, std::string("/usr/bin/krane").size(), runfile("agent/krane"));
    }
    for (auto at = text.find(state); at != std::string::npos; at = text.find(state, at + 1)) {
      text.replace(at, state.size(), dir);
    }
    return text;
  };
  const auto probe = [&] { return runCommand({"/bin/sh", "-c", localized(script)}); };
  CHECK(probe().exit_code == 0);
  {
    ipc::CursorStoreOptions options;
    options.region = "eu-west-1";
    options.max_resources = 1000;
    options.preallocate = false;
    auto store = ipc::CursorStore::open(dir, options);
    REQUIRE_THAT(store, IsOk());
  }
  auto healthy = probe();
  INFO(healthy.out << healthy.err);
  CHECK(healthy.exit_code == 0);
  {
    std::fstream file(strCat(dir, "/cursor.store"),
                      std::ios::in | std::ios::out | std::ios::binary);
    file.write("not a cursor store", 18);
  }
  auto damaged = probe();
  INFO(damaged.out << damaged.err);
  CHECK(damaged.exit_code != 0);

  // The state directory is handed to the user the agent runs as, on the same volume.
  const json& pod = ds["spec"]["template"]["spec"];
  const std::string user = strCat(pod["securityContext"]["runAsUser"].get<int64_t>(), ":",
                                  pod["securityContext"]["runAsGroup"].get<int64_t>());
  CHECK(krane["securityContext"]["runAsUser"] == pod["securityContext"]["runAsUser"]);
  REQUIRE(pod["initContainers"].size() == 1u);
  const json& owner = pod["initContainers"][0];
  CHECK(mountPath(owner, "state") == state);
  CHECK_THAT(owner["args"][0].get<std::string>(),
             Catch::Contains(strCat("chown -R -h ", user, " ", state)) &&
                 Catch::Contains(strCat("chmod 0700 ", state)));
  CHECK(owner["image"] == krane["image"]);
  CHECK_THAT(testing::slurp(runfile("manifests/images/krane.Containerfile")),
             Catch::Contains(strCat("USER ", user)));
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

  INFO("peer hints: the container port, and the pod's own address advertised to the others");
  CHECK(config->feed.peer_hints.listen == "*:7072");
  bool hint_port = false;
  for (const auto& p : ctrl["ports"]) {
    hint_port = hint_port || (p["name"] == "peer-hints" && p["containerPort"] == 7072);
  }
  CHECK(hint_port);
  std::map<std::string, json> env;
  for (const auto& e : ctrl["env"]) env[e["name"]] = e;
  REQUIRE(env.count("POD_IP"));
  CHECK(env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP");
  REQUIRE(env.count("KRANE_PEER_HINTS_ADVERTISE"));
  CHECK(env["KRANE_PEER_HINTS_ADVERTISE"]["value"] == "$(POD_IP):7072");
  INFO("only krane-ctrl pods reach the hint port; gRPC and HTTP stay open");
  const json& policy = docs.at("NetworkPolicy krane-system/krane-ctrl")["spec"];
  CHECK(policy["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == "krane-ctrl");
  std::map<int, json> from_by_port;  // port -> the rule's `from` (null: from anywhere)
  for (const auto& rule : policy["ingress"]) {
    for (const auto& p : rule["ports"]) {
      from_by_port[p["port"].get<int>()] = rule.contains("from") ? rule["from"] : json();
    }
  }
  CHECK(from_by_port.count(7070));
  CHECK(from_by_port[7070].is_null());
  CHECK(from_by_port[7071].is_null());
  REQUIRE(from_by_port.count(7072));
  REQUIRE(from_by_port[7072].size() == 1u);
  CHECK(from_by_port[7072][0]["podSelector"]["matchLabels"]["app.kubernetes.io/name"] ==
        "krane-ctrl");
  INFO("POD_IP comes first: Kubernetes expands $(VAR) only from variables defined before");
  std::vector<std::string> order;
  for (const auto& e : ctrl["env"]) order.push_back(e["name"]);
  CHECK(std::find(order.begin(), order.end(), "POD_IP") <
        std::find(order.begin(), order.end(), "KRANE_PEER_HINTS_ADVERTISE"));
  CHECK_THAT(testing::slurp(runfile("manifests/images/krane-ctrl.Containerfile")),
             Catch::Contains("COPY bin/krane-ctrl /usr/bin/"));
}

// The Debian packages an image's `apt-get install` names (the words after `install` that are no
// option, up to the end of that command).
std::set<std::string> installedBy(const std::string& containerfile) {
  std::set<std::string> packages;
  const auto install = containerfile.find("apt-get install");
  REQUIRE(install != std::string::npos);
  std::istringstream words(containerfile.substr(install + 15));
  std::string word;
  while (words >> word && word != "&&") {
    if (word[0] != '-' && word != "\\") packages.insert(word);
  }
  return packages;
}

// The packages `roots` pull in, themselves included (Depends and Pre-Depends of what this
// machine has installed, alternatives and all).
std::set<std::string> withDependencies(const std::set<std::string>& roots) {
  static const std::map<std::string, std::vector<std::string>> depends = [] {
    auto r =
        runCommand({"/usr/bin/dpkg-query", "-W", "-f=${Package}\t${Depends},${Pre-Depends}\n"});
    REQUIRE(r.exit_code == 0);
    std::map<std::string, std::vector<std::string>> out;
    std::istringstream lines(r.out);
    std::string line;
    while (std::getline(lines, line)) {
      const auto tab = line.find('\t');
      if (tab == std::string::npos) continue;
      std::string deps = line.substr(tab + 1);
      for (char& c : deps) {
        if (c == ',' || c == '|') c = ' ';
      }
      std::istringstream in(deps);
      std::string w;
      int depth = 0;  // inside "(>= 1.2)"
      auto& list = out[line.substr(0, tab)];
      while (in >> w) {
        if (w[0] == '(') ++depth;
        if (depth == 0) list.push_back(w.substr(0, w.find(':')));  // "libfoo:any"
        if (w.back() == ')') --depth;
      }
    }
    return out;
  }();
  std::set<std::string> seen;
  std::vector<std::string> queue(roots.begin(), roots.end());
  while (!queue.empty()) {
    const std::string pkg = queue.back();
    queue.pop_back();
    if (!seen.insert(pkg).second) continue;
    if (auto it = depends.find(pkg); it != depends.end()) {
      queue.insert(queue.end(), it->second.begin(), it->second.end());
    }
  }
  return seen;
}

// For each shared library `binary` links against directly, the packages that have a file of that
// name (libm.so.6: libc6 and libc6-i386; from dpkg's file lists). Libraries of this build
// (Bazel's own, in _solib directories of a development build) are left out: a release build
// links them in.
std::map<std::string, std::set<std::string>> packagesOfLibraries(const std::string& binary) {
  static const std::map<std::string, std::set<std::string>> owners = [] {
    std::map<std::string, std::set<std::string>> out;
    for (const auto& entry : fs::directory_iterator("/var/lib/dpkg/info")) {
      const std::string name = entry.path().filename().string();
      if (entry.path().extension() != ".list") continue;
      const std::string stem = name.substr(0, name.size() - 5);  // "libzmq5:amd64.list"
      const std::string package = stem.substr(0, stem.find(':'));
      std::ifstream in(entry.path());
      std::string file;
      while (std::getline(in, file)) {
        if (file.find(".so") != std::string::npos) {
          out[file.substr(file.rfind('/') + 1)].insert(package);
        }
      }
    }
    return out;
  }();
  auto elf = runCommand({"/usr/bin/readelf", "-d", binary});
  REQUIRE(elf.exit_code == 0);
  auto resolved = runCommand({"/usr/bin/ldd", binary});
  REQUIRE(resolved.exit_code == 0);
  std::map<std::string, std::set<std::string>> out;
  std::istringstream lines(elf.out);
  std::string line;
  while (std::getline(lines, line)) {
    const auto open = line.find("Shared library: [");
    if (open == std::string::npos) continue;
    const std::string soname = line.substr(open + 17, line.find(']', open) - open - 17);
    const auto at = resolved.out.find(soname + " => ");
    if (at != std::string::npos &&
        resolved.out.substr(at, resolved.out.find('\n', at) - at).find("_solib") !=
            std::string::npos) {
      continue;
    }
    const auto it = owners.find(soname);
    INFO(binary << ": no package has " << soname);
    REQUIRE(it != owners.end());
    out[soname] = it->second;
  }
  return out;
}

TEST_CASE("each image installs the libraries its programs link against", "[manifests]") {
  // What debian:12-slim has without installing anything: apt and what it needs.
  const std::set<std::string> base = withDependencies({"apt"});
  const std::vector<std::pair<const char*, std::vector<const char*>>> images = {
      {"manifests/images/krane-ctrl.Containerfile", {"controlplane/krane-ctrl"}},
      {"manifests/images/krane.Containerfile",
       {"agent/krane", "agent/krane-plugin-host", "plugins/deployment/libdeployment.so",
        "plugins/sentinel/libsentinel.so", "plugins/cilium/libcilium.so"}},
      {"manifests/images/sentinel.Containerfile", {"plugins/sentinel/krane-sentinel"}},
  };
  for (const auto& [containerfile, binaries] : images) {
    std::set<std::string> available =
        withDependencies(installedBy(testing::slurp(runfile(containerfile))));
    available.insert(base.begin(), base.end());
    for (const char* binary : binaries) {
      const auto libraries = packagesOfLibraries(runfile(binary));
      INFO(binary << ": no shared library of a package found: nothing would be checked");
      REQUIRE_FALSE(libraries.empty());
      if (std::string_view(binary) == "controlplane/krane-ctrl") {
        INFO("the peer hints' library, the one the image once lacked");
        REQUIRE(libraries.count("libzmq.so.5"));
        CHECK(libraries.at("libzmq.so.5").count("libzmq5"));
      }
      for (const auto& [soname, packages] : libraries) {
        bool installed = false;
        for (const std::string& p : packages) installed = installed || available.count(p) == 1;
        INFO(containerfile << ": " << binary << " needs " << soname << " from "
                           << (packages.empty() ? "?" : *packages.begin()));
        CHECK(installed);
      }
    }
  }
}

TEST_CASE("the sentinel image runs the routing proxy", "[manifests]") {
  const std::string image = testing::slurp(runfile("manifests/images/sentinel.Containerfile"));
  CHECK_THAT(image, Catch::Contains("FROM debian:12-slim"));
  CHECK_THAT(image, Catch::Contains("COPY bin/krane-sentinel /usr/bin/"));
  CHECK_THAT(image, Catch::Contains(R"(ENTRYPOINT ["/usr/bin/krane-sentinel"])"));
  INFO("the port the sentinel plugin's Service and probes use");
  CHECK_THAT(image, Catch::Contains("EXPOSE 8040"));
  INFO("the libraries of its Kubernetes client: it follows its routes ConfigMap");
  CHECK_THAT(image, Catch::Contains("libcurl4"));
  CHECK_THAT(image, Catch::Contains("libyaml-cpp0.7"));
  const std::string stage = testing::slurp(runfile("manifests/images/stage.sh"));
  CHECK_THAT(stage, Catch::Contains("//plugins/sentinel:krane-sentinel"));
  CHECK_THAT(stage, Catch::Contains("$bin/plugins/sentinel/krane-sentinel"));
}

}  // namespace
}  // namespace krane
