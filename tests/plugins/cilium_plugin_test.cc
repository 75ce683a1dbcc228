// libcilium.so loaded as the agent loads it: on the process runtime (policies recorded, reported
// as not enforced) and on the Kubernetes runtime against the fake API server (apply, update,
// rename, delete, garbage collection after a sync, invalid policies, API server refusals).
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <mutex>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "agent/plugin_loader.h"
#include "common/strings.h"
#include "nlohmann/json.hpp"
#include "tests/support/fake_kube_api.h"
#include "tests/support/process.h"

namespace krane {
namespace {

using krane::testing::FakeKubeApi;
using krane::testing::runfile;
using nlohmann::json;
using ::testing::HasSubstr;
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
  auto* group = end.add_resources();
  group->set_resource_type("cilium_network_policy");
  for (const auto& id : ids) group->add_ids(id);
  return end;
}

class CiliumPluginTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/krane-cil-XXXXXX";
    dir_ = ::mkdtemp(pattern);
  }
  void TearDown() override {
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

TEST_F(CiliumPluginTest, ConfigurationErrorsNameTheKey) {
  const auto message = [&](const json& config) {
    auto st = load(config);
    EXPECT_FALSE(st.ok()) << config.dump();
    return std::string(st.message());
  };
  EXPECT_THAT(message({{"runtime", "process"}, {"process", {{"stat_dir", dir_}}}}),
              HasSubstr("process.stat_dir: unknown key"));
  EXPECT_THAT(message({{"runtime", "process"}, {"extra", 1}}), HasSubstr("extra: unknown key"));
  EXPECT_THAT(message({{"runtime", "process"}}), HasSubstr("process.state_dir: required"));
  EXPECT_THAT(message({{"runtime", "docker"}}),
              HasSubstr("runtime: must be process or kubernetes, got \"docker\""));
  EXPECT_THAT(message({{"runtime", "kubernetes"}, {"kubernetes", {{"qqps", 1}}}}),
              HasSubstr("kubernetes.qqps: unknown key"));
  EXPECT_THAT(message({{"runtime", "kubernetes"}, {"kubernetes", {{"qps", "fast"}}}}),
              HasSubstr("kubernetes.qps: must be a whole number"));
  EXPECT_THAT(
      message({{"runtime", "kubernetes"}, {"kubernetes", {{"kubeconfig", dir_ + "/none"}}}}),
      HasSubstr("kubernetes: cannot read kubeconfig"));
  EXPECT_THAT(message({{"runtime", "kubernetes"}, {"process", {{"state_dir", dir_}}}}),
              HasSubstr("process: only for runtime process"));
  EXPECT_THAT(message({{"runtime", "kubernetes"},
                       {"kubernetes", {{"kubeconfig", "k"}, {"namespace", "Bad_NS"}}}}),
              HasSubstr("kubernetes.namespace: \"Bad_NS\" is not a valid namespace"));
  EXPECT_THAT(message("not an object"), HasSubstr("must be a mapping"));
}

// --- process runtime -----------------------------------------------------------------------

class CiliumProcessTest : public CiliumPluginTest {
 protected:
  void SetUp() override {
    CiliumPluginTest::SetUp();
    ASSERT_TRUE(
        load({{"runtime", "process"}, {"process", {{"state_dir", dir_ + "/cilium"}}}}).ok());
    EXPECT_EQ(plugin_->resourceTypes(), std::vector<std::string>{"cilium_network_policy"});
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

TEST_F(CiliumProcessTest, RecordsThePolicyAndReportsItNotEnforced) {
  ASSERT_TRUE(plugin_->apply(policyChange("pol_1", rule("web"), 7)).ok());
  auto r = latest("pol_1");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->type(), "cilium_network_policy");
  EXPECT_EQ(r->phase(), cluster::v1::RESOURCE_PHASE_READY);
  EXPECT_EQ(r->version(), 7u);
  EXPECT_EQ(r->region(), "eu-1");
  EXPECT_EQ(r->plugin(), "cilium");
  EXPECT_THAT(r->message(), HasSubstr("not enforced on the process runtime"));
  auto held = records();
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(held[0]["id"], "pol_1");
  EXPECT_EQ(held[0]["version"], 7);
  EXPECT_EQ(held[0]["object"]["kind"], "CiliumNetworkPolicy");
  EXPECT_EQ(held[0]["object"]["spec"], rule("web"));

  // An update replaces the record; a redelivery changes nothing.
  ASSERT_TRUE(plugin_->apply(policyChange("pol_1", rule("admin"), 8)).ok());
  ASSERT_TRUE(plugin_->apply(policyChange("pol_1", rule("admin"), 8)).ok());
  held = records();
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(held[0]["object"]["spec"], rule("admin"));
  EXPECT_EQ(held[0]["version"], 8);

  // observe() repeats the latest state.
  const size_t before = reportCount();
  ASSERT_TRUE(plugin_->observe().ok());
  EXPECT_EQ(reportCount(), before + 1);

  ASSERT_TRUE(plugin_->remove(deleteChange("pol_1", 9)).ok());
  EXPECT_TRUE(records().empty());
  EXPECT_EQ(latest("pol_1")->phase(), cluster::v1::RESOURCE_PHASE_DELETED);
  EXPECT_EQ(latest("pol_1")->version(), 9u);
  // Deleting what is gone is fine.
  EXPECT_TRUE(plugin_->remove(deleteChange("pol_1", 10)).ok());
}

TEST_F(CiliumProcessTest, AnInvalidPolicyIsReportedWithTheReasonAndRefusedForGood) {
  json bad = rule("web");
  bad["ingress"] = "everyone";
  const auto st = plugin_->apply(policyChange("pol_bad", bad, 3));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("policy_json.ingress: must be an array"));
  auto r = latest("pol_bad");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->phase(), cluster::v1::RESOURCE_PHASE_FAILED);
  EXPECT_EQ(r->version(), 3u);
  EXPECT_THAT(r->message(), HasSubstr("invalid policy: policy_json.ingress: must be an array"));
  ASSERT_TRUE(r->has_apply_error());
  EXPECT_FALSE(r->apply_error().retryable());
  EXPECT_EQ(r->apply_error().code(), KRANE_INVALID);
  EXPECT_THAT(r->apply_error().message(), HasSubstr("policy_json.ingress"));
  EXPECT_TRUE(records().empty());

  // A change without a policy at all.
  cluster::v1::Change empty = policyChange("pol_none", rule("web"), 4);
  empty.mutable_resource()->clear_kind();
  EXPECT_EQ(plugin_->apply(empty).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(latest("pol_none")->phase(), cluster::v1::RESOURCE_PHASE_FAILED);
}

TEST_F(CiliumProcessTest, GarbageCollectsWhatTheSyncDidNotList) {
  for (const std::string id : {"a", "b", "c"}) {
    ASSERT_TRUE(plugin_->apply(policyChange(id, rule("web"), 1)).ok());
  }
  ASSERT_TRUE(plugin_->syncEnd(syncEnd({"a", "c"}, 5)).ok());
  std::set<std::string> ids;
  for (const auto& r : records()) ids.insert(r["id"]);
  EXPECT_EQ(ids, (std::set<std::string>{"a", "c"}));
  EXPECT_EQ(latest("b")->phase(), cluster::v1::RESOURCE_PHASE_DELETED);
  EXPECT_EQ(latest("a")->phase(), cluster::v1::RESOURCE_PHASE_READY);

  // Records survive a restart of the plugin; a sync listing nothing removes them all.
  plugin_.reset();
  ASSERT_TRUE(load({{"runtime", "process"}, {"process", {{"state_dir", dir_ + "/cilium"}}}}).ok());
  EXPECT_EQ(records().size(), 2u);
  ASSERT_TRUE(plugin_->syncEnd(syncEnd({}, 6)).ok());
  EXPECT_TRUE(records().empty());
}

// --- Kubernetes runtime --------------------------------------------------------------------

class CiliumKubeTest : public CiliumPluginTest {
 protected:
  void SetUp() override {
    CiliumPluginTest::SetUp();
    loadKube();
    api_.put({{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", "ws1"}}}});
  }

  void loadKube() {
    const std::string kubeconfig = dir_ + "/kubeconfig";
    std::ofstream(kubeconfig) << api_.kubeconfigYaml();
    ASSERT_TRUE(
        load({{"runtime", "kubernetes"}, {"kubernetes", {{"kubeconfig", kubeconfig}, {"qps", 0}}}})
            .ok());
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

TEST_F(CiliumKubeTest, AppliesUpdatesAndDeletes) {
  ASSERT_TRUE(plugin_->apply(policyChange("pol_1", rule("web"), 1)).ok());
  // The name is derived from the id; the annotation carries the id itself.
  auto all = api_.objects(kCnpVersion, kCnp, "ws1");
  ASSERT_EQ(all.size(), 1u);
  const json stored = all[0];
  EXPECT_EQ(stored["metadata"]["annotations"]["krane.dev/policy.id"], "pol_1");
  EXPECT_EQ(stored["metadata"]["labels"]["app.kubernetes.io/managed-by"], "krane");
  EXPECT_EQ(stored["metadata"]["labels"]["app.kubernetes.io/component"], "cilium-policy");
  EXPECT_EQ(stored["spec"], rule("web"));
  const int64_t generation = stored["metadata"]["generation"];
  auto r = latest("pol_1");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->phase(), cluster::v1::RESOURCE_PHASE_READY);
  EXPECT_THAT(r->message(), HasSubstr("applied as ws1/"));
  // Server-side apply, as field manager krane.
  bool saw_apply = false;
  for (const auto& req : api_.requests()) {
    if (req.method == "PATCH" && req.path.find("/apis/cilium.io/v2/namespaces/ws1/") == 0) {
      saw_apply = true;
      EXPECT_EQ(req.content_type, "application/apply-patch+yaml");
      EXPECT_THAT(req.query, HasSubstr("fieldManager=krane"));
      EXPECT_THAT(req.query, HasSubstr("force=true"));
    }
  }
  EXPECT_TRUE(saw_apply);

  // Update: the spec changes in place.
  ASSERT_TRUE(plugin_->apply(policyChange("pol_1", rule("admin", "9090"), 2)).ok());
  all = api_.objects(kCnpVersion, kCnp, "ws1");
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0]["spec"], rule("admin", "9090"));
  EXPECT_GT(all[0]["metadata"]["generation"].get<int64_t>(), generation);
  EXPECT_EQ(latest("pol_1")->version(), 2u);

  // A new name (and namespace): the old object goes.
  json moved = {{"metadata", {{"namespace", "shop"}}}, {"spec", rule("admin")}};
  ASSERT_TRUE(plugin_->apply(policyChange("pol_1", moved, 3, "allow-admin")).ok());
  EXPECT_EQ(cnpNames(), (std::set<std::string>{"shop/allow-admin"}));
  EXPECT_TRUE(api_.object("v1", "Namespace", "", "shop")) << "a missing namespace is created";

  ASSERT_TRUE(plugin_->remove(deleteChange("pol_1", 4)).ok());
  EXPECT_TRUE(cnpNames().empty());
  EXPECT_EQ(latest("pol_1")->phase(), cluster::v1::RESOURCE_PHASE_DELETED);
  EXPECT_EQ(latest("pol_1")->message(), "removed");
  ASSERT_TRUE(plugin_->remove(deleteChange("pol_1", 5)).ok()) << "deleting twice is fine";
  EXPECT_EQ(latest("pol_1")->message(), "nothing to remove");
}

TEST_F(CiliumKubeTest, GarbageCollectsOnlyItsOwnPoliciesAfterASync) {
  for (const std::string id : {"a", "b", "c"}) {
    ASSERT_TRUE(plugin_->apply(policyChange(id, rule("web"), 1, "p-" + id)).ok());
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

  ASSERT_TRUE(plugin_->syncEnd(syncEnd({"b"}, 10)).ok());
  EXPECT_EQ(cnpNames(),
            (std::set<std::string>{"sentinel/sentinel-gossip-e1", "ws1/by-hand", "ws1/p-b"}));
  EXPECT_EQ(latest("a")->phase(), cluster::v1::RESOURCE_PHASE_DELETED);
  EXPECT_EQ(latest("c")->phase(), cluster::v1::RESOURCE_PHASE_DELETED);
  EXPECT_EQ(latest("a")->version(), 10u);
  EXPECT_EQ(latest("b")->phase(), cluster::v1::RESOURCE_PHASE_READY);

  // GC asked the server only for Krane's Cilium policies.
  bool listed = false;
  for (const auto& req : api_.requests()) {
    if (req.method == "GET" && req.path == "/apis/cilium.io/v2/ciliumnetworkpolicies") {
      listed = true;
      EXPECT_THAT(req.query, HasSubstr("labelSelector="));
      EXPECT_THAT(req.query, HasSubstr("cilium-policy"));
    }
  }
  EXPECT_TRUE(listed);

  // Restarted plugin, empty sync: everything of its own goes, nothing else.
  plugin_.reset();
  loadKube();
  ASSERT_TRUE(plugin_->syncEnd(syncEnd({}, 11)).ok());
  EXPECT_EQ(cnpNames(), (std::set<std::string>{"sentinel/sentinel-gossip-e1", "ws1/by-hand"}));
}

TEST_F(CiliumKubeTest, InvalidPoliciesNeverReachTheServerAndRefusalsAreReported) {
  api_.clearRequests();
  json bad = rule("web");
  bad["toPorts"] = json::array();  // a field of ingress rules, not of the policy
  const auto st = plugin_->apply(policyChange("pol_bad", bad, 2));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(api_.countRequests("PATCH"), 0u);
  auto r = latest("pol_bad");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->phase(), cluster::v1::RESOURCE_PHASE_FAILED);
  EXPECT_THAT(r->apply_error().message(), HasSubstr("policy_json.toPorts: unknown field"));

  // The API server refusing the object (422) is final too, with the server's reason.
  api_.failNext(1, 422, -1, "PATCH");
  const auto refused = plugin_->apply(policyChange("pol_2", rule("web"), 3));
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  r = latest("pol_2");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->phase(), cluster::v1::RESOURCE_PHASE_FAILED);
  EXPECT_FALSE(r->apply_error().retryable());
  EXPECT_THAT(r->apply_error().message(), HasSubstr("422"));
  // The next version goes through.
  ASSERT_TRUE(plugin_->apply(policyChange("pol_2", rule("web"), 4)).ok());
  EXPECT_EQ(latest("pol_2")->phase(), cluster::v1::RESOURCE_PHASE_READY);
}

}  // namespace
}  // namespace krane
