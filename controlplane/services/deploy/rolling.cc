#include "controlplane/services/deploy/rolling.h"

#include <algorithm>
#include <map>

#include "common/clock.h"
#include "common/status.h"
#include "common/strings.h"
#include "controlplane/services/routing/routing.h"
#include "controlplane/strategy/rolling.h"
#include "controlplane/workflow/typed.h"
#include "spdlog/spdlog.h"

namespace krane::services::deploy {
namespace {

using services::v1::DeploymentInfo;
using services::v1::RollingObservation;
using services::v1::RollingRegion;
using workflow::Context;
using workflow::terminalError;

// The next cycle runs when a report of the new deployment's instances arrives (readiness.h), or
// after this long without one (instances that ran min_ready_seconds send no report of it, a
// drained one may not either).
constexpr auto kTick = std::chrono::seconds(1);

// Replicas and reported instances of `to` and `from` in every region of the deployment: two
// queries for all regions. A running instance counts only after min_ready_seconds.
absl::StatusOr<RollingObservation> observe(db::Pool& pool, const DeploymentInfo& info,
                                           const std::string& to, const std::string& from) {
  KRANE_ASSIGN_OR_RETURN(auto conn, pool.acquire());
  KRANE_ASSIGN_OR_RETURN(auto topologies,
                         conn->query("SELECT deployment_id, region_id, replicas FROM"
                                     " deployment_topology WHERE deployment_id IN (?, ?)"
                                     " AND deleted_at IS NULL",
                                     {to, from}));
  // An instance counts as running once it ran for min_ready_seconds without a break; until
  // then it is still starting.
  const int64_t now = unixMillis();
  const int64_t ready_before = now - int64_t{info.rolling_update().min_ready_seconds()} * 1000;
  KRANE_ASSIGN_OR_RETURN(
      auto instances,
      conn->query("SELECT deployment_id, region_id, IF(status = 'running' AND"
                  " running_since > ?, 'pending', status) AS s, COUNT(*), MAX(failure_reason)"
                  " FROM instances WHERE deployment_id IN (?, ?)"
                  " GROUP BY deployment_id, region_id, s",
                  {ready_before, to, from}));
  RollingObservation out;
  out.set_now_ms(now);
  std::map<std::string, RollingRegion*> regions;
  for (const auto& region : info.regions()) {
    RollingRegion* r = out.add_regions();
    r->set_region_id(region.region_id());
    r->set_desired(region.replicas());
    regions[region.region_id()] = r;
  }
  for (const db::Row& row : topologies.rows) {
    auto it = regions.find(row.str(1));
    if (it == regions.end()) continue;
    const auto n = static_cast<uint32_t>(row.u64(2));
    row.str(0) == to ? it->second->set_to_replicas(n) : it->second->set_from_replicas(n);
  }
  for (const db::Row& row : instances.rows) {
    auto it = regions.find(row.str(1));
    if (it == regions.end()) continue;
    RollingRegion& r = *it->second;
    const bool is_to = row.str(0) == to;
    const std::string status = row.str(2);
    const auto count = static_cast<uint32_t>(row.u64(3));
    if (status == "running") {
      is_to ? r.set_to_running(count) : r.set_from_running(count);
    } else if (status == "pending") {
      is_to ? r.set_to_pending(count) : r.set_from_pending(count);
    } else if (status == "failed") {
      is_to ? r.set_to_failed(count) : r.set_from_failed(count);
      if (is_to) r.set_to_failure(row.optStr(4).value_or(""));
    }
  }
  return out;
}

// The region as the evaluator sees it. Replicas asked for but not reported yet are starting (to)
// or still serving (from); what was reported beyond the replicas asked for is on its way out.
std::vector<strategy::Instance> viewOf(const RollingRegion& r) {
  std::vector<strategy::Instance> v;
  for (uint32_t i = 0; i < r.from_replicas(); ++i) {
    v.push_back({strCat("from-", i), false,
                 i < r.from_running() ? strategy::InstanceState::kHealthy
                                      : strategy::InstanceState::kUnhealthy});
  }
  const uint32_t healthy = std::min(r.to_running(), r.to_replicas());
  const uint32_t failed = std::min(r.to_failed(), r.to_replicas() - healthy);
  for (uint32_t i = 0; i < r.to_replicas(); ++i) {
    strategy::InstanceState s = strategy::InstanceState::kProvisioning;
    if (i < healthy) {
      s = strategy::InstanceState::kHealthy;
    } else if (i < healthy + failed) {
      // A failed instance restarts in place (crash loop): it holds its replica, and the give-up
      // cap decides when to stop waiting for it.
      s = strategy::InstanceState::kUnhealthy;
    }
    v.push_back({strCat("to-", i), true, s});
  }
  return v;
}

// Sets the replicas of `deployment` in `region` on the step's transaction.
absl::Status setReplicas(feed::WriteTx& tx, const std::string& deployment,
                         const std::string& region, uint32_t replicas) {
  return tx
      .update({std::string(feed::kDeploymentTopology), deployment, region},
              [&](feed::Resource& r) {
                if (r.deployment_topology().replicas() == replicas) return false;
                r.mutable_deployment_topology()->set_replicas(replicas);
                return true;
              })
      .status();
}

struct Move {
  std::string region;
  uint32_t to_replicas;
  uint32_t from_replicas;
};

// A region's phase in one cycle, for the history.
struct Phase {
  std::string region;
  std::string phase;
  std::string detail;
};

// Appends the cycle's phases to `deployment`'s history, merging a phase equal (phase and detail)
// to the region's latest record into it: one more attempt, phase_started_at unchanged.
absl::Status recordPhases(db::Connection& conn, const std::string& deployment,
                          const std::vector<Phase>& phases, int64_t now) {
  for (const Phase& p : phases) {
    const std::string detail = p.detail.substr(0, 1024);
    KRANE_ASSIGN_OR_RETURN(auto latest, conn.query("SELECT id, phase, detail FROM deployment_phases"
                                                   " WHERE deployment_id = ? AND region_id = ?"
                                                   " ORDER BY id DESC LIMIT 1 FOR UPDATE",
                                                   {deployment, p.region}));
    if (!latest.empty() && latest.rows[0].str("phase") == p.phase &&
        latest.rows[0].str("detail") == detail) {
      KRANE_RETURN_IF_ERROR(conn.exec("UPDATE deployment_phases SET attempts = attempts + 1,"
                                      " updated_at = ? WHERE id = ?",
                                      {now, latest.rows[0].u64("id")})
                                .status());
      continue;
    }
    KRANE_RETURN_IF_ERROR(
        conn.exec("INSERT INTO deployment_phases (deployment_id, region_id, phase, detail,"
                  " phase_started_at, updated_at) VALUES (?, ?, ?, ?, ?, ?)",
                  {deployment, p.region, p.phase, detail, now, now})
            .status());
  }
  return absl::OkStatus();
}

const char* phaseName(strategy::Result result) {
  switch (result) {
    case strategy::Result::kProvisioning:
      return "provisioning";
    case strategy::Result::kProgressing:
      return "progressing";
    case strategy::Result::kCompleted:
      return "completed";
  }
  return "progressing";
}

// Moves replicas from `from` to `to` until every region completed, or (unless `rolling_back`)
// until the deadline or the give-up cap. `label` names the steps; each cycle's phases go to the
// history of `deployment` (as `rolled_back.phase` with its detail when set). Returns the reason it
// stopped early, or "" when completed.
absl::StatusOr<std::string> move(Context& ctx, const DeployDependencies& deps,
                                 const DeploymentInfo& info, const std::string& to,
                                 const std::string& from, const std::string& label,
                                 const std::string& deployment, const Phase& rolled_back,
                                 int64_t deadline_ms, uint32_t give_up) {
  const strategy::RollingSpec spec = strategy::specOf(info.rolling_update());
  // Failed new instances seen, summed over samples at most one tick apart: failed
  // instance-seconds. Every report wakes a cycle, so a sum over cycles would count how often the
  // agents report, and one instance failing for a moment could reach the cap.
  uint32_t failures = 0;
  int64_t sampled_ms = 0;
  for (int cycle = 1;; ++cycle) {
    auto seen = workflow::run<RollingObservation>(ctx, strCat(label, " cycle ", cycle, ": observe"),
                                                  [&]() -> absl::StatusOr<RollingObservation> {
                                                    return observe(*deps.pool, info, to, from);
                                                  });
    if (!seen.ok()) return seen.status();
    bool completed = true;
    std::string failure;
    std::vector<Move> moves;
    std::vector<Phase> phases;
    const bool sample = seen->now_ms() - sampled_ms >= std::chrono::milliseconds(kTick).count();
    if (sample) sampled_ms = seen->now_ms();
    for (const RollingRegion& r : seen->regions()) {
      if (sample) failures += r.to_failed();
      if (!r.to_failure().empty()) failure = strCat(r.region_id(), ": ", r.to_failure());
      const auto e =
          strategy::evaluate(viewOf(r), r.desired(), strategy::resolve(spec, r.desired()));
      if (rolled_back.phase.empty()) {
        phases.push_back({r.region_id(), phaseName(e.result), r.to_failure()});
      } else {
        phases.push_back({r.region_id(), rolled_back.phase, rolled_back.detail});
      }
      if (e.result == strategy::Result::kCompleted) {
        // Replacements of failed instances may have left more than desired: back to desired.
        if (r.to_replicas() != r.desired()) {
          completed = false;
          if (rolled_back.phase.empty()) phases.back().phase = "progressing";
          moves.push_back({r.region_id(), r.desired(), 0});
        }
        continue;
      }
      completed = false;
      const uint32_t drained = static_cast<uint32_t>(e.drain_ids.size());
      if (e.to_create > 0 || drained > 0) {
        moves.push_back({r.region_id(), r.to_replicas() + e.to_create,
                         r.from_replicas() - std::min(r.from_replicas(), drained)});
      }
    }
    std::string stopped;
    if (!completed && give_up > 0 && failures >= give_up) {
      stopped = strCat("new instances kept failing (", failures, " failures seen, the cap is ",
                       give_up, ")", failure.empty() ? "" : strCat(", last: ", failure));
    } else if (!completed && deadline_ms > 0 && seen->now_ms() >= deadline_ms) {
      stopped = strCat("not completed within ", info.deploy_timeout_seconds(), " s");
    }
    if (!stopped.empty()) moves.clear();
    // The cycle's history and its mutations in one step (exactly once).
    std::vector<feed::WriteResult> written;
    auto applied = ctx.runTx(
        strCat(label, " cycle ", cycle, ": apply"),
        [&](db::Connection& conn) -> absl::StatusOr<std::string> {
          KRANE_RETURN_IF_ERROR(recordPhases(conn, deployment, phases, seen->now_ms()));
          if (moves.empty()) return std::string();
          KRANE_ASSIGN_OR_RETURN(written, deps.writer->transactIn(conn, [&](feed::WriteTx& tx) {
            for (const Move& m : moves) {
              KRANE_RETURN_IF_ERROR(setReplicas(tx, to, m.region, m.to_replicas));
              KRANE_RETURN_IF_ERROR(setReplicas(tx, from, m.region, m.from_replicas));
            }
            return absl::OkStatus();
          }));
          return std::string();
        });
    deps.writer->committed(written);  // empty when the step was replayed
    if (!applied.ok()) return applied.status();
    if (completed || !stopped.empty()) {
      ctx.clear(kRollAwakeableState);
      return stopped;
    }
    workflow::Awakeable woken = ctx.awakeable();
    ctx.set(kRollAwakeableState, woken.id);
    KRANE_RETURN_IF_ERROR(ctx.select({woken.future, ctx.timer(kTick)}).status());
  }
}

}  // namespace

// Points the environment's sentinels at `deployment_id` besides the live one and records it as
// the app's deploying revision; "" stops both (for `rolling`, only if it is still the one).
absl::Status routeRolling(Context& ctx, feed::Writer& writer, const std::string& environment_id,
                          const std::string& deployment_id, const std::string& rolling,
                          const std::string& name) {
  std::vector<feed::WriteResult> written;
  auto done = ctx.runTx(name, [&](db::Connection& conn) -> absl::StatusOr<std::string> {
    KRANE_RETURN_IF_ERROR(
        conn.exec(deployment_id.empty()
                      ? "UPDATE apps SET deploying_deployment_id = NULL WHERE id ="
                        " (SELECT app_id FROM environments WHERE id = ?)"
                        " AND deploying_deployment_id = ?"
                      : "UPDATE apps SET deploying_deployment_id = ? WHERE id ="
                        " (SELECT app_id FROM environments WHERE id = ?)",
                  deployment_id.empty() ? std::vector<db::Value>{environment_id, rolling}
                                        : std::vector<db::Value>{deployment_id, environment_id})
            .status());
    KRANE_ASSIGN_OR_RETURN(
        written, routing::setSentinelsRolling(writer, conn, environment_id, deployment_id));
    return std::string();
  });
  writer.committed(written);
  return done.status();
}

// The live deployment back to the environment's replicas in every region, if it is still live:
// a roll that stopped (a cancel, an error after it) leaves no region scaled down. Whether it is
// still live is read under the app's row lock, which every swap (deploy, promote, rollback) holds
// while it changes the live deployment: none can move it between this check and the write, which
// would leave a deployment that is no longer live at full replicas. A swap locks the deployment
// that goes live before the app; this locks no deployment (the app id is read without a lock, it
// never changes), so the two cannot wait for each other.
absl::Status restoreLive(Context& ctx, feed::Writer& writer, const std::string& live,
                         const std::vector<std::pair<std::string, uint32_t>>& replicas) {
  std::vector<feed::WriteResult> written;
  auto done = ctx.runTx(
      "rolling: restore the live deployment",
      [&](db::Connection& conn) -> absl::StatusOr<std::string> {
        KRANE_ASSIGN_OR_RETURN(auto owner,
                               conn.query("SELECT app_id FROM deployments WHERE id = ?", {live}));
        if (owner.empty()) return std::string("no longer live");
        KRANE_ASSIGN_OR_RETURN(auto app, conn.query("SELECT current_deployment_id FROM apps"
                                                    " WHERE id = ? FOR UPDATE",
                                                    {owner.rows[0].str("app_id")}));
        if (app.empty() || app.rows[0].optStr("current_deployment_id") != live) {
          return std::string("no longer live");
        }
        KRANE_ASSIGN_OR_RETURN(written, writer.transactIn(conn, [&](feed::WriteTx& tx) {
          for (const auto& [region, n] : replicas) {
            KRANE_RETURN_IF_ERROR(setReplicas(tx, live, region, n));
          }
          return absl::OkStatus();
        }));
        return std::string();
      });
  writer.committed(written);
  return done.status();
}

absl::Status rollOut(Context& ctx, const DeployDependencies& deps, const DeploymentInfo& info,
                     const std::string& id, const std::function<absl::Status()>& rolling_back) {
  // The sentinels route to the new deployment's ready instances too, until the swap (which
  // clears it) or the rollback.
  KRANE_RETURN_IF_ERROR(
      routeRolling(ctx, *deps.writer, info.environment_id(), id, id, "rolling: route to both"));
  ctx.compensate("rolling: stop routing to the new deployment",
                 [writer = deps.writer, env = info.environment_id(), id](Context& ctx) {
                   return routeRolling(ctx, *writer, env, "", id,
                                       "rolling: stop routing to the new deployment");
                 });
  // Runs before the one above (newest first): the live deployment gets its replicas back
  // before the new one stops taking traffic and is removed.
  std::vector<std::pair<std::string, uint32_t>> full;
  for (const auto& r : info.regions()) full.emplace_back(r.region_id(), r.replicas());
  ctx.compensate("rolling: restore the live deployment",
                 [writer = deps.writer, live = info.live_deployment_id(), full](Context& ctx) {
                   return restoreLive(ctx, *writer, live, full);
                 });
  uint32_t desired = 0;
  for (const auto& r : info.regions()) desired += r.replicas();
  // The start time and the give-up cap, journaled: a replica that replays the roll with another
  // deploy.rolling_give_up_per_replica must take the decisions the journal recorded.
  auto started = ctx.run("rolling starts", [&] {
    return absl::StatusOr<std::string>(
        strCat(unixMillis(), " ", deps.rolling_give_up_per_replica * desired));
  });
  if (!started.ok()) return started.status();
  const size_t space = started->find(' ');
  const int64_t deadline = std::stoll(started->substr(0, space)) +
                           std::max<int64_t>(1, info.deploy_timeout_seconds()) * 1000;
  // (A roll journaled before the cap was recorded has the start time alone.)
  const uint32_t give_up = space == std::string::npos
                               ? deps.rolling_give_up_per_replica * desired
                               : static_cast<uint32_t>(std::stoul(started->substr(space + 1)));
  KRANE_ASSIGN_OR_RETURN(std::string stopped, move(ctx, deps, info, id, info.live_deployment_id(),
                                                   "rolling", id, {}, deadline, give_up));
  if (stopped.empty()) return absl::OkStatus();

  // Roll back: the old deployment up again first (within the surge), the new one drained, never
  // below min_available. Bounded by the timeout once more.
  spdlog::warn("deploy: rolling deployment={} rolls back: {}", id, stopped);
  KRANE_RETURN_IF_ERROR(rolling_back());
  auto now = ctx.run("rolling back",
                     [] { return absl::StatusOr<std::string>(std::to_string(unixMillis())); });
  if (!now.ok()) return now.status();
  const int64_t back_deadline =
      std::stoll(*now) + std::max<int64_t>(1, info.deploy_timeout_seconds()) * 1000;
  KRANE_ASSIGN_OR_RETURN(std::string back,
                         move(ctx, deps, info, info.live_deployment_id(), id, "rolling back", id,
                              {"", "rolling_back", stopped}, back_deadline, 0));
  // (The compensation then stops the sentinels routing to the new deployment.)
  return terminalError(absl::StatusCode::kAborted,
                       strCat("rolled back to ", info.live_deployment_id(), ": ", stopped,
                              back.empty() ? "" : strCat("; the rollback itself stopped: ", back)));
}

}  // namespace krane::services::deploy
