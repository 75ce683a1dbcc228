#include "controlplane/services/deploy/readiness.h"

#include <algorithm>

#include "common/status.h"
#include "common/strings.h"
#include "controlplane/services/deploy/deploy.h"
#include "controlplane/workflow/operations.h"
#include "spdlog/spdlog.h"

namespace krane::services::deploy {

absl::StatusOr<Readiness> readinessOf(db::Connection& conn, const std::string& deployment_id) {
  KRANE_ASSIGN_OR_RETURN(
      auto rows,
      conn.query("SELECT t.region_id, COALESCE(t.autoscale_min_replicas, t.replicas) AS wanted,"
                 " (SELECT COUNT(*) FROM instances i WHERE i.deployment_id = t.deployment_id"
                 "  AND i.region_id = t.region_id AND i.status = 'running') AS running"
                 " FROM deployment_topology t WHERE t.deployment_id = ? AND t.deleted_at IS NULL",
                 {deployment_id}));
  Readiness r;
  r.regions = static_cast<int>(rows.rows.size());
  for (const db::Row& row : rows.rows) {
    if (row.i64("running") >= std::max<int64_t>(1, row.i64("wanted"))) {
      ++r.healthy;
      continue;
    }
    KRANE_ASSIGN_OR_RETURN(auto failed,
                           conn.query("SELECT COALESCE(failure_reason, 'failed') AS reason"
                                      " FROM instances WHERE deployment_id = ? AND region_id = ?"
                                      " AND status = 'failed' ORDER BY id LIMIT 1",
                                      {deployment_id, row.str("region_id")}));
    if (!failed.empty()) {
      r.failing.push_back(strCat(row.str("region_id"), ": ", failed.rows[0].str("reason")));
    }
  }
  r.needed = std::max(1, r.regions - 1);
  return r;
}

void ReadinessGate::onInstancesReported(const std::string& deployment_id, const std::string&,
                                        uint32_t running, uint32_t, uint32_t failed) {
  if (running == 0 && failed == 0) return;  // this report changes neither outcome
  // What the deploy waits for, both in one query: reports arrive all the time.
  auto states = workflow::readStates(*pool_, kServiceName, deployment_id,
                                     {kRollAwakeableState, kReadyAwakeableState});
  if (!states.ok()) return;
  if (auto roll = states->find(kRollAwakeableState); roll != states->end()) {
    // A rolling deploy between cycles runs its next one now. The first settle wins: another
    // replica, or the tick, may have been first.
    (void)engine_.resolveAwakeable(roll->second, "");
    return;
  }
  auto ready_wait = states->find(kReadyAwakeableState);
  if (ready_wait == states->end()) return;  // not waiting: it checks for itself when it starts
  const std::string& waiting = ready_wait->second;
  auto conn = pool_->acquire();
  if (!conn.ok()) return;
  auto ready = readinessOf(**conn, deployment_id);
  if (!ready.ok()) return;
  if (!ready->ready()) {
    if (!ready->hopeless()) return;
    // The first settle of an awakeable wins: a reject from several replicas is one.
    std::string reasons;
    for (const auto& f : ready->failing) reasons += (reasons.empty() ? "" : "; ") + f;
    auto rejected = engine_.rejectAwakeable(
        waiting, strCat("instances failing in ", ready->failing.size(), " of ", ready->regions,
                        " regions (", ready->needed, " must be healthy): ", reasons));
    if (!rejected.ok()) {
      spdlog::warn("deploy: failing deployment={} fast did not work: {}", deployment_id,
                   toStd(rejected.message()));
    }
    return;
  }
  auto sent = workflow::sendOncePerWait(engine_, kServiceName, "NotifyInstancesReady",
                                        deployment_id, waiting);
  if (!sent.ok()) {
    spdlog::warn("deploy: notifying deployment={} of its ready instances failed: {}", deployment_id,
                 sent.status().message());
  }
}

}  // namespace krane::services::deploy
