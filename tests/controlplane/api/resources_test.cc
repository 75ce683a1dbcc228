// ResourceService and the agents' report calls on a krane-ctrl server in process: a put answers
// with the resource as stored (what Get returns); a Cilium policy the plugin would refuse is
// refused when it is written; values over a field's limit are refused quickly, naming the field
// and the limit, with a short message however large the value; a report without a region is
// refused naming `region`. Nothing is written by a refused call.
#include <chrono>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <google/protobuf/util/message_differencer.h>

#include "common/strings.h"
#include "krane/api/v1/resources.grpc.pb.h"
#include "krane/api/v1/tenancy.grpc.pb.h"
#include "krane/cluster/v1/cluster.grpc.pb.h"
#include "tests/support/control_plane.h"
#include "tests/support/matchers.h"

namespace krane {
namespace {

using krane::testing::kOperatorToken;
using krane::testing::TestControlPlane;
namespace v1 = krane::api::v1;

constexpr size_t kMiB = 1 << 20;

cluster::v1::Resource ciliumPolicy(const std::string& id, const std::string& policy_json) {
  cluster::v1::Resource r;
  r.set_type("cilium_network_policy");
  r.set_id(id);
  r.set_region("eu-1");
  auto* p = r.mutable_cilium_network_policy();
  p->set_workspace_id("ws");
  p->set_project_id("proj");
  p->set_environment_id("prod");
  p->set_policy_json(policy_json);
  return r;
}

constexpr const char* kGoodPolicy =
    R"({"endpointSelector": {"matchLabels": {"app": "shop"}},)"
    R"( "ingress": [{"fromEndpoints": [{"matchLabels": {"app": "web"}}]}]})";

class ResourceApiTest {
 protected:
  ResourceApiTest() {
    cp_.startReplica();
    resources_ = cp_.resources();
    tenancy_ = v1::TenancyService::NewStub(cp_.channel());
    cluster_ = cp_.cluster();
  }
  static std::unique_ptr<grpc::ClientContext> ctx() {
    // A server that answers at all answers these at once; a hung call fails the test.
    return TestControlPlane::withToken(kOperatorToken, std::chrono::seconds(10));
  }
  int64_t count(const std::string& sql) {
    auto rows = (*cp_.pool()->acquire())->query(sql, {});
    return rows.ok() ? rows->rows[0].i64(0) : -1;
  }

  TestControlPlane cp_;
  std::unique_ptr<v1::ResourceService::Stub> resources_;
  std::unique_ptr<v1::TenancyService::Stub> tenancy_;
  std::unique_ptr<cluster::v1::ClusterService::Stub> cluster_;
};

TEST_CASE_METHOD(ResourceApiTest, "put answers with the resource as stored, as get returns it",
                 "[resource-api]") {
  cluster::v1::Resource generic;
  generic.set_type("example.krane.dev/bucket");
  generic.set_id("photos");
  generic.set_region("eu-1");
  generic.mutable_generic()->set_spec(R"({"size": 3})");
  for (const auto& resource : {ciliumPolicy("allow-web", kGoodPolicy), generic}) {
    INFO(resource.type());
    v1::PutResourceRequest put;
    *put.mutable_resource() = resource;
    put.mutable_resource()->set_version(77);  // ignored: the server assigns it
    v1::PutResourceResponse written;
    REQUIRE_THAT(resources_->Put(ctx().get(), put, &written), IsOk());
    CHECK(written.created());
    CHECK(written.version() > 0u);
    CHECK(written.resource().version() == written.version());
    CHECK(written.resource().id() == resource.id());
    CHECK(written.resource().region() == "eu-1");

    v1::GetResourceRequest get;
    get.set_type(resource.type());
    get.set_id(resource.id());
    get.set_region("eu-1");
    v1::GetResourceResponse read;
    REQUIRE_THAT(resources_->Get(ctx().get(), get, &read), IsOk());
    CHECK(read.version() == written.version());
    INFO("put answered " << written.resource().ShortDebugString());
    INFO("get answered " << read.resource().ShortDebugString());
    CHECK(google::protobuf::util::MessageDifferencer::Equals(written.resource(), read.resource()));
  }
}

TEST_CASE_METHOD(
    ResourceApiTest,
    "a cilium policy the plugin would refuse is refused when written, naming the field",
    "[resource-api]") {
  struct Bad {
    std::string policy_json;
    std::string names;
  };
  const std::vector<Bad> bad = {
      {R"({"spec": {"endpointSelector": {}, "ingress": {"fromEndpoints": []}}})",
       "cilium_network_policy.policy_json.spec.ingress: must be an array"},
      {R"({"endpointSelector": {}, "nodeSelector": {}})",
       "cilium_network_policy.policy_json: endpointSelector and nodeSelector are mutually"},
      {R"({"endpointSelector": {}, "ingres": []})",
       "cilium_network_policy.policy_json.ingres: unknown field of a CiliumNetworkPolicy rule"},
      {R"({"kind": "NetworkPolicy", "spec": {"endpointSelector": {}}})",
       "cilium_network_policy.policy_json.kind: must be CiliumNetworkPolicy"},
  };
  for (const auto& [policy_json, names] : bad) {
    INFO(policy_json);
    v1::PutResourceRequest put;
    *put.mutable_resource() = ciliumPolicy("p1", policy_json);
    v1::PutResourceResponse response;
    const grpc::Status st = resources_->Put(ctx().get(), put, &response);
    REQUIRE_THAT(st, IsError(absl::StatusCode::kInvalidArgument));
    CHECK_THAT(st.error_message(), Catch::StartsWith(names));
  }
  CHECK(count("SELECT COUNT(*) FROM cilium_network_policies") == 0);
  CHECK(count("SELECT COUNT(*) FROM resource_changes") == 0);
  // The same policy made valid is stored.
  v1::PutResourceRequest put;
  *put.mutable_resource() = ciliumPolicy("p1", kGoodPolicy);
  v1::PutResourceResponse response;
  CHECK_THAT(resources_->Put(ctx().get(), put, &response), IsOk());
}

TEST_CASE_METHOD(ResourceApiTest,
                 "a 1 MiB value is refused at once naming the field and its limit, in a short "
                 "message",
                 "[resource-api]") {
  const std::string huge(kMiB, 'x');
  struct Case {
    std::string field;  // as the error names it
    std::string says;   // the limit as the error states it, or what it says instead
    std::function<grpc::Status(grpc::ClientContext*)> call;
  };
  const auto put = [this](std::function<void(cluster::v1::Resource&)> change) {
    return [this, change](grpc::ClientContext* c) {
      v1::PutResourceRequest request;
      *request.mutable_resource() = ciliumPolicy("p1", kGoodPolicy);
      change(*request.mutable_resource());
      v1::PutResourceResponse response;
      return resources_->Put(c, request, &response);
    };
  };
  const std::vector<Case> cases = {
      {"resource.id", "64", put([&](auto& r) { r.set_id(huge); })},
      {"resource.region", "64", put([&](auto& r) { r.set_region(huge); })},
      {"resource.type", "64", put([&](auto& r) { r.set_type(huge); })},
      {"cilium_network_policy.policy_id", "differs from resource.id",
       put([&](auto& r) { r.mutable_cilium_network_policy()->set_policy_id(huge); })},
      {"cilium_network_policy.region", "differs from resource.region",
       put([&](auto& r) { r.mutable_cilium_network_policy()->set_region(huge); })},
      {"cilium_network_policy.name", "253",
       put([&](auto& r) { r.mutable_cilium_network_policy()->set_name(huge); })},
      {"cilium_network_policy.workspace_id", "64",
       put([&](auto& r) { r.mutable_cilium_network_policy()->set_workspace_id(huge); })},
      {"cilium_network_policy.policy_json", "1048576",
       put([&](auto& r) { r.mutable_cilium_network_policy()->set_policy_json(huge + " "); })},
      {"request.id", "64",
       [&](grpc::ClientContext* c) {
         v1::GetResourceRequest request;
         request.set_type("cilium_network_policy");
         request.set_id(huge);
         request.set_region("eu-1");
         v1::GetResourceResponse response;
         return resources_->Get(c, request, &response);
       }},
      {"name", "255",
       [&](grpc::ClientContext* c) {
         v1::CreateWorkspaceRequest request;
         request.set_name(huge);
         v1::Workspace response;
         return tenancy_->CreateWorkspace(c, request, &response);
       }},
  };
  for (const auto& [field, says, call] : cases) {
    INFO(field);
    const auto started = std::chrono::steady_clock::now();
    const grpc::Status st = call(ctx().get());
    CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(5));
    REQUIRE_THAT(st, IsError(absl::StatusCode::kInvalidArgument));
    INFO(st.error_message().substr(0, 300));
    CHECK(st.error_message().size() < 512u);
    CHECK_THAT(st.error_message(), Catch::StartsWith(field + ":"));
    CHECK_THAT(st.error_message(), Catch::Contains(says));
  }
  CHECK(count("SELECT COUNT(*) FROM resource_changes") == 0);
  CHECK(count("SELECT COUNT(*) FROM workspaces") == 0);
}

TEST_CASE_METHOD(ResourceApiTest, "a report without a region is refused naming region",
                 "[resource-api]") {
  const std::string token = cp_.agentToken("eu-1");
  cluster::v1::ReportResourceStatusRequest report;
  report.set_type("example.krane.dev/bucket");
  report.set_id("photos");
  report.set_version(1);
  report.set_phase(cluster::v1::RESOURCE_PHASE_READY);
  cluster::v1::ReportResourceStatusResponse reported;
  grpc::Status st =
      cluster_->ReportResourceStatus(TestControlPlane::withToken(token).get(), report, &reported);
  REQUIRE_THAT(st, IsError(absl::StatusCode::kInvalidArgument));
  CHECK_THAT(st.error_message(), Catch::StartsWith("region: required"));
  CHECK(count("SELECT COUNT(*) FROM resource_status") == 0);

  cluster::v1::HeartbeatRequest beat;
  beat.set_agent_id("agent-1");
  cluster::v1::HeartbeatResponse answer;
  st = cluster_->Heartbeat(TestControlPlane::withToken(token).get(), beat, &answer);
  REQUIRE_THAT(st, IsError(absl::StatusCode::kInvalidArgument));
  CHECK_THAT(st.error_message(), Catch::StartsWith("region: required"));
  CHECK(count("SELECT COUNT(*) FROM agents") == 0);

  cluster::v1::ReportSentinelStatusRequest sentinel;
  sentinel.set_sentinel_id("s1");
  cluster::v1::ReportSentinelStatusResponse sentinel_answer;
  st = cluster_->ReportSentinelStatus(TestControlPlane::withToken(token).get(), sentinel,
                                      &sentinel_answer);
  CHECK_THAT(st, IsError(absl::StatusCode::kInvalidArgument));
  CHECK_THAT(st.error_message(), Catch::StartsWith("region: required"));

  cluster::v1::ReportDeploymentStatusRequest deployment;
  deployment.set_deployment_id("d1");
  deployment.mutable_instances();
  cluster::v1::ReportDeploymentStatusResponse deployment_answer;
  st = cluster_->ReportDeploymentStatus(TestControlPlane::withToken(token).get(), deployment,
                                        &deployment_answer);
  CHECK_THAT(st, IsError(absl::StatusCode::kInvalidArgument));
  CHECK_THAT(st.error_message(), Catch::StartsWith("region: required"));
  CHECK(count("SELECT COUNT(*) FROM instances") == 0);

  // With its region, the same report is stored (once the resource it is about exists).
  v1::PutResourceRequest put;
  put.mutable_resource()->set_type("example.krane.dev/bucket");
  put.mutable_resource()->set_id("photos");
  put.mutable_resource()->set_region("eu-1");
  put.mutable_resource()->mutable_generic()->set_spec("{}");
  v1::PutResourceResponse written;
  REQUIRE_THAT(resources_->Put(ctx().get(), put, &written), IsOk());
  report.set_region("eu-1");
  CHECK_THAT(
      cluster_->ReportResourceStatus(TestControlPlane::withToken(token).get(), report, &reported),
      IsOk());
  CHECK(count("SELECT COUNT(*) FROM resource_status") == 1);
}

}  // namespace
}  // namespace krane
