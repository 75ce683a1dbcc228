// WorkflowService of the public API on a real krane-ctrl server (in process, real MariaDB): the
// server's engine runs BuildSlotService; operators list and inspect its invocations, and wrong
// requests get the right codes with the field named.
#include <catch2/catch.hpp>

#include "controlplane/services/buildslot/buildslot.h"
#include "controlplane/workflow/typed.h"
#include "krane/api/v1/workflows.grpc.pb.h"
#include "tests/support/control_plane.h"
#include "tests/support/matchers.h"

namespace krane::api {
namespace {

using krane::testing::kOperatorToken;
using krane::testing::TestControlPlane;
namespace buildslot = services::buildslot;

TEST_CASE("operators inspect and steer invocations of the servers engine", "[workflow-api]") {
  TestControlPlane cp;
  ctrl::Server& server = cp.startReplica(
      [](ctrl::CtrlConfig& c) { c.workflow.poll_interval = std::chrono::milliseconds(20); });
  // The replica's engine serves BuildSlotService.
  buildslot::AcquireSlotRequest request;
  request.set_deployment_id("d1");
  request.set_awakeable_id("prm_unknown");
  request.set_is_production(true);
  auto acquired = workflow::resultAs<buildslot::AcquireSlotResponse>(server.workflowEngine().call(
      workflow::invocation(buildslot::kServiceName, "AcquireOrWait", "ws1", request),
      std::chrono::seconds(20)));
  REQUIRE_THAT(acquired, IsOk());
  CHECK(acquired->acquired());

  auto stub = v1::WorkflowService::NewStub(cp.channel());
  v1::ListInvocationsRequest list;
  list.set_service(buildslot::kServiceName);
  list.set_key("ws1");
  v1::ListInvocationsResponse listed;
  REQUIRE_THAT(
      stub->ListInvocations(TestControlPlane::withToken(kOperatorToken).get(), list, &listed),
      IsOk());
  REQUIRE(listed.invocations_size() == 1);
  const v1::InvocationSummary& s = listed.invocations(0);
  CHECK(s.handler() == "AcquireOrWait");
  CHECK(s.status() == "succeeded");
  CHECK(s.finished_at_ms() > 0);

  v1::GetInvocationRequest get;
  get.set_id(s.id());
  v1::GetInvocationResponse got;
  REQUIRE_THAT(stub->GetInvocation(TestControlPlane::withToken(kOperatorToken).get(), get, &got),
               IsOk());
  CHECK(got.summary().id() == s.id());
  CHECK_THAT(got.output(), Catch::Contains("acquired"));
  REQUIRE(got.journal_size() > 0);
  bool read_quota = false;
  for (const auto& e : got.journal()) read_quota |= e.kind() == "run" && e.name() == "read quota";
  INFO(got.DebugString());
  CHECK(read_quota);

  // The slot is held by d1 but no invocation holds the key any more.
  v1::ListHeldKeysRequest held;
  v1::ListHeldKeysResponse keys;
  REQUIRE_THAT(stub->ListHeldKeys(TestControlPlane::withToken(kOperatorToken).get(), held, &keys),
               IsOk());
  CHECK(keys.keys_size() == 0);

  v1::InvocationRef ref;
  ref.set_id(s.id());
  v1::InvocationActionResponse done;
  auto cancel =
      stub->CancelInvocation(TestControlPlane::withToken(kOperatorToken).get(), ref, &done);
  CHECK(cancel.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
  ref.set_id("inv_nope");
  auto kill = stub->KillInvocation(TestControlPlane::withToken(kOperatorToken).get(), ref, &done);
  CHECK(kill.error_code() == grpc::StatusCode::NOT_FOUND);
  ref.set_id("");
  auto resume =
      stub->ResumeInvocation(TestControlPlane::withToken(kOperatorToken).get(), ref, &done);
  CHECK(resume.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK_THAT(resume.error_message(), Catch::Contains("id: required"));

  v1::SettleAwakeableRequest settle;
  settle.set_awakeable_id("prm_nope");
  v1::SettleAwakeableResponse settled;
  auto unknown =
      stub->SettleAwakeable(TestControlPlane::withToken(kOperatorToken).get(), settle, &settled);
  CHECK(unknown.error_code() == grpc::StatusCode::NOT_FOUND);
  settle.set_reject(true);
  auto no_message =
      stub->SettleAwakeable(TestControlPlane::withToken(kOperatorToken).get(), settle, &settled);
  CHECK(no_message.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK_THAT(no_message.error_message(), Catch::Contains("error_message"));

  list.set_status("sleeping");
  auto bad =
      stub->ListInvocations(TestControlPlane::withToken(kOperatorToken).get(), list, &listed);
  CHECK(bad.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK_THAT(bad.error_message(), Catch::Contains("status: unknown invocation status"));

  auto anonymous = stub->ListInvocations(TestControlPlane::withToken("wrong-token").get(),
                                         v1::ListInvocationsRequest(), &listed);
  CHECK(anonymous.error_code() == grpc::StatusCode::UNAUTHENTICATED);

  // The engine's and the watchdog's metrics are on the replica's /metrics page.
  const std::string metrics = server.metricsText();
  CHECK_THAT(metrics, Catch::Contains("krane_workflow_invocations"));
  CHECK_THAT(metrics, Catch::Contains("krane_workflow_step_duration_seconds"));
  CHECK_THAT(metrics, Catch::Contains("krane_workflow_keys_held_too_long"));
}

}  // namespace
}  // namespace krane::api
