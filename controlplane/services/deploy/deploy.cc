#include "controlplane/services/deploy/deploy.h"

#include <algorithm>

#include "common/clock.h"
#include "common/status.h"
#include "common/strings.h"
#include "controlplane/services/buildslot/buildslot.h"
#include "controlplane/services/dedup/dedup.h"
#include "controlplane/services/deploy/environment_resources.h"
#include "controlplane/services/deploy/readiness.h"
#include "controlplane/services/deploy/rolling.h"
#include "controlplane/services/deployment/deployment.h"
#include "controlplane/services/routing/routing.h"
#include "controlplane/workflow/operations.h"
#include "controlplane/workflow/typed.h"
#include "spdlog/spdlog.h"

namespace krane::services::deploy {
// Ends the open step with `error` (first write wins) and moves an unfinished deployment to
// `status`; a finished one (ready, failed, superseded, cancelled) keeps its status.
absl::Status markFinished(db::Connection& conn, const std::string& id, const std::string& status,
                          const std::string& error) {
  const int64_t now = unixMillis();
  KRANE_RETURN_IF_ERROR(conn.exec("UPDATE deployment_steps SET ended_at = ?, error = ?"
                                  " WHERE deployment_id = ? AND ended_at IS NULL",
                                  {now, error.substr(0, 60000), id})
                            .status());
  return conn
      .exec(
          "UPDATE deployments SET status = ?, updated_at = ? WHERE id = ? AND status IN"
          " ('pending', 'awaiting_approval', 'starting', 'building', 'deploying', 'network',"
          " 'finalizing')",
          {status, now, id})
      .status();
}

namespace {

using services::v1::DeploymentInfo;
using services::v1::SlotHold;
using workflow::Context;
using workflow::terminalError;

bool among(const std::string& status, const std::vector<std::string>& set) {
  return std::find(set.begin(), set.end(), status) != set.end();
}

absl::StatusOr<DeploymentInfo> loadInfo(db::Connection& conn, const std::string& id) {
  KRANE_ASSIGN_OR_RETURN(
      auto rows,
      conn.query("SELECT d.workspace_id, d.project_id, d.app_id, d.environment_id, d.status,"
                 " d.git_branch, d.git_commit_sha, e.kind, e.deploy_timeout_seconds,"
                 " e.strategy, e.max_surge, e.max_unavailable, e.max_surge_percent,"
                 " e.max_unavailable_percent, e.min_ready_seconds, live.id AS live_id"
                 " FROM deployments d JOIN environments e ON e.id = d.environment_id"
                 " JOIN apps a ON a.id = d.app_id"
                 " LEFT JOIN deployments live ON live.id = a.current_deployment_id"
                 "  AND live.environment_id = d.environment_id"
                 " WHERE d.id = ?",
                 {id}));
  if (rows.empty()) {
    return terminalError(absl::StatusCode::kNotFound, strCat("deployment '", id, "' not found"));
  }
  const db::Row& r = rows.rows[0];
  DeploymentInfo info;
  info.set_workspace_id(r.str("workspace_id"));
  info.set_project_id(r.str("project_id"));
  info.set_app_id(r.str("app_id"));
  info.set_environment_id(r.str("environment_id"));
  info.set_status(r.str("status"));
  info.set_git_branch(r.optStr("git_branch").value_or(""));
  info.set_git_commit_sha(r.optStr("git_commit_sha").value_or(""));
  info.set_production(r.str("kind") == "production");
  info.set_deploy_timeout_seconds(r.i64("deploy_timeout_seconds"));
  info.set_strategy(r.str("strategy"));
  auto* rolling = info.mutable_rolling_update();
  if (auto percent = r.optI64("max_surge_percent")) {
    rolling->mutable_max_surge()->set_value(static_cast<uint32_t>(*percent));
    rolling->mutable_max_surge()->set_percent(true);
  } else {
    rolling->mutable_max_surge()->set_value(static_cast<uint32_t>(r.i64("max_surge")));
  }
  if (auto percent = r.optI64("max_unavailable_percent")) {
    rolling->mutable_max_unavailable()->set_value(static_cast<uint32_t>(*percent));
    rolling->mutable_max_unavailable()->set_percent(true);
  } else {
    rolling->mutable_max_unavailable()->set_value(static_cast<uint32_t>(r.i64("max_unavailable")));
  }
  rolling->set_min_ready_seconds(static_cast<uint32_t>(r.i64("min_ready_seconds")));
  // The live deployment of this environment (a preview environment has none: the app's live
  // deployment is production's).
  const std::string live = r.optStr("live_id").value_or("");
  if (live != id) info.set_live_deployment_id(live);
  KRANE_ASSIGN_OR_RETURN(auto regions, conn.query("SELECT region_id, replicas FROM"
                                                  " environment_regions WHERE environment_id = ?"
                                                  " ORDER BY region_id",
                                                  {info.environment_id()}));
  if (regions.empty()) {
    return terminalError(absl::StatusCode::kFailedPrecondition,
                         strCat("environment '", info.environment_id(), "' has no regions"));
  }
  for (const db::Row& region : regions.rows) {
    auto* out = info.add_regions();
    out->set_region_id(region.str("region_id"));
    out->set_replicas(static_cast<uint32_t>(region.i64("replicas")));
  }
  return info;
}

// Ends the open step of `id`, starts `step`, and moves the deployment to `status` (unless empty).
absl::Status startStep(db::Connection& conn, const std::string& id, const std::string& step,
                       const std::string& status) {
  const int64_t now = unixMillis();
  KRANE_RETURN_IF_ERROR(conn.exec("UPDATE deployment_steps SET ended_at = ?"
                                  " WHERE deployment_id = ? AND ended_at IS NULL",
                                  {now, id})
                            .status());
  KRANE_RETURN_IF_ERROR(conn.exec("INSERT INTO deployment_steps (deployment_id, step,"
                                  " started_at) VALUES (?, ?, ?)",
                                  {id, step, now})
                            .status());
  if (status.empty()) return absl::OkStatus();
  return conn
      .exec("UPDATE deployments SET status = ?, updated_at = ? WHERE id = ?", {status, now, id})
      .status();
}

// Starts step `step` (ending the open one) and, unless `status` is empty, moves the deployment
// to it; only while the deployment is in one of `from`. False (nothing written) otherwise.
absl::StatusOr<bool> enterStep(Context& ctx, const std::string& step, const std::string& status,
                               const std::vector<std::string>& from) {
  auto entered =
      ctx.runTx(strCat("step ", step), [&](db::Connection& conn) -> absl::StatusOr<std::string> {
        KRANE_ASSIGN_OR_RETURN(auto rows, conn.query("SELECT status FROM deployments WHERE id = ?"
                                                     " FOR UPDATE",
                                                     {ctx.key()}));
        if (rows.empty() || !among(rows.rows[0].str("status"), from)) {
          return rows.empty() ? std::string("gone") : rows.rows[0].str("status");
        }
        KRANE_RETURN_IF_ERROR(startStep(conn, ctx.key(), step, status));
        return std::string();
      });
  if (!entered.ok()) return entered.status();
  return entered->empty();
}

// A rolling deploy of a production environment enters `deploying` alone: two rolls from one live
// deployment would drain it twice and route the sentinels to each other's new revision. In one
// transaction under the environment's row lock: no other deployment of the environment with a
// deploy workflow still running past its build (rolling, moving routes, going live, or undoing a
// failed roll), then the step. Otherwise it waits (a durable sleep, backing off to 30 s) and
// looks again; a deploy of the same branch that became newer meanwhile supersedes it.
struct Entered {
  enum { kEntered, kSuperseded, kLeft } outcome = kLeft;
  // The deployment it rolls from: the environment's live one when it entered; "" when there is
  // none, or when the app is rolled back (the deploy stays off live then, and starts in full).
  std::string live;
};

absl::StatusOr<Entered> enterDeployingAlone(Context& ctx, const DeploymentInfo& info) {
  std::chrono::milliseconds pause(1000);
  for (int look = 1;; ++look) {
    // The first look has enterStep's name: a deploy journaled before rolls were serialized
    // replays it as it was (its result then is "", and the live deployment the one it loaded).
    auto entered = ctx.runTx(
        look == 1 ? std::string("step deploying") : strCat("step deploying, look ", look),
        [&](db::Connection& conn) -> absl::StatusOr<std::string> {
          KRANE_RETURN_IF_ERROR(conn.query("SELECT id FROM environments WHERE id = ? FOR UPDATE",
                                           {info.environment_id()})
                                    .status());
          KRANE_ASSIGN_OR_RETURN(
              auto busy,
              conn.query(strCat("SELECT d.id FROM deployments d JOIN workflow_invocations i ON"
                                " i.id = d.invocation_id WHERE d.environment_id = ? AND d.id <> ?"
                                " AND d.status IN ('deploying', 'network', 'finalizing', 'failed',"
                                " 'cancelled') AND i.status NOT IN (",
                                workflow::kFinalStatuses, ") ORDER BY d.id LIMIT 1"),
                         {info.environment_id(), ctx.key()}));
          KRANE_ASSIGN_OR_RETURN(auto own, conn.query("SELECT status FROM deployments WHERE"
                                                      " id = ? FOR UPDATE",
                                                      {ctx.key()}));
          if (own.empty() || own.rows[0].str("status") != "building") {
            return own.empty() ? std::string("gone") : own.rows[0].str("status");
          }
          KRANE_ASSIGN_OR_RETURN(bool newer, dedup::hasNewerActiveDeployment(conn, ctx.key()));
          if (newer) {
            KRANE_RETURN_IF_ERROR(markFinished(conn, ctx.key(), "superseded",
                                               std::string(dedup::kSupersededMessage)));
            return std::string("superseded");
          }
          if (!busy.empty()) return strCat("wait ", busy.rows[0].str("id"));
          KRANE_RETURN_IF_ERROR(startStep(conn, ctx.key(), "deploying", "deploying"));
          KRANE_ASSIGN_OR_RETURN(auto live,
                                 conn.query("SELECT live.id FROM apps a JOIN deployments live ON"
                                            " live.id = a.current_deployment_id WHERE a.id = ? AND"
                                            " live.environment_id = ? AND NOT a.is_rolled_back",
                                            {info.app_id(), info.environment_id()}));
          return strCat("entered ", live.empty() ? std::string() : live.rows[0].str("id"));
        });
    if (!entered.ok()) return entered.status();
    if (entered->empty()) return Entered{Entered::kEntered, info.live_deployment_id()};
    if (entered->rfind("entered ", 0) == 0) {
      const std::string live = entered->substr(8);
      return Entered{Entered::kEntered, live == ctx.key() ? std::string() : live};
    }
    if (*entered == "superseded") return Entered{Entered::kSuperseded, ""};
    if (entered->rfind("wait ", 0) != 0) return Entered{};  // its status was no longer building
    KRANE_RETURN_IF_ERROR(ctx.sleep(pause));
    pause = std::min<std::chrono::milliseconds>(pause * 2, std::chrono::seconds(30));
  }
}

// What a deploy that stopped early (superseded while queued) answers.
DeployResult stoppedAs(const std::string& status) {
  DeployResult r;
  r.set_status(status);
  return r;
}

absl::Status releaseSlot(Context& ctx, const SlotHold& hold) {
  buildslot::ReleaseSlotRequest release;
  release.set_deployment_id(hold.deployment_id());
  workflow::send(ctx, buildslot::kServiceName, "Release", hold.workspace_id(), release);
  return absl::OkStatus();
}

feed::Resource topologyFor(const DeployRequest& req, const DeploymentInfo& info,
                           const std::string& deployment_id, const std::string& image,
                           const DeploymentInfo::Region& region) {
  feed::Resource r;
  r.set_type(std::string(feed::kDeploymentTopology));
  r.set_id(deployment_id);
  r.set_region(region.region_id());
  auto* t = r.mutable_deployment_topology();
  *t = req.spec();
  t->set_workspace_id(info.workspace_id());
  t->set_project_id(info.project_id());
  t->set_app_id(info.app_id());
  t->set_environment_id(info.environment_id());
  t->set_image(image);
  t->set_replicas(region.replicas());
  if (t->desired_status() == cluster::v1::DESIRED_STATUS_UNSPECIFIED) {
    t->set_desired_status(cluster::v1::DESIRED_STATUS_RUNNING);
  }
  return r;
}

// Puts the topology of every region, and the environment's sentinels and policies where a
// region has none, on the step's own transaction (Context::runTx): the changes commit with the
// step's journal entry, so a crash never writes them twice.
absl::StatusOr<services::v1::EnvironmentResources> writeDesiredState(
    Context& ctx, feed::Writer& writer, const std::vector<feed::Resource>& wanted,
    const DeploymentInfo& info, const EnvironmentResourceOptions& options) {
  std::vector<feed::WriteResult> written;
  auto done = workflow::runTx<services::v1::EnvironmentResources>(
      ctx, "write topology",
      [&](db::Connection& conn) -> absl::StatusOr<services::v1::EnvironmentResources> {
        services::v1::EnvironmentResources created;
        auto results = writer.transactIn(conn, [&](feed::WriteTx& tx) -> absl::Status {
          for (const feed::Resource& r : wanted) KRANE_RETURN_IF_ERROR(tx.put(r));
          KRANE_ASSIGN_OR_RETURN(created, ensureEnvironmentResources(tx, info, options));
          return absl::OkStatus();
        });
        if (!results.ok()) {
          // A spec the table refuses will be refused on every retry.
          if (absl::IsInvalidArgument(results.status())) {
            return terminalError(results.status().code(), toStd(results.status().message()));
          }
          return results.status();
        }
        written = *std::move(results);
        return created;
      });
  writer.committed(written);  // empty when the step was replayed
  return done;
}

// Removes the topology writeDesiredState wrote, the same way.
absl::Status removeTopology(Context& ctx, feed::Writer& writer, const std::string& deployment_id,
                            const std::vector<std::string>& regions) {
  const feed::ResourceTable& table = writer.tables().forType(feed::kDeploymentTopology);
  std::vector<feed::WriteResult> written;
  auto done =
      ctx.runTx("remove topology", [&](db::Connection& conn) -> absl::StatusOr<std::string> {
        // A deployment that serves traffic keeps its instances whatever cancelled its deploy
        // (a cancel that raced its swap to live, or one sent to the workflow directly): removing
        // them would take down what the routes point at. Its row first, as a swap locks it
        // before the app's: a swap under way finishes before the check, and one that comes later
        // waits for the removal.
        KRANE_RETURN_IF_ERROR(
            conn.query("SELECT id FROM deployments WHERE id = ? FOR UPDATE", {deployment_id})
                .status());
        KRANE_ASSIGN_OR_RETURN(
            auto serving,
            conn.query("SELECT 1 FROM apps WHERE current_deployment_id = ? UNION ALL"
                       " SELECT 1 FROM frontline_routes WHERE deployment_id = ? LIMIT 1",
                       {deployment_id, deployment_id}));
        if (!serving.empty()) {
          spdlog::warn("deploy: deployment {} serves traffic; its topology stays", deployment_id);
          return std::string("serving");
        }
        KRANE_ASSIGN_OR_RETURN(
            written, writer.transactIn(conn, [&](feed::WriteTx& tx) -> absl::Status {
              for (const std::string& region : regions) {
                const feed::ResourceKey key{std::string(feed::kDeploymentTopology), deployment_id,
                                            region};
                KRANE_ASSIGN_OR_RETURN(auto stored, table.load(tx.connection(), key));
                if (!stored || stored->deleted) continue;
                KRANE_RETURN_IF_ERROR(tx.remove(key));
              }
              return absl::OkStatus();
            }));
        return std::string();
      });
  writer.committed(written);
  return done.status();
}

// The blue-green wait: until the readiness gate says enough regions run their minimum replicas
// (readiness.h), or the environment's deploy timeout passes.
absl::Status awaitReadiness(Context& ctx, const DeployDependencies& deps,
                            const DeploymentInfo& info, const std::string& id) {
  workflow::Awakeable ready = ctx.awakeable();
  ctx.set(kReadyAwakeableState, ready.id);
  ctx.compensate("forget readiness wait", [](Context& ctx) {
    ctx.clear(kReadyAwakeableState);
    return absl::OkStatus();
  });
  auto already = ctx.run("initial readiness check", [&]() -> absl::StatusOr<std::string> {
    KRANE_ASSIGN_OR_RETURN(auto conn, deps.pool->acquire());
    KRANE_ASSIGN_OR_RETURN(Readiness r, readinessOf(*conn, id));
    return std::string(r.ready() ? "ready" : "");
  });
  if (!already.ok()) return already.status();
  if (*already == "ready") ctx.resolveAwakeable(ready.id, "");
  const auto timeout = std::chrono::seconds(std::max<int64_t>(1, info.deploy_timeout_seconds()));
  KRANE_ASSIGN_OR_RETURN(workflow::Selected first, ctx.select({ready.future, ctx.timer(timeout)}));
  if (first.index == 0 && !first.result.ok()) {
    // The gate gave up on it: failing regions make the threshold unreachable.
    return terminalError(absl::StatusCode::kFailedPrecondition,
                         toStd(first.result.status().message()));
  }
  if (first.index == 1) {
    auto detail = ctx.run("readiness at the timeout", [&]() -> absl::StatusOr<std::string> {
      KRANE_ASSIGN_OR_RETURN(auto conn, deps.pool->acquire());
      KRANE_ASSIGN_OR_RETURN(Readiness r, readinessOf(*conn, id));
      return strCat(r.healthy, " of ", r.regions, " regions healthy, ", r.needed, " needed");
    });
    return terminalError(absl::StatusCode::kDeadlineExceeded,
                         strCat("instances not ready within ", timeout.count(), " s (",
                                detail.ok() ? *detail : "readiness unknown", ")"));
  }
  ctx.clear(kReadyAwakeableState);
  return absl::OkStatus();
}

absl::StatusOr<DeployResult> runDeploy(Context& ctx, const DeployDependencies& deps,
                                       const DeployRequest& req) {
  const std::string id = ctx.key();
  KRANE_ASSIGN_OR_RETURN(
      DeploymentInfo info,
      workflow::runTx<DeploymentInfo>(
          ctx, "load deployment", [&](db::Connection& conn) -> absl::StatusOr<DeploymentInfo> {
            KRANE_ASSIGN_OR_RETURN(DeploymentInfo loaded, loadInfo(conn, id));
            // Commit dedup cancels a superseded deployment through this.
            KRANE_RETURN_IF_ERROR(conn.exec("UPDATE deployments SET invocation_id = ?"
                                            " WHERE id = ? AND invocation_id IS NULL",
                                            {ctx.invocationId(), id})
                                      .status());
            return loaded;
          }));
  // A spec that no region would accept fails now, before it waits for a build slot.
  {
    DeploymentInfo::Region any;
    any.set_region_id(info.regions(0).region_id());
    any.set_replicas(info.regions(0).replicas());
    feed::Resource probe = topologyFor(req, info, id, "validation.invalid/image:check", any);
    absl::Status valid = deps.writer->tables().forType(feed::kDeploymentTopology).validate(probe);
    if (!valid.ok()) {
      return terminalError(absl::StatusCode::kInvalidArgument,
                           strCat("spec: ", toStd(valid.message())));
    }
  }
  SlotHold hold;
  hold.set_workspace_id(info.workspace_id());
  hold.set_deployment_id(id);
  // Registered first, so it runs last: whatever happened, an unfinished deployment ends failed
  // (cancelled, when it was cancelled). A failure the handler saw is recorded with its error
  // before this runs (deploy()), so this only finds unfinished ones after a cancel or a give-up.
  workflow::compensate(ctx, "mark failed", hold, [](Context& ctx, const SlotHold& h) {
    return ctx
        .runTx("mark failed",
               [&](db::Connection& conn) -> absl::StatusOr<std::string> {
                 KRANE_ASSIGN_OR_RETURN(auto rows, conn.query("SELECT cancel_requested FROM"
                                                              " workflow_invocations WHERE id = ?",
                                                              {ctx.invocationId()}));
                 const bool cancelled = !rows.empty() && rows.rows[0].i64(0) != 0;
                 KRANE_RETURN_IF_ERROR(markFinished(
                     conn, h.deployment_id(), cancelled ? "cancelled" : "failed",
                     cancelled ? std::string("cancelled")
                               : strCat("the deploy workflow failed (krane-ctrl workflow show ",
                                        ctx.invocationId(), ")")));
                 return std::string();
               })
        .status();
  });

  // queued: self-skip, then a build slot.
  KRANE_ASSIGN_OR_RETURN(bool queued,
                         enterStep(ctx, "queued", "", {"pending", "awaiting_approval"}));
  if (!queued) return stoppedAs(info.status());
  auto newer = ctx.run("newer sibling?", [&]() -> absl::StatusOr<std::string> {
    KRANE_ASSIGN_OR_RETURN(auto conn, deps.pool->acquire());
    KRANE_ASSIGN_OR_RETURN(bool skip, dedup::hasNewerActiveDeployment(*conn, id));
    return std::string(skip ? "yes" : "no");
  });
  if (!newer.ok()) return newer.status();
  if (*newer == "yes") {
    KRANE_RETURN_IF_ERROR(
        ctx.runTx("superseded",
                  [&](db::Connection& conn) -> absl::StatusOr<std::string> {
                    const int64_t now = unixMillis();
                    KRANE_RETURN_IF_ERROR(conn.exec("UPDATE deployment_steps SET ended_at = ?,"
                                                    " error = ? WHERE deployment_id = ?"
                                                    " AND ended_at IS NULL",
                                                    {now, dedup::kSupersededMessage, id})
                                              .status());
                    KRANE_RETURN_IF_ERROR(conn.exec("UPDATE deployments SET status = 'superseded',"
                                                    " updated_at = ? WHERE id = ? AND status IN"
                                                    " ('pending', 'awaiting_approval')",
                                                    {now, id})
                                              .status());
                    return std::string();
                  })
            .status());
    return stoppedAs("superseded");
  }
  workflow::Awakeable slot = ctx.awakeable();
  workflow::compensate(ctx, "release build slot", hold, releaseSlot);
  buildslot::AcquireSlotRequest acquire;
  acquire.set_deployment_id(id);
  acquire.set_awakeable_id(slot.id);
  acquire.set_is_production(info.production());
  KRANE_RETURN_IF_ERROR(workflow::await(ctx, workflow::call<buildslot::AcquireSlotResponse>(
                                                 ctx, buildslot::kServiceName, "AcquireOrWait",
                                                 info.workspace_id(), acquire))
                            .status());
  KRANE_RETURN_IF_ERROR(ctx.await(slot.future).status());

  // starting: out of the queue for good, unless it was superseded while it waited.
  KRANE_ASSIGN_OR_RETURN(bool started,
                         enterStep(ctx, "starting", "starting", {"pending", "awaiting_approval"}));
  if (!started) {
    KRANE_RETURN_IF_ERROR(releaseSlot(ctx, hold));
    return stoppedAs("superseded");
  }

  // building
  KRANE_ASSIGN_OR_RETURN(bool building, enterStep(ctx, "building", "building", {"starting"}));
  if (!building) return terminalError(absl::StatusCode::kAborted, "deployment left the workflow");
  builder::BuildRequest build = req.build();
  build.set_deployment_id(id);
  build.set_commit_sha(info.git_commit_sha());
  KRANE_ASSIGN_OR_RETURN(builder::Builder * b,
                         builder::builderFor(build, *deps.prebuilt, *deps.command));
  KRANE_ASSIGN_OR_RETURN(
      builder::BuildResult built,
      workflow::run<builder::BuildResult>(ctx, "build", [&] { return b->build(build); }));
  KRANE_RETURN_IF_ERROR(ctx.runTx("record image",
                                  [&](db::Connection& conn) -> absl::StatusOr<std::string> {
                                    KRANE_RETURN_IF_ERROR(
                                        conn.exec("UPDATE deployments SET image = ? WHERE id = ?",
                                                  {built.image(), id})
                                            .status());
                                    return std::string();
                                  })
                            .status());
  // The slot caps builds: the next deploy of the workspace may build while this one rolls out.
  // (The compensation's Release then finds nothing to release, which is a no-op.)
  KRANE_RETURN_IF_ERROR(releaseSlot(ctx, hold));

  // deploying: desired state in every region. A rolling deploy rolls alone, from the deployment
  // live when its turn comes.
  if (info.strategy() == "rolling" && info.production()) {
    KRANE_ASSIGN_OR_RETURN(Entered entered, enterDeployingAlone(ctx, info));
    if (entered.outcome == Entered::kSuperseded) return stoppedAs("superseded");
    if (entered.outcome == Entered::kLeft) {
      return terminalError(absl::StatusCode::kAborted, "deployment left the workflow");
    }
    // A rolled-back app keeps its live deployment until a promote: a roll would drain it for a
    // swap that would not happen. The deploy starts in full beside it instead (as blue-green).
    info.set_live_deployment_id(entered.live);
  } else {
    KRANE_ASSIGN_OR_RETURN(bool deploying, enterStep(ctx, "deploying", "deploying", {"building"}));
    if (!deploying) {
      return terminalError(absl::StatusCode::kAborted, "deployment left the workflow");
    }
  }
  // Rolling (seed 002): the new deployment starts at 0 replicas and takes them over from the
  // live one step by step (rolling.h); the first deploy of an environment starts in full.
  const bool rolling =
      info.strategy() == "rolling" && info.production() && !info.live_deployment_id().empty();
  std::vector<feed::Resource> topologies;
  std::vector<std::string> regions;
  for (const auto& region : info.regions()) {
    topologies.push_back(topologyFor(req, info, id, built.image(), region));
    if (info.strategy() == "rolling") {
      auto* t = topologies.back().mutable_deployment_topology();
      *t->mutable_rolling_update() = info.rolling_update();
      if (rolling) t->set_replicas(0);
    }
    regions.push_back(region.region_id());
  }
  // The writer outlives the engine: captured by value, like the data.
  ctx.compensate("remove topology", [writer = deps.writer, id, regions](Context& ctx) {
    return removeTopology(ctx, *writer, id, regions);
  });
  KRANE_ASSIGN_OR_RETURN(services::v1::EnvironmentResources created,
                         writeDesiredState(ctx, *deps.writer, topologies, info, deps.environment));
  // Seed 001's ensureSentinels: each sentinel this deploy created converges (SentinelService)
  // while the instances come up; both are waited for before routes are assigned.
  std::vector<workflow::TypedFuture<sentinel::SentinelDeployResponse>> sentinels;
  for (const auto& sentinel_id : created.created_sentinel_ids()) {
    sentinels.push_back(workflow::call<sentinel::SentinelDeployResponse>(
        ctx, sentinel::kServiceName, "Deploy", sentinel_id, sentinel::SentinelDeployRequest()));
  }

  // waiting: for the readiness gate, or the timeout; rolling: until the roll completed.
  KRANE_ASSIGN_OR_RETURN(bool waiting, enterStep(ctx, "waiting", "", {"deploying"}));
  if (!waiting) return terminalError(absl::StatusCode::kAborted, "deployment left the workflow");
  if (rolling) {
    KRANE_RETURN_IF_ERROR(rollOut(ctx, deps, info, id, [&]() -> absl::Status {
      KRANE_ASSIGN_OR_RETURN(bool entered, enterStep(ctx, "rolling_back", "", {"deploying"}));
      if (!entered)
        return terminalError(absl::StatusCode::kAborted, "deployment left the workflow");
      return absl::OkStatus();
    }));
  } else {
    KRANE_RETURN_IF_ERROR(awaitReadiness(ctx, deps, info, id));
  }
  if (!sentinels.empty()) {
    KRANE_ASSIGN_OR_RETURN(auto converged, workflow::awaitAll(ctx, sentinels));
    for (size_t i = 0; i < converged.size(); ++i) {
      const std::string& sentinel_id = created.created_sentinel_ids(static_cast<int>(i));
      if (!converged[i].ok()) {
        return terminalError(
            absl::StatusCode::kFailedPrecondition,
            strCat("sentinel ", sentinel_id, ": ", toStd(converged[i].status().message())));
      }
      if (converged[i]->outcome() != services::v1::SENTINEL_DEPLOY_OUTCOME_READY) {
        return terminalError(absl::StatusCode::kDeadlineExceeded, converged[i]->message());
      }
    }
  }

  // network: routes that follow the environment or the branch.
  KRANE_ASSIGN_OR_RETURN(bool network, enterStep(ctx, "network", "network", {"deploying"}));
  if (!network) return terminalError(absl::StatusCode::kAborted, "deployment left the workflow");
  routing::AssignRoutesRequest assign;
  assign.set_deployment_id(id);
  KRANE_RETURN_IF_ERROR(workflow::await(ctx, workflow::call<routing::AssignRoutesResponse>(
                                                 ctx, routing::kServiceName, "AssignRoutes",
                                                 info.environment_id(), assign))
                            .status());

  // finalizing: a production deployment goes live.
  KRANE_ASSIGN_OR_RETURN(bool finalizing, enterStep(ctx, "finalizing", "finalizing", {"network"}));
  if (!finalizing) return terminalError(absl::StatusCode::kAborted, "deployment left the workflow");
  bool live = false;
  if (info.production()) {
    routing::SwapLiveRequest swap;
    swap.set_deployment_id(id);
    swap.set_reason(services::v1::SWAP_REASON_DEPLOY);
    KRANE_ASSIGN_OR_RETURN(
        routing::SwapLiveResponse swapped,
        workflow::await(ctx, workflow::call<routing::SwapLiveResponse>(
                                 ctx, routing::kServiceName, "SwapLiveDeployment",
                                 info.environment_id(), swap)));
    live = swapped.swapped();
  }

  KRANE_ASSIGN_OR_RETURN(bool done, enterStep(ctx, "ready", "ready", {"finalizing"}));
  if (!done) return terminalError(absl::StatusCode::kAborted, "deployment left the workflow");
  KRANE_RETURN_IF_ERROR(
      ctx.runTx("ready",
                [&](db::Connection& conn) -> absl::StatusOr<std::string> {
                  KRANE_RETURN_IF_ERROR(
                      conn.exec("UPDATE deployment_steps SET ended_at = started_at"
                                " WHERE deployment_id = ? AND ended_at IS NULL",
                                {id})
                          .status());
                  return std::string();
                })
          .status());
  DeployResult result;
  result.set_status("ready");
  result.set_image(built.image());
  for (const auto& r : regions) result.add_regions(r);
  result.set_live(live);
  *result.mutable_created_sentinel_ids() = created.created_sentinel_ids();
  return result;
}

absl::StatusOr<DeployResult> deploy(Context& ctx, const DeployDependencies& deps,
                                    const DeployRequest& req) {
  absl::StatusOr<DeployResult> result = runDeploy(ctx, deps, req);
  // A cancel is recorded by the "mark failed" compensation: after a cancel only compensations
  // may still write.
  if (!result.ok() && workflow::isTerminal(result.status()) &&
      !absl::IsCancelled(result.status())) {
    // The open step gets the real error; the compensations then find the deployment finished.
    const std::string status = "failed";
    const std::string error(toStd(result.status().message()));
    KRANE_RETURN_IF_ERROR(ctx.runTx("record failure",
                                    [&](db::Connection& conn) -> absl::StatusOr<std::string> {
                                      KRANE_RETURN_IF_ERROR(
                                          markFinished(conn, ctx.key(), status, error));
                                      return std::string();
                                    })
                              .status());
  }
  return result;
}

absl::StatusOr<NotifyInstancesReadyResponse> notifyReady(Context& ctx,
                                                         const NotifyInstancesReadyRequest&) {
  NotifyInstancesReadyResponse out;
  if (auto awakeable = ctx.get(kReadyAwakeableState)) {
    ctx.resolveAwakeable(*awakeable, "");
    out.set_resolved(true);
  }
  return out;
}

}  // namespace

workflow::ServiceDefinition deployService(DeployDependencies deps) {
  using workflow::typed;
  return workflow::ServiceDefinition::virtualObject(kServiceName)
      .exclusive("Deploy",
                 typed<DeployRequest, DeployResult>([deps](Context& ctx, const DeployRequest& req) {
                   return deploy(ctx, deps, req);
                 }))
      .shared("NotifyInstancesReady",
              typed<NotifyInstancesReadyRequest, NotifyInstancesReadyResponse>(notifyReady))
      .retry(workflow::RetryPolicy::deployPreset());
}

std::vector<workflow::ServiceDefinition> deployServices(DeployDependencies deps,
                                                        routing::RoutingOptions routing) {
  std::vector<workflow::ServiceDefinition> out;
  out.push_back(buildslot::buildSlotService(deps.pool));
  out.push_back(deployment::deploymentService(deps.writer));
  out.push_back(routing::routingService(routing));
  out.push_back(sentinel::sentinelService(deps.pool, deps.writer, deps.sentinel));
  out.push_back(deployService(std::move(deps)));
  return out;
}

}  // namespace krane::services::deploy
