// krane.api.v1.TenancyService on a krane-ctrl server in process: a workspace, project, app and
// environment created through the API are what a deployment needs (one is then created through
// DeploymentService); bad input is refused naming the field, taken ids and slugs with
// ALREADY_EXISTS, unknown parents and regions with NOT_FOUND, and nothing is written then.
#include <catch2/catch.hpp>

#include "krane/api/v1/deployments.grpc.pb.h"
#include "krane/api/v1/tenancy.grpc.pb.h"
#include "tests/support/control_plane.h"
#include "tests/support/matchers.h"

namespace krane {
namespace {

using krane::testing::kOperatorToken;
using krane::testing::TestControlPlane;
namespace v1 = krane::api::v1;

class TenancyApiTest {
 protected:
  TenancyApiTest() {
    cp_.startReplica();
    stub_ = v1::TenancyService::NewStub(cp_.channel());
  }
  static std::unique_ptr<grpc::ClientContext> ctx() {
    return TestControlPlane::withToken(kOperatorToken);
  }
  int64_t count(const std::string& table) {
    auto rows = (*cp_.pool()->acquire())->query("SELECT COUNT(*) FROM " + table, {});
    return rows.ok() ? rows->rows[0].i64(0) : -1;
  }
  static v1::CreateEnvironmentRequest production(const std::string& app) {
    v1::CreateEnvironmentRequest r;
    r.set_app_id(app);
    r.set_slug("production");
    r.set_kind("production");
    auto* eu = r.add_regions();
    eu->set_region("eu-1");
    eu->set_replicas(2);
    auto* us = r.add_regions();
    us->set_region("us-1");
    us->set_replicas(1);
    return r;
  }

  TestControlPlane cp_;
  std::unique_ptr<v1::TenancyService::Stub> stub_;
};

TEST_CASE_METHOD(TenancyApiTest, "what a deployment needs is created through the API",
                 "[tenancy-api]") {
  v1::CreateWorkspaceRequest ws;
  ws.set_name("Acme Corp");
  ws.set_max_concurrent_builds(3);
  v1::Workspace workspace;
  REQUIRE_THAT(stub_->CreateWorkspace(ctx().get(), ws, &workspace), IsOk());
  CHECK_THAT(workspace.id(), Catch::StartsWith("ws_"));
  CHECK(workspace.slug() == "acme-corp");
  v1::CreateProjectRequest pr;
  pr.set_workspace_id(workspace.id());
  pr.set_name("Web");
  pr.set_id("web");
  v1::Project project;
  REQUIRE_THAT(stub_->CreateProject(ctx().get(), pr, &project), IsOk());
  CHECK(project.id() == "web");
  v1::CreateAppRequest ar;
  ar.set_project_id("web");
  ar.set_name("Shop");
  ar.set_id("shop");
  v1::App app;
  REQUIRE_THAT(stub_->CreateApp(ctx().get(), ar, &app), IsOk());
  CHECK(app.workspace_id() == workspace.id());
  v1::Environment env;
  REQUIRE_THAT(stub_->CreateEnvironment(ctx().get(), production("shop"), &env), IsOk());
  CHECK(env.strategy() == "blue_green");
  CHECK(env.max_surge() == 1);
  CHECK(env.deploy_timeout_seconds() == 1800);
  auto quota = (*cp_.pool()->acquire())
                   ->query("SELECT max_concurrent_builds FROM quotas WHERE workspace_id = ?",
                           {workspace.id()});
  REQUIRE_THAT(quota, IsOk());
  CHECK(quota->rows[0].i64(0) == 3);
  CHECK(count("environment_regions") == 2);

  // Enough for a deployment.
  auto deployments = v1::DeploymentService::NewStub(cp_.channel());
  v1::CreateDeploymentRequest dr;
  dr.set_app_id("shop");
  dr.set_environment_id(env.id());
  dr.set_image("registry.example.com/shop:v1");
  dr.mutable_spec()->set_port(8080);
  dr.mutable_spec()->set_cpu_millicores(100);
  dr.mutable_spec()->set_memory_mib(64);
  v1::Deployment d;
  REQUIRE_THAT(deployments->CreateDeployment(ctx().get(), dr, &d), IsOk());
  CHECK(d.status() == "pending");

  INFO("one production environment per app: it has one live deployment");
  auto second = production("shop");
  second.set_slug("prod-2");
  v1::Environment refused;
  auto twice = stub_->CreateEnvironment(ctx().get(), second, &refused);
  CHECK(twice.error_code() == grpc::FAILED_PRECONDITION);
  CHECK_THAT(twice.error_message(),
             Catch::StartsWith("kind: app 'shop' already has a production environment"));
  second.set_kind("preview");
  REQUIRE_THAT(stub_->CreateEnvironment(ctx().get(), second, &refused), IsOk());

  INFO("a rolling environment with percentages, of another app");
  ar.set_name("Shop canary");
  ar.set_id("shop-canary");
  REQUIRE_THAT(stub_->CreateApp(ctx().get(), ar, &app), IsOk());
  auto rolling = production("shop-canary");
  rolling.set_slug("canary");
  rolling.set_strategy("rolling");
  rolling.set_max_surge_percent(25);
  rolling.set_max_unavailable(0);
  rolling.set_min_ready_seconds(5);
  rolling.set_deploy_timeout_seconds(600);
  v1::Environment env2;
  REQUIRE_THAT(stub_->CreateEnvironment(ctx().get(), rolling, &env2), IsOk());
  CHECK(env2.has_max_surge_percent());
  CHECK(env2.max_surge_percent() == 25);
  CHECK_FALSE(env2.has_max_unavailable_percent());
  CHECK(env2.min_ready_seconds() == 5);
  auto stored = (*cp_.pool()->acquire())
                    ->query(
                        "SELECT max_surge, max_surge_percent, max_unavailable_percent,"
                        " min_ready_seconds, deploy_timeout_seconds FROM environments WHERE id = ?",
                        {env2.id()});
  REQUIRE_THAT(stored, IsOk());
  CHECK(stored->rows[0].i64(0) == 0);
  CHECK(stored->rows[0].i64(1) == 25);
  CHECK(stored->rows[0].isNull("max_unavailable_percent"));
  CHECK(stored->rows[0].i64(3) == 5);
  CHECK(stored->rows[0].i64(4) == 600);
}

TEST_CASE_METHOD(TenancyApiTest, "bad tenancy requests are refused naming the field",
                 "[tenancy-api]") {
  v1::Workspace workspace;
  v1::CreateWorkspaceRequest ws;
  CHECK(stub_->CreateWorkspace(ctx().get(), ws, &workspace).error_message() == "name: required");
  ws.set_name("Acme");
  ws.set_id("Bad Id");
  CHECK_THAT(stub_->CreateWorkspace(ctx().get(), ws, &workspace).error_message(),
             Catch::StartsWith("id: 1-64 of a-z"));
  ws.set_id("acme");
  REQUIRE_THAT(stub_->CreateWorkspace(ctx().get(), ws, &workspace), IsOk());
  auto again = stub_->CreateWorkspace(ctx().get(), ws, &workspace);
  CHECK(again.error_code() == grpc::ALREADY_EXISTS);
  CHECK_THAT(again.error_message(), Catch::Contains("workspace id 'acme' or slug 'acme' is taken"));

  v1::Project project;
  v1::CreateProjectRequest pr;
  pr.set_name("Web");
  pr.set_workspace_id("nope");
  auto orphan = stub_->CreateProject(ctx().get(), pr, &project);
  CHECK(orphan.error_code() == grpc::NOT_FOUND);
  CHECK(orphan.error_message() == "workspace_id: no workspace 'nope'");
  pr.set_workspace_id("acme");
  pr.set_id("web");
  REQUIRE_THAT(stub_->CreateProject(ctx().get(), pr, &project), IsOk());
  v1::App app;
  v1::CreateAppRequest ar;
  ar.set_project_id("web");
  ar.set_name("Shop");
  ar.set_id("shop");
  REQUIRE_THAT(stub_->CreateApp(ctx().get(), ar, &app), IsOk());

  v1::Environment env;
  auto refused = [&](v1::CreateEnvironmentRequest r) {
    auto st = stub_->CreateEnvironment(ctx().get(), r, &env);
    return std::make_pair(st.error_code(), st.error_message());
  };
  auto r = production("shop");
  r.set_kind("staging");
  CHECK(refused(r).second == "kind: \"production\" or \"preview\"");
  r = production("shop");
  r.clear_regions();
  CHECK(refused(r).second == "regions: at least one region");
  r = production("shop");
  r.mutable_regions(1)->set_replicas(0);
  CHECK(refused(r).second == "regions[1].replicas: 1 to 1000");
  r = production("shop");
  r.mutable_regions(1)->set_region("eu-1");
  CHECK(refused(r).second == "regions[1].region: 'eu-1' twice");
  r = production("shop");
  r.mutable_regions(1)->set_region("mars-1");
  CHECK(refused(r).first == grpc::NOT_FOUND);
  CHECK_THAT(refused(r).second, Catch::StartsWith("regions[1].region: no region 'mars-1'"));
  r = production("shop");
  r.set_strategy("canary");
  CHECK(refused(r).second == "strategy: \"blue_green\" or \"rolling\"");
  r = production("shop");
  r.set_max_surge(0);
  r.set_max_unavailable(0);
  CHECK_THAT(refused(r).second, Catch::StartsWith("max_surge, max_unavailable: at least one"));
  r = production("shop");
  r.set_max_surge(1);
  r.set_max_surge_percent(10);
  CHECK(refused(r).second == "max_surge, max_surge_percent: one or the other");
  r = production("shop");
  r.set_max_unavailable_percent(101);
  CHECK(refused(r).second == "max_unavailable_percent: at most 100%, got 101%");
  r = production("shop");
  r.set_max_surge_percent(0);
  r.set_max_unavailable_percent(0);
  CHECK_THAT(refused(r).second, Catch::Contains("at least one must be positive"));
  r = production("shop");
  r.set_min_ready_seconds(4000);
  CHECK(refused(r).second == "min_ready_seconds: at most 3600");
  r = production("shop");
  r.set_strategy("rolling");
  r.set_deploy_timeout_seconds(60);
  r.set_min_ready_seconds(60);
  CHECK_THAT(refused(r).second,
             Catch::StartsWith("min_ready_seconds: must be below deploy_timeout_seconds (60)"));
  r = production("shop");
  r.set_deploy_timeout_seconds(0);
  CHECK_THAT(refused(r).second, Catch::StartsWith("deploy_timeout_seconds: must be at least 1"));
  r = production("shop");
  r.set_deploy_timeout_seconds(86401);
  CHECK(refused(r).second == "deploy_timeout_seconds: at most 86400");
  r = production("nope");
  CHECK(refused(r).second == "app_id: no app 'nope'");
  INFO("nothing was written by the refused requests");
  CHECK(count("environments") == 0);
  CHECK(count("environment_regions") == 0);
  REQUIRE_THAT(stub_->CreateEnvironment(ctx().get(), production("shop"), &env), IsOk());
  CHECK(refused(production("shop")).first == grpc::ALREADY_EXISTS);
  CHECK(count("environment_regions") == 2);
}

}  // namespace
}  // namespace krane
