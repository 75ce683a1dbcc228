// The fake API server's test hooks, through krane's client: what plugin tests will rely on.
#include "tests/support/fake_kube_api.h"

#include <httplib.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "plugins/runtime/kubernetes/client.h"
#include "plugins/runtime/kubernetes/errors.h"
#include "tests/plugins/runtime/kubernetes/requests.h"

namespace krane::testing {
namespace {

using kube::Json;
using ::testing::HasSubstr;

class FakeKubeApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto created = kube::Client::create(api.clusterConfig());
    ASSERT_TRUE(created.ok());
    client = std::move(*created);
    ASSERT_TRUE(
        client->apply({{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", "ws"}}}})
            .ok());
    ASSERT_TRUE(client->apply(deployment(3)).ok());
  }
  static Json deployment(int replicas) {
    return {{"apiVersion", "apps/v1"},
            {"kind", "Deployment"},
            {"metadata", {{"name", "web"}, {"namespace", "ws"}}},
            {"spec",
             {{"replicas", replicas},
              {"selector", {{"matchLabels", {{"app", "web"}}}}},
              {"template",
               {{"metadata", {{"labels", {{"app", "web"}}}}},
                {"spec",
                 {{"containers",
                   Json::array({{{"name", "app"},
                                 {"image", "registry/web:1"},
                                 {"ports", Json::array({{{"containerPort", 8080}}})}}})}}}}}}}};
  }
  std::vector<Json> pods() {
    auto list = client->list(kube::listReq("v1", "Pod", "ws", "app=web", 0, ""));
    EXPECT_TRUE(list.ok()) << list.status();
    return list.ok() ? list->items : std::vector<Json>{};
  }
  Json deploymentStatus() {
    auto got = client->get({"apps/v1", "Deployment", "ws", "web"});
    EXPECT_TRUE(got.ok());
    return got.ok() ? (*got)["status"] : Json();
  }

  FakeKubeApi api;
  std::unique_ptr<kube::Client> client;
};

TEST_F(FakeKubeApiTest, ReadyPodsHaveAddressesAndTheDeploymentStatusSaysSo) {
  ASSERT_TRUE(api.makePodsReady("ws", "web").ok());
  const auto ready = pods();
  ASSERT_EQ(ready.size(), 3u);
  std::set<std::string> ips;
  for (const auto& pod : ready) {
    EXPECT_EQ(pod["status"]["phase"], "Running");
    ips.insert(pod["status"]["podIP"].get<std::string>());
    EXPECT_EQ(pod["status"]["containerStatuses"][0]["ready"], true);
    EXPECT_EQ(pod["status"]["containerStatuses"][0]["image"], "registry/web:1");
    EXPECT_EQ(pod["spec"]["containers"][0]["ports"][0]["containerPort"], 8080);
    EXPECT_EQ(pod["metadata"]["ownerReferences"][0]["kind"], "ReplicaSet");
    bool ready_condition = false;
    for (const auto& c : pod["status"]["conditions"]) {
      ready_condition |= c["type"] == "Ready" && c["status"] == "True";
    }
    EXPECT_TRUE(ready_condition);
  }
  EXPECT_EQ(ips.size(), 3u) << "one address per pod";
  const Json status = deploymentStatus();
  EXPECT_EQ(status["replicas"], 3);
  EXPECT_EQ(status["readyReplicas"], 3);
  EXPECT_EQ(status["availableReplicas"], 3);
  EXPECT_EQ(status["updatedReplicas"], 3);
  EXPECT_EQ(status["observedGeneration"], 1);

  // A new template and fewer replicas: the old pods are replaced.
  Json next = deployment(1);
  next["spec"]["template"]["spec"]["containers"][0]["image"] = "registry/web:2";
  ASSERT_TRUE(client->apply(next).ok());
  ASSERT_TRUE(api.makePodsReady("ws", "web").ok());
  const auto replaced = pods();
  ASSERT_EQ(replaced.size(), 1u);
  EXPECT_EQ(replaced[0]["status"]["containerStatuses"][0]["image"], "registry/web:2");
  EXPECT_EQ(deploymentStatus()["observedGeneration"], 2);
}

TEST_F(FakeKubeApiTest, CrashLoopingPods) {
  ASSERT_TRUE(api.makePodsCrashLoop("ws", "web", 7, 137).ok());
  const auto crashing = pods();
  ASSERT_EQ(crashing.size(), 3u);
  const Json cs = crashing[0]["status"]["containerStatuses"][0];
  EXPECT_EQ(cs["ready"], false);
  EXPECT_EQ(cs["restartCount"], 7);
  EXPECT_EQ(cs["state"]["waiting"]["reason"], "CrashLoopBackOff");
  EXPECT_EQ(cs["lastState"]["terminated"]["exitCode"], 137);
  const Json status = deploymentStatus();
  EXPECT_FALSE(status.contains("readyReplicas")) << "zero counts are omitted, as upstream";
  EXPECT_EQ(status["unavailableReplicas"], 3);
}

TEST_F(FakeKubeApiTest, ImagePullFailures) {
  ASSERT_TRUE(api.makePodsFailImagePull("ws", "web", "ErrImagePull").ok());
  const auto pending = pods();
  ASSERT_EQ(pending.size(), 3u);
  EXPECT_EQ(pending[0]["status"]["phase"], "Pending");
  EXPECT_FALSE(pending[0]["status"].contains("podIP"));
  EXPECT_EQ(pending[0]["status"]["containerStatuses"][0]["state"]["waiting"]["reason"],
            "ErrImagePull");
  EXPECT_THAT(pending[0]["status"]["containerStatuses"][0]["state"]["waiting"]["message"]
                  .get<std::string>(),
              HasSubstr("registry/web:1"));
  EXPECT_TRUE(absl::IsNotFound(api.makePodsReady("ws", "missing")));
}

TEST_F(FakeKubeApiTest, HooksProduceWatchEvents) {
  const std::string from = std::to_string(api.resourceVersion());
  ASSERT_TRUE(api.makePodsReady("ws", "web").ok());
  std::vector<std::string> types;
  auto status = client->watch(kube::watchReq("v1", "Pod", "ws", "", from, 10),
                              [&](const kube::WatchEvent& e) {
                                types.push_back(e.type);
                                return types.size() < 3;
                              });
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(types, (std::vector<std::string>{"ADDED", "ADDED", "ADDED"}));
}

TEST_F(FakeKubeApiTest, InjectedFailuresByMethodAndTheRequestLog) {
  kube::ClientOptions options;
  options.max_retries = 0;
  auto once = kube::Client::create(api.clusterConfig(), options);
  ASSERT_TRUE(once.ok());
  api.clearRequests();
  api.failNext(1, 500, -1, "PATCH");
  EXPECT_TRUE((*once)->get({"apps/v1", "Deployment", "ws", "web"}).ok()) << "GETs pass";
  auto failed = (*once)->apply(deployment(2));
  EXPECT_TRUE(absl::IsInternal(failed.status()));
  EXPECT_TRUE((*once)->apply(deployment(2)).ok()) << "only the next one failed";
  const auto log = api.requests();
  ASSERT_EQ(log.size(), 3u);
  EXPECT_EQ(log[1].status, 500);
  EXPECT_THAT(log[2].body, HasSubstr("\"replicas\":2"));
  EXPECT_EQ(api.countRequests("PATCH", "/deployments/web"), 2u);
}

TEST_F(FakeKubeApiTest, RefusesObjectsThatDoNotMatchTheirUrl) {
  httplib::Client raw("127.0.0.1", api.port());
  auto put = [&](const std::string& path, const Json& body) {
    auto res = raw.Patch((path + "?fieldManager=krane").c_str(), body.dump(),
                         "application/apply-patch+yaml");
    EXPECT_TRUE(res);
    return res ? std::make_pair(res->status, Json::parse(res->body)) : std::make_pair(0, Json());
  };
  auto [code, status] = put("/apis/apps/v1/namespaces/ws/deployments/other", deployment(1));
  EXPECT_EQ(code, 400);
  EXPECT_EQ(status["kind"], "Status");
  EXPECT_EQ(status["reason"], "BadRequest");
  EXPECT_THAT(status["message"].get<std::string>(), HasSubstr("does not match the name"));

  Json old_version = deployment(1);
  old_version["apiVersion"] = "apps/v1beta1";
  std::tie(code, status) = put("/apis/apps/v1/namespaces/ws/deployments/web", old_version);
  EXPECT_EQ(code, 400);
  EXPECT_THAT(status["message"].get<std::string>(), HasSubstr("does not match the expected API"));

  std::tie(code, status) = put("/apis/apps/v1/namespaces/ws/statefulsets/web", deployment(1));
  EXPECT_EQ(code, 404);
  auto no_manager = raw.Patch("/apis/apps/v1/namespaces/ws/deployments/web", deployment(1).dump(),
                              "application/apply-patch+yaml");
  ASSERT_TRUE(no_manager);
  EXPECT_EQ(no_manager->status, 422);
  EXPECT_THAT(no_manager->body, HasSubstr("fieldManager: Required value"));
}

}  // namespace
}  // namespace krane::testing
