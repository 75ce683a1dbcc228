// RoutingService on the workflow engine and a real MariaDB: the live swap and its routes,
// rollback and the rolled-back flag that keeps new deploys off the live routes until a promote,
// route assignment of 'environment' and 'branch' routes, refusals naming the reason, and many
// swaps, promotes and rollbacks racing on one environment applied one at a time.
#include "controlplane/services/routing/routing.h"

#include <atomic>
#include <thread>

#include <catch2/catch.hpp>

#include "controlplane/feed/writer.h"
#include "controlplane/services/deployment/deployment.h"
#include "controlplane/workflow/engine.h"
#include "controlplane/workflow/typed.h"
#include "tests/controlplane/workflow/fixture.h"
#include "tests/support/matchers.h"
#include "tests/support/resources.h"
#include "tests/support/threads.h"
#include "tests/support/wait.h"

namespace krane::services::routing {
namespace {

using krane::testing::eventually;
using services::v1::SWAP_REASON_DEPLOY;
using services::v1::SWAP_REASON_PROMOTE;
using services::v1::SwapReason;
using workflow::Engine;
using workflow::invocation;
using workflow::resultAs;
using namespace std::chrono_literals;

class RoutingTest : public workflow::WorkflowTest {
 protected:
  RoutingTest()
      : writer_(std::make_shared<feed::Writer>(pool_, std::make_shared<feed::ResourceTables>())) {
    seedTenancy({{"prod", "production"}, {"prev", "preview"}});
  }

  void deployment(const std::string& id, int64_t at, const std::string& status = "ready",
                  const std::string& env = "prod", const std::string& branch = "main") {
    exec(
        "INSERT INTO deployments (id, workspace_id, project_id, app_id, environment_id, status,"
        " git_branch, created_at) VALUES (?, 'ws', 'proj', 'app', ?, ?, ?, ?)",
        {id, env, status, branch, at});
  }
  void route(const std::string& hostname, const std::string& sticky, const std::string& to,
             const std::string& env = "prod", std::optional<std::string> branch = std::nullopt) {
    exec(
        "INSERT INTO frontline_routes (id, workspace_id, project_id, app_id, environment_id,"
        " deployment_id, hostname, sticky, git_branch, created_at)"
        " VALUES (?, 'ws', 'proj', 'app', ?, ?, ?, ?, ?, 1)",
        {"rt_" + hostname, env, to, hostname, sticky, branch});
  }
  std::string routeOf(const std::string& hostname) {
    auto rows =
        (*pool_->acquire())
            ->query("SELECT deployment_id FROM frontline_routes WHERE hostname = ?", {hostname});
    return rows.ok() && !rows->empty() ? rows->rows[0].str(0) : "<none>";
  }
  std::string live() {
    auto rows =
        (*pool_->acquire())
            ->query("SELECT COALESCE(current_deployment_id, '') FROM apps WHERE id = 'app'");
    return rows.ok() && !rows->empty() ? rows->rows[0].str(0) : "<none>";
  }
  bool rolledBack() { return scalar("SELECT is_rolled_back FROM apps WHERE id = 'app'") != 0; }

  std::shared_ptr<feed::Writer> writer_;

  // A running sentinel of environment `env` in `region`, written through the feed.
  void sentinel(const std::string& id, const std::string& region, const std::string& env = "prod") {
    feed::Resource r;
    r.set_type("sentinel");
    r.set_id(id);
    r.set_region(region);
    auto* s = r.mutable_sentinel();
    s->set_sentinel_id(id);
    s->set_workspace_id("ws");
    s->set_project_id("proj");
    s->set_app_id("app");
    s->set_environment_id(env);
    s->set_region(region);
    s->set_image("krane.dev/sentinel:v1");
    s->set_replicas(1);
    s->set_cpu_millicores(100);
    s->set_memory_mib(64);
    s->set_desired_state(cluster::v1::SENTINEL_DESIRED_STATE_RUNNING);
    REQUIRE_THAT(writer_->put(r), IsOk());
  }
  std::string sentinelLive(const std::string& id) {
    auto rows =
        (*pool_->acquire())
            ->query("SELECT COALESCE(live_deployment_id, '') FROM sentinels WHERE id = ?", {id});
    return rows.ok() && !rows->empty() ? rows->rows[0].str(0) : "<none>";
  }

  // With DeploymentService, which a swap schedules the previous deployment's stop on.
  Engine& start(RoutingOptions options = {}) {
    if (options.writer == nullptr) options.writer = writer_;
    return engine([&](Engine& e) {
      REQUIRE_THAT(e.registerService(routingService(options)), IsOk());
      REQUIRE_THAT(e.registerService(deployment::deploymentService(writer_)), IsOk());
    });
  }
  static SwapLiveRequest swapOf(const std::string& id, SwapReason reason) {
    SwapLiveRequest r;
    r.set_deployment_id(id);
    r.set_reason(reason);
    return r;
  }
  absl::StatusOr<SwapLiveResponse> swap(Engine& e, const std::string& id, SwapReason reason,
                                        const std::string& env = "prod") {
    return resultAs<SwapLiveResponse>(
        e.call(invocation(kServiceName, "SwapLiveDeployment", env, swapOf(id, reason)), 20s));
  }
  absl::StatusOr<SwapLiveResponse> rollback(Engine& e) {
    return resultAs<SwapLiveResponse>(
        e.call(invocation(kServiceName, "Rollback", "prod", RollbackRequest()), 20s));
  }
};

TEST_CASE_METHOD(RoutingTest, "a swap makes a deployment live and moves the live routes",
                 "[routing]") {
  deployment("d1", 100);
  deployment("d2", 200);
  route("app.example.com", "live", "d1");
  route("www.app.example.com", "live", "d1");
  route("d1.app.example.com", "none", "d1");
  Engine& e = start();
  auto first = swap(e, "d1", SWAP_REASON_DEPLOY);
  REQUIRE_THAT(first, IsOk());
  CHECK(first->swapped());
  CHECK(first->previous_deployment_id().empty());
  auto second = swap(e, "d2", SWAP_REASON_DEPLOY);
  REQUIRE_THAT(second, IsOk());
  CHECK(second->swapped());
  CHECK(second->previous_deployment_id() == "d1");
  CHECK(std::vector<std::string>(second->hostnames().begin(), second->hostnames().end()) ==
        std::vector<std::string>{"app.example.com", "www.app.example.com"});
  CHECK(live() == "d2");
  CHECK(routeOf("app.example.com") == "d2");
  CHECK(routeOf("www.app.example.com") == "d2");
  CHECK(routeOf("d1.app.example.com") == "d1");  // a deployment's own hostname never moves
}

TEST_CASE_METHOD(RoutingTest, "a rollback keeps new deploys off the live routes until a promote",
                 "[routing]") {
  deployment("d1", 100);
  deployment("d2", 200);
  route("app.example.com", "live", "d1");
  Engine& e = start();
  REQUIRE_THAT(swap(e, "d1", SWAP_REASON_DEPLOY), IsOk());
  REQUIRE_THAT(swap(e, "d2", SWAP_REASON_DEPLOY), IsOk());

  auto back = rollback(e);
  REQUIRE_THAT(back, IsOk());
  CHECK(back->swapped());
  CHECK(back->previous_deployment_id() == "d2");
  CHECK(back->live_deployment_id() == "d1");
  CHECK(live() == "d1");
  CHECK(routeOf("app.example.com") == "d1");
  CHECK(rolledBack());

  // A new deploy finishes while the app is rolled back: ready, but not live.
  deployment("d3", 300);
  auto held = swap(e, "d3", SWAP_REASON_DEPLOY);
  REQUIRE_THAT(held, IsOk());
  CHECK_FALSE(held->swapped());
  CHECK_THAT(held->reason(), Catch::Contains("rolled back"));
  CHECK(live() == "d1");
  CHECK(routeOf("app.example.com") == "d1");

  // An explicit promote goes live and clears the flag; the next deploy goes live again.
  auto promoted = swap(e, "d3", SWAP_REASON_PROMOTE);
  REQUIRE_THAT(promoted, IsOk());
  CHECK(promoted->swapped());
  CHECK(live() == "d3");
  CHECK_FALSE(rolledBack());
  deployment("d4", 400);
  REQUIRE_THAT(swap(e, "d4", SWAP_REASON_DEPLOY), IsOk());
  CHECK(live() == "d4");
}

// The instances behind a swap: the deployment that was live stops after the configured delay
// (DeploymentService), and one that goes live again through a rollback or promote runs again,
// which also makes the stop still pending for it a no-op.
TEST_CASE_METHOD(RoutingTest, "a swap stops the previous deployment later and a rollback starts it",
                 "[routing]") {
  exec("INSERT INTO regions (id, display_name, created_at) VALUES ('eu-1', 'eu-1', 1)");
  for (const char* id : {"d1", "d2"}) {
    deployment(id, id == std::string("d1") ? 100 : 200);
    REQUIRE_THAT(writer_->put(krane::testing::topologyResource(id, "eu-1")), IsOk());
  }
  auto desired = [&](const std::string& id) {
    auto rows = (*pool_->acquire())
                    ->query(
                        "SELECT desired_status FROM deployment_topology"
                        " WHERE deployment_id = ?",
                        {id});
    return rows.ok() && !rows->empty() ? rows->rows[0].str(0) : "<none>";
  };
  Engine& e = start({.previous_stop_delay = 1500ms});
  REQUIRE_THAT(swap(e, "d1", SWAP_REASON_DEPLOY), IsOk());
  REQUIRE_THAT(swap(e, "d2", SWAP_REASON_DEPLOY), IsOk());
  INFO("d1 keeps running for the delay, so a quick rollback finds it up");
  CHECK(desired("d1") == "running");
  REQUIRE(eventually([&] { return desired("d1") == "stopped"; }, 20s));
  CHECK(desired("d2") == "running");

  // Rolled back to d1: it runs again at once; d2 stops after the delay.
  REQUIRE_THAT(rollback(e), IsOk());
  REQUIRE(eventually([&] { return desired("d1") == "running"; }, 20s));
  CHECK(desired("d2") == "running");
  // A promote of d2 before d2's stop is due replaces that stop: d2 keeps running.
  REQUIRE_THAT(swap(e, "d2", SWAP_REASON_PROMOTE), IsOk());
  std::this_thread::sleep_for(2500ms);  // past the delay of d2's replaced stop
  CHECK(desired("d2") == "running");
  REQUIRE(eventually([&] { return desired("d1") == "stopped"; }, 20s));
  CHECK(desired("d2") == "running");
}

TEST_CASE_METHOD(RoutingTest, "routes that follow the environment or the branch are assigned",
                 "[routing]") {
  deployment("d1", 100, "ready", "prod", "main");
  deployment("d2", 200, "ready", "prod", "feature");
  route("prod.app.example.com", "environment", "d1");
  route("main.app.example.com", "branch", "d1", "prod", std::string("main"));
  route("feature.app.example.com", "branch", "d1", "prod", std::string("feature"));
  route("app.example.com", "live", "d1");
  Engine& e = start();
  AssignRoutesRequest req;
  req.set_deployment_id("d2");
  auto assigned = resultAs<AssignRoutesResponse>(
      e.call(invocation(kServiceName, "AssignRoutes", "prod", req), 20s));
  REQUIRE_THAT(assigned, IsOk());
  CHECK_THAT(std::vector<std::string>(assigned->hostnames().begin(), assigned->hostnames().end()),
             Catch::UnorderedEquals(
                 std::vector<std::string>{"prod.app.example.com", "feature.app.example.com"}));
  CHECK(routeOf("prod.app.example.com") == "d2");
  CHECK(routeOf("feature.app.example.com") == "d2");
  CHECK(routeOf("main.app.example.com") == "d1");
  CHECK(routeOf("app.example.com") == "d1");  // live routes move only with a swap
}

TEST_CASE_METHOD(RoutingTest, "refusals name the reason and change nothing", "[routing]") {
  deployment("d1", 100);
  deployment("building", 200, "building");
  deployment("p1", 300, "ready", "prev");
  route("app.example.com", "live", "d1");
  Engine& e = start();
  REQUIRE_THAT(swap(e, "d1", SWAP_REASON_DEPLOY), IsOk());

  auto not_ready = swap(e, "building", SWAP_REASON_PROMOTE);
  CHECK_THAT(not_ready, IsError(absl::StatusCode::kFailedPrecondition));
  CHECK_THAT(workflow::messageOf(not_ready.status()), Catch::Contains("is building, not ready"));
  auto nothing_older = rollback(e);
  CHECK_THAT(nothing_older, IsError(absl::StatusCode::kFailedPrecondition));
  CHECK_THAT(workflow::messageOf(nothing_older.status()),
             Catch::Contains("no ready deployment older"));
  auto elsewhere = swap(e, "p1", SWAP_REASON_PROMOTE);
  CHECK_THAT(elsewhere, IsError(absl::StatusCode::kNotFound));
  CHECK_THAT(workflow::messageOf(elsewhere.status()), Catch::StartsWith("deployment_id:"));
  auto preview = swap(e, "p1", SWAP_REASON_PROMOTE, "prev");
  CHECK_THAT(preview, IsError(absl::StatusCode::kFailedPrecondition));
  CHECK_THAT(workflow::messageOf(preview.status()), Catch::Contains("preview environment"));
  auto no_reason = swap(e, "d1", services::v1::SWAP_REASON_UNSPECIFIED);
  CHECK_THAT(workflow::messageOf(no_reason.status()), Catch::StartsWith("reason:"));
  auto no_id = swap(e, "", SWAP_REASON_PROMOTE);
  CHECK_THAT(workflow::messageOf(no_id.status()), Catch::StartsWith("deployment_id: required"));
  CHECK(live() == "d1");
  CHECK(routeOf("app.example.com") == "d1");
  CHECK_FALSE(rolledBack());
}

// Deploys, promotes and rollbacks of one environment sent at once from many threads: applied one
// at a time, so every swap saw the live deployment the one before it left, and the live routes
// end on the app's live deployment.
TEST_CASE_METHOD(RoutingTest, "swaps promotes and rollbacks racing on one environment serialize",
                 "[routing]") {
  for (int i = 1; i <= 6; ++i) deployment("d" + std::to_string(i), i * 100);
  route("app.example.com", "live", "d1");
  route("www.app.example.com", "live", "d1");
  Engine& e = start();
  REQUIRE_THAT(swap(e, "d1", SWAP_REASON_DEPLOY), IsOk());
  std::vector<std::string> ids(24);
  krane::testing::ThreadFailures failures;
  std::vector<std::thread> ts;
  for (int i = 0; i < 24; ++i) {
    ts.emplace_back([&, i] {
      absl::StatusOr<std::string> id;
      if (i % 4 == 3) {
        id = e.send(invocation(kServiceName, "Rollback", "prod", RollbackRequest()));
      } else {
        id = e.send(invocation(kServiceName, "SwapLiveDeployment", "prod",
                               swapOf("d" + std::to_string(1 + i % 6),
                                      i % 2 == 0 ? SWAP_REASON_DEPLOY : SWAP_REASON_PROMOTE)));
      }
      if (failures.expectOk(id, "send")) ids[i] = *id;
    });
  }
  for (auto& t : ts) t.join();
  REQUIRE(failures.all() == std::vector<std::string>{});
  for (const auto& id : ids) (void)e.awaitResult(id, 30s);  // a rollback may find nothing older
  // In the order the key ran them: each swap started from the live deployment the previous left.
  auto rows = (*pool_->acquire())
                  ->query(
                      "SELECT output FROM workflow_invocations WHERE service = ?"
                      " AND status = 'succeeded' ORDER BY key_seq",
                      {kServiceName});
  REQUIRE_THAT(rows, IsOk());
  REQUIRE(rows->rows.size() >= 20u);
  std::string current;
  for (const auto& r : rows->rows) {
    auto out = workflow::decodeAs<SwapLiveResponse>(r.str(0), "output");
    REQUIRE_THAT(out, IsOk());
    CHECK(out->previous_deployment_id() == current);
    current = out->live_deployment_id();
  }
  CHECK(live() == current);
  CHECK(routeOf("app.example.com") == current);
  CHECK(routeOf("www.app.example.com") == current);
}

TEST_CASE_METHOD(RoutingTest,
                 "a swap points the environment's sentinels at the live deployment in its "
                 "transaction",
                 "[routing]") {
  exec("INSERT INTO regions (id, display_name, created_at) VALUES ('eu-1', 'eu-1', 1)");
  exec("INSERT INTO regions (id, display_name, created_at) VALUES ('us-1', 'us-1', 1)");
  for (int i = 1; i <= 4; ++i) deployment("d" + std::to_string(i), i * 100);
  sentinel("sen_eu", "eu-1");
  sentinel("sen_us", "us-1");
  sentinel("sen_preview", "eu-1", "prev");
  Engine& e = start();
  CHECK(sentinelLive("sen_eu").empty());

  REQUIRE_THAT(swap(e, "d1", SWAP_REASON_DEPLOY), IsOk());
  CHECK(sentinelLive("sen_eu") == "d1");
  CHECK(sentinelLive("sen_us") == "d1");
  INFO("another environment's sentinel is not touched");
  CHECK(sentinelLive("sen_preview").empty());

  // Each change is a change record at the sentinel's version, so agents get it.
  const auto changedAt = [&](const std::string& id) {
    return scalar(
        "SELECT COUNT(*) FROM resource_changes c JOIN sentinels s ON s.id = c.resource_id"
        " AND s.region_id = c.region_id AND s.version = c.version"
        " WHERE c.resource_type = 'sentinel' AND c.resource_id = ?",
        {id});
  };
  CHECK(changedAt("sen_eu") == 1);
  CHECK(changedAt("sen_us") == 1);
  auto stored = writer_->tables()
                    .forType("sentinel")
                    .load(**pool_->acquire(), feed::ResourceKey{"sentinel", "sen_eu", "eu-1"});
  REQUIRE_THAT(stored, IsOk());
  REQUIRE(stored->has_value());
  CHECK((*stored)->resource.sentinel().live_deployment_id() == "d1");
  CHECK((*stored)->resource.sentinel().image() == "krane.dev/sentinel:v1");

  // While swaps, promotes and rollbacks run, one consistent read never sees the app's live
  // deployment and a sentinel's disagree: they commit together.
  std::atomic<bool> stop{false};
  std::atomic<int> reads{0};
  std::atomic<int> mismatches{0};
  std::thread reader([&] {
    auto conn = pool_->acquire();
    REQUIRE_THAT(conn, IsOk());
    while (!stop) {
      auto rows = (*conn)->query(
          "SELECT a.current_deployment_id, s.live_deployment_id FROM apps a"
          " JOIN sentinels s ON s.app_id = a.id AND s.environment_id = 'prod'"
          " WHERE a.id = 'app'");
      if (!rows.ok()) continue;
      ++reads;
      for (const auto& r : rows->rows) {
        if (r.optStr(0) != r.optStr(1)) ++mismatches;
      }
    }
  });
  REQUIRE_THAT(swap(e, "d2", SWAP_REASON_DEPLOY), IsOk());
  REQUIRE_THAT(swap(e, "d3", SWAP_REASON_PROMOTE), IsOk());
  REQUIRE_THAT(rollback(e), IsOk());
  CHECK(sentinelLive("sen_eu") == "d2");
  REQUIRE_THAT(swap(e, "d4", SWAP_REASON_PROMOTE), IsOk());
  REQUIRE_THAT(rollback(e), IsOk());
  stop = true;
  reader.join();
  CHECK(reads > 0);
  CHECK(mismatches == 0);
  CHECK(live() == "d3");
  CHECK(sentinelLive("sen_eu") == "d3");
  CHECK(sentinelLive("sen_us") == "d3");
  CHECK(sentinelLive("sen_preview").empty());

  INFO("a refused swap changes no sentinel");
  deployment("d5", 500, "building");
  CHECK_FALSE(swap(e, "d5", SWAP_REASON_PROMOTE).ok());
  CHECK(sentinelLive("sen_eu") == "d3");
}

}  // namespace
}  // namespace krane::services::routing
