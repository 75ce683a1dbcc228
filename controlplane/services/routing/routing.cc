#include "controlplane/services/routing/routing.h"

#include <functional>

#include "common/clock.h"
#include "common/status.h"
#include "common/strings.h"
#include "controlplane/services/deployment/deployment.h"
#include "controlplane/workflow/typed.h"

namespace krane::services::routing {
namespace {

using services::v1::SwapReason;
using workflow::Context;
using workflow::terminalError;

struct Deployment {
  std::string id;
  std::string app_id;
  std::string status;
  std::optional<std::string> branch;
  int64_t created_at = 0;
};

absl::Status refuse(absl::StatusCode code, std::string_view message) {
  return terminalError(code, message);
}

// The deployment, which must belong to `environment_id` (locked for the transaction).
absl::StatusOr<Deployment> deploymentOf(db::Connection& conn, const std::string& environment_id,
                                        const std::string& deployment_id) {
  if (deployment_id.empty()) {
    return refuse(absl::StatusCode::kInvalidArgument, "deployment_id: required");
  }
  KRANE_ASSIGN_OR_RETURN(auto rows,
                         conn.query("SELECT id, app_id, status, git_branch, created_at"
                                    " FROM deployments WHERE id = ? AND environment_id = ?"
                                    " FOR UPDATE",
                                    {deployment_id, environment_id}));
  if (rows.empty()) {
    return refuse(absl::StatusCode::kNotFound,
                  strCat("deployment_id: no deployment '", deployment_id, "' in environment '",
                         environment_id, "'"));
  }
  const db::Row& r = rows.rows[0];
  return Deployment{r.str("id"), r.str("app_id"), r.str("status"), r.optStr("git_branch"),
                    r.i64("created_at")};
}

// Ready; or, for the deploy workflow's own network and finalizing steps (`deploying_ok`), on
// its way there.
absl::Status mustBeReady(const Deployment& d, std::string_view what, bool deploying_ok = false) {
  if (d.status == "ready") return absl::OkStatus();
  if (deploying_ok && (d.status == "network" || d.status == "finalizing")) {
    return absl::OkStatus();
  }
  return refuse(absl::StatusCode::kFailedPrecondition,
                strCat("deployment '", d.id, "' is ", d.status, ", not ready: it cannot ", what));
}

// Points the environment's routes of `sticky` (and `branch`, for branch routes) at the
// deployment; returns their hostnames.
absl::StatusOr<std::vector<std::string>> moveRoutes(db::Connection& conn,
                                                    const std::string& environment_id,
                                                    const std::string& sticky, const Deployment& to,
                                                    int64_t now) {
  std::string where = "environment_id = ? AND sticky = ?";
  db::Params params = {environment_id, sticky};
  if (sticky == "branch") {
    if (!to.branch) return std::vector<std::string>();
    where += " AND git_branch = ?";
    params.emplace_back(*to.branch);
  }
  KRANE_ASSIGN_OR_RETURN(auto rows,
                         conn.query(strCat("SELECT hostname FROM frontline_routes WHERE ", where,
                                           " ORDER BY hostname FOR UPDATE"),
                                    params));
  std::vector<std::string> hostnames;
  for (const db::Row& r : rows.rows) hostnames.push_back(r.str("hostname"));
  if (hostnames.empty()) return hostnames;
  db::Params update = {to.id, now};
  update.insert(update.end(), params.begin(), params.end());
  KRANE_RETURN_IF_ERROR(
      conn.exec(
              strCat("UPDATE frontline_routes SET deployment_id = ?, updated_at = ? WHERE ", where),
              update)
          .status());
  return hostnames;
}

// Not locked: the kind never changes, and a lock here would order against the shared locks that
// inserting a deployment takes on its environment and app (foreign keys), which deadlocks with
// the app lock a swap takes next.
absl::StatusOr<std::string> environmentKind(db::Connection& conn,
                                            const std::string& environment_id) {
  KRANE_ASSIGN_OR_RETURN(
      auto rows, conn.query("SELECT kind FROM environments WHERE id = ?", {environment_id}));
  if (rows.empty()) {
    return refuse(absl::StatusCode::kNotFound,
                  strCat("environment '", environment_id, "' not found"));
  }
  return rows.rows[0].str("kind");
}

// Applies `change` to every sentinel of the environment (all regions), through the feed writer on
// `conn`; `change` returns false when a sentinel already is as wanted (no change written).
absl::StatusOr<std::vector<feed::WriteResult>> updateSentinels(
    feed::Writer& writer, db::Connection& conn, const std::string& environment_id,
    const std::function<bool(cluster::v1::Sentinel&)>& change) {
  return writer.transactIn(conn, [&](feed::WriteTx& tx) -> absl::Status {
    KRANE_ASSIGN_OR_RETURN(auto rows,
                           tx.connection().query("SELECT id, region_id FROM sentinels"
                                                 " WHERE environment_id = ? AND deleted_at IS NULL"
                                                 " ORDER BY id FOR UPDATE",
                                                 {environment_id}));
    for (const db::Row& r : rows.rows) {
      KRANE_RETURN_IF_ERROR(
          tx.update({std::string(feed::kSentinel), r.str("id"), r.str("region_id")},
                    [&](feed::Resource& next) { return change(*next.mutable_sentinel()); })
              .status());
    }
    return absl::OkStatus();
  });
}

// Points every sentinel of the environment at its new live deployment: the change reaches the
// agents with the swap's commit. A roll ends with the swap: no more rolling deployment.
absl::StatusOr<std::vector<feed::WriteResult>> setSentinelsLive(feed::Writer& writer,
                                                                db::Connection& conn,
                                                                const std::string& environment_id,
                                                                const std::string& deployment_id) {
  return updateSentinels(writer, conn, environment_id, [&](cluster::v1::Sentinel& s) {
    if (s.live_deployment_id() == deployment_id && s.rolling_deployment_id().empty()) return false;
    s.set_live_deployment_id(deployment_id);
    s.clear_rolling_deployment_id();
    return true;
  });
}

}  // namespace

absl::StatusOr<std::vector<feed::WriteResult>> setSentinelsRolling(
    feed::Writer& writer, db::Connection& conn, const std::string& environment_id,
    const std::string& deployment_id) {
  return updateSentinels(writer, conn, environment_id, [&](cluster::v1::Sentinel& s) {
    if (s.rolling_deployment_id() == deployment_id) return false;
    s.set_rolling_deployment_id(deployment_id);
    return true;
  });
}

namespace {

// The swap itself, in the caller's transaction. The sentinels' changes it writes (when the
// service has a writer) go to `written`, for Writer::committed once the step committed.
// A deployment a rolling deploy drained (it stays `ready`) that goes live again by a promote or
// rollback: its regions get the environment's replicas back in the swap's commit. Without it the
// routes would move to a deployment that runs nothing, or less than the environment asks for (a
// roll stopped while a swap took the deployment off live leaves it partly drained).
absl::StatusOr<std::vector<feed::WriteResult>> restoreDrained(feed::Writer& writer,
                                                              db::Connection& conn,
                                                              const std::string& environment_id,
                                                              const std::string& deployment_id) {
  return writer.transactIn(conn, [&](feed::WriteTx& tx) -> absl::Status {
    KRANE_ASSIGN_OR_RETURN(auto regions,
                           tx.connection().query("SELECT region_id, replicas FROM"
                                                 " environment_regions WHERE environment_id = ?"
                                                 " ORDER BY region_id",
                                                 {environment_id}));
    for (const db::Row& r : regions.rows) {
      const auto wanted = static_cast<uint32_t>(r.i64("replicas"));
      KRANE_RETURN_IF_ERROR(
          tx.update({std::string(feed::kDeploymentTopology), deployment_id, r.str("region_id")},
                    [&](feed::Resource& next) {
                      if (next.deployment_topology().replicas() >= wanted) return false;
                      next.mutable_deployment_topology()->set_replicas(wanted);
                      return true;
                    })
              .status());
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<SwapLiveResponse> swap(db::Connection& conn, const RoutingOptions& options,
                                      const std::string& environment_id, const Deployment& to,
                                      SwapReason reason, std::vector<feed::WriteResult>* written) {
  KRANE_ASSIGN_OR_RETURN(std::string kind, environmentKind(conn, environment_id));
  if (kind != "production") {
    return refuse(absl::StatusCode::kFailedPrecondition,
                  strCat("environment '", environment_id,
                         "' is a preview environment: it has no live deployment"));
  }
  KRANE_RETURN_IF_ERROR(mustBeReady(to, "go live", reason == services::v1::SWAP_REASON_DEPLOY));
  KRANE_ASSIGN_OR_RETURN(auto app, conn.query("SELECT current_deployment_id, is_rolled_back"
                                              " FROM apps WHERE id = ? FOR UPDATE",
                                              {to.app_id}));
  if (app.empty()) {
    return refuse(absl::StatusCode::kNotFound, strCat("app '", to.app_id, "' not found"));
  }
  SwapLiveResponse out;
  out.set_previous_deployment_id(app.rows[0].optStr("current_deployment_id").value_or(""));
  const bool rolled_back = app.rows[0].i64("is_rolled_back") != 0;
  if (reason == services::v1::SWAP_REASON_DEPLOY && rolled_back) {
    out.set_live_deployment_id(out.previous_deployment_id());
    out.set_reason(
        "the app is rolled back: the new deployment is ready but stays off the live routes"
        " until it is promoted");
    return out;
  }
  const int64_t now = unixMillis();
  KRANE_RETURN_IF_ERROR(
      // A rolling deploy's swap: its deploying revision becomes the current one, in one step.
      conn.exec("UPDATE apps SET current_deployment_id = ?,"
                " deploying_deployment_id = IF(deploying_deployment_id <=> ?, NULL,"
                " deploying_deployment_id), is_rolled_back = ?, updated_at = ? WHERE id = ?",
                {to.id, to.id, reason == services::v1::SWAP_REASON_ROLLBACK, now, to.app_id})
          .status());
  KRANE_ASSIGN_OR_RETURN(std::vector<std::string> hostnames,
                         moveRoutes(conn, environment_id, "live", to, now));
  if (options.writer != nullptr) {
    KRANE_ASSIGN_OR_RETURN(*written,
                           setSentinelsLive(*options.writer, conn, environment_id, to.id));
    if (reason != services::v1::SWAP_REASON_DEPLOY) {
      KRANE_ASSIGN_OR_RETURN(auto restored,
                             restoreDrained(*options.writer, conn, environment_id, to.id));
      written->insert(written->end(), restored.begin(), restored.end());
    }
  }
  out.set_swapped(true);
  out.set_live_deployment_id(to.id);
  for (auto& h : hostnames) out.add_hostnames(std::move(h));
  return out;
}

// What a swap sets in motion for the two deployments' instances (journaled sends).
void scheduleAfterSwap(Context& ctx, const SwapLiveResponse& swapped, SwapReason reason,
                       const RoutingOptions& options) {
  if (!swapped.swapped()) return;
  auto schedule = [&](const std::string& deployment_id, cluster::v1::DesiredStatus status,
                      std::chrono::milliseconds delay) {
    deployment::ScheduleDesiredStateRequest req;
    req.set_desired_status(status);
    req.set_delay_ms(delay.count());
    workflow::send(ctx, deployment::kServiceName, "Schedule", deployment_id, req);
  };
  // A deploy's own deployment runs, and nothing can have scheduled its stop yet.
  if (reason != services::v1::SWAP_REASON_DEPLOY) {
    schedule(swapped.live_deployment_id(), cluster::v1::DESIRED_STATUS_RUNNING, {});
  }
  const std::string& previous = swapped.previous_deployment_id();
  if (options.previous_stop_delay.count() > 0 && !previous.empty() &&
      previous != swapped.live_deployment_id()) {
    schedule(previous, cluster::v1::DESIRED_STATUS_STOPPED, options.previous_stop_delay);
  }
}

absl::StatusOr<SwapLiveResponse> swapLive(Context& ctx, const RoutingOptions& options,
                                          const SwapLiveRequest& req) {
  if (req.reason() == services::v1::SWAP_REASON_UNSPECIFIED) {
    return refuse(absl::StatusCode::kInvalidArgument,
                  "reason: SWAP_REASON_DEPLOY, SWAP_REASON_PROMOTE or SWAP_REASON_ROLLBACK");
  }
  std::vector<feed::WriteResult> written;
  auto swapped = workflow::runTx<SwapLiveResponse>(
      ctx, "swap live", [&](db::Connection& conn) -> absl::StatusOr<SwapLiveResponse> {
        KRANE_ASSIGN_OR_RETURN(Deployment to, deploymentOf(conn, ctx.key(), req.deployment_id()));
        return swap(conn, options, ctx.key(), to, req.reason(), &written);
      });
  if (options.writer != nullptr) options.writer->committed(written);  // empty when replayed
  if (swapped.ok()) scheduleAfterSwap(ctx, *swapped, req.reason(), options);
  return swapped;
}

absl::StatusOr<SwapLiveResponse> rollback(Context& ctx, const RoutingOptions& options,
                                          const RollbackRequest&) {
  std::vector<feed::WriteResult> written;
  auto swapped = workflow::runTx<SwapLiveResponse>(
      ctx, "rollback", [&](db::Connection& conn) -> absl::StatusOr<SwapLiveResponse> {
        KRANE_ASSIGN_OR_RETURN(auto live,
                               conn.query("SELECT d.id, d.created_at FROM environments e"
                                          " JOIN apps a ON a.id = e.app_id"
                                          " JOIN deployments d ON d.id = a.current_deployment_id"
                                          " WHERE e.id = ?",
                                          {ctx.key()}));
        if (live.empty()) {
          return refuse(
              absl::StatusCode::kFailedPrecondition,
              strCat("environment '", ctx.key(), "' has no live deployment to roll back"));
        }
        KRANE_ASSIGN_OR_RETURN(
            auto previous,
            conn.query("SELECT id FROM deployments WHERE environment_id = ? AND status = 'ready'"
                       " AND id <> ? AND (created_at < ? OR (created_at = ? AND id < ?))"
                       " ORDER BY created_at DESC, id DESC LIMIT 1",
                       {ctx.key(), live.rows[0].str("id"), live.rows[0].i64("created_at"),
                        live.rows[0].i64("created_at"), live.rows[0].str("id")}));
        if (previous.empty()) {
          return refuse(absl::StatusCode::kFailedPrecondition,
                        strCat("no ready deployment older than the live one (",
                               live.rows[0].str("id"), ") to roll back to"));
        }
        KRANE_ASSIGN_OR_RETURN(Deployment to,
                               deploymentOf(conn, ctx.key(), previous.rows[0].str("id")));
        return swap(conn, options, ctx.key(), to, services::v1::SWAP_REASON_ROLLBACK, &written);
      });
  if (options.writer != nullptr) options.writer->committed(written);  // empty when replayed
  if (swapped.ok()) scheduleAfterSwap(ctx, *swapped, services::v1::SWAP_REASON_ROLLBACK, options);
  return swapped;
}

absl::StatusOr<AssignRoutesResponse> assignRoutes(Context& ctx, const AssignRoutesRequest& req) {
  return workflow::runTx<AssignRoutesResponse>(
      ctx, "assign routes", [&](db::Connection& conn) -> absl::StatusOr<AssignRoutesResponse> {
        KRANE_ASSIGN_OR_RETURN(Deployment to, deploymentOf(conn, ctx.key(), req.deployment_id()));
        KRANE_RETURN_IF_ERROR(mustBeReady(to, "take routes", /*deploying_ok=*/true));
        AssignRoutesResponse out;
        const int64_t now = unixMillis();
        for (const char* sticky : {"environment", "branch"}) {
          KRANE_ASSIGN_OR_RETURN(auto moved, moveRoutes(conn, ctx.key(), sticky, to, now));
          for (auto& h : moved) out.add_hostnames(std::move(h));
        }
        return out;
      });
}

}  // namespace

workflow::ServiceDefinition routingService(RoutingOptions options) {
  using workflow::typed;
  return workflow::ServiceDefinition::virtualObject(kServiceName)
      .exclusive("AssignRoutes", typed<AssignRoutesRequest, AssignRoutesResponse>(assignRoutes))
      .exclusive("SwapLiveDeployment", typed<SwapLiveRequest, SwapLiveResponse>(
                                           [options](Context& ctx, const SwapLiveRequest& req) {
                                             return swapLive(ctx, options, req);
                                           }))
      .exclusive("Rollback", typed<RollbackRequest, SwapLiveResponse>(
                                 [options](Context& ctx, const RollbackRequest& req) {
                                   return rollback(ctx, options, req);
                                 }))
      .retry(workflow::RetryPolicy::deployPreset());
}

}  // namespace krane::services::routing
