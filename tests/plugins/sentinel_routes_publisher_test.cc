// RoutesPublisher without processes: routes follow the live deployment's published endpoints,
// a switch waits for the new deployment's first ready instance, no live deployment means empty
// routes, a new publisher carries on from the files an earlier one left, forget removes them.
#include <stdlib.h>

#include <filesystem>

#include <catch2/catch.hpp>

#include "common/files.h"
#include "nlohmann/json.hpp"
#include "plugins/runtime/process/process_runtime.h"
#include "plugins/sentinel/routes_publisher.h"
#include "tests/support/matchers.h"

namespace krane::sentinel {
namespace {

namespace fs = std::filesystem;

class PublisherTest {
 protected:
  PublisherTest() {
    char pattern[] = "/tmp/krane-rp-XXXXXX";
    dir_ = ::mkdtemp(pattern);
    options_.routes_dir = dir_ + "/sentinels/routes";
    options_.deployment_state_dir = dir_ + "/deployments";
    fs::create_directories(dir_ + "/deployments/endpoints");
  }
  ~PublisherTest() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  void publish(const std::string& deployment, const std::vector<std::string>& endpoints) {
    const std::string workload = "deployment/" + deployment;
    REQUIRE_THAT(
        replaceFile(runtime::endpointsFile(options_.deployment_state_dir, workload),
                    nlohmann::json{{"workload", workload}, {"endpoints", endpoints}}.dump()),
        IsOk());
  }

  Routes routes(const RoutesPublisher& p, const std::string& sentinel) {
    auto text = readFile(p.routesFile(sentinel), "routes");
    REQUIRE_THAT(text, IsOk());
    auto r = parseRoutes(*text);
    REQUIRE_THAT(r, IsOk());
    return *r;
  }

  static Routes of(const std::string& deployment, const std::vector<std::string>& addresses) {
    Routes r;
    r.deployment_id = deployment;
    for (const auto& a : addresses) r.endpoints.push_back(*parseEndpoint(a));
    return r;
  }

  std::string dir_;
  RoutesPublisherOptions options_;
};

TEST_CASE_METHOD(PublisherTest, "routes follow the live deployment's ready instances",
                 "[routes-publisher]") {
  RoutesPublisher p(options_);
  p.setLive("s1", "");
  CHECK(routes(p, "s1") == of("", {}));

  publish("d1", {"127.0.0.1:20001", "127.0.0.1:20002"});
  p.setLive("s1", "d1");
  CHECK(routes(p, "s1") == of("d1", {"127.0.0.1:20001", "127.0.0.1:20002"}));
  publish("d1", {"127.0.0.1:20002"});
  p.publishAll();
  CHECK(routes(p, "s1") == of("d1", {"127.0.0.1:20002"}));

  INFO("d2 has no ready instance yet: d1 keeps serving");
  p.setLive("s1", "d2");
  CHECK(routes(p, "s1") == of("d1", {"127.0.0.1:20002"}));
  publish("d2", {});
  p.publishAll();
  CHECK(routes(p, "s1") == of("d1", {"127.0.0.1:20002"}));
  publish("d2", {"127.0.0.1:20003"});
  p.publishAll();
  CHECK(routes(p, "s1") == of("d2", {"127.0.0.1:20003"}));

  INFO("the live deployment losing its instances leaves no route");
  publish("d2", {});
  p.publishAll();
  CHECK(routes(p, "s1") == of("d2", {}));

  p.setLive("s1", "");
  CHECK(routes(p, "s1") == of("", {}));
  p.forget("s1");
  CHECK_FALSE(fs::exists(p.routesFile("s1")));
}

TEST_CASE_METHOD(PublisherTest, "during a rolling deploy both deployments' instances are routed",
                 "[routes-publisher]") {
  RoutesPublisher p(options_);
  publish("d1", {"127.0.0.1:20001", "127.0.0.1:20002"});
  p.setLive("s1", "d1", "d2");
  INFO("d2 has no ready instance yet");
  CHECK(routes(p, "s1") == of("d1", {"127.0.0.1:20001", "127.0.0.1:20002"}));
  publish("d2", {"127.0.0.1:20003"});
  publish("d1", {"127.0.0.1:20002"});  // one old instance drained
  p.publishAll();
  CHECK(routes(p, "s1") == of("d1", {"127.0.0.1:20002", "127.0.0.1:20003"}));
  INFO("the swap: d2 live, no more rolling");
  publish("d1", {});
  p.setLive("s1", "d2");
  CHECK(routes(p, "s1") == of("d2", {"127.0.0.1:20003"}));
}

TEST_CASE_METHOD(PublisherTest, "a new publisher keeps the routes an earlier one left current",
                 "[routes-publisher]") {
  publish("d1", {"127.0.0.1:20001"});
  {
    RoutesPublisher first(options_);
    first.setLive("s1", "d1");
  }
  RoutesPublisher second(options_);
  CHECK(routes(second, "s1") == of("d1", {"127.0.0.1:20001"}));
  publish("d1", {"127.0.0.1:20005"});
  second.start();  // the polling thread picks the change up
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (routes(second, "s1") != of("d1", {"127.0.0.1:20005"}) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CHECK(routes(second, "s1") == of("d1", {"127.0.0.1:20005"}));
  second.stop();
}

}  // namespace
}  // namespace krane::sentinel
