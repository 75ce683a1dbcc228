// DeploymentService on the workflow engine, the feed writer and a real MariaDB: a scheduled
// desired-state transition is applied after its delay in every region (state row and change
// record), a newer Schedule turns the older delayed Apply into a no-op, an Apply that runs again
// changes nothing, and bad requests are refused naming the field.
#include "controlplane/services/deployment/deployment.h"

#include <catch2/catch.hpp>

#include "controlplane/workflow/engine.h"
#include "controlplane/workflow/typed.h"
#include "tests/controlplane/workflow/fixture.h"
#include "tests/support/matchers.h"
#include "tests/support/wait.h"

namespace krane::services::deployment {
namespace {

using cluster::v1::DESIRED_STATUS_RUNNING;
using cluster::v1::DESIRED_STATUS_STOPPED;
using krane::testing::eventually;
using workflow::Engine;
using workflow::invocation;
using workflow::resultAs;
using namespace std::chrono_literals;

class DeploymentServiceTest : public workflow::WorkflowTest {
 protected:
  DeploymentServiceTest()
      : writer_(std::make_shared<feed::Writer>(pool_, std::make_shared<feed::ResourceTables>())) {
    for (const char* region : {"eu-1", "us-1"}) {
      REQUIRE_THAT((*pool_->acquire())
                       ->exec("INSERT INTO regions (id, display_name, created_at) VALUES (?, ?, 1)",
                              {region, region}),
                   IsOk());
      REQUIRE_THAT(writer_->put(topology("d1", region)), IsOk());
    }
    REQUIRE_THAT(writer_->put(topology("d2", "eu-1")), IsOk());
  }

  static feed::Resource topology(const std::string& id, const std::string& region) {
    feed::Resource r;
    r.set_type("deployment_topology");
    r.set_id(id);
    r.set_region(region);
    auto* t = r.mutable_deployment_topology();
    t->set_workspace_id("ws_1");
    t->set_project_id("proj_1");
    t->set_app_id("app_1");
    t->set_environment_id("env_1");
    t->set_image("registry.example.com/app:v1");
    t->set_port(8080);
    t->set_cpu_millicores(250);
    t->set_memory_mib(128);
    t->set_replicas(2);
    t->set_desired_status(DESIRED_STATUS_RUNNING);
    return r;
  }

  Engine& start() {
    return engine(
        [&](Engine& e) { REQUIRE_THAT(e.registerService(deploymentService(writer_)), IsOk()); });
  }

  std::string desired(const std::string& id, const std::string& region) {
    auto rows = (*pool_->acquire())
                    ->query(
                        "SELECT desired_status FROM deployment_topology"
                        " WHERE deployment_id = ? AND region_id = ?",
                        {id, region});
    return rows.ok() && !rows->empty() ? rows->rows[0].str(0) : "<none>";
  }
  int64_t changes(const std::string& id) {
    return scalar("SELECT COUNT(*) FROM resource_changes WHERE resource_id = ?", {id});
  }
  static ScheduleDesiredStateRequest scheduleOf(cluster::v1::DesiredStatus status, int64_t delay_ms,
                                                const std::string& nonce = "") {
    ScheduleDesiredStateRequest r;
    r.set_desired_status(status);
    r.set_delay_ms(delay_ms);
    r.set_nonce(nonce);
    return r;
  }
  absl::StatusOr<ApplyDesiredStateResponse> applyResult(const std::string& nonce) {
    // The Apply that Schedule sent, found by its input.
    auto rows = (*pool_->acquire())
                    ->query(
                        "SELECT id FROM workflow_invocations WHERE service = ?"
                        " AND handler = 'Apply' AND input LIKE ?",
                        {kServiceName, "%\"" + nonce + "\"%"});
    if (!rows.ok() || rows->empty()) return absl::NotFoundError("no Apply for " + nonce);
    return resultAs<ApplyDesiredStateResponse>(
        engines_.back()->awaitResult(rows->rows[0].str(0), 20s));
  }

  std::shared_ptr<feed::Writer> writer_;
};

TEST_CASE_METHOD(DeploymentServiceTest, "a scheduled transition is applied after its delay",
                 "[deployment-service]") {
  Engine& e = start();
  const int64_t before = changes("d1");
  auto scheduled = resultAs<ScheduleDesiredStateResponse>(e.call(
      invocation(kServiceName, "Schedule", "d1", scheduleOf(DESIRED_STATUS_STOPPED, 500)), 20s));
  REQUIRE_THAT(scheduled, IsOk());
  CHECK_FALSE(scheduled->nonce().empty());  // the scheduling invocation's id
  CHECK(desired("d1", "eu-1") == "running");
  REQUIRE(eventually(
      [&] { return desired("d1", "eu-1") == "stopped" && desired("d1", "us-1") == "stopped"; }));
  auto applied = applyResult(scheduled->nonce());
  REQUIRE_THAT(applied, IsOk());
  CHECK(applied->applied());
  CHECK(std::vector<std::string>(applied->changed_regions().begin(),
                                 applied->changed_regions().end()) ==
        std::vector<std::string>{"eu-1", "us-1"});
  INFO("one change record per region, written with the state row");
  CHECK(changes("d1") == before + 2);
  CHECK(desired("d2", "eu-1") == "running");
}

TEST_CASE_METHOD(DeploymentServiceTest,
                 "a newer schedule turns the older delayed apply into a no-op",
                 "[deployment-service]") {
  Engine& e = start();
  const int64_t before = changes("d1");
  REQUIRE_THAT(e.call(invocation(kServiceName, "Schedule", "d1",
                                 scheduleOf(DESIRED_STATUS_STOPPED, 400, "stop-later")),
                      20s),
               IsOk());
  // The previous deployment is promoted back before the stop is due.
  REQUIRE_THAT(e.call(invocation(kServiceName, "Schedule", "d1",
                                 scheduleOf(DESIRED_STATUS_RUNNING, 0, "keep")),
                      20s),
               IsOk());
  auto stale = applyResult("stop-later");
  REQUIRE_THAT(stale, IsOk());
  CHECK_FALSE(stale->applied());
  auto kept = applyResult("keep");
  REQUIRE_THAT(kept, IsOk());
  CHECK(kept->applied());
  CHECK(kept->changed_regions().empty());  // it was running already
  CHECK(desired("d1", "eu-1") == "running");
  CHECK(desired("d1", "us-1") == "running");
  CHECK(changes("d1") == before);
}

TEST_CASE_METHOD(DeploymentServiceTest, "an apply that runs again changes nothing",
                 "[deployment-service]") {
  Engine& e = start();
  REQUIRE_THAT(e.call(invocation(kServiceName, "Schedule", "d2",
                                 scheduleOf(DESIRED_STATUS_STOPPED, 600000, "n1")),
                      20s),
               IsOk());
  ApplyDesiredStateRequest apply;
  apply.set_desired_status(DESIRED_STATUS_STOPPED);
  apply.set_nonce("n1");
  auto first = resultAs<ApplyDesiredStateResponse>(
      e.call(invocation(kServiceName, "Apply", "d2", apply), 20s));
  const int64_t after_first = changes("d2");
  auto second = resultAs<ApplyDesiredStateResponse>(
      e.call(invocation(kServiceName, "Apply", "d2", apply), 20s));
  REQUIRE_THAT(first, IsOk());
  REQUIRE_THAT(second, IsOk());
  CHECK(first->changed_regions_size() == 1);
  CHECK(second->applied());
  CHECK(second->changed_regions().empty());
  CHECK(changes("d2") == after_first);
  CHECK(desired("d2", "eu-1") == "stopped");
}

TEST_CASE_METHOD(DeploymentServiceTest, "bad requests are refused naming the field",
                 "[deployment-service]") {
  Engine& e = start();
  auto unspecified = e.call(invocation(kServiceName, "Schedule", "d1",
                                       scheduleOf(cluster::v1::DESIRED_STATUS_UNSPECIFIED, 0)),
                            20s);
  CHECK_THAT(unspecified, IsError(absl::StatusCode::kInvalidArgument));
  CHECK_THAT(workflow::messageOf(unspecified.status()), Catch::StartsWith("desired_status:"));
  auto negative = e.call(
      invocation(kServiceName, "Schedule", "d1", scheduleOf(DESIRED_STATUS_STOPPED, -5)), 20s);
  CHECK_THAT(workflow::messageOf(negative.status()), Catch::StartsWith("delay_ms:"));
  CHECK(scalar("SELECT COUNT(*) FROM workflow_invocations WHERE handler = 'Apply'") == 0);
  CHECK(desired("d1", "eu-1") == "running");
}

}  // namespace
}  // namespace krane::services::deployment
