// WorkflowService of the public API on a real krane-ctrl server (in process, real MariaDB): the
// server's engine runs BuildSlotService; operators list and inspect its invocations, and wrong
// requests get the right codes with the field named.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "controlplane/services/buildslot/buildslot.h"
#include "krane/api/v1/workflows.grpc.pb.h"
#include "tests/support/control_plane.h"

namespace krane::api {
namespace {

using krane::testing::kOperatorToken;
using krane::testing::TestControlPlane;
using ::testing::HasSubstr;
namespace buildslot = services::buildslot;

TEST(WorkflowApi, OperatorsInspectAndSteerInvocationsOfTheServersEngine) {
  TestControlPlane cp;
  ctrl::Server& server = cp.startReplica(
      [](ctrl::CtrlConfig& c) { c.workflow.poll_interval = std::chrono::milliseconds(20); });
  // The replica's engine serves BuildSlotService.
  auto acquired =
      server.workflowEngine().call({buildslot::kServiceName, "AcquireOrWait", "ws1",
                                    buildslot::encodeAcquire({"d1", "prm_unknown", true})},
                                   std::chrono::seconds(20));
  ASSERT_TRUE(acquired.ok()) << acquired.status();
  EXPECT_THAT(*acquired, HasSubstr("\"acquired\":true"));

  auto stub = v1::WorkflowService::NewStub(cp.channel());
  v1::ListInvocationsRequest list;
  list.set_service(buildslot::kServiceName);
  list.set_key("ws1");
  v1::ListInvocationsResponse listed;
  ASSERT_TRUE(
      stub->ListInvocations(TestControlPlane::withToken(kOperatorToken).get(), list, &listed).ok());
  ASSERT_EQ(listed.invocations_size(), 1);
  const v1::InvocationSummary& s = listed.invocations(0);
  EXPECT_EQ(s.handler(), "AcquireOrWait");
  EXPECT_EQ(s.status(), "succeeded");
  EXPECT_GT(s.finished_at_ms(), 0);

  v1::GetInvocationRequest get;
  get.set_id(s.id());
  v1::GetInvocationResponse got;
  ASSERT_TRUE(
      stub->GetInvocation(TestControlPlane::withToken(kOperatorToken).get(), get, &got).ok());
  EXPECT_EQ(got.summary().id(), s.id());
  EXPECT_THAT(got.output(), HasSubstr("acquired"));
  ASSERT_GT(got.journal_size(), 0);
  bool read_quota = false;
  for (const auto& e : got.journal()) read_quota |= e.kind() == "run" && e.name() == "read quota";
  EXPECT_TRUE(read_quota) << got.DebugString();

  // The slot is held by d1 but no invocation holds the key any more.
  v1::ListHeldKeysRequest held;
  v1::ListHeldKeysResponse keys;
  ASSERT_TRUE(
      stub->ListHeldKeys(TestControlPlane::withToken(kOperatorToken).get(), held, &keys).ok());
  EXPECT_EQ(keys.keys_size(), 0);

  v1::InvocationRef ref;
  ref.set_id(s.id());
  v1::InvocationActionResponse done;
  auto cancel =
      stub->CancelInvocation(TestControlPlane::withToken(kOperatorToken).get(), ref, &done);
  EXPECT_EQ(cancel.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  ref.set_id("inv_nope");
  auto kill = stub->KillInvocation(TestControlPlane::withToken(kOperatorToken).get(), ref, &done);
  EXPECT_EQ(kill.error_code(), grpc::StatusCode::NOT_FOUND);
  ref.set_id("");
  auto resume =
      stub->ResumeInvocation(TestControlPlane::withToken(kOperatorToken).get(), ref, &done);
  EXPECT_EQ(resume.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(resume.error_message(), HasSubstr("id: required"));

  v1::SettleAwakeableRequest settle;
  settle.set_awakeable_id("prm_nope");
  v1::SettleAwakeableResponse settled;
  auto unknown =
      stub->SettleAwakeable(TestControlPlane::withToken(kOperatorToken).get(), settle, &settled);
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::NOT_FOUND);
  settle.set_reject(true);
  auto no_message =
      stub->SettleAwakeable(TestControlPlane::withToken(kOperatorToken).get(), settle, &settled);
  EXPECT_EQ(no_message.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(no_message.error_message(), HasSubstr("error_message"));

  list.set_status("sleeping");
  auto bad =
      stub->ListInvocations(TestControlPlane::withToken(kOperatorToken).get(), list, &listed);
  EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(bad.error_message(), HasSubstr("status: unknown invocation status"));

  auto anonymous = stub->ListInvocations(TestControlPlane::withToken("wrong-token").get(),
                                         v1::ListInvocationsRequest(), &listed);
  EXPECT_EQ(anonymous.error_code(), grpc::StatusCode::UNAUTHENTICATED);

  // The engine's and the watchdog's metrics are on the replica's /metrics page.
  const std::string metrics = server.metricsText();
  EXPECT_THAT(metrics, HasSubstr("krane_workflow_invocations"));
  EXPECT_THAT(metrics, HasSubstr("krane_workflow_step_duration_seconds"));
  EXPECT_THAT(metrics, HasSubstr("krane_workflow_keys_held_too_long"));
}

}  // namespace
}  // namespace krane::api
