// krane.api.v1.DeploymentService on a krane-ctrl server in process, with a real MariaDB: bad
// requests are refused naming the field with nothing written; a deployment created through the
// API is deployed to ready once the agents report its instances (through ClusterService); it
// lists newest first; rollback and promote move the live deployment; cancel refuses a finished
// deployment and cancels a running one. A page of the listing takes three queries however many
// deployments it holds; watches are bounded in number and in lifetime.
#include "controlplane/api/deployments.h"

#include <atomic>
#include <cstdio>
#include <optional>
#include <thread>

#include <catch2/catch.hpp>

#include "common/strings.h"
#include "controlplane/config.h"
#include "controlplane/feed/resource_table.h"
#include "controlplane/workflow/engine.h"
#include "controlplane/workflow/operations.h"
#include "krane/api/v1/deployments.grpc.pb.h"
#include "krane/cluster/v1/cluster.grpc.pb.h"
#include "tests/support/control_plane.h"
#include "tests/support/mariadb.h"
#include "tests/support/matchers.h"
#include "tests/support/reports.h"
#include "tests/support/threads.h"
#include "tests/support/wait.h"

namespace krane {
namespace {

using krane::testing::eventually;
using krane::testing::kOperatorToken;
using krane::testing::TestControlPlane;
namespace v1 = krane::api::v1;

// GetDeployment as the operator; a failure fails the test.
v1::Deployment getDeployment(v1::DeploymentService::Stub& stub, const std::string& id) {
  v1::DeploymentRef ref;
  ref.set_id(id);
  v1::Deployment d;
  CHECK_THAT(stub.GetDeployment(TestControlPlane::withToken(kOperatorToken).get(), ref, &d),
             IsOk());
  return d;
}

class DeploymentsApiTest {
 protected:
  DeploymentsApiTest() {
    cp_.startReplica(
        [](ctrl::CtrlConfig& c) { c.workflow.poll_interval = std::chrono::milliseconds(20); });
    cp_.seedApp();
    REQUIRE_THAT((*cp_.pool()->acquire())
                     ->exec("INSERT INTO environments (id, workspace_id, project_id, app_id,"
                            " slug, kind, created_at)"
                            " VALUES ('empty', 'ws', 'proj', 'app', 'empty', 'preview', 1)",
                            {}),
                 IsOk());
    stub_ = v1::DeploymentService::NewStub(cp_.channel());
    cluster_ = cp_.cluster();
    sentinel_agents_ = std::make_unique<krane::testing::SentinelAgents>(cp_);
  }

  static v1::CreateDeploymentRequest request(const std::string& sha) {
    v1::CreateDeploymentRequest r;
    r.set_app_id("app");
    r.set_environment_id("prod");
    r.set_git_branch("main");
    r.set_git_commit_sha(sha);
    r.set_image("registry.example.com/app:" + sha);
    r.mutable_spec()->set_port(8080);
    r.mutable_spec()->set_cpu_millicores(100);
    r.mutable_spec()->set_memory_mib(64);
    return r;
  }
  grpc::Status create(const v1::CreateDeploymentRequest& r, v1::Deployment* out) {
    return stub_->CreateDeployment(TestControlPlane::withToken(kOperatorToken).get(), r, out);
  }
  v1::Deployment get(const std::string& id) { return getDeployment(*stub_, id); }
  // Both regions' agents report one running instance.
  void instancesUp(const std::string& id) {
    for (const char* region : {"eu-1", "us-1"}) {
      cluster::v1::ReportDeploymentStatusResponse ignored;
      REQUIRE_THAT(cluster_->ReportDeploymentStatus(
                       TestControlPlane::withToken(cp_.agentToken(region)).get(),
                       krane::testing::instancesReport(id, region), &ignored),
                   IsOk());
    }
  }
  // Created, deployed, ready.
  v1::Deployment deployed(const std::string& sha) {
    v1::Deployment d;
    REQUIRE_THAT(create(request(sha), &d), IsOk());
    REQUIRE(eventually([&] { return get(d.id()).status() == "deploying"; }));
    REQUIRE(eventually([&] {
      const auto steps = get(d.id()).steps();
      return !steps.empty() && steps.rbegin()->step() == "waiting";
    }));
    instancesUp(d.id());
    REQUIRE(eventually([&] { return get(d.id()).status() == "ready"; }));
    return get(d.id());
  }
  int64_t count(const std::string& table) {
    auto rows = (*cp_.pool()->acquire())->query("SELECT COUNT(*) FROM " + table, {});
    return rows.ok() ? rows->rows[0].i64(0) : -1;
  }

  TestControlPlane cp_;
  std::unique_ptr<krane::testing::SentinelAgents> sentinel_agents_;
  std::unique_ptr<v1::DeploymentService::Stub> stub_;
  std::unique_ptr<cluster::v1::ClusterService::Stub> cluster_;
};

// DeploymentService alone on a gRPC server of its own, over a scratch database: no engine runs
// and no agent reports, so the database serves nothing but the calls of the test.
class DeploymentServiceAlone : public krane::testing::MigratedDbTest {
 protected:
  DeploymentServiceAlone() : MigratedDbTest(8), engine_(pool_) {
    for (const std::string& sql : krane::testing::appTenancySql()) exec(sql);
  }
  ~DeploymentServiceAlone() {
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  }

  void serve(api::DeploymentWatchLimits limits = {}) {
    service_ = std::make_unique<api::DeploymentServiceImpl>(
        pool_, std::make_shared<feed::ResourceTables>(), engine_,
        std::make_shared<api::OperatorTokens>(std::vector<std::string>{kOperatorToken}), limits);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    REQUIRE(server_ != nullptr);
    stub_ = v1::DeploymentService::NewStub(
        grpc::CreateChannel(strCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  }
  void exec(const std::string& sql, const db::Params& params = {}) {
    REQUIRE_THAT((*pool_->acquire())->exec(sql, params), IsOk());
  }
  void deployment(const std::string& id, int64_t created_at, const std::string& status) {
    exec(
        "INSERT INTO deployments (id, workspace_id, project_id, app_id, environment_id, status,"
        " git_branch, git_commit_sha, image, created_at)"
        " VALUES (?, 'ws', 'proj', 'app', 'prod', ?, 'main', 'abc', ?, ?)",
        {id, status, "registry.example.com/app:" + id, created_at});
  }
  // SELECT statements the server ran, all clients together.
  int64_t selects() {
    auto rows = (*pool_->acquire())->query("SHOW GLOBAL STATUS LIKE 'Com_select'");
    REQUIRE_THAT(rows, IsOk());
    return std::stoll(rows->rows.at(0).str(1));
  }
  v1::ListDeploymentsResponse list(uint32_t limit, const std::string& page_token = "") {
    v1::ListDeploymentsRequest request;
    request.set_app_id("app");
    request.set_limit(limit);
    request.set_page_token(page_token);
    v1::ListDeploymentsResponse response;
    CHECK_THAT(stub_->ListDeployments(TestControlPlane::withToken(kOperatorToken).get(), request,
                                      &response),
               IsOk());
    return response;
  }
  v1::Deployment get(const std::string& id) { return getDeployment(*stub_, id); }

  // A WatchDeployment call of the test.
  struct Watch {
    std::unique_ptr<grpc::ClientContext> context;
    std::unique_ptr<grpc::ClientReader<v1::Deployment>> reader;
    // Cancels the call and collects its status.
    grpc::Status end() {
      context->TryCancel();
      v1::Deployment ignored;
      while (reader->Read(&ignored)) {
      }
      return reader->Finish();
    }
  };
  Watch watch(const std::string& id, std::chrono::seconds deadline = std::chrono::seconds(30)) {
    v1::DeploymentRef ref;
    ref.set_id(id);
    Watch w;
    w.context = TestControlPlane::withToken(kOperatorToken, deadline);
    w.reader = stub_->WatchDeployment(w.context.get(), ref);
    return w;
  }

  workflow::Engine engine_;  // never started: the service only needs one to exist
  std::unique_ptr<api::DeploymentServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::DeploymentService::Stub> stub_;
};

TEST_CASE_METHOD(DeploymentServiceAlone,
                 "a page of deployments takes three queries however many it holds",
                 "[deployments-api]") {
  serve();
  // 25 deployments, each with three steps and three phases, written interleaved: a deployment's
  // steps are not next to each other, and its phases are not in region order.
  auto name = [](int i) {
    char id[16];
    std::snprintf(id, sizeof id, "dep-%02d", i);
    return std::string(id);
  };
  for (int i = 0; i < 25; ++i) deployment(name(i), 1000 + i, i % 2 == 0 ? "ready" : "failed");
  for (const char* step : {"queued", "starting", "building"}) {
    for (int i = 0; i < 25; ++i) {
      const bool last = std::string(step) == "building";
      exec(
          "INSERT INTO deployment_steps (deployment_id, step, started_at, ended_at, error)"
          " VALUES (?, ?, ?, ?, ?)",
          {name(i), step, 2000 + i, last && i % 2 == 1 ? db::Value() : db::Value(3000 + i),
           last && i % 2 == 1 ? db::Value(strCat("build of ", name(i), " failed")) : db::Value()});
    }
  }
  for (const auto& [region, phase] : std::vector<std::pair<std::string, std::string>>{
           {"us-1", "provisioning"}, {"eu-1", "progressing"}, {"us-1", "completed"}}) {
    for (int i = 0; i < 25; ++i) {
      exec(
          "INSERT INTO deployment_phases (deployment_id, region_id, phase, detail,"
          " phase_started_at, updated_at, attempts) VALUES (?, ?, ?, ?, ?, ?, ?)",
          {name(i), region, phase, strCat(phase, " ", name(i)), 4000 + i, 5000 + i, i + 1});
    }
  }
  exec("UPDATE apps SET current_deployment_id = 'dep-21' WHERE id = 'app'");

  int64_t before = selects();
  const v1::ListDeploymentsResponse two = list(2);
  const int64_t two_selects = selects() - before;
  before = selects();
  const v1::ListDeploymentsResponse twenty = list(20);
  const int64_t twenty_selects = selects() - before;
  INFO("SELECTs for a page of 2: " << two_selects << ", for a page of 20: " << twenty_selects);
  CHECK(twenty_selects == two_selects);
  CHECK(twenty_selects <= 3);

  INFO("the pages hold what they held: newest first, each deployment as GetDeployment shows it");
  REQUIRE(two.deployments_size() == 2);
  CHECK(two.deployments(0).id() == "dep-24");
  CHECK(two.deployments(1).id() == "dep-23");
  CHECK(two.next_page_token() == "1023/dep-23");
  REQUIRE(twenty.deployments_size() == 20);
  for (int i = 0; i < 20; ++i) {
    const v1::Deployment& listed = twenty.deployments(i);
    INFO(listed.DebugString());
    CHECK(listed.id() == name(24 - i));
    CHECK(listed.SerializeAsString() == get(listed.id()).SerializeAsString());
  }
  const v1::Deployment& d = twenty.deployments(3);
  CHECK(d.id() == "dep-21");
  CHECK(d.live());
  CHECK_FALSE(twenty.deployments(0).live());
  CHECK(d.status() == "failed");
  CHECK(d.image() == "registry.example.com/app:dep-21");
  REQUIRE(d.steps_size() == 3);
  CHECK(d.steps(0).step() == "queued");
  CHECK(d.steps(0).started_at_ms() == 2021);
  CHECK(d.steps(0).ended_at_ms() == 3021);
  CHECK(d.steps(1).step() == "starting");
  CHECK(d.steps(2).step() == "building");
  CHECK(d.steps(2).ended_at_ms() == 0);
  CHECK(d.steps(2).error() == "build of dep-21 failed");
  REQUIRE(d.phases_size() == 3);
  CHECK(d.phases(0).region() == "eu-1");
  CHECK(d.phases(0).phase() == "progressing");
  CHECK(d.phases(1).region() == "us-1");
  CHECK(d.phases(1).phase() == "provisioning");
  CHECK(d.phases(1).detail() == "provisioning dep-21");
  CHECK(d.phases(1).phase_started_at_ms() == 4021);
  CHECK(d.phases(1).updated_at_ms() == 5021);
  CHECK(d.phases(1).attempts() == 22);
  CHECK(d.phases(2).phase() == "completed");
  INFO("the next page: the five oldest, and no more");
  REQUIRE_FALSE(twenty.next_page_token().empty());
  const v1::ListDeploymentsResponse rest = list(20, twenty.next_page_token());
  REQUIRE(rest.deployments_size() == 5);
  CHECK(rest.deployments(0).id() == "dep-04");
  CHECK(rest.deployments(4).id() == "dep-00");
  CHECK(rest.deployments(4).steps_size() == 3);
  CHECK(rest.next_page_token().empty());
}

TEST_CASE_METHOD(DeploymentServiceAlone, "watches over the limit are refused naming the setting",
                 "[deployments-api]") {
  serve({.max_streams = 2});
  deployment("dep-slow", 1000, "building");  // nothing finishes it: its watches go on
  Watch first = watch("dep-slow");
  Watch second = watch("dep-slow");
  v1::Deployment d;
  REQUIRE(first.reader->Read(&d));
  REQUIRE(second.reader->Read(&d));
  Watch third = watch("dep-slow");
  CHECK_FALSE(third.reader->Read(&d));
  const grpc::Status refused = third.reader->Finish();
  CHECK(refused.error_code() == grpc::RESOURCE_EXHAUSTED);
  CHECK(refused.error_message() ==
        "too many deployment watches: this krane-ctrl serves at most 2 at once"
        " (deploy.watch_max_streams); watch again later, or read the deployment with"
        " GetDeployment");
  INFO("a watch that ends gives its slot back");
  CHECK(first.end().error_code() == grpc::CANCELLED);
  std::optional<Watch> again;
  CHECK(eventually([&] {
    again = watch("dep-slow");
    if (again->reader->Read(&d)) return true;
    CHECK(again->reader->Finish().error_code() == grpc::RESOURCE_EXHAUSTED);
    again.reset();
    return false;
  }));
  if (again) again->end();
  second.end();
}

TEST_CASE_METHOD(DeploymentServiceAlone, "a watch ends after its maximum lifetime",
                 "[deployments-api]") {
  serve({.max_lifetime = std::chrono::seconds(1)});
  deployment("dep-slow", 1000, "building");
  const auto started = std::chrono::steady_clock::now();
  Watch w = watch("dep-slow", std::chrono::seconds(20));
  v1::Deployment d;
  int messages = 0;
  while (w.reader->Read(&d)) ++messages;
  const grpc::Status ended = w.reader->Finish();
  const auto took = std::chrono::steady_clock::now() - started;
  CHECK(messages == 1);
  CHECK(ended.error_code() == grpc::OUT_OF_RANGE);
  CHECK(ended.error_message() ==
        "this watch of deployment 'dep-slow' reached its maximum lifetime (1 s,"
        " deploy.watch_max_lifetime_s); the deployment goes on, watch it again");
  CHECK(took >= std::chrono::seconds(1));
  CHECK(took < std::chrono::seconds(5));
  INFO("watched again, it starts with the deployment as it is then, and ends when it finished");
  exec("UPDATE deployments SET status = 'ready' WHERE id = 'dep-slow'");
  Watch again = watch("dep-slow");
  REQUIRE(again.reader->Read(&d));
  CHECK(d.status() == "ready");
  CHECK_FALSE(again.reader->Read(&d));
  CHECK_THAT(again.reader->Finish(), IsOk());
}

TEST_CASE("the deployment watch limits are krane-ctrl settings", "[deployments-api]") {
  auto defaults = ctrl::parseCtrlConfig("listen: 127.0.0.1:0\n", "ctrl.yaml");
  REQUIRE_THAT(defaults, IsOk());
  CHECK(defaults->deploy.watch_max_streams == 256u);
  CHECK(defaults->deploy.watch_max_lifetime == std::chrono::hours(1));
  auto set = ctrl::parseCtrlConfig("deploy:\n  watch_max_streams: 1\n  watch_max_lifetime_s: 600\n",
                                   "ctrl.yaml");
  REQUIRE_THAT(set, IsOk());
  CHECK(set->deploy.watch_max_streams == 1u);
  CHECK(set->deploy.watch_max_lifetime == std::chrono::minutes(10));
  auto none = ctrl::parseCtrlConfig("deploy:\n  watch_max_streams: 0\n", "ctrl.yaml");
  REQUIRE_FALSE(none.ok());
  CHECK(std::string(none.status().message()) ==
        "ctrl.yaml: deploy.watch_max_streams: must be between 1 and 100000, got 0");
  auto forever = ctrl::parseCtrlConfig("deploy:\n  watch_max_lifetime_s: 0\n", "ctrl.yaml");
  REQUIRE_FALSE(forever.ok());
  CHECK_THAT(std::string(forever.status().message()),
             Catch::StartsWith("ctrl.yaml: deploy.watch_max_lifetime_s: must be between 1 and"));

  INFO("a krane-ctrl started with watch_max_streams 1 serves one watch at once");
  TestControlPlane cp;
  cp.startReplica([&](ctrl::CtrlConfig& c) {
    c.deploy.watch_max_streams = set->deploy.watch_max_streams;
    c.deploy.watch_max_lifetime = set->deploy.watch_max_lifetime;
  });
  cp.seedApp();
  REQUIRE_THAT((*cp.pool()->acquire())
                   ->exec("INSERT INTO deployments (id, workspace_id, project_id, app_id,"
                          " environment_id, status, created_at)"
                          " VALUES ('dep-slow', 'ws', 'proj', 'app', 'prod', 'building', 1)",
                          {}),
               IsOk());
  auto stub = v1::DeploymentService::NewStub(cp.channel());
  v1::DeploymentRef ref;
  ref.set_id("dep-slow");
  auto first_context = TestControlPlane::withToken(kOperatorToken);
  auto first = stub->WatchDeployment(first_context.get(), ref);
  v1::Deployment d;
  REQUIRE(first->Read(&d));
  auto second_context = TestControlPlane::withToken(kOperatorToken);
  auto second = stub->WatchDeployment(second_context.get(), ref);
  CHECK_FALSE(second->Read(&d));
  const grpc::Status refused = second->Finish();
  CHECK(refused.error_code() == grpc::RESOURCE_EXHAUSTED);
  CHECK_THAT(refused.error_message(),
             Catch::Contains("at most 1 at once (deploy.watch_max_streams)"));
  first_context->TryCancel();
  while (first->Read(&d)) {
  }
  CHECK(first->Finish().error_code() == grpc::CANCELLED);
}

TEST_CASE_METHOD(DeploymentsApiTest, "bad deployments are refused naming the field",
                 "[deployments-api]") {
  v1::Deployment out;
  auto refused = [&](v1::CreateDeploymentRequest r) {
    auto st = create(r, &out);
    return std::make_pair(st.error_code(), st.error_message());
  };
  auto r = request("abc");
  r.clear_app_id();
  CHECK(refused(r) == std::make_pair(grpc::INVALID_ARGUMENT, std::string("app_id: required")));
  r = request("abc");
  r.clear_image();
  CHECK_THAT(refused(r).second, Catch::StartsWith("source: an image, or a build command"));
  r = request("abc");
  r.set_image("app v2");
  CHECK_THAT(refused(r).second, Catch::StartsWith("image: must not contain spaces"));
  r = request("abc");
  r.mutable_build()->set_image_name("demo");
  CHECK_THAT(refused(r).second, Catch::StartsWith("build.argv: required"));
  r = request("abc");
  r.set_environment_id("staging");
  CHECK(refused(r).first == grpc::NOT_FOUND);
  CHECK_THAT(refused(r).second, Catch::StartsWith("environment_id: no environment 'staging'"));
  r = request("abc");
  r.set_environment_id("empty");
  CHECK(refused(r).first == grpc::FAILED_PRECONDITION);
  CHECK_THAT(refused(r).second, Catch::Contains("has no regions"));
  r = request("abc");
  r.mutable_spec()->set_port(70000);
  CHECK(refused(r).first == grpc::INVALID_ARGUMENT);
  CHECK_THAT(refused(r).second, Catch::StartsWith("spec: deployment_topology.port"));
  r = request(std::string(65, 'f'));
  CHECK_THAT(refused(r).second, Catch::StartsWith("git_commit_sha: at most 64 bytes"));
  r = request("abc def");
  CHECK_THAT(refused(r).second, Catch::StartsWith("git_commit_sha: 'abc def' is not a commit"));
  r = request("-abc");
  CHECK_THAT(refused(r).second, Catch::StartsWith("git_commit_sha: '-abc' is not a commit"));
  auto st = stub_->CreateDeployment(TestControlPlane::withToken("not-a-token").get(),
                                    request("abc"), &out);
  CHECK(st.error_code() == grpc::UNAUTHENTICATED);
  INFO("nothing was written");
  CHECK(count("deployments") == 0);
  CHECK(count("workflow_invocations WHERE service = 'DeployService'") == 0);
}

TEST_CASE_METHOD(DeploymentsApiTest, "a deployment whose workflow cannot start is not written",
                 "[deployments-api]") {
  // A replica whose engine takes smaller inputs than this deploy request: the request passes
  // every check of the API, and the engine refuses the workflow.
  cp_.startReplica([](ctrl::CtrlConfig& c) { c.workflow.max_payload_bytes = 1024; });
  auto stub = v1::DeploymentService::NewStub(cp_.channel(1));
  auto r = request("abc");
  for (int i = 0; i < 8; ++i) {
    auto* env = r.mutable_spec()->add_env();
    env->set_name("VAR_" + std::to_string(i));
    env->set_value(std::string(200, 'x'));
  }
  v1::Deployment out;
  const grpc::Status st =
      stub->CreateDeployment(TestControlPlane::withToken(kOperatorToken).get(), r, &out);
  CHECK(st.error_code() == grpc::INVALID_ARGUMENT);
  CHECK_THAT(st.error_message(), Catch::StartsWith("spec: the deploy workflow's input: "));
  INFO("no pending deployment is left that no workflow deploys, cancels or finishes");
  CHECK(count("deployments") == 0);
  CHECK(count("workflow_invocations WHERE service = 'DeployService'") == 0);
  INFO("the same request on a replica that takes it");
  REQUIRE_THAT(create(r, &out), IsOk());
  CHECK(count("deployments WHERE invocation_id IS NOT NULL") == 1);
}

TEST_CASE_METHOD(DeploymentsApiTest, "a deployment is never seen without its workflow",
                 "[deployments-api]") {
  // Readers see a created deployment only together with the invocation that deploys it, so a
  // crash of krane-ctrl at any moment of a create leaves both or neither.
  std::atomic<bool> creating{true};
  std::atomic<int> reads{0};
  krane::testing::ThreadFailures failures;
  std::thread reader([&] {
    auto conn = cp_.pool()->acquire();
    if (!failures.expectOk(conn, "acquire")) return;
    while (creating.load()) {
      auto orphans = (*conn)->query(
          "SELECT d.id FROM deployments d LEFT JOIN workflow_invocations i"
          " ON i.id = d.invocation_id WHERE i.id IS NULL",
          {});
      if (!failures.expectOk(orphans, "read")) return;
      for (const auto& row : orphans->rows) failures.add("without a workflow: " + row.str("id"));
      if (!orphans->rows.empty()) return;
      reads.fetch_add(1);
    }
  });
  std::vector<std::thread> creators;
  for (int t = 0; t < 4; ++t) {
    creators.emplace_back([&, t] {
      for (int i = 0; i < 5; ++i) {
        v1::Deployment d;
        auto r = request("sha" + std::to_string(t * 10 + i));
        r.set_git_branch("branch-" + std::to_string(t));
        const grpc::Status st =
            stub_->CreateDeployment(TestControlPlane::withToken(kOperatorToken).get(), r, &d);
        if (!st.ok()) failures.add("create: " + st.error_message());
      }
    });
  }
  for (auto& c : creators) c.join();
  creating = false;
  reader.join();
  CHECK(failures.all() == std::vector<std::string>{});
  CHECK(reads.load() > 0);
  CHECK(count("deployments") == 20);
  CHECK(count("workflow_invocations WHERE service = 'DeployService'") == 20);
}

TEST_CASE_METHOD(DeploymentsApiTest, "deploy promote rollback and cancel through the API",
                 "[deployments-api]") {
  v1::Deployment created;
  REQUIRE_THAT(create(request("sha1"), &created), IsOk());
  CHECK(created.status() == "pending");
  CHECK_FALSE(created.invocation_id().empty());
  CHECK_THAT(created.id(), Catch::StartsWith("dep_"));
  REQUIRE(eventually([&] {
    const auto steps = get(created.id()).steps();
    return !steps.empty() && steps.rbegin()->step() == "waiting";
  }));
  instancesUp(created.id());
  REQUIRE(eventually([&] { return get(created.id()).status() == "ready"; }));
  v1::Deployment first = get(created.id());
  CHECK(first.live());
  CHECK(first.image() == "registry.example.com/app:sha1");
  std::vector<std::string> steps;
  for (const auto& s : first.steps()) steps.push_back(s.step());
  CHECK(steps == std::vector<std::string>{"queued", "starting", "building", "deploying", "waiting",
                                          "network", "finalizing", "ready"});

  v1::RollbackEnvironmentRequest rollback;
  rollback.set_environment_id("prod");
  v1::LiveChange change;
  auto nothing = stub_->RollbackEnvironment(TestControlPlane::withToken(kOperatorToken).get(),
                                            rollback, &change);
  CHECK(nothing.error_code() == grpc::FAILED_PRECONDITION);
  CHECK_THAT(nothing.error_message(), Catch::Contains("no ready deployment older"));

  v1::Deployment second = deployed("sha2");
  CHECK(second.live());
  CHECK_FALSE(get(first.id()).live());
  REQUIRE_THAT(stub_->RollbackEnvironment(TestControlPlane::withToken(kOperatorToken).get(),
                                          rollback, &change),
               IsOk());
  CHECK(change.swapped());
  CHECK(change.live_deployment_id() == first.id());
  CHECK(change.previous_deployment_id() == second.id());
  CHECK(get(first.id()).live());

  v1::DeploymentRef ref;
  ref.set_id(second.id());
  REQUIRE_THAT(
      stub_->PromoteDeployment(TestControlPlane::withToken(kOperatorToken).get(), ref, &change),
      IsOk());
  CHECK(change.live_deployment_id() == second.id());
  CHECK(get(second.id()).live());

  v1::ListDeploymentsRequest list;
  list.set_app_id("app");
  v1::ListDeploymentsResponse listed;
  REQUIRE_THAT(
      stub_->ListDeployments(TestControlPlane::withToken(kOperatorToken).get(), list, &listed),
      IsOk());
  REQUIRE(listed.deployments_size() == 2);
  CHECK(listed.deployments(0).id() == second.id());  // newest first
  CHECK(listed.deployments(1).id() == first.id());
  CHECK(listed.next_page_token().empty());
  INFO("pages of one: the newest, then the older one, then no more");
  list.set_limit(1);
  REQUIRE_THAT(
      stub_->ListDeployments(TestControlPlane::withToken(kOperatorToken).get(), list, &listed),
      IsOk());
  REQUIRE(listed.deployments_size() == 1);
  CHECK(listed.deployments(0).id() == second.id());
  REQUIRE_FALSE(listed.next_page_token().empty());
  list.set_page_token(listed.next_page_token());
  REQUIRE_THAT(
      stub_->ListDeployments(TestControlPlane::withToken(kOperatorToken).get(), list, &listed),
      IsOk());
  REQUIRE(listed.deployments_size() == 1);
  CHECK(listed.deployments(0).id() == first.id());
  CHECK(listed.next_page_token().empty());
  for (const char* token :
       {"not a token", "12x/dep_1", "-1/dep_1", "99999999999999999999/dep_1", "12/", "/dep_1"}) {
    INFO(token);
    list.set_page_token(token);
    auto bad =
        stub_->ListDeployments(TestControlPlane::withToken(kOperatorToken).get(), list, &listed);
    CHECK(bad.error_code() == grpc::INVALID_ARGUMENT);
    CHECK(bad.error_message() == "page_token: not a token this server issued");
  }
  list.clear_page_token();
  list.clear_limit();

  v1::Deployment out;
  auto finished =
      stub_->CancelDeployment(TestControlPlane::withToken(kOperatorToken).get(), ref, &out);
  CHECK(finished.error_code() == grpc::FAILED_PRECONDITION);
  CHECK_THAT(finished.error_message(), Catch::Contains("already finished (ready)"));

  v1::Deployment third;
  REQUIRE_THAT(create(request("sha3"), &third), IsOk());
  REQUIRE(eventually([&] { return get(third.id()).status() == "deploying"; }));
  // Waiting for its instances, the deploy touches no status: the test may play its later ones.
  REQUIRE(eventually([&] {
    const auto steps = get(third.id()).steps();
    return !steps.empty() && steps.rbegin()->step() == "waiting";
  }));
  ref.set_id(third.id());
  INFO("once its routes move to it, a deployment is rolled back, not cancelled");
  for (const char* moving : {"network", "finalizing"}) {
    REQUIRE_THAT((*cp_.pool()->acquire())
                     ->exec("UPDATE deployments SET status = ? WHERE id = ?", {moving, third.id()}),
                 IsOk());
    auto late =
        stub_->CancelDeployment(TestControlPlane::withToken(kOperatorToken).get(), ref, &out);
    CHECK(late.error_code() == grpc::FAILED_PRECONDITION);
    CHECK_THAT(late.error_message(), Catch::Contains("too late to cancel"));
  }
  REQUIRE_THAT((*cp_.pool()->acquire())
                   ->exec("UPDATE deployments SET status = 'deploying' WHERE id = ?", {third.id()}),
               IsOk());
  ref.set_id("dep_nope");
  CHECK(stub_->CancelDeployment(TestControlPlane::withToken(kOperatorToken).get(), ref, &out)
            .error_code() == grpc::NOT_FOUND);
  ref.set_id(third.id());
  REQUIRE_THAT(
      stub_->CancelDeployment(TestControlPlane::withToken(kOperatorToken).get(), ref, &out),
      IsOk());
  REQUIRE(eventually([&] { return get(third.id()).status() == "cancelled"; }));
  CHECK(get(second.id()).live());

  INFO("a deployment whose workflow was killed (no compensations) is finished by its cancel");
  v1::Deployment fourth;
  REQUIRE_THAT(create(request("sha4"), &fourth), IsOk());
  REQUIRE(eventually([&] { return get(fourth.id()).status() == "deploying"; }));
  REQUIRE_THAT(workflow::killInvocation(*cp_.pool(), fourth.invocation_id()), IsOk());
  ref.set_id(fourth.id());
  REQUIRE_THAT(
      stub_->CancelDeployment(TestControlPlane::withToken(kOperatorToken).get(), ref, &out),
      IsOk());
  CHECK(out.status() == "cancelled");
  REQUIRE(out.steps_size() > 0);
  CHECK_THAT(
      out.steps(out.steps_size() - 1).error(),
      Catch::Contains("its deploy workflow " + fourth.invocation_id() + " had ended (killed)"));
}

TEST_CASE_METHOD(DeploymentsApiTest, "a deployment is watched until it finished",
                 "[deployments-api]") {
  v1::Deployment created;
  REQUIRE_THAT(create(request("sha1"), &created), IsOk());
  krane::testing::ThreadFailures failures;
  // The agents bring the instances up once the deploy waits for them.
  std::thread agents([&] {
    const bool waiting = eventually([&] {
      auto rows = (*cp_.pool()->acquire())
                      ->query(
                          "SELECT 1 FROM deployment_steps WHERE deployment_id = ? AND"
                          " step = 'waiting'",
                          {created.id()});
      return rows.ok() && !rows->empty();
    });
    if (!failures.expect(waiting, "the deploy never waited")) return;
    for (const char* region : {"eu-1", "us-1"}) {
      cluster::v1::ReportDeploymentStatusResponse ignored;
      failures.expect(cluster_
                          ->ReportDeploymentStatus(
                              TestControlPlane::withToken(cp_.agentToken(region)).get(),
                              krane::testing::instancesReport(created.id(), region), &ignored)
                          .ok(),
                      "report");
    }
  });
  v1::DeploymentRef ref;
  ref.set_id(created.id());
  auto context = TestControlPlane::withToken(kOperatorToken, std::chrono::seconds(60));
  auto reader = stub_->WatchDeployment(context.get(), ref);
  std::vector<v1::Deployment> seen;
  v1::Deployment d;
  while (reader->Read(&d)) seen.push_back(d);
  const grpc::Status ended = reader->Finish();
  agents.join();
  CHECK(failures.all() == std::vector<std::string>{});
  REQUIRE_THAT(ended, IsOk());
  REQUIRE(seen.size() >= 2u);
  CHECK(seen.back().status() == "ready");
  CHECK(seen.back().steps_size() == 8);
  for (size_t i = 1; i < seen.size(); ++i) {
    INFO("message " << i);
    CHECK(seen[i].SerializeAsString() != seen[i - 1].SerializeAsString());  // only changes
    CHECK(seen[i].steps_size() >= seen[i - 1].steps_size());
  }

  ref.set_id("dep_nope");
  auto missing_context = TestControlPlane::withToken(kOperatorToken);
  auto missing = stub_->WatchDeployment(missing_context.get(), ref);
  CHECK_FALSE(missing->Read(&d));
  CHECK(missing->Finish().error_code() == grpc::NOT_FOUND);
}

}  // namespace
}  // namespace krane
