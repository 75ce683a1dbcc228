#include "controlplane/services/deployment/deployment.h"

#include "common/status.h"
#include "common/strings.h"
#include "controlplane/workflow/typed.h"

namespace krane::services::deployment {
namespace {

using cluster::v1::DesiredStatus;
using workflow::Context;
using workflow::terminalError;

constexpr char kNonceKey[] = "nonce";

absl::Status checkStatus(DesiredStatus status) {
  if (status == cluster::v1::DESIRED_STATUS_RUNNING ||
      status == cluster::v1::DESIRED_STATUS_STOPPED) {
    return absl::OkStatus();
  }
  return terminalError(absl::StatusCode::kInvalidArgument,
                       "desired_status: DESIRED_STATUS_RUNNING or DESIRED_STATUS_STOPPED");
}

absl::StatusOr<ScheduleDesiredStateResponse> schedule(Context& ctx,
                                                      const ScheduleDesiredStateRequest& req) {
  KRANE_RETURN_IF_ERROR(checkStatus(req.desired_status()));
  if (req.delay_ms() < 0) {
    return terminalError(absl::StatusCode::kInvalidArgument, "delay_ms: must not be negative");
  }
  const std::string nonce = req.nonce().empty() ? ctx.invocationId() : req.nonce();
  ctx.set(kNonceKey, nonce);
  ApplyDesiredStateRequest apply;
  apply.set_desired_status(req.desired_status());
  apply.set_nonce(nonce);
  workflow::send(ctx, kServiceName, "Apply", ctx.key(), apply,
                 std::chrono::milliseconds(req.delay_ms()));
  ScheduleDesiredStateResponse out;
  out.set_nonce(nonce);
  return out;
}

// Sets the desired status of every live topology row of the deployment, on `conn` (the journal
// transaction of the step that calls it); returns the regions that changed.
absl::StatusOr<std::vector<feed::WriteResult>> write(feed::Writer& writer, db::Connection& conn,
                                                     const std::string& deployment_id,
                                                     DesiredStatus status,
                                                     ApplyDesiredStateResponse* out) {
  return writer.transactIn(conn, [&](feed::WriteTx& tx) -> absl::Status {
    out->clear_changed_regions();
    KRANE_ASSIGN_OR_RETURN(auto rows,
                           tx.connection().query("SELECT region_id FROM deployment_topology"
                                                 " WHERE deployment_id = ? AND deleted_at IS NULL"
                                                 " ORDER BY region_id FOR UPDATE",
                                                 {deployment_id}));
    for (const db::Row& r : rows.rows) {
      KRANE_ASSIGN_OR_RETURN(
          bool changed,
          tx.update({std::string(feed::kDeploymentTopology), deployment_id, r.str("region_id")},
                    [&](feed::Resource& resource) {
                      if (resource.deployment_topology().desired_status() == status) return false;
                      resource.mutable_deployment_topology()->set_desired_status(status);
                      return true;
                    }));
      if (changed) out->add_changed_regions(r.str("region_id"));
    }
    return absl::OkStatus();
  });
}

// The change commits with the step's journal entry: exactly once, even across a crash.
absl::StatusOr<ApplyDesiredStateResponse> apply(Context& ctx, feed::Writer& writer,
                                                const ApplyDesiredStateRequest& req) {
  KRANE_RETURN_IF_ERROR(checkStatus(req.desired_status()));
  if (ctx.get(kNonceKey) != req.nonce()) return ApplyDesiredStateResponse();  // replaced
  std::vector<feed::WriteResult> written;
  auto result = workflow::runTx<ApplyDesiredStateResponse>(
      ctx, "write desired state",
      [&](db::Connection& conn) -> absl::StatusOr<ApplyDesiredStateResponse> {
        ApplyDesiredStateResponse out;
        out.set_applied(true);
        KRANE_ASSIGN_OR_RETURN(written, write(writer, conn, ctx.key(), req.desired_status(), &out));
        return out;
      });
  writer.committed(written);  // empty when the step was replayed
  return result;
}

}  // namespace

workflow::ServiceDefinition deploymentService(std::shared_ptr<feed::Writer> writer) {
  using workflow::typed;
  return workflow::ServiceDefinition::virtualObject(kServiceName)
      .exclusive("Schedule",
                 typed<ScheduleDesiredStateRequest, ScheduleDesiredStateResponse>(schedule))
      .exclusive("Apply", typed<ApplyDesiredStateRequest, ApplyDesiredStateResponse>(
                              [writer](Context& ctx, const ApplyDesiredStateRequest& req) {
                                return apply(ctx, *writer, req);
                              }))
      .retry(workflow::RetryPolicy::deployPreset());
}

}  // namespace krane::services::deployment
