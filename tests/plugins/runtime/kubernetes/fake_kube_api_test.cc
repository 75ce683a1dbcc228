// The fake API server's test hooks, through krane's client: what plugin tests will rely on.
#include "tests/support/fake_kube_api.h"

#include <httplib.h>

#include <catch2/catch.hpp>

#include "plugins/runtime/kubernetes/client.h"
#include "plugins/runtime/kubernetes/errors.h"
#include "tests/plugins/runtime/kubernetes/requests.h"
#include "tests/support/matchers.h"

namespace krane::testing {
namespace {

using kube::Json;

class FakeKubeApiTest {
 protected:
  FakeKubeApiTest() {
    auto created = kube::Client::create(api.clusterConfig());
    REQUIRE_THAT(created, IsOk());
    client = std::move(*created);
    REQUIRE_THAT(client->apply(
                     {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", "ws"}}}}),
                 IsOk());
    REQUIRE_THAT(client->apply(deployment(3)), IsOk());
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
    CHECK_THAT(list, IsOk());
    return list.ok() ? list->items : std::vector<Json>{};
  }
  Json deploymentStatus() {
    auto got = client->get({"apps/v1", "Deployment", "ws", "web"});
    CHECK_THAT(got, IsOk());
    return got.ok() ? (*got)["status"] : Json();
  }

  FakeKubeApi api;
  std::unique_ptr<kube::Client> client;
};

TEST_CASE_METHOD(FakeKubeApiTest, "ready pods have addresses and the deployment status says so",
                 "[fake-kube-api]") {
  REQUIRE_THAT(api.makePodsReady("ws", "web"), IsOk());
  const auto ready = pods();
  REQUIRE(ready.size() == 3u);
  std::set<std::string> ips;
  for (const auto& pod : ready) {
    CHECK(pod["status"]["phase"] == "Running");
    ips.insert(pod["status"]["podIP"].get<std::string>());
    CHECK(pod["status"]["containerStatuses"][0]["ready"] == true);
    CHECK(pod["status"]["containerStatuses"][0]["image"] == "registry/web:1");
    CHECK(pod["spec"]["containers"][0]["ports"][0]["containerPort"] == 8080);
    CHECK(pod["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet");
    bool ready_condition = false;
    for (const auto& c : pod["status"]["conditions"]) {
      ready_condition |= c["type"] == "Ready" && c["status"] == "True";
    }
    CHECK(ready_condition);
  }
  INFO("one address per pod");
  CHECK(ips.size() == 3u);
  const Json status = deploymentStatus();
  CHECK(status["replicas"] == 3);
  CHECK(status["readyReplicas"] == 3);
  CHECK(status["availableReplicas"] == 3);
  CHECK(status["updatedReplicas"] == 3);
  CHECK(status["observedGeneration"] == 1);

  // A new template and fewer replicas: the old pods are replaced.
  Json next = deployment(1);
  next["spec"]["template"]["spec"]["containers"][0]["image"] = "registry/web:2";
  REQUIRE_THAT(client->apply(next), IsOk());
  REQUIRE_THAT(api.makePodsReady("ws", "web"), IsOk());
  const auto replaced = pods();
  REQUIRE(replaced.size() == 1u);
  CHECK(replaced[0]["status"]["containerStatuses"][0]["image"] == "registry/web:2");
  CHECK(deploymentStatus()["observedGeneration"] == 2);
}

TEST_CASE_METHOD(FakeKubeApiTest, "crash looping pods", "[fake-kube-api]") {
  REQUIRE_THAT(api.makePodsCrashLoop("ws", "web", 7, 137), IsOk());
  const auto crashing = pods();
  REQUIRE(crashing.size() == 3u);
  const Json cs = crashing[0]["status"]["containerStatuses"][0];
  CHECK(cs["ready"] == false);
  CHECK(cs["restartCount"] == 7);
  CHECK(cs["state"]["waiting"]["reason"] == "CrashLoopBackOff");
  CHECK(cs["lastState"]["terminated"]["exitCode"] == 137);
  const Json status = deploymentStatus();
  INFO("zero counts are omitted, as upstream");
  CHECK_FALSE(status.contains("readyReplicas"));
  CHECK(status["unavailableReplicas"] == 3);
}

TEST_CASE_METHOD(FakeKubeApiTest, "image pull failures", "[fake-kube-api]") {
  REQUIRE_THAT(api.makePodsFailImagePull("ws", "web", "ErrImagePull"), IsOk());
  const auto pending = pods();
  REQUIRE(pending.size() == 3u);
  CHECK(pending[0]["status"]["phase"] == "Pending");
  CHECK_FALSE(pending[0]["status"].contains("podIP"));
  CHECK(pending[0]["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] ==
        "ErrImagePull");
  CHECK_THAT(pending[0]["status"]["containerStatuses"][0]["state"]["waiting"]["message"]
                 .get<std::string>(),
             Catch::Contains("registry/web:1"));
  CHECK(absl::IsNotFound(api.makePodsReady("ws", "missing")));
}

TEST_CASE_METHOD(FakeKubeApiTest, "hooks produce watch events", "[fake-kube-api]") {
  const std::string from = std::to_string(api.resourceVersion());
  REQUIRE_THAT(api.makePodsReady("ws", "web"), IsOk());
  std::vector<std::string> types;
  auto status = client->watch(kube::watchReq("v1", "Pod", "ws", "", from, 10),
                              [&](const kube::WatchEvent& e) {
                                types.push_back(e.type);
                                return types.size() < 3;
                              });
  CHECK_THAT(status, IsOk());
  CHECK(types == (std::vector<std::string>{"ADDED", "ADDED", "ADDED"}));
}

TEST_CASE_METHOD(FakeKubeApiTest, "injected failures by method and the request log",
                 "[fake-kube-api]") {
  kube::ClientOptions options;
  options.max_retries = 0;
  auto once = kube::Client::create(api.clusterConfig(), options);
  REQUIRE_THAT(once, IsOk());
  api.clearRequests();
  api.failNext(1, 500, -1, "PATCH");
  INFO("GETs pass");
  CHECK_THAT((*once)->get({"apps/v1", "Deployment", "ws", "web"}), IsOk());
  auto failed = (*once)->apply(deployment(2));
  CHECK(absl::IsInternal(failed.status()));
  INFO("only the next one failed");
  CHECK_THAT((*once)->apply(deployment(2)), IsOk());
  const auto log = api.requests();
  REQUIRE(log.size() == 3u);
  CHECK(log[1].status == 500);
  CHECK_THAT(log[2].body, Catch::Contains("\"replicas\":2"));
  CHECK(api.countRequests("PATCH", "/deployments/web") == 2u);
}

TEST_CASE_METHOD(FakeKubeApiTest, "refuses objects that do not match their url",
                 "[fake-kube-api]") {
  httplib::Client raw("127.0.0.1", api.port());
  auto put = [&](const std::string& path, const Json& body) {
    auto res = raw.Patch((path + "?fieldManager=krane").c_str(), body.dump(),
                         "application/apply-patch+yaml");
    CHECK(res);
    return res ? std::make_pair(res->status, Json::parse(res->body)) : std::make_pair(0, Json());
  };
  auto [code, status] = put("/apis/apps/v1/namespaces/ws/deployments/other", deployment(1));
  CHECK(code == 400);
  CHECK(status["kind"] == "Status");
  CHECK(status["reason"] == "BadRequest");
  CHECK_THAT(status["message"].get<std::string>(), Catch::Contains("does not match the name"));

  Json old_version = deployment(1);
  old_version["apiVersion"] = "apps/v1beta1";
  std::tie(code, status) = put("/apis/apps/v1/namespaces/ws/deployments/web", old_version);
  CHECK(code == 400);
  CHECK_THAT(status["message"].get<std::string>(),
             Catch::Contains("does not match the expected API"));

  std::tie(code, status) = put("/apis/apps/v1/namespaces/ws/statefulsets/web", deployment(1));
  CHECK(code == 404);
  auto no_manager = raw.Patch("/apis/apps/v1/namespaces/ws/deployments/web", deployment(1).dump(),
                              "application/apply-patch+yaml");
  REQUIRE(no_manager);
  CHECK(no_manager->status == 422);
  CHECK_THAT(no_manager->body, Catch::Contains("fieldManager: Required value"));
}

}  // namespace
}  // namespace krane::testing
