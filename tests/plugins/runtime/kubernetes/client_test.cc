#include "plugins/runtime/kubernetes/client.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/strings.h"
#include "plugins/runtime/kubernetes/errors.h"
#include "tests/plugins/runtime/kubernetes/requests.h"
#include "tests/support/fake_kube_api.h"
#include "tests/support/wait.h"

namespace krane::kube {
namespace {

using krane::testing::eventually;
using krane::testing::FakeKubeApi;
using ::testing::HasSubstr;

std::string msg(const absl::Status& s) { return std::string(s.message()); }

Json ns(const std::string& name) {
  return {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", name}}}};
}

Json service(const std::string& ns, const std::string& name, Json labels = Json::object(),
             int port = 8080) {
  return {{"apiVersion", "v1"},
          {"kind", "Service"},
          {"metadata", {{"name", name}, {"namespace", ns}, {"labels", labels}}},
          {"spec", {{"selector", {{"app", name}}}, {"ports", Json::array({{{"port", port}}})}}}};
}

Json deployment(const std::string& ns, const std::string& name, const std::string& image,
                int replicas = 2) {
  return {{"apiVersion", "apps/v1"},
          {"kind", "Deployment"},
          {"metadata", {{"name", name}, {"namespace", ns}, {"labels", {{"app", name}}}}},
          {"spec",
           {{"replicas", replicas},
            {"selector", {{"matchLabels", {{"app", name}}}}},
            {"template",
             {{"metadata", {{"labels", {{"app", name}}}}},
              {"spec",
               {{"containers",
                 Json::array({{{"name", "app"},
                               {"image", image},
                               {"env", Json::array({{{"name", "A"}, {"value", "1"}}})}}})}}}}}}}};
}

ObjectRef deploymentRef(const std::string& ns, const std::string& name) {
  return {"apps/v1", "Deployment", ns, name};
}

class ClientTest : public ::testing::Test {
 protected:
  std::unique_ptr<Client> makeClient(const ClientOptions& options = fastOptions()) {
    auto client = Client::create(api.clusterConfig(), options);
    EXPECT_TRUE(client.ok()) << client.status();
    return std::move(*client);
  }
  static ClientOptions fastOptions() {
    ClientOptions options;
    options.qps = 0;
    options.backoff = {std::chrono::milliseconds(1), 2.0, std::chrono::milliseconds(20), 0.5};
    return options;
  }
  void SetUp() override {
    client = makeClient();
    ASSERT_TRUE(client->apply(ns("apps")).ok());
  }

  FakeKubeApi api;
  std::unique_ptr<Client> client;
};

TEST_F(ClientTest, ApplyCreatesThenMergesAndIsIdempotent) {
  auto created = client->apply(deployment("apps", "web", "web:1"));
  ASSERT_TRUE(created.ok()) << created.status();
  const Json& meta = (*created)["metadata"];
  EXPECT_FALSE(meta.value("uid", "").empty());
  EXPECT_FALSE(meta.value("creationTimestamp", "").empty());
  EXPECT_EQ(meta.value("generation", 0), 1);
  const std::string rv = meta.value("resourceVersion", "");

  const auto applies = api.requests();
  const auto& last = applies.back();
  EXPECT_EQ(last.method, "PATCH");
  EXPECT_EQ(last.path, "/apis/apps/v1/namespaces/apps/deployments/web");
  EXPECT_EQ(last.content_type, "application/apply-patch+yaml");
  EXPECT_THAT(last.query, HasSubstr("fieldManager=krane"));
  EXPECT_THAT(last.query, HasSubstr("force=true"));

  auto again = client->apply(deployment("apps", "web", "web:1"));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)["metadata"]["resourceVersion"], rv) << "an unchanged apply changes nothing";

  Json relabelled = deployment("apps", "web", "web:1");
  relabelled["metadata"]["labels"]["team"] = "core";
  auto labelled = client->apply(relabelled);
  ASSERT_TRUE(labelled.ok());
  EXPECT_EQ((*labelled)["metadata"]["generation"], 1) << "labels are not spec";
  EXPECT_NE((*labelled)["metadata"]["resourceVersion"], rv);

  Json updated = deployment("apps", "web", "web:2");
  updated["spec"]["template"]["spec"]["containers"][0].erase("env");
  auto changed = client->apply(updated);
  ASSERT_TRUE(changed.ok());
  EXPECT_EQ((*changed)["metadata"]["generation"], 2);
  const Json container = (*changed)["spec"]["template"]["spec"]["containers"][0];
  EXPECT_EQ(container["image"], "web:2");
  EXPECT_FALSE(container.contains("env")) << "lists are replaced";
  EXPECT_FALSE((*changed)["metadata"]["labels"].contains("team"))
      << "a field the manager no longer applies is removed";
  EXPECT_EQ((*changed)["metadata"]["uid"], meta["uid"]);
}

TEST_F(ClientTest, GetAndErrorsCarryTheServerStatus) {
  ASSERT_TRUE(client->apply(service("apps", "api")).ok());
  auto got = client->get({"v1", "Service", "apps", "api"});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)["spec"]["ports"][0]["port"], 8080);

  auto missing = client->get(deploymentRef("apps", "nope"));
  EXPECT_TRUE(absl::IsNotFound(missing.status()));
  EXPECT_THAT(msg(missing.status()),
              HasSubstr("GET /apis/apps/v1/namespaces/apps/deployments/nope: HTTP 404 NotFound: "
                        "deployments.apps \"nope\" not found"));
  EXPECT_EQ(httpCode(missing.status()), 404);
  EXPECT_EQ(reason(missing.status()), "NotFound");

  auto no_namespace = client->apply(service("ghost", "api"));
  EXPECT_TRUE(absl::IsNotFound(no_namespace.status()));
  EXPECT_THAT(msg(no_namespace.status()), HasSubstr("namespaces \"ghost\" not found"));

  Json bad = deployment("apps", "bad", "img");
  bad["spec"]["template"]["metadata"]["labels"]["app"] = "other";
  auto invalid = client->apply(bad);
  EXPECT_TRUE(absl::IsInvalidArgument(invalid.status()));
  EXPECT_EQ(httpCode(invalid.status()), 422);
  EXPECT_THAT(msg(invalid.status()), HasSubstr("Deployment.apps \"bad\" is invalid: "
                                               "spec.template.metadata.labels"));
  EXPECT_THAT(msg(invalid.status()), HasSubstr("`selector` does not match template `labels`"));

  auto bad_name = client->apply(service("apps", "Bad_Name"));
  EXPECT_THAT(msg(bad_name.status()), HasSubstr("metadata.name: Invalid value: \"Bad_Name\""));

  auto no_ns_field =
      client->apply(Json{{"apiVersion", "v1"}, {"kind", "Service"}, {"metadata", {{"name", "x"}}}});
  EXPECT_TRUE(absl::IsInvalidArgument(no_ns_field.status()));
  EXPECT_THAT(msg(no_ns_field.status()), HasSubstr("metadata.namespace missing"));
  EXPECT_THAT(
      msg(client
              ->apply(Json{{"apiVersion", "v1"}, {"kind", "Secret"}, {"metadata", {{"name", "x"}}}})
              .status()),
      HasSubstr("unknown kind \"Secret\""));
}

TEST_F(ClientTest, CreateConflictsAndReplaceIsCompareAndSwap) {
  auto created = client->create(service("apps", "svc"));
  ASSERT_TRUE(created.ok()) << created.status();
  auto twice = client->create(service("apps", "svc"));
  EXPECT_TRUE(absl::IsAlreadyExists(twice.status()));
  EXPECT_THAT(msg(twice.status()), HasSubstr("services \"svc\" already exists"));

  Json next = *created;
  next["spec"]["ports"][0]["port"] = 9090;
  auto replaced = client->replace(next);
  ASSERT_TRUE(replaced.ok()) << replaced.status();
  EXPECT_EQ((*replaced)["spec"]["ports"][0]["port"], 9090);

  // Writing again from the first version loses: someone else changed it since.
  auto stale = client->replace(next);
  EXPECT_TRUE(absl::IsAborted(stale.status()));
  EXPECT_EQ(httpCode(stale.status()), 409);
  EXPECT_THAT(msg(stale.status()), HasSubstr("the object has been modified"));
}

TEST_F(ClientTest, ListWithLabelSelectors) {
  ASSERT_TRUE(client->apply(ns("other")).ok());
  ASSERT_TRUE(client->apply(service("apps", "a1", {{"app", "a"}, {"tier", "web"}})).ok());
  ASSERT_TRUE(client->apply(service("apps", "a2", {{"app", "a"}, {"tier", "db"}})).ok());
  ASSERT_TRUE(client->apply(service("apps", "b1", {{"app", "b"}, {"tier", "web"}})).ok());
  ASSERT_TRUE(client->apply(service("apps", "c1", {{"app", "c"}})).ok());
  ASSERT_TRUE(client->apply(service("other", "a3", {{"app", "a"}})).ok());

  auto names = [&](const std::string& selector, const std::string& in_ns = "apps") {
    auto page = client->list(listReq("v1", "Service", in_ns, selector, 0, ""));
    EXPECT_TRUE(page.ok()) << selector << ": " << page.status();
    std::vector<std::string> out;
    if (!page.ok()) return out;
    for (const auto& item : page->items) {
      EXPECT_EQ(item["kind"], "Service") << "list items are whole objects";
      EXPECT_EQ(item["apiVersion"], "v1");
      out.push_back(item["metadata"]["name"]);
    }
    return out;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(names(""), (V{"a1", "a2", "b1", "c1"}));
  EXPECT_EQ(names("app=a"), (V{"a1", "a2"}));
  EXPECT_EQ(names("app==a,tier=web"), (V{"a1"}));
  EXPECT_EQ(names("app!=a"), (V{"b1", "c1"}));
  EXPECT_EQ(names("app in (b, c)"), (V{"b1", "c1"}));
  EXPECT_EQ(names("app notin (a,b)"), (V{"c1"}));
  EXPECT_EQ(names("tier"), (V{"a1", "a2", "b1"}));
  EXPECT_EQ(names("!tier"), (V{"c1"}));
  EXPECT_EQ(names("tier!=web"), (V{"a2", "c1"})) << "!= also matches objects without the key";
  EXPECT_EQ(names("app=a", ""), (V{"a1", "a2", "a3"})) << "every namespace";

  auto bad = client->list(listReq("v1", "Service", "apps", "app in a", 0, ""));
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status()));
  EXPECT_THAT(msg(bad.status()), HasSubstr("unable to parse requirement"));

  auto namespaces = client->list(listReq("v1", "Namespace", "", "", 0, ""));
  ASSERT_TRUE(namespaces.ok());
  EXPECT_EQ(namespaces->items.size(), 4u) << "default, kube-system, apps, other";
  EXPECT_EQ(api.requests().back().path, "/api/v1/namespaces");
}

TEST_F(ClientTest, PaginationFollowsContinueTokens) {
  for (int i = 0; i < 25; ++i) {
    ASSERT_TRUE(client->apply(service("apps", fmt::format("s{:02}", i), {{"page", "yes"}})).ok());
  }
  ASSERT_TRUE(client->apply(service("apps", "unlabelled")).ok());

  std::vector<std::string> seen;
  ListRequest request = listReq("v1", "Service", "apps", "page=yes", 10, "");
  int pages = 0;
  for (;;) {
    auto page = client->list(request);
    ASSERT_TRUE(page.ok()) << page.status();
    ++pages;
    EXPECT_LE(page->items.size(), 10u);
    for (const auto& item : page->items) seen.push_back(item["metadata"]["name"]);
    if (page->continue_token.empty()) break;
    request.continue_token = page->continue_token;
  }
  EXPECT_EQ(pages, 3);
  ASSERT_EQ(seen.size(), 25u);
  EXPECT_EQ(std::set<std::string>(seen.begin(), seen.end()).size(), 25u) << "no duplicates";
  EXPECT_GE(api.countRequests("GET", "/services"), 3u);

  auto all = client->listAll(listReq("v1", "Service", "apps", "page=yes", 7, ""));
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->items.size(), 25u);
  EXPECT_FALSE(all->resource_version.empty());

  // A continue token older than the server keeps is 410: list again from scratch.
  auto first = client->list(listReq("v1", "Service", "apps", "", 5, ""));
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(client->apply(service("apps", "later")).ok());
  api.compactHistory();
  auto expired = client->list(listReq("v1", "Service", "apps", "", 5, first->continue_token));
  EXPECT_TRUE(isGone(expired.status())) << expired.status();
  EXPECT_TRUE(absl::IsOutOfRange(expired.status()));
  EXPECT_EQ(reason(expired.status()), "Expired");
}

TEST_F(ClientTest, DeleteWithPropagation) {
  ASSERT_TRUE(client->apply(deployment("apps", "web", "web:1")).ok());
  ASSERT_TRUE(api.makePodsReady("apps", "web").ok());
  ASSERT_EQ(api.objects("v1", "Pod", "apps").size(), 2u);
  ASSERT_EQ(api.objects("apps/v1", "ReplicaSet", "apps").size(), 1u);

  ASSERT_TRUE(client->remove(deploymentRef("apps", "web")).ok());
  EXPECT_THAT(api.requests().back().query, HasSubstr("propagationPolicy=Background"));
  EXPECT_TRUE(absl::IsNotFound(client->get(deploymentRef("apps", "web")).status()));
  EXPECT_TRUE(api.objects("v1", "Pod", "apps").empty()) << "owned pods go with it";
  EXPECT_TRUE(api.objects("apps/v1", "ReplicaSet", "apps").empty());

  ASSERT_TRUE(client->apply(deployment("apps", "keep", "keep:1")).ok());
  ASSERT_TRUE(api.makePodsReady("apps", "keep").ok());
  ASSERT_TRUE(client->remove(deploymentRef("apps", "keep"), Propagation::kOrphan).ok());
  EXPECT_EQ(api.objects("apps/v1", "ReplicaSet", "apps").size(), 1u) << "orphaned, not deleted";

  auto again = client->remove(deploymentRef("apps", "keep"));
  EXPECT_TRUE(absl::IsNotFound(again));

  ASSERT_TRUE(client->remove({"v1", "Namespace", "", "apps"}).ok());
  EXPECT_TRUE(api.objects("apps/v1", "ReplicaSet", "apps").empty())
      << "a namespace takes its objects with it";
}

TEST_F(ClientTest, StatusSubresource) {
  ASSERT_TRUE(client->apply(deployment("apps", "web", "web:1")).ok());
  auto patched = client->patchStatus(deploymentRef("apps", "web"),
                                     {{"status", {{"readyReplicas", 2}, {"replicas", 2}}}});
  ASSERT_TRUE(patched.ok()) << patched.status();
  EXPECT_EQ((*patched)["status"]["readyReplicas"], 2);
  EXPECT_EQ((*patched)["metadata"]["generation"], 1) << "status is not spec";
  EXPECT_EQ(api.requests().back().path, "/apis/apps/v1/namespaces/apps/deployments/web/status");
  EXPECT_EQ(api.requests().back().content_type, "application/merge-patch+json");

  auto status = client->getStatus(deploymentRef("apps", "web"));
  ASSERT_TRUE(status.ok());
  EXPECT_EQ((*status)["status"]["replicas"], 2);

  // Status sent to the main resource is ignored; applying status goes to the subresource.
  Json with_status = deployment("apps", "web", "web:1");
  with_status["status"] = {{"replicas", 99}};
  auto main = client->apply(with_status);
  ASSERT_TRUE(main.ok());
  EXPECT_EQ((*main)["status"]["replicas"], 2);
  auto applied = client->applyStatus(with_status);
  ASSERT_TRUE(applied.ok()) << applied.status();
  EXPECT_EQ((*applied)["status"]["replicas"], 99);
  EXPECT_EQ((*applied)["status"]["readyReplicas"], 2);

  auto nothing = client->patchStatus(deploymentRef("apps", "ghost"), {{"status", {}}});
  EXPECT_TRUE(absl::IsNotFound(nothing.status()));
}

TEST_F(ClientTest, WatchStreamsChangesFromAVersionAndStopsOnRequest) {
  auto start = client->list(listReq("v1", "Service", "apps", "", 0, ""));
  ASSERT_TRUE(start.ok());
  std::mutex mutex;
  std::vector<std::pair<std::string, std::string>> events;
  std::atomic<bool> cancel{false};
  absl::Status result;
  std::thread watcher([&] {
    result = client->watch(
        watchReq("v1", "Service", "apps", "watched=yes", start->resource_version, 60),
        [&](const WatchEvent& e) {
          if (e.type == "BOOKMARK") return true;
          std::lock_guard lock(mutex);
          events.emplace_back(e.type, e.object["metadata"]["name"]);
          return true;
        },
        &cancel);
  });
  ASSERT_TRUE(client->apply(service("apps", "one", {{"watched", "yes"}})).ok());
  ASSERT_TRUE(client->apply(service("apps", "ignored")).ok());
  ASSERT_TRUE(client->apply(service("apps", "one", {{"watched", "yes"}}, 9000)).ok());
  ASSERT_TRUE(client->remove({"v1", "Service", "apps", "one"}).ok());
  ASSERT_TRUE(eventually([&] {
    std::lock_guard lock(mutex);
    return events.size() >= 3;
  }));
  cancel = true;
  watcher.join();
  EXPECT_TRUE(result.ok()) << result;
  using E = std::vector<std::pair<std::string, std::string>>;
  EXPECT_EQ(events, (E{{"ADDED", "one"}, {"MODIFIED", "one"}, {"DELETED", "one"}}));
}

TEST_F(ClientTest, WatchWithoutAVersionStartsWithTheCurrentObjects) {
  ASSERT_TRUE(client->apply(service("apps", "a")).ok());
  ASSERT_TRUE(client->apply(service("apps", "b")).ok());
  std::vector<std::string> added;
  auto status =
      client->watch(watchReq("v1", "Service", "apps", "", "", 30), [&](const WatchEvent& e) {
        if (e.type == "ADDED") added.push_back(e.object["metadata"]["name"]);
        return added.size() < 2;  // stop once both are in
      });
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(added, (std::vector<std::string>{"a", "b"}));
}

TEST_F(ClientTest, WatchFromAVersionTooOldIsGoneThenRelistAndWatchAgain) {
  ASSERT_TRUE(client->apply(service("apps", "a")).ok());
  const std::string old = std::to_string(api.resourceVersion());
  ASSERT_TRUE(client->apply(service("apps", "b")).ok());
  api.compactHistory();

  auto gone = client->watch(watchReq("v1", "Service", "apps", "", old, 30),
                            [](const WatchEvent&) { return true; });
  EXPECT_TRUE(isGone(gone)) << gone;
  EXPECT_THAT(msg(gone), HasSubstr("too old resource version"));

  auto relist = client->list(listReq("v1", "Service", "apps", "", 0, ""));
  ASSERT_TRUE(relist.ok());
  EXPECT_EQ(relist->items.size(), 2u);
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ASSERT_TRUE(client->apply(service("apps", "c")).ok());
  });
  std::string seen;
  auto resumed = client->watch(watchReq("v1", "Service", "apps", "", relist->resource_version, 30),
                               [&](const WatchEvent& e) {
                                 if (e.type == "BOOKMARK") return true;
                                 seen = strCat(e.type, " ", e.object["metadata"].value("name", ""));
                                 return false;
                               });
  writer.join();
  EXPECT_TRUE(resumed.ok()) << resumed;
  EXPECT_EQ(seen, "ADDED c");
}

TEST_F(ClientTest, RetriesOn429And5xxThenSucceeds) {
  ASSERT_TRUE(client->apply(service("apps", "svc")).ok());
  const auto before = client->stats();
  api.failNext(2, 500);
  auto got = client->get({"v1", "Service", "apps", "svc"});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(client->stats().retries - before.retries, 2u);

  api.clearRequests();
  api.failNext(3, 429, /*retry_after_seconds=*/0);
  ASSERT_TRUE(client->apply(service("apps", "svc2")).ok());
  const auto log = api.requests();
  ASSERT_EQ(log.size(), 4u) << "three refusals, then the apply";
  EXPECT_EQ(log[0].status, 429);
  EXPECT_EQ(log[3].status, 201);

  // Retry-After is honoured: one second before the second attempt (a lower bound only).
  api.failNext(1, 429, /*retry_after_seconds=*/1);
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(client->get({"v1", "Service", "apps", "svc"}).ok());
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(900));

  // 4xx answers other than 429 are final.
  api.clearRequests();
  auto missing = client->get({"v1", "Service", "apps", "nope"});
  EXPECT_TRUE(absl::IsNotFound(missing.status()));
  EXPECT_EQ(api.requests().size(), 1u);
}

TEST_F(ClientTest, RetriesAreBoundedAndTheLastAnswerIsReported) {
  ClientOptions options = fastOptions();
  options.max_retries = 2;
  auto bounded = makeClient(options);
  api.clearRequests();
  api.failNext(100, 503);
  auto result = bounded->get({"v1", "Service", "apps", "svc"});
  EXPECT_TRUE(absl::IsUnavailable(result.status())) << result.status();
  EXPECT_THAT(msg(result.status()), HasSubstr("gave up after 3 attempts"));
  EXPECT_THAT(msg(result.status()), HasSubstr("HTTP 503 ServiceUnavailable: injected failure"));
  EXPECT_EQ(api.requests().size(), 3u);

  api.failNext(100, 429);
  auto throttled = bounded->get({"v1", "Service", "apps", "svc"});
  EXPECT_TRUE(absl::IsResourceExhausted(throttled.status()));
  api.failNext(0, 0);
}

TEST(ClientConnection, UnreachableServerIsUnavailableAfterBoundedRetries) {
  // A port nobody listens on: bind, read the port, close.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  ClusterConfig config;
  config.server = strCat("http://127.0.0.1:", ntohs(addr.sin_port));
  config.source = "test";
  ClientOptions options;
  options.max_retries = 2;
  options.backoff = {std::chrono::milliseconds(1), 2.0, std::chrono::milliseconds(5), 0.5};
  auto client = Client::create(config, options);
  ASSERT_TRUE(client.ok());
  auto result = (*client)->get({"v1", "Namespace", "", "default"});
  EXPECT_TRUE(absl::IsUnavailable(result.status()));
  EXPECT_THAT(msg(result.status()), HasSubstr("cannot reach the API server " + config.server));
  EXPECT_EQ((*client)->stats().requests, 3u);

  config.server = "ftp://x";
  EXPECT_TRUE(absl::IsInvalidArgument(Client::create(config).status()));
}

TEST_F(ClientTest, ClientSideRateLimitThrottlesBeyondTheBurst) {
  ClientOptions options = fastOptions();
  options.qps = 20;
  options.burst = 2;
  auto limited = makeClient(options);
  for (int i = 0; i < 12; ++i) ASSERT_TRUE(limited->get({"v1", "Namespace", "", "apps"}).ok());
  const auto stats = limited->stats();
  EXPECT_EQ(stats.requests, 12u);
  // Two go through on the burst; nearly all others wait for a token (a few may find one that
  // refilled while the previous request was in flight).
  EXPECT_GE(stats.throttled, 7u);
  EXPECT_EQ(client->stats().throttled, 0u) << "an unlimited client never waits";
}

TEST_F(ClientTest, BearerTokenIsSent) {
  api.requireToken("s3cret");
  auto anonymous = client->get({"v1", "Namespace", "", "apps"});
  EXPECT_TRUE(absl::IsUnauthenticated(anonymous.status()));
  EXPECT_THAT(msg(anonymous.status()), HasSubstr("HTTP 401 Unauthorized"));
  auto with_token = makeClient();
  EXPECT_EQ(with_token->config().bearer_token, "s3cret");
  EXPECT_TRUE(with_token->get({"v1", "Namespace", "", "apps"}).ok());
}

TEST_F(ClientTest, FieldSelectorsOnTheFieldsTheServerIndexes) {
  ASSERT_TRUE(client->apply(deployment("apps", "web", "web:1", 3)).ok());
  ASSERT_TRUE(api.makePodsReady("apps", "web").ok());
  ASSERT_TRUE(client->apply(deployment("apps", "db", "db:1", 1)).ok());
  ASSERT_TRUE(api.makePodsFailImagePull("apps", "db").ok());
  ListRequest running = listReq("v1", "Pod", "apps", "", 0, "", "status.phase=Running");
  auto pods = client->list(running);
  ASSERT_TRUE(pods.ok()) << pods.status();
  EXPECT_EQ(pods->items.size(), 3u);
  running.field_selector = "status.phase!=Running,status.phase!=Succeeded";
  pods = client->list(running);
  ASSERT_TRUE(pods.ok());
  ASSERT_EQ(pods->items.size(), 1u);
  EXPECT_EQ(pods->items[0]["status"]["phase"], "Pending");

  auto by_name = client->list(listReq("v1", "Service", "", "", 0, "", "metadata.name=nope"));
  ASSERT_TRUE(by_name.ok());
  EXPECT_TRUE(by_name->items.empty());
  auto unknown = client->list(listReq("v1", "Service", "apps", "", 0, "", "spec.type=ClusterIP"));
  EXPECT_TRUE(absl::IsInvalidArgument(unknown.status()));
  EXPECT_THAT(msg(unknown.status()), HasSubstr("not a known field selector"));
}

TEST_F(ClientTest, AnObjectLeavingAWatchedSelectorArrivesAsDeleted) {
  ASSERT_TRUE(client->apply(service("apps", "s", {{"tier", "web"}})).ok());
  const std::string from = std::to_string(api.resourceVersion());
  ASSERT_TRUE(client->apply(service("apps", "s", {{"tier", "db"}})).ok());
  ASSERT_TRUE(client->apply(service("apps", "s", {{"tier", "web"}})).ok());
  std::vector<std::string> types;
  auto status = client->watch(watchReq("v1", "Service", "apps", "tier=web", from, 10),
                              [&](const WatchEvent& e) {
                                if (e.type != "BOOKMARK") types.push_back(e.type);
                                return types.size() < 2;
                              });
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(types, (std::vector<std::string>{"DELETED", "ADDED"}));
}

TEST_F(ClientTest, AWatchAnsweredWithHttp410IsGoneToo) {
  api.failNext(1, 410, -1, "GET");
  auto gone = client->watch(watchReq("v1", "Service", "apps", "", "1", 10),
                            [](const WatchEvent&) { return true; });
  EXPECT_TRUE(isGone(gone)) << gone;
}

TEST_F(ClientTest, ARotatedTokenFileIsReadAgain) {
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/token";
  std::ofstream(path) << "first\n";
  ClusterConfig config = api.clusterConfig();
  config.bearer_token = "first";
  config.token_file = path;
  ClientOptions options = fastOptions();
  options.token_reread_interval = std::chrono::milliseconds(0);
  auto rotating = Client::create(config, options);
  ASSERT_TRUE(rotating.ok());
  api.requireToken("first");
  EXPECT_TRUE((*rotating)->get({"v1", "Namespace", "", "apps"}).ok());
  std::ofstream(path) << "second\n";
  api.requireToken("second");
  EXPECT_TRUE((*rotating)->get({"v1", "Namespace", "", "apps"}).ok());
}

}  // namespace
}  // namespace krane::kube
