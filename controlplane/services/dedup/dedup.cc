#include "controlplane/services/dedup/dedup.h"

#include "common/clock.h"
#include "common/status.h"
#include "common/strings.h"
#include "controlplane/workflow/operations.h"
#include "spdlog/spdlog.h"

namespace krane::services::dedup {
namespace {

struct Identity {
  std::string app_id;
  std::string environment_id;
  std::optional<std::string> branch;
  int64_t created_at = 0;
};

absl::StatusOr<Identity> identityOf(db::Connection& conn, const std::string& deployment_id) {
  KRANE_ASSIGN_OR_RETURN(auto rows,
                         conn.query("SELECT app_id, environment_id, git_branch, created_at"
                                    " FROM deployments WHERE id = ?",
                                    {deployment_id}));
  if (rows.empty())
    return absl::NotFoundError(strCat("deployment '", deployment_id, "' not found"));
  const db::Row& r = rows.rows[0];
  return Identity{r.str("app_id"), r.str("environment_id"), r.optStr("git_branch"),
                  r.i64("created_at")};
}

}  // namespace

absl::StatusOr<std::vector<Superseded>> cancelOlderSiblings(db::Pool& pool,
                                                            const std::string& deployment_id) {
  std::vector<Superseded> superseded;
  KRANE_RETURN_IF_ERROR(
      pool.transact("supersede siblings", [&](db::Connection& conn) -> absl::Status {
        superseded.clear();
        KRANE_ASSIGN_OR_RETURN(Identity me, identityOf(conn, deployment_id));
        if (!me.branch) return absl::OkStatus();
        KRANE_ASSIGN_OR_RETURN(
            auto rows, conn.query("SELECT id, invocation_id FROM deployments"
                                  " WHERE app_id = ? AND environment_id = ? AND git_branch = ?"
                                  " AND status IN ('pending', 'awaiting_approval')"
                                  " AND (created_at < ? OR (created_at = ? AND id < ?)) FOR UPDATE",
                                  {me.app_id, me.environment_id, *me.branch, me.created_at,
                                   me.created_at, deployment_id}));
        if (rows.empty()) return absl::OkStatus();
        db::Params ids;
        for (const db::Row& r : rows.rows) {
          superseded.push_back(Superseded{r.str("id"), r.optStr("invocation_id").value_or(""), ""});
          ids.emplace_back(r.str("id"));
        }
        const int64_t now = unixMillis();
        db::Params steps = {kSupersededMessage, now};
        steps.insert(steps.end(), ids.begin(), ids.end());
        KRANE_RETURN_IF_ERROR(conn.exec(strCat("UPDATE deployment_steps SET error = ?, ended_at = ?"
                                               " WHERE ended_at IS NULL AND deployment_id IN (",
                                               db::placeholders(ids.size()), ")"),
                                        steps)
                                  .status());
        db::Params status = {now};
        status.insert(status.end(), ids.begin(), ids.end());
        return conn
            .exec(strCat("UPDATE deployments SET status = 'superseded', updated_at = ?"
                         " WHERE id IN (",
                         db::placeholders(ids.size()), ")"),
                  status)
            .status();
      }));
  for (Superseded& s : superseded) {
    if (s.invocation_id.empty()) continue;
    absl::Status cancelled = workflow::cancelInvocation(pool, s.invocation_id);
    // An invocation that already finished needs no cancel.
    if (cancelled.ok() || absl::IsFailedPrecondition(cancelled)) continue;
    s.cancel_error = std::string(toStd(cancelled.message()));
    spdlog::warn(
        "dedup: cancelling superseded deployment={} invocation={} failed (it will skip itself):"
        " {}",
        s.deployment_id, s.invocation_id, cancelled.message());
  }
  return superseded;
}

absl::StatusOr<bool> hasNewerActiveDeployment(db::Connection& conn,
                                              const std::string& deployment_id) {
  KRANE_ASSIGN_OR_RETURN(Identity me, identityOf(conn, deployment_id));
  if (!me.branch) return false;
  KRANE_ASSIGN_OR_RETURN(
      auto rows,
      conn.query(
          "SELECT 1 FROM deployments"
          " WHERE app_id = ? AND environment_id = ? AND git_branch = ?"
          " AND status IN ('pending', 'awaiting_approval', 'starting', 'building',"
          " 'deploying', 'network', 'finalizing', 'ready')"
          " AND (created_at > ? OR (created_at = ? AND id > ?)) LIMIT 1",
          {me.app_id, me.environment_id, *me.branch, me.created_at, me.created_at, deployment_id}));
  return !rows.empty();
}

}  // namespace krane::services::dedup
