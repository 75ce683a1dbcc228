// SentinelRolloutService on the workflow engine with SentinelService, the real ingestor and a
// fake fleet that reports sentinels converged (or not) the way agents do, on a real MariaDB:
// the default waves, a failure that pauses the rollout with the right ids, Resume, Cancel,
// RollbackAll, the refusal of a second rollout, a bake that catches a sentinel that turned
// unhealthy, Slack posts in order to a real HTTP server on loopback, and bad requests refused
// naming the field.
#include "controlplane/services/sentinelrollout/rollout.h"

#include <httplib.h>

#include <limits>

#include <catch2/catch.hpp>

#include "common/http_serve.h"
#include "common/strings.h"
#include "controlplane/workflow/typed.h"
#include "nlohmann/json.hpp"
#include "tests/controlplane/services/sentinel/fleet.h"
#include "tests/support/wait.h"

namespace krane::services::sentinelrollout {
namespace {

using krane::testing::eventually;
using sentinel::testing::SentinelFleetTest;
using services::v1::ROLLOUT_STATE_CANCELLED;
using services::v1::ROLLOUT_STATE_COMPLETED;
using services::v1::ROLLOUT_STATE_IN_PROGRESS;
using services::v1::ROLLOUT_STATE_PAUSED;
using workflow::Engine;
using workflow::invocation;
using workflow::resultAs;
using namespace std::chrono_literals;

constexpr char kOld[] = "krane.dev/sentinel:v1";
constexpr char kNew[] = "krane.dev/sentinel:v2";

std::string sentinelId(int i) { return strCat("snt_", i < 10 ? "00" : i < 100 ? "0" : "", i); }

class RolloutTest : public SentinelFleetTest {
 protected:
  Engine& start(RolloutOptions options = {}) {
    return startEngine([&](Engine& e) {
      REQUIRE_THAT(e.registerService(sentinelRolloutService(pool_, options)), IsOk());
    });
  }
  void addFleet(int n, const std::string& image = kOld) {
    for (int i = 0; i < n; ++i) addSentinel(sentinelId(i), image, true, i % 2 ? "us-1" : "eu-1");
  }
  absl::StatusOr<SentinelRollout> op(Engine& e, const std::string& handler,
                                     const google::protobuf::Message& req) {
    workflow::InvokeRequest r;
    r.service = kServiceName;
    r.handler = handler;
    r.key = kKey;
    r.input = workflow::encodeMessage(req);
    auto result = resultAs<RolloutResponse>(e.call(r, 120s));
    if (!result.ok()) return result.status();
    return result->rollout();
  }
  absl::StatusOr<SentinelRollout> get(Engine& e) { return op(e, "Get", RolloutOperationRequest()); }
  // Waits until the rollout is in `state`.
  SentinelRollout waitFor(Engine& e, services::v1::RolloutState state) {
    SentinelRollout last;
    bool reached = eventually(
        [&] {
          auto r = get(e);
          if (r.ok()) last = *r;
          return r.ok() && r->state() == state;
        },
        120s);
    INFO("rollout: " << last.ShortDebugString());
    REQUIRE(reached);
    return last;
  }
  int64_t onImage(const std::string& image) {
    return scalar("SELECT COUNT(*) FROM sentinels WHERE image = ?", {image});
  }
  static RolloutStartRequest startOf(const std::string& image) {
    RolloutStartRequest r;
    r.set_image(image);
    r.set_deploy_timeout_ms(1500);
    return r;
  }
};

TEST_CASE("waves split by cumulative percentage", "[rollout]") {
  std::vector<std::string> ids;
  for (int i = 0; i < 100; ++i) ids.push_back(sentinelId(i));
  std::vector<size_t> sizes;
  for (const auto& w : computeWaves(ids, {1, 5, 25, 50, 100})) sizes.push_back(w.size());
  CHECK(sizes == std::vector<size_t>{1, 4, 20, 25, 50});
  // Small fleets: no empty waves, every sentinel exactly once, in order.
  for (size_t n : {0, 1, 2, 3, 7, 1001}) {
    std::vector<std::string> some(ids.begin(), ids.begin() + std::min<size_t>(n, 100));
    for (size_t i = 100; i < n; ++i) some.push_back(strCat("x", i));
    auto waves = computeWaves(some, {1, 5, 25, 50, 100});
    std::vector<std::string> flat;
    for (const auto& w : waves) {
      CHECK_FALSE(w.empty());
      flat.insert(flat.end(), w.begin(), w.end());
    }
    CHECK(flat == some);
  }
  CHECK(computeWaves({"a", "b", "c"}, {1, 5, 25, 50, 100}).size() == 3u);
}

TEST_CASE("a rollout step outlasts a database outage instead of giving up", "[rollout]") {
  // Given up, a step would leave the rollout in progress with nothing to move it on.
  const auto policy = sentinelRolloutService(nullptr, RolloutOptions()).retryPolicy();
  CHECK(policy.max_attempts == std::numeric_limits<int>::max());
  CHECK(policy.max_interval == std::chrono::seconds(60));
  CHECK(policy.on_exhausted == workflow::OnExhausted::kPause);
}

TEST_CASE_METHOD(RolloutTest, "a rollout of 100 sentinels runs the default waves to completion",
                 "[rollout]") {
  Engine& e = start();
  addFleet(100);
  addSentinel("snt_already", kNew);
  startFleet();
  auto started = op(e, "Rollout", startOf(kNew));
  REQUIRE_THAT(started, IsOk());
  CHECK(started->total() == 100u);
  CHECK(started->already_on_image() == 1u);
  std::vector<int> sizes;
  for (const auto& w : started->waves()) sizes.push_back(w.sentinel_ids_size());
  CHECK(sizes == std::vector<int>{1, 4, 20, 25, 50});
  auto done = waitFor(e, ROLLOUT_STATE_COMPLETED);
  CHECK(onImage(kNew) == 101);
  CHECK(scalar("SELECT COUNT(*) FROM sentinels WHERE deploy_status <> 'ready'") == 0);
  for (const auto& w : done.waves()) {
    CHECK(w.ready() == static_cast<uint32_t>(w.sentinel_ids_size()));
    CHECK(w.failed() == 0u);
  }
  INFO("each sentinel got exactly one change from the rollout");
  CHECK(scalar("SELECT COUNT(*) FROM resource_changes WHERE resource_type = 'sentinel'") ==
        101 + 100);
}

TEST_CASE_METHOD(RolloutTest, "a failure pauses the rollout; resume skips the failed wave",
                 "[rollout]") {
  Engine& e = start();
  addFleet(100);
  // Wave 3 holds sentinels 5..24.
  failing({sentinelId(7), sentinelId(20)});
  startFleet();
  REQUIRE_THAT(op(e, "Rollout", startOf(kNew)), IsOk());
  auto paused = waitFor(e, ROLLOUT_STATE_PAUSED);
  CHECK(paused.current_wave() == 2u);
  CHECK(std::vector<std::string>(paused.failed_ids().begin(), paused.failed_ids().end()) ==
        std::vector<std::string>{sentinelId(7), sentinelId(20)});
  CHECK_THAT(paused.message(), ContainsRegex("2 of 20 sentinels of wave 3"));
  CHECK(paused.waves(2).ready() == 18u);
  INFO("wave 4 did not start");
  CHECK(onImage(kNew) == 25);
  CHECK(column(sentinelId(7), "deploy_status") == "failed");

  SECTION("a second rollout is refused while paused") {
    auto refused = op(e, "Rollout", startOf("krane.dev/sentinel:v3"));
    CHECK(refused.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK_THAT(std::string(toStd(refused.status().message())), ContainsRegex("is paused"));
    CHECK(get(e)->image() == kNew);
  }
  SECTION("resume goes on with wave 4; the failed sentinels are not retried") {
    failing({});
    auto resumed = op(e, "Resume", RolloutOperationRequest());
    REQUIRE_THAT(resumed, IsOk());
    auto done = waitFor(e, ROLLOUT_STATE_COMPLETED);
    CHECK(onImage(kNew) == 100);  // the failed ones have the image as desired state
    CHECK(column(sentinelId(7), "deploy_status") == "failed");
    CHECK(done.failed_ids_size() == 2);
    CHECK_THAT(done.message(), ContainsRegex("98 of 100"));
    auto again = op(e, "Resume", RolloutOperationRequest());
    CHECK(again.status().code() == absl::StatusCode::kFailedPrecondition);
  }
  SECTION("rollback reverts every sentinel given the image, the failed ones too") {
    auto rolled = op(e, "RollbackAll", RolloutOperationRequest());
    REQUIRE_THAT(rolled, IsOk());
    CHECK(rolled->state() == ROLLOUT_STATE_CANCELLED);
    // 1 + 4 + 20, the 2 that failed included; those fail in the test whatever their image, so
    // they are deployed back without converging.
    CHECK(rolled->reverted() == 23u);
    CHECK_THAT(rolled->message(), ContainsRegex("rolled back: 23 of 25 .*not converged"));
    CHECK(onImage(kOld) == 100);
    INFO("a sentinel that failed its wave got the new image (a Deploy commits it first)");
    CHECK(column(sentinelId(7), "image") == kOld);
    CHECK(column(sentinelId(0), "image") == kOld);
    CHECK(op(e, "Resume", RolloutOperationRequest()).status().code() ==
          absl::StatusCode::kFailedPrecondition);
    INFO("a new rollout may start once the last one is cancelled");
    CHECK_THAT(op(e, "Rollout", startOf(kNew)), IsOk());
  }
}

TEST_CASE_METHOD(RolloutTest, "cancel stops a rollout between batches", "[rollout]") {
  Engine& e = start();
  addFleet(60);
  startFleet();
  auto req = startOf(kNew);
  req.add_wave_percentages(100);
  req.set_max_parallel(2);
  REQUIRE_THAT(op(e, "Rollout", req), IsOk());
  REQUIRE(eventually([&] { return onImage(kNew) >= 4; }, 60s));
  auto cancelled = op(e, "Cancel", RolloutOperationRequest());
  REQUIRE_THAT(cancelled, IsOk());
  CHECK(cancelled->state() == ROLLOUT_STATE_CANCELLED);
  const int64_t moved = onImage(kNew);
  std::this_thread::sleep_for(500ms);
  CHECK(onImage(kNew) == moved);
  CHECK(moved < 60);
  CHECK(get(e)->state() == ROLLOUT_STATE_CANCELLED);
  auto rolled = op(e, "RollbackAll", RolloutOperationRequest());
  REQUIRE_THAT(rolled, IsOk());
  CHECK(rolled->reverted() == static_cast<uint32_t>(moved));
  CHECK(onImage(kOld) == 60);
  CHECK(op(e, "Cancel", RolloutOperationRequest()).status().code() ==
        absl::StatusCode::kFailedPrecondition);
}

TEST_CASE_METHOD(RolloutTest, "a sentinel that turns unhealthy during the bake pauses the rollout",
                 "[rollout]") {
  Engine& e = start();
  addFleet(10);
  startFleet();
  auto req = startOf(kNew);
  for (uint32_t p : {10, 100}) req.add_wave_percentages(p);
  req.set_bake_ms(1500);
  REQUIRE_THAT(op(e, "Rollout", req), IsOk());
  // (One query: the row's status and image are read together, not before and after a write.)
  REQUIRE(eventually([&] {
    return scalar(
               "SELECT COUNT(*) FROM sentinels WHERE id = ? AND deploy_status = 'ready' AND"
               " image = ?",
               {sentinelId(0), kNew}) == 1;
  }));
  stopFleet();                   // (so that no healthy report of it is still on its way)
  report(sentinelId(0), false);  // crashes after it converged
  auto paused = waitFor(e, ROLLOUT_STATE_PAUSED);
  CHECK(std::vector<std::string>(paused.failed_ids().begin(), paused.failed_ids().end()) ==
        std::vector<std::string>{sentinelId(0)});
  CHECK_THAT(paused.message(), ContainsRegex("did not stay healthy"));
  CHECK(onImage(kNew) == 1);
}

TEST_CASE_METHOD(RolloutTest, "slack gets every transition in order and the url stays secret",
                 "[rollout]") {
  httplib::Server slack;
  std::mutex mutex;
  std::vector<std::string> texts;
  int calls = 0;
  slack.Post("/services/T000/B000/secret",
             [&](const httplib::Request& req, httplib::Response& res) {
               std::lock_guard lock(mutex);
               if (++calls == 2) {  // one failed post is retried
                 res.status = 500;
                 return;
               }
               texts.push_back(nlohmann::json::parse(req.body).at("text").get<std::string>());
               res.set_content("ok", "text/plain");
             });
  const int port = slack.bind_to_any_port("127.0.0.1");
  std::thread serving = serveInBackground(slack);

  Engine& e = start();
  addFleet(4);
  failing({sentinelId(3)});
  startFleet();
  auto req = startOf(kNew);
  for (uint32_t p : {25, 100}) req.add_wave_percentages(p);
  const std::string url = strCat("http://127.0.0.1:", port, "/services/T000/B000/secret");
  req.set_slack_webhook_url(url);
  auto started = op(e, "Rollout", req);
  REQUIRE_THAT(started, IsOk());
  CHECK(started->slack_webhook_url().empty());
  waitFor(e, ROLLOUT_STATE_PAUSED);
  REQUIRE_THAT(op(e, "RollbackAll", RolloutOperationRequest()), IsOk());
  slack.stop();
  serving.join();
  std::vector<std::string> expected = {
      "started: 4 sentinels in 2 waves",
      "wave 1/2 \\(1 sentinels\\) started",
      "wave 1/2 \\(1 sentinels\\) completed",
      "wave 2/2 \\(3 sentinels\\) started",
      "paused: 1 of 3 sentinels of wave 2 did not become ready: snt_003",
      "rollback from .* started: 4 sentinels",
      // snt_003 fails in the test whatever its image: deployed back, it does not converge.
      "rollback from .* completed: rolled back: 3 of 4 sentinels back on their previous image;"
      " not converged: snt_003",
  };
  std::lock_guard lock(mutex);
  REQUIRE(texts.size() == expected.size());
  for (size_t i = 0; i < expected.size(); ++i) CHECK_THAT(texts[i], ContainsRegex(expected[i]));
  INFO("the webhook is not in the state the API returns");
  CHECK(get(e)->slack_webhook_url().empty());
}

TEST_CASE_METHOD(RolloutTest, "a slack webhook that is down never holds the rollout back",
                 "[rollout]") {
  // A loopback port nothing listens on: every post is refused, retried, then given up.
  int port = 0;
  {
    httplib::Server probe;
    port = probe.bind_to_any_port("127.0.0.1");
  }
  RolloutOptions options;
  options.slack.backoff = std::chrono::milliseconds(10);
  options.slack.timeout = std::chrono::milliseconds(500);
  Engine& e = start(options);
  addFleet(4);
  startFleet();
  auto req = startOf(kNew);
  for (uint32_t p : {50, 100}) req.add_wave_percentages(p);
  req.set_slack_webhook_url(strCat("http://127.0.0.1:", port, "/hook"));
  REQUIRE_THAT(op(e, "Rollout", req), IsOk());
  auto done = waitFor(e, ROLLOUT_STATE_COMPLETED);
  CHECK(onImage(kNew) == 4);
  CHECK(done.failed_ids_size() == 0);
}

TEST_CASE_METHOD(RolloutTest, "bad rollout requests are refused naming the field", "[rollout]") {
  Engine& e = start();
  addFleet(3);
  auto refused = [&](RolloutStartRequest req) {
    auto r = op(e, "Rollout", req);
    CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
    return std::string(toStd(r.status().message()));
  };
  CHECK_THAT(refused(RolloutStartRequest()), ContainsRegex("^image: required"));
  auto decreasing = startOf(kNew);
  for (uint32_t p : {5, 1, 100}) decreasing.add_wave_percentages(p);
  CHECK_THAT(refused(decreasing), ContainsRegex("wave_percentages\\[1\\]"));
  auto short_of_100 = startOf(kNew);
  for (uint32_t p : {10, 50}) short_of_100.add_wave_percentages(p);
  CHECK_THAT(refused(short_of_100),
             ContainsRegex("wave_percentages: the last wave must end at 100"));
  auto plain_http = startOf(kNew);
  plain_http.set_slack_webhook_url("http://hooks.example.com/x");
  CHECK_THAT(refused(plain_http), ContainsRegex("slack_webhook_url: must be https"));
  auto negative = startOf(kNew);
  negative.set_bake_ms(-1);
  CHECK_THAT(refused(negative), ContainsRegex("bake_ms"));
  INFO("nothing started, nothing changed");
  CHECK(get(e)->state() == services::v1::ROLLOUT_STATE_IDLE);
  CHECK(onImage(kOld) == 3);
  for (const char* handler : {"Resume", "Cancel", "RollbackAll"}) {
    auto r = op(e, handler, RolloutOperationRequest());
    CHECK(r.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK_THAT(std::string(toStd(r.status().message())), ContainsRegex("is idle"));
  }
}

}  // namespace
}  // namespace krane::services::sentinelrollout
