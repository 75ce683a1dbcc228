#include "plugins/runtime/kubernetes/client.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <set>
#include <thread>

#include <catch2/catch.hpp>

#include "common/strings.h"
#include "plugins/runtime/kubernetes/errors.h"
#include "tests/plugins/runtime/kubernetes/requests.h"
#include "tests/support/fake_kube_api.h"
#include "tests/support/matchers.h"
#include "tests/support/wait.h"

namespace krane::kube {
namespace {

using krane::testing::eventually;
using krane::testing::FakeKubeApi;

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

class ClientTest {
 protected:
  std::unique_ptr<Client> makeClient(const ClientOptions& options = fastOptions()) {
    auto client = Client::create(api.clusterConfig(), options);
    CHECK_THAT(client, IsOk());
    return std::move(*client);
  }
  static ClientOptions fastOptions() {
    ClientOptions options;
    options.qps = 0;
    options.backoff = {std::chrono::milliseconds(1), 2.0, std::chrono::milliseconds(20), 0.5};
    return options;
  }
  ClientTest() {
    client = makeClient();
    REQUIRE_THAT(client->apply(ns("apps")), IsOk());
  }

  FakeKubeApi api;
  std::unique_ptr<Client> client;
};

TEST_CASE_METHOD(ClientTest, "apply creates then merges and is idempotent", "[client]") {
  auto created = client->apply(deployment("apps", "web", "web:1"));
  REQUIRE_THAT(created, IsOk());
  const Json& meta = (*created)["metadata"];
  CHECK_FALSE(meta.value("uid", "").empty());
  CHECK_FALSE(meta.value("creationTimestamp", "").empty());
  CHECK(meta.value("generation", 0) == 1);
  const std::string rv = meta.value("resourceVersion", "");

  const auto applies = api.requests();
  const auto& last = applies.back();
  CHECK(last.method == "PATCH");
  CHECK(last.path == "/apis/apps/v1/namespaces/apps/deployments/web");
  CHECK(last.content_type == "application/apply-patch+yaml");
  CHECK_THAT(last.query, Catch::Contains("fieldManager=krane"));
  CHECK_THAT(last.query, Catch::Contains("force=true"));

  auto again = client->apply(deployment("apps", "web", "web:1"));
  REQUIRE_THAT(again, IsOk());
  INFO("an unchanged apply changes nothing");
  CHECK((*again)["metadata"]["resourceVersion"] == rv);

  Json relabelled = deployment("apps", "web", "web:1");
  relabelled["metadata"]["labels"]["team"] = "core";
  auto labelled = client->apply(relabelled);
  REQUIRE_THAT(labelled, IsOk());
  INFO("labels are not spec");
  CHECK((*labelled)["metadata"]["generation"] == 1);
  CHECK((*labelled)["metadata"]["resourceVersion"] != rv);

  Json updated = deployment("apps", "web", "web:2");
  updated["spec"]["template"]["spec"]["containers"][0].erase("env");
  auto changed = client->apply(updated);
  REQUIRE_THAT(changed, IsOk());
  CHECK((*changed)["metadata"]["generation"] == 2);
  const Json container = (*changed)["spec"]["template"]["spec"]["containers"][0];
  CHECK(container["image"] == "web:2");
  INFO("lists are replaced");
  CHECK_FALSE(container.contains("env"));
  INFO("a field the manager no longer applies is removed");
  CHECK_FALSE((*changed)["metadata"]["labels"].contains("team"));
  CHECK((*changed)["metadata"]["uid"] == meta["uid"]);
}

TEST_CASE_METHOD(ClientTest, "get and errors carry the server status", "[client]") {
  REQUIRE_THAT(client->apply(service("apps", "api")), IsOk());
  auto got = client->get({"v1", "Service", "apps", "api"});
  REQUIRE_THAT(got, IsOk());
  CHECK((*got)["spec"]["ports"][0]["port"] == 8080);

  auto missing = client->get(deploymentRef("apps", "nope"));
  CHECK(absl::IsNotFound(missing.status()));
  CHECK_THAT(
      msg(missing.status()),
      Catch::Contains("GET /apis/apps/v1/namespaces/apps/deployments/nope: HTTP 404 NotFound: "
                      "deployments.apps \"nope\" not found"));
  CHECK(httpCode(missing.status()) == 404);
  CHECK(reason(missing.status()) == "NotFound");

  auto no_namespace = client->apply(service("ghost", "api"));
  CHECK(absl::IsNotFound(no_namespace.status()));
  CHECK_THAT(msg(no_namespace.status()), Catch::Contains("namespaces \"ghost\" not found"));

  Json bad = deployment("apps", "bad", "img");
  bad["spec"]["template"]["metadata"]["labels"]["app"] = "other";
  auto invalid = client->apply(bad);
  CHECK(absl::IsInvalidArgument(invalid.status()));
  CHECK(httpCode(invalid.status()) == 422);
  CHECK_THAT(msg(invalid.status()), Catch::Contains("Deployment.apps \"bad\" is invalid: "
                                                    "spec.template.metadata.labels"));
  CHECK_THAT(msg(invalid.status()), Catch::Contains("`selector` does not match template `labels`"));

  auto bad_name = client->apply(service("apps", "Bad_Name"));
  CHECK_THAT(msg(bad_name.status()), Catch::Contains("metadata.name: Invalid value: \"Bad_Name\""));

  auto no_ns_field =
      client->apply(Json{{"apiVersion", "v1"}, {"kind", "Service"}, {"metadata", {{"name", "x"}}}});
  CHECK(absl::IsInvalidArgument(no_ns_field.status()));
  CHECK_THAT(msg(no_ns_field.status()), Catch::Contains("metadata.namespace missing"));
  CHECK_THAT(
      msg(client
              ->apply(Json{{"apiVersion", "v1"}, {"kind", "Secret"}, {"metadata", {{"name", "x"}}}})
              .status()),
      Catch::Contains("unknown kind \"Secret\""));
}

TEST_CASE_METHOD(ClientTest, "create conflicts and replace is compare and swap", "[client]") {
  auto created = client->create(service("apps", "svc"));
  REQUIRE_THAT(created, IsOk());
  auto twice = client->create(service("apps", "svc"));
  CHECK(absl::IsAlreadyExists(twice.status()));
  CHECK_THAT(msg(twice.status()), Catch::Contains("services \"svc\" already exists"));

  Json next = *created;
  next["spec"]["ports"][0]["port"] = 9090;
  auto replaced = client->replace(next);
  REQUIRE_THAT(replaced, IsOk());
  CHECK((*replaced)["spec"]["ports"][0]["port"] == 9090);

  // Writing again from the first version loses: someone else changed it since.
  auto stale = client->replace(next);
  CHECK(absl::IsAborted(stale.status()));
  CHECK(httpCode(stale.status()) == 409);
  CHECK_THAT(msg(stale.status()), Catch::Contains("the object has been modified"));
}

TEST_CASE_METHOD(ClientTest, "list with label selectors", "[client]") {
  REQUIRE_THAT(client->apply(ns("other")), IsOk());
  REQUIRE_THAT(client->apply(service("apps", "a1", {{"app", "a"}, {"tier", "web"}})), IsOk());
  REQUIRE_THAT(client->apply(service("apps", "a2", {{"app", "a"}, {"tier", "db"}})), IsOk());
  REQUIRE_THAT(client->apply(service("apps", "b1", {{"app", "b"}, {"tier", "web"}})), IsOk());
  REQUIRE_THAT(client->apply(service("apps", "c1", {{"app", "c"}})), IsOk());
  REQUIRE_THAT(client->apply(service("other", "a3", {{"app", "a"}})), IsOk());

  auto names = [&](const std::string& selector, const std::string& in_ns = "apps") {
    auto page = client->list(listReq("v1", "Service", in_ns, selector, 0, ""));
    INFO(selector << ": " << page.status());
    CHECK_THAT(page, IsOk());
    std::vector<std::string> out;
    if (!page.ok()) return out;
    for (const auto& item : page->items) {
      INFO("list items are whole objects");
      CHECK(item["kind"] == "Service");
      CHECK(item["apiVersion"] == "v1");
      out.push_back(item["metadata"]["name"]);
    }
    return out;
  };
  using V = std::vector<std::string>;
  CHECK(names("") == (V{"a1", "a2", "b1", "c1"}));
  CHECK(names("app=a") == (V{"a1", "a2"}));
  CHECK(names("app==a,tier=web") == (V{"a1"}));
  CHECK(names("app!=a") == (V{"b1", "c1"}));
  CHECK(names("app in (b, c)") == (V{"b1", "c1"}));
  CHECK(names("app notin (a,b)") == (V{"c1"}));
  CHECK(names("tier") == (V{"a1", "a2", "b1"}));
  CHECK(names("!tier") == (V{"c1"}));
  INFO("!= also matches objects without the key");
  CHECK(names("tier!=web") == (V{"a2", "c1"}));
  INFO("every namespace");
  CHECK(names("app=a", "") == (V{"a1", "a2", "a3"}));

  auto bad = client->list(listReq("v1", "Service", "apps", "app in a", 0, ""));
  CHECK(absl::IsInvalidArgument(bad.status()));
  CHECK_THAT(msg(bad.status()), Catch::Contains("unable to parse requirement"));

  auto namespaces = client->list(listReq("v1", "Namespace", "", "", 0, ""));
  REQUIRE_THAT(namespaces, IsOk());
  INFO("default, kube-system, apps, other");
  CHECK(namespaces->items.size() == 4u);
  CHECK(api.requests().back().path == "/api/v1/namespaces");
}

TEST_CASE_METHOD(ClientTest, "pagination follows continue tokens", "[client]") {
  for (int i = 0; i < 25; ++i) {
    REQUIRE_THAT(client->apply(service("apps", fmt::format("s{:02}", i), {{"page", "yes"}})),
                 IsOk());
  }
  REQUIRE_THAT(client->apply(service("apps", "unlabelled")), IsOk());

  std::vector<std::string> seen;
  ListRequest request = listReq("v1", "Service", "apps", "page=yes", 10, "");
  int pages = 0;
  for (;;) {
    auto page = client->list(request);
    REQUIRE_THAT(page, IsOk());
    ++pages;
    CHECK(page->items.size() <= 10u);
    for (const auto& item : page->items) seen.push_back(item["metadata"]["name"]);
    if (page->continue_token.empty()) break;
    request.continue_token = page->continue_token;
  }
  CHECK(pages == 3);
  REQUIRE(seen.size() == 25u);
  INFO("no duplicates");
  CHECK(std::set<std::string>(seen.begin(), seen.end()).size() == 25u);
  CHECK(api.countRequests("GET", "/services") >= 3u);

  auto all = client->listAll(listReq("v1", "Service", "apps", "page=yes", 7, ""));
  REQUIRE_THAT(all, IsOk());
  CHECK(all->items.size() == 25u);
  CHECK_FALSE(all->resource_version.empty());

  // A continue token older than the server keeps is 410: list again from scratch.
  auto first = client->list(listReq("v1", "Service", "apps", "", 5, ""));
  REQUIRE_THAT(first, IsOk());
  REQUIRE_THAT(client->apply(service("apps", "later")), IsOk());
  api.compactHistory();
  auto expired = client->list(listReq("v1", "Service", "apps", "", 5, first->continue_token));
  INFO(expired.status());
  CHECK(isGone(expired.status()));
  CHECK(absl::IsOutOfRange(expired.status()));
  CHECK(reason(expired.status()) == "Expired");
}

TEST_CASE_METHOD(ClientTest, "delete with propagation", "[client]") {
  REQUIRE_THAT(client->apply(deployment("apps", "web", "web:1")), IsOk());
  REQUIRE_THAT(api.makePodsReady("apps", "web"), IsOk());
  REQUIRE(api.objects("v1", "Pod", "apps").size() == 2u);
  REQUIRE(api.objects("apps/v1", "ReplicaSet", "apps").size() == 1u);

  REQUIRE_THAT(client->remove(deploymentRef("apps", "web")), IsOk());
  CHECK_THAT(api.requests().back().query, Catch::Contains("propagationPolicy=Background"));
  CHECK(absl::IsNotFound(client->get(deploymentRef("apps", "web")).status()));
  INFO("owned pods go with it");
  CHECK(api.objects("v1", "Pod", "apps").empty());
  CHECK(api.objects("apps/v1", "ReplicaSet", "apps").empty());

  REQUIRE_THAT(client->apply(deployment("apps", "keep", "keep:1")), IsOk());
  REQUIRE_THAT(api.makePodsReady("apps", "keep"), IsOk());
  REQUIRE_THAT(client->remove(deploymentRef("apps", "keep"), Propagation::kOrphan), IsOk());
  INFO("orphaned, not deleted");
  CHECK(api.objects("apps/v1", "ReplicaSet", "apps").size() == 1u);

  auto again = client->remove(deploymentRef("apps", "keep"));
  CHECK(absl::IsNotFound(again));

  REQUIRE_THAT(client->remove({"v1", "Namespace", "", "apps"}), IsOk());
  INFO("a namespace takes its objects with it");
  CHECK(api.objects("apps/v1", "ReplicaSet", "apps").empty());
}

TEST_CASE_METHOD(ClientTest, "status subresource", "[client]") {
  REQUIRE_THAT(client->apply(deployment("apps", "web", "web:1")), IsOk());
  auto patched = client->patchStatus(deploymentRef("apps", "web"),
                                     {{"status", {{"readyReplicas", 2}, {"replicas", 2}}}});
  REQUIRE_THAT(patched, IsOk());
  CHECK((*patched)["status"]["readyReplicas"] == 2);
  INFO("status is not spec");
  CHECK((*patched)["metadata"]["generation"] == 1);
  CHECK(api.requests().back().path == "/apis/apps/v1/namespaces/apps/deployments/web/status");
  CHECK(api.requests().back().content_type == "application/merge-patch+json");

  auto status = client->getStatus(deploymentRef("apps", "web"));
  REQUIRE_THAT(status, IsOk());
  CHECK((*status)["status"]["replicas"] == 2);

  // Status sent to the main resource is ignored; applying status goes to the subresource.
  Json with_status = deployment("apps", "web", "web:1");
  with_status["status"] = {{"replicas", 99}};
  auto main = client->apply(with_status);
  REQUIRE_THAT(main, IsOk());
  CHECK((*main)["status"]["replicas"] == 2);
  auto applied = client->applyStatus(with_status);
  REQUIRE_THAT(applied, IsOk());
  CHECK((*applied)["status"]["replicas"] == 99);
  CHECK((*applied)["status"]["readyReplicas"] == 2);

  auto nothing = client->patchStatus(deploymentRef("apps", "ghost"), {{"status", {}}});
  CHECK(absl::IsNotFound(nothing.status()));
}

TEST_CASE_METHOD(ClientTest, "watch streams changes from a version and stops on request",
                 "[client]") {
  auto start = client->list(listReq("v1", "Service", "apps", "", 0, ""));
  REQUIRE_THAT(start, IsOk());
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
  REQUIRE_THAT(client->apply(service("apps", "one", {{"watched", "yes"}})), IsOk());
  REQUIRE_THAT(client->apply(service("apps", "ignored")), IsOk());
  REQUIRE_THAT(client->apply(service("apps", "one", {{"watched", "yes"}}, 9000)), IsOk());
  REQUIRE_THAT(client->remove({"v1", "Service", "apps", "one"}), IsOk());
  REQUIRE(eventually([&] {
    std::lock_guard lock(mutex);
    return events.size() >= 3;
  }));
  cancel = true;
  watcher.join();
  CHECK_THAT(result, IsOk());
  using E = std::vector<std::pair<std::string, std::string>>;
  CHECK(events == (E{{"ADDED", "one"}, {"MODIFIED", "one"}, {"DELETED", "one"}}));
}

TEST_CASE_METHOD(ClientTest, "watch without a version starts with the current objects",
                 "[client]") {
  REQUIRE_THAT(client->apply(service("apps", "a")), IsOk());
  REQUIRE_THAT(client->apply(service("apps", "b")), IsOk());
  std::vector<std::string> added;
  auto status =
      client->watch(watchReq("v1", "Service", "apps", "", "", 30), [&](const WatchEvent& e) {
        if (e.type == "ADDED") added.push_back(e.object["metadata"]["name"]);
        return added.size() < 2;  // stop once both are in
      });
  CHECK_THAT(status, IsOk());
  CHECK(added == (std::vector<std::string>{"a", "b"}));
}

TEST_CASE_METHOD(ClientTest, "watch from a version too old is gone then relist and watch again",
                 "[client]") {
  REQUIRE_THAT(client->apply(service("apps", "a")), IsOk());
  const std::string old = std::to_string(api.resourceVersion());
  REQUIRE_THAT(client->apply(service("apps", "b")), IsOk());
  api.compactHistory();

  auto gone = client->watch(watchReq("v1", "Service", "apps", "", old, 30),
                            [](const WatchEvent&) { return true; });
  INFO(gone);
  CHECK(isGone(gone));
  CHECK_THAT(msg(gone), Catch::Contains("too old resource version"));

  auto relist = client->list(listReq("v1", "Service", "apps", "", 0, ""));
  REQUIRE_THAT(relist, IsOk());
  CHECK(relist->items.size() == 2u);
  absl::Status written;
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    written = client->apply(service("apps", "c")).status();
  });
  std::string seen;
  auto resumed = client->watch(watchReq("v1", "Service", "apps", "", relist->resource_version, 30),
                               [&](const WatchEvent& e) {
                                 if (e.type == "BOOKMARK") return true;
                                 seen = strCat(e.type, " ", e.object["metadata"].value("name", ""));
                                 return false;
                               });
  writer.join();
  CHECK_THAT(written, IsOk());
  CHECK_THAT(resumed, IsOk());
  CHECK(seen == "ADDED c");
}

TEST_CASE_METHOD(ClientTest, "retries on429 and5xx then succeeds", "[client]") {
  REQUIRE_THAT(client->apply(service("apps", "svc")), IsOk());
  const auto before = client->stats();
  api.failNext(2, 500);
  auto got = client->get({"v1", "Service", "apps", "svc"});
  REQUIRE_THAT(got, IsOk());
  CHECK((client->stats().retries - before.retries) == 2u);

  api.clearRequests();
  api.failNext(3, 429, /*retry_after_seconds=*/0);
  REQUIRE_THAT(client->apply(service("apps", "svc2")), IsOk());
  const auto log = api.requests();
  INFO("three refusals, then the apply");
  REQUIRE(log.size() == 4u);
  CHECK(log[0].status == 429);
  CHECK(log[3].status == 201);

  // Retry-After is honoured: one second before the second attempt (a lower bound only).
  api.failNext(1, 429, /*retry_after_seconds=*/1);
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE_THAT(client->get({"v1", "Service", "apps", "svc"}), IsOk());
  CHECK((std::chrono::steady_clock::now() - t0) >= std::chrono::milliseconds(900));

  // 4xx answers other than 429 are final.
  api.clearRequests();
  auto missing = client->get({"v1", "Service", "apps", "nope"});
  CHECK(absl::IsNotFound(missing.status()));
  CHECK(api.requests().size() == 1u);
}

TEST_CASE_METHOD(ClientTest, "retries are bounded and the last answer is reported", "[client]") {
  ClientOptions options = fastOptions();
  options.max_retries = 2;
  auto bounded = makeClient(options);
  api.clearRequests();
  api.failNext(100, 503);
  auto result = bounded->get({"v1", "Service", "apps", "svc"});
  INFO(result.status());
  CHECK(absl::IsUnavailable(result.status()));
  CHECK_THAT(msg(result.status()), Catch::Contains("gave up after 3 attempts"));
  CHECK_THAT(msg(result.status()),
             Catch::Contains("HTTP 503 ServiceUnavailable: injected failure"));
  CHECK(api.requests().size() == 3u);

  api.failNext(100, 429);
  auto throttled = bounded->get({"v1", "Service", "apps", "svc"});
  CHECK(absl::IsResourceExhausted(throttled.status()));
  api.failNext(0, 0);
}

TEST_CASE("unreachable server is unavailable after bounded retries", "[client-connection]") {
  // A port nobody listens on: bind, read the port, close.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
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
  REQUIRE_THAT(client, IsOk());
  auto result = (*client)->get({"v1", "Namespace", "", "default"});
  CHECK(absl::IsUnavailable(result.status()));
  CHECK_THAT(msg(result.status()), Catch::Contains("cannot reach the API server " + config.server));
  CHECK((*client)->stats().requests == 3u);

  config.server = "ftp://x";
  CHECK(absl::IsInvalidArgument(Client::create(config).status()));
}

TEST_CASE_METHOD(ClientTest, "client side rate limit throttles beyond the burst", "[client]") {
  ClientOptions options = fastOptions();
  options.qps = 20;
  options.burst = 2;
  auto limited = makeClient(options);
  for (int i = 0; i < 12; ++i) REQUIRE_THAT(limited->get({"v1", "Namespace", "", "apps"}), IsOk());
  const auto stats = limited->stats();
  CHECK(stats.requests == 12u);
  // Two go through on the burst; nearly all others wait for a token (a few may find one that
  // refilled while the previous request was in flight).
  CHECK(stats.throttled >= 7u);
  INFO("an unlimited client never waits");
  CHECK(client->stats().throttled == 0u);
}

TEST_CASE_METHOD(ClientTest, "bearer token is sent", "[client]") {
  api.requireToken("s3cret");
  auto anonymous = client->get({"v1", "Namespace", "", "apps"});
  CHECK(absl::IsUnauthenticated(anonymous.status()));
  CHECK_THAT(msg(anonymous.status()), Catch::Contains("HTTP 401 Unauthorized"));
  auto with_token = makeClient();
  CHECK(with_token->config().bearer_token == "s3cret");
  CHECK_THAT(with_token->get({"v1", "Namespace", "", "apps"}), IsOk());
}

TEST_CASE_METHOD(ClientTest, "field selectors on the fields the server indexes", "[client]") {
  REQUIRE_THAT(client->apply(deployment("apps", "web", "web:1", 3)), IsOk());
  REQUIRE_THAT(api.makePodsReady("apps", "web"), IsOk());
  REQUIRE_THAT(client->apply(deployment("apps", "db", "db:1", 1)), IsOk());
  REQUIRE_THAT(api.makePodsFailImagePull("apps", "db"), IsOk());
  ListRequest running = listReq("v1", "Pod", "apps", "", 0, "", "status.phase=Running");
  auto pods = client->list(running);
  REQUIRE_THAT(pods, IsOk());
  CHECK(pods->items.size() == 3u);
  running.field_selector = "status.phase!=Running,status.phase!=Succeeded";
  pods = client->list(running);
  REQUIRE_THAT(pods, IsOk());
  REQUIRE(pods->items.size() == 1u);
  CHECK(pods->items[0]["status"]["phase"] == "Pending");

  auto by_name = client->list(listReq("v1", "Service", "", "", 0, "", "metadata.name=nope"));
  REQUIRE_THAT(by_name, IsOk());
  CHECK(by_name->items.empty());
  auto unknown = client->list(listReq("v1", "Service", "apps", "", 0, "", "spec.type=ClusterIP"));
  CHECK(absl::IsInvalidArgument(unknown.status()));
  CHECK_THAT(msg(unknown.status()), Catch::Contains("not a known field selector"));
}

TEST_CASE_METHOD(ClientTest, "an object leaving a watched selector arrives as deleted",
                 "[client]") {
  REQUIRE_THAT(client->apply(service("apps", "s", {{"tier", "web"}})), IsOk());
  const std::string from = std::to_string(api.resourceVersion());
  REQUIRE_THAT(client->apply(service("apps", "s", {{"tier", "db"}})), IsOk());
  REQUIRE_THAT(client->apply(service("apps", "s", {{"tier", "web"}})), IsOk());
  std::vector<std::string> types;
  auto status = client->watch(watchReq("v1", "Service", "apps", "tier=web", from, 10),
                              [&](const WatchEvent& e) {
                                if (e.type != "BOOKMARK") types.push_back(e.type);
                                return types.size() < 2;
                              });
  CHECK_THAT(status, IsOk());
  CHECK(types == (std::vector<std::string>{"DELETED", "ADDED"}));
}

TEST_CASE_METHOD(ClientTest, "a watch answered with http410 is gone too", "[client]") {
  api.failNext(1, 410, -1, "GET");
  auto gone = client->watch(watchReq("v1", "Service", "apps", "", "1", 10),
                            [](const WatchEvent&) { return true; });
  INFO(gone);
  CHECK(isGone(gone));
}

TEST_CASE_METHOD(ClientTest, "a rotated token file is read again", "[client]") {
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/token";
  std::ofstream(path) << "first\n";
  ClusterConfig config = api.clusterConfig();
  config.bearer_token = "first";
  config.token_file = path;
  ClientOptions options = fastOptions();
  options.token_reread_interval = std::chrono::milliseconds(0);
  auto rotating = Client::create(config, options);
  REQUIRE_THAT(rotating, IsOk());
  api.requireToken("first");
  CHECK_THAT((*rotating)->get({"v1", "Namespace", "", "apps"}), IsOk());
  std::ofstream(path) << "second\n";
  api.requireToken("second");
  CHECK_THAT((*rotating)->get({"v1", "Namespace", "", "apps"}), IsOk());
}

}  // namespace
}  // namespace krane::kube
