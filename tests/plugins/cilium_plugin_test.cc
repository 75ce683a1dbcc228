// libcilium.so loaded as the agent loads it: on the process runtime (policies recorded, reported
// as not enforced) and on the Kubernetes runtime against the fake API server (apply, update,
// rename, delete, garbage collection after a sync, invalid policies, API server refusals).
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <mutex>

#include <catch2/catch.hpp>

#include "agent/plugin_loader.h"
#include "common/strings.h"
#include "nlohmann/json.hpp"
#include "tests/support/fake_kube_api.h"
#include "tests/support/matchers.h"
#include "tests/support/process.h"

namespace krane {
namespace {

using krane::testing::FakeKubeApi;
using krane::testing::runfile;
using nlohmann::json;
namespace fs = std::filesystem;
using Report = cluster::v1::ReportResourceStatusRequest;

constexpr char kCnpVersion[] = "cilium.io/v2";
constexpr char kCnp[] = "CiliumNetworkPolicy";

json rule(const std::string& from_app, const std::string& port = "8080") {
  return {{"endpointSelector", {{"matchLabels", {{"app", "api"}}}}},
          {"ingress",
           json::array(
               {{{"fromEndpoints", json::array({{{"matchLabels", {{"app", from_app}}}}})},
                 {"toPorts", json::array({{{"ports", json::array({{{"port", port},
                                                                   {"protocol", "TCP"}}})}}})}}})}};
}

cluster::v1::Change policyChange(const std::string& id, const json& body, uint64_t version,
                                 const std::string& name = "") {
  cluster::v1::Change c;
  c.set_op(cluster::v1::CHANGE_OP_APPLY);
  c.set_version(version);
  auto* r = c.mutable_resource();
  r->set_type("cilium_network_policy");
  r->set_id(id);
  r->set_region("eu-1");
  r->set_version(version);
  auto* p = r->mutable_cilium_network_policy();
  p->set_policy_id(id);
  p->set_workspace_id("ws1");
  p->set_project_id("p1");
  p->set_environment_id("e1");
  p->set_region("eu-1");
  p->set_name(name);
  p->set_policy_json(body.dump());
  return c;
}

cluster::v1::Change deleteChange(const std::string& id, uint64_t version) {
  cluster::v1::Change c;
  c.set_op(cluster::v1::CHANGE_OP_DELETE);
  c.set_version(version);
  c.mutable_resource()->set_type("cilium_network_policy");
  c.mutable_resource()->set_id(id);
  c.mutable_resource()->set_region("eu-1");
  return c;
}

plugin::v1::SyncEnd syncEnd(std::initializer_list<std::string> ids, uint64_t version) {
  plugin::v1::SyncEnd end;
  end.set_snapshot_version(version);
  end.set_region("eu-1");
  auto* group = end.add_resources();
  group->set_resource_type("cilium_network_policy");
  for (const auto& id : ids) group->add_ids(id);
  return end;
}

class CiliumPluginTest {
 protected:
  CiliumPluginTest() {
    char pattern[] = "/tmp/krane-cil-XXXXXX";
    dir_ = ::mkdtemp(pattern);
  }
  ~CiliumPluginTest() {
    plugin_.reset();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  absl::Status load(const json& config) {
    agent::HostCallbacks callbacks;
    callbacks.report_status = [this](const plugin::v1::StatusReport& r) {
      std::lock_guard lock(mutex_);
      if (r.has_resource()) reports_.push_back(r.resource());
    };
    auto loaded =
        agent::loadPlugin(runfile("plugins/cilium/libcilium.so"), config.dump(), callbacks);
    if (!loaded.ok()) return loaded.status();
    plugin_ = *std::move(loaded);
    return absl::OkStatus();
  }

  std::optional<Report> latest(const std::string& id) {
    std::lock_guard lock(mutex_);
    for (auto it = reports_.rbegin(); it != reports_.rend(); ++it) {
      if (it->id() == id) return *it;
    }
    return std::nullopt;
  }
  size_t reportCount() {
    std::lock_guard lock(mutex_);
    return reports_.size();
  }

  std::string dir_;
  std::unique_ptr<agent::LoadedPlugin> plugin_;
  std::mutex mutex_;
  std::vector<Report> reports_;
};

// --- configuration -------------------------------------------------------------------------

TEST_CASE_METHOD(CiliumPluginTest, "configuration errors name the key", "[cilium-plugin]") {
  const auto message = [&](const json& config) {
    auto st = load(config);
    INFO(config.dump());
    CHECK_FALSE(st.ok());
    return std::string(st.message());
  };
  CHECK_THAT(message({{"runtime", "process"}, {"process", {{"stat_dir", dir_}}}}),
             Catch::Contains("process.stat_dir: unknown key"));
  CHECK_THAT(message({{"runtime", "process"}, {"extra", 1}}),
             Catch::Contains("extra: unknown key"));
  CHECK_THAT(message({{"runtime", "process"}}), Catch::Contains("process.state_dir: required"));
  CHECK_THAT(message({{"runtime", "docker"}}),
             Catch::Contains("runtime: must be process or kubernetes, got \"docker\""));
  CHECK_THAT(message({{"runtime", "kubernetes"}, {"kubernetes", {{"qqps", 1}}}}),
             Catch::Contains("kubernetes.qqps: unknown key"));
  CHECK_THAT(message({{"runtime", "kubernetes"}, {"kubernetes", {{"qps", "fast"}}}}),
             Catch::Contains("kubernetes.qps: must be a whole number"));
  CHECK_THAT(message({{"runtime", "kubernetes"}, {"kubernetes", {{"kubeconfig", dir_ + "/none"}}}}),
             Catch::Contains("kubernetes: cannot read kubeconfig"));
  CHECK_THAT(message({{"runtime", "kubernetes"}, {"process", {{"state_dir", dir_}}}}),
             Catch::Contains("process: only for runtime process"));
  CHECK_THAT(message({{"runtime", "kubernetes"},
                      {"kubernetes", {{"kubeconfig", "k"}, {"namespace", "Bad_NS"}}}}),
             Catch::Contains("kubernetes.namespace: \"Bad_NS\" is not a valid namespace"));
  CHECK_THAT(message("not an object"), Catch::Contains("must be a mapping"));
}

// --- process runtime -----------------------------------------------------------------------

class CiliumProcessTest : public CiliumPluginTest {
 protected:
  CiliumProcessTest() {
    REQUIRE_THAT(load({{"runtime", "process"}, {"process", {{"state_dir", dir_ + "/cilium"}}}}),
                 IsOk());
    CHECK(plugin_->resourceTypes() == std::vector<std::string>{"cilium_network_policy"});
  }
  std::vector<json> records() {
    std::vector<json> out;
    for (const auto& entry : fs::directory_iterator(dir_ + "/cilium")) {
      std::ifstream in(entry.path());
      out.push_back(json::parse(in));
    }
    return out;
  }
};

TEST_CASE_METHOD(CiliumProcessTest, "records the policy and reports it not enforced",
                 "[cilium-process]") {
  REQUIRE_THAT(plugin_->apply(policyChange("pol_1", rule("web"), 7)), IsOk());
  auto r = latest("pol_1");
  REQUIRE(r);
  CHECK(r->type() == "cilium_network_policy");
  CHECK(r->phase() == cluster::v1::RESOURCE_PHASE_READY);
  CHECK(r->version() == 7u);
  CHECK(r->region() == "eu-1");
  CHECK(r->plugin() == "cilium");
  CHECK_THAT(r->message(), Catch::Contains("not enforced on the process runtime"));
  auto held = records();
  REQUIRE(held.size() == 1u);
  CHECK(held[0]["id"] == "pol_1");
  CHECK(held[0]["version"] == 7);
  CHECK(held[0]["object"]["kind"] == "CiliumNetworkPolicy");
  CHECK(held[0]["object"]["spec"] == rule("web"));

  // An update replaces the record; a redelivery changes nothing.
  REQUIRE_THAT(plugin_->apply(policyChange("pol_1", rule("admin"), 8)), IsOk());
  REQUIRE_THAT(plugin_->apply(policyChange("pol_1", rule("admin"), 8)), IsOk());
  held = records();
  REQUIRE(held.size() == 1u);
  CHECK(held[0]["object"]["spec"] == rule("admin"));
  CHECK(held[0]["version"] == 8);

  // observe() repeats the latest state.
  const size_t before = reportCount();
  REQUIRE_THAT(plugin_->observe(), IsOk());
  CHECK(reportCount() == (before + 1));

  REQUIRE_THAT(plugin_->remove(deleteChange("pol_1", 9)), IsOk());
  CHECK(records().empty());
  CHECK(latest("pol_1")->phase() == cluster::v1::RESOURCE_PHASE_DELETED);
  CHECK(latest("pol_1")->version() == 9u);
  // Deleting what is gone is fine.
  CHECK_THAT(plugin_->remove(deleteChange("pol_1", 10)), IsOk());
}

TEST_CASE_METHOD(CiliumProcessTest,
                 "an invalid policy is reported with the reason and refused for good",
                 "[cilium-process]") {
  json bad = rule("web");
  bad["ingress"] = "everyone";
  const auto st = plugin_->apply(policyChange("pol_bad", bad, 3));
  INFO(st);
  CHECK(st.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(st.message()), Catch::Contains("policy_json.ingress: must be an array"));
  auto r = latest("pol_bad");
  REQUIRE(r);
  CHECK(r->phase() == cluster::v1::RESOURCE_PHASE_FAILED);
  CHECK(r->version() == 3u);
  CHECK_THAT(r->message(),
             Catch::Contains("invalid policy: policy_json.ingress: must be an array"));
  REQUIRE(r->has_apply_error());
  CHECK_FALSE(r->apply_error().retryable());
  CHECK(r->apply_error().code() == KRANE_INVALID);
  CHECK_THAT(r->apply_error().message(), Catch::Contains("policy_json.ingress"));
  CHECK(records().empty());

  // A change without a policy at all.
  cluster::v1::Change empty = policyChange("pol_none", rule("web"), 4);
  empty.mutable_resource()->clear_kind();
  CHECK(plugin_->apply(empty).code() == absl::StatusCode::kInvalidArgument);
  CHECK(latest("pol_none")->phase() == cluster::v1::RESOURCE_PHASE_FAILED);
}

TEST_CASE_METHOD(CiliumProcessTest, "garbage collects what the sync did not list",
                 "[cilium-process]") {
  for (const std::string id : {"a", "b", "c"}) {
    REQUIRE_THAT(plugin_->apply(policyChange(id, rule("web"), 1)), IsOk());
  }
  REQUIRE_THAT(plugin_->syncEnd(syncEnd({"a", "c"}, 5)), IsOk());
  std::set<std::string> ids;
  for (const auto& r : records()) ids.insert(r["id"]);
  CHECK(ids == (std::set<std::string>{"a", "c"}));
  CHECK(latest("b")->phase() == cluster::v1::RESOURCE_PHASE_DELETED);
  CHECK(latest("a")->phase() == cluster::v1::RESOURCE_PHASE_READY);

  // Records survive a restart of the plugin; a sync listing nothing removes them all.
  plugin_.reset();
  REQUIRE_THAT(load({{"runtime", "process"}, {"process", {{"state_dir", dir_ + "/cilium"}}}}),
               IsOk());
  CHECK(records().size() == 2u);
  REQUIRE_THAT(plugin_->syncEnd(syncEnd({}, 6)), IsOk());
  CHECK(records().empty());
}

// --- Kubernetes runtime --------------------------------------------------------------------

class CiliumKubeTest : public CiliumPluginTest {
 protected:
  CiliumKubeTest() {
    loadKube();
    api_.put({{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", "ws1"}}}});
  }

  void loadKube() {
    const std::string kubeconfig = dir_ + "/kubeconfig";
    std::ofstream(kubeconfig) << api_.kubeconfigYaml();
    REQUIRE_THAT(
        load({{"runtime", "kubernetes"}, {"kubernetes", {{"kubeconfig", kubeconfig}, {"qps", 0}}}}),
        IsOk());
  }

  std::set<std::string> cnpNames() {
    std::set<std::string> out;
    for (const auto& o : api_.objects(kCnpVersion, kCnp)) {
      out.insert(strCat(o["metadata"]["namespace"].get<std::string>(), "/",
                        o["metadata"]["name"].get<std::string>()));
    }
    return out;
  }

  FakeKubeApi api_;
};

TEST_CASE_METHOD(CiliumKubeTest, "applies updates and deletes", "[cilium-kube]") {
  REQUIRE_THAT(plugin_->apply(policyChange("pol_1", rule("web"), 1)), IsOk());
  // The name is derived from the id; the annotation carries the id itself.
  auto all = api_.objects(kCnpVersion, kCnp, "ws1");
  REQUIRE(all.size() == 1u);
  const json stored = all[0];
  CHECK(stored["metadata"]["annotations"]["krane.dev/policy.id"] == "pol_1");
  CHECK(stored["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "krane");
  CHECK(stored["metadata"]["labels"]["app.kubernetes.io/component"] == "cilium-policy");
  CHECK(stored["spec"] == rule("web"));
  const int64_t generation = stored["metadata"]["generation"];
  auto r = latest("pol_1");
  REQUIRE(r);
  CHECK(r->phase() == cluster::v1::RESOURCE_PHASE_READY);
  CHECK_THAT(r->message(), Catch::Contains("applied as ws1/"));
  // Server-side apply, as field manager krane.
  bool saw_apply = false;
  for (const auto& req : api_.requests()) {
    if (req.method == "PATCH" && req.path.find("/apis/cilium.io/v2/namespaces/ws1/") == 0) {
      saw_apply = true;
      CHECK(req.content_type == "application/apply-patch+yaml");
      CHECK_THAT(req.query, Catch::Contains("fieldManager=krane"));
      CHECK_THAT(req.query, Catch::Contains("force=true"));
    }
  }
  CHECK(saw_apply);

  // Update: the spec changes in place.
  REQUIRE_THAT(plugin_->apply(policyChange("pol_1", rule("admin", "9090"), 2)), IsOk());
  all = api_.objects(kCnpVersion, kCnp, "ws1");
  REQUIRE(all.size() == 1u);
  CHECK(all[0]["spec"] == rule("admin", "9090"));
  CHECK(all[0]["metadata"]["generation"].get<int64_t>() > generation);
  CHECK(latest("pol_1")->version() == 2u);

  // A new name (and namespace): the old object goes.
  json moved = {{"metadata", {{"namespace", "shop"}}}, {"spec", rule("admin")}};
  REQUIRE_THAT(plugin_->apply(policyChange("pol_1", moved, 3, "allow-admin")), IsOk());
  CHECK(cnpNames() == (std::set<std::string>{"shop/allow-admin"}));
  INFO("a missing namespace is created");
  CHECK(api_.object("v1", "Namespace", "", "shop"));

  REQUIRE_THAT(plugin_->remove(deleteChange("pol_1", 4)), IsOk());
  CHECK(cnpNames().empty());
  CHECK(latest("pol_1")->phase() == cluster::v1::RESOURCE_PHASE_DELETED);
  CHECK(latest("pol_1")->message() == "removed");
  INFO("deleting twice is fine");
  REQUIRE_THAT(plugin_->remove(deleteChange("pol_1", 5)), IsOk());
  CHECK(latest("pol_1")->message() == "nothing to remove");
}

TEST_CASE_METHOD(CiliumKubeTest, "garbage collects only its own policies after a sync",
                 "[cilium-kube]") {
  for (const std::string id : {"a", "b", "c"}) {
    REQUIRE_THAT(plugin_->apply(policyChange(id, rule("web"), 1, "p-" + id)), IsOk());
  }
  // Objects that are not the plugin's: the sentinel plugin's gossip policy and a hand-made one.
  api_.put({{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", "sentinel"}}}});
  api_.put({{"apiVersion", kCnpVersion},
            {"kind", kCnp},
            {"metadata",
             {{"name", "sentinel-gossip-e1"},
              {"namespace", "sentinel"},
              {"labels",
               {{"app.kubernetes.io/managed-by", "krane"},
                {"app.kubernetes.io/component", "sentinel"}}}}},
            {"spec", rule("sentinel")}});
  api_.put({{"apiVersion", kCnpVersion},
            {"kind", kCnp},
            {"metadata", {{"name", "by-hand"}, {"namespace", "ws1"}}},
            {"spec", rule("ops")}});
  // Another region's agent shares this cluster: its policy is not this sync's business.
  auto elsewhere = policyChange("far", rule("web"), 1, "p-far");
  elsewhere.mutable_resource()->set_region("us-1");
  elsewhere.mutable_resource()->mutable_cilium_network_policy()->set_region("us-1");
  REQUIRE_THAT(plugin_->apply(elsewhere), IsOk());

  REQUIRE_THAT(plugin_->syncEnd(syncEnd({"b"}, 10)), IsOk());
  CHECK(cnpNames() == (std::set<std::string>{"sentinel/sentinel-gossip-e1", "ws1/by-hand",
                                             "ws1/p-b", "ws1/p-far"}));
  CHECK(latest("a")->phase() == cluster::v1::RESOURCE_PHASE_DELETED);
  CHECK(latest("c")->phase() == cluster::v1::RESOURCE_PHASE_DELETED);
  CHECK(latest("a")->version() == 10u);
  CHECK(latest("b")->phase() == cluster::v1::RESOURCE_PHASE_READY);

  // GC asked the server only for Krane's Cilium policies.
  bool listed = false;
  for (const auto& req : api_.requests()) {
    if (req.method == "GET" && req.path == "/apis/cilium.io/v2/ciliumnetworkpolicies") {
      listed = true;
      CHECK_THAT(req.query, Catch::Contains("labelSelector="));
      CHECK_THAT(req.query, Catch::Contains("cilium-policy"));
    }
  }
  CHECK(listed);

  // Restarted plugin, empty sync: everything of its own goes, nothing else.
  plugin_.reset();
  loadKube();
  REQUIRE_THAT(plugin_->syncEnd(syncEnd({}, 11)), IsOk());
  CHECK(cnpNames() ==
        (std::set<std::string>{"sentinel/sentinel-gossip-e1", "ws1/by-hand", "ws1/p-far"}));
}

TEST_CASE_METHOD(CiliumKubeTest,
                 "invalid policies never reach the server and refusals are reported",
                 "[cilium-kube]") {
  api_.clearRequests();
  json bad = rule("web");
  bad["toPorts"] = json::array();  // a field of ingress rules, not of the policy
  const auto st = plugin_->apply(policyChange("pol_bad", bad, 2));
  CHECK(st.code() == absl::StatusCode::kInvalidArgument);
  CHECK(api_.countRequests("PATCH") == 0u);
  auto r = latest("pol_bad");
  REQUIRE(r);
  CHECK(r->phase() == cluster::v1::RESOURCE_PHASE_FAILED);
  CHECK_THAT(r->apply_error().message(), Catch::Contains("policy_json.toPorts: unknown field"));

  // The API server refusing the object (422) is final too, with the server's reason.
  api_.failNext(1, 422, -1, "PATCH");
  const auto refused = plugin_->apply(policyChange("pol_2", rule("web"), 3));
  INFO(refused);
  CHECK(refused.code() == absl::StatusCode::kInvalidArgument);
  r = latest("pol_2");
  REQUIRE(r);
  CHECK(r->phase() == cluster::v1::RESOURCE_PHASE_FAILED);
  CHECK_FALSE(r->apply_error().retryable());
  CHECK_THAT(r->apply_error().message(), Catch::Contains("422"));
  // The next version goes through.
  REQUIRE_THAT(plugin_->apply(policyChange("pol_2", rule("web"), 4)), IsOk());
  CHECK(latest("pol_2")->phase() == cluster::v1::RESOURCE_PHASE_READY);
}

}  // namespace
}  // namespace krane
