#include "controlplane/api/deployments.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <thread>

#include "common/clock.h"
#include "common/grpc_status.h"
#include "common/random_id.h"
#include "common/status.h"
#include "common/strings.h"
#include "controlplane/api/services.h"
#include "controlplane/services/builder/builder.h"
#include "controlplane/services/dedup/dedup.h"
#include "controlplane/services/deploy/deploy.h"
#include "controlplane/services/routing/routing.h"
#include "controlplane/workflow/operations.h"
#include "controlplane/workflow/typed.h"
#include "spdlog/spdlog.h"

namespace krane::api {
namespace {

constexpr auto kRoutingTimeout = std::chrono::seconds(30);
constexpr auto kWatchPoll = std::chrono::milliseconds(200);

bool finished(const std::string& status) {
  return status == "ready" || status == "failed" || status == "superseded" || status == "cancelled";
}

absl::Status invalid(const std::string& message) { return absl::InvalidArgumentError(message); }

// Input in a message, in this service's single quotes (krane::quote: short and printable).
std::string singleQuoted(std::string_view value) { return quote(value, 64, '\''); }

absl::Status checkText(std::string_view field, const std::string& value, size_t max,
                       bool required) {
  if (required && value.empty()) return invalid(strCat(field, ": required"));
  if (value.size() > max) return invalid(strCat(field, ": at most ", max, " bytes"));
  return absl::OkStatus();
}

// The build request of the deploy workflow, checked the way the builders will check it.
absl::StatusOr<services::v1::BuildRequest> buildOf(const v1::CreateDeploymentRequest& req) {
  services::v1::BuildRequest build;
  switch (req.source_case()) {
    case v1::CreateDeploymentRequest::kImage: {
      build.set_image(req.image());
      KRANE_RETURN_IF_ERROR(services::builder::PrebuiltBuilder().build(build).status());
      break;
    }
    case v1::CreateDeploymentRequest::kBuild: {
      const v1::BuildCommand& in = req.build();
      if (in.argv().empty() || in.argv(0).empty()) {
        return invalid("build.argv: required, the build command and its arguments");
      }
      KRANE_RETURN_IF_ERROR(checkText("build.image_name", in.image_name(), 255, true));
      auto* out = build.mutable_command();
      *out->mutable_argv() = in.argv();
      out->set_working_dir(in.working_dir());
      out->set_image_name(in.image_name());
      out->set_timeout_seconds(in.timeout_seconds());
      break;
    }
    case v1::CreateDeploymentRequest::SOURCE_NOT_SET:
      return invalid("source: an image, or a build command");
  }
  return build;
}

// A deployment's columns as the API shows it, from `deployments d JOIN apps a`.
constexpr const char* kDeploymentColumns =
    "d.id, d.app_id, d.environment_id, d.status, d.git_branch, d.git_commit_sha, d.image,"
    " d.invocation_id, d.created_at, a.current_deployment_id = d.id AS live,"
    " a.deploying_deployment_id = d.id AS deploying";

v1::Deployment deploymentOf(const db::Row& r) {
  v1::Deployment d;
  d.set_id(r.str("id"));
  d.set_app_id(r.str("app_id"));
  d.set_environment_id(r.str("environment_id"));
  d.set_status(r.str("status"));
  d.set_git_branch(r.optStr("git_branch").value_or(""));
  d.set_git_commit_sha(r.optStr("git_commit_sha").value_or(""));
  d.set_image(r.optStr("image").value_or(""));
  d.set_invocation_id(r.optStr("invocation_id").value_or(""));
  d.set_created_at_ms(r.i64("created_at"));
  d.set_live(!r.isNull("live") && r.i64("live") != 0);
  d.set_deploying(!r.isNull("deploying") && r.i64("deploying") != 0);
  return d;
}

// Adds their steps and phases to `deployments`: one query for the steps of them all and one for
// their phases, whatever their number (a page of the listing is not a query per deployment). The
// IN list is padded to a power of two with the last id again, so that pages of any size use one
// of a few statements (a connection keeps those it used last, prepared).
absl::Status addStepsAndPhases(db::Connection& conn,
                               const std::vector<v1::Deployment*>& deployments) {
  if (deployments.empty()) return absl::OkStatus();
  std::map<std::string, v1::Deployment*> by_id;
  db::Params ids;
  for (v1::Deployment* d : deployments) {
    by_id[d->id()] = d;
    ids.emplace_back(d->id());
  }
  const size_t padded = db::paddedListSize(ids.size());
  while (ids.size() < padded) ids.push_back(ids.back());
  const std::string in = db::placeholders(ids.size());
  KRANE_RETURN_IF_ERROR(conn.queryEach(
      strCat("SELECT deployment_id, step, started_at, ended_at, error FROM deployment_steps"
             " WHERE deployment_id IN (",
             in, ") ORDER BY id"),
      ids, [&](const db::Row& s) -> absl::Status {
        auto* step = by_id.at(s.str("deployment_id"))->add_steps();
        step->set_step(s.str("step"));
        step->set_started_at_ms(s.i64("started_at"));
        step->set_ended_at_ms(s.optI64("ended_at").value_or(0));
        step->set_error(s.optStr("error").value_or(""));
        return absl::OkStatus();
      }));
  return conn.queryEach(
      strCat("SELECT deployment_id, region_id, phase, detail, phase_started_at, updated_at,"
             " attempts FROM deployment_phases WHERE deployment_id IN (",
             in, ") ORDER BY deployment_id, region_id, id"),
      ids, [&](const db::Row& p) -> absl::Status {
        auto* phase = by_id.at(p.str("deployment_id"))->add_phases();
        phase->set_region(p.str("region_id"));
        phase->set_phase(p.str("phase"));
        phase->set_detail(p.str("detail"));
        phase->set_phase_started_at_ms(p.i64("phase_started_at"));
        phase->set_updated_at_ms(p.i64("updated_at"));
        phase->set_attempts(static_cast<uint32_t>(p.u64("attempts")));
        return absl::OkStatus();
      });
}

absl::StatusOr<v1::Deployment> loadDeployment(db::Connection& conn, const std::string& id) {
  KRANE_ASSIGN_OR_RETURN(auto rows, conn.query(strCat("SELECT ", kDeploymentColumns,
                                                      " FROM deployments d JOIN apps a ON"
                                                      " a.id = d.app_id WHERE d.id = ?"),
                                               {id}));
  if (rows.empty()) return absl::NotFoundError(strCat("no deployment ", singleQuoted(id)));
  v1::Deployment d = deploymentOf(rows.rows[0]);
  KRANE_RETURN_IF_ERROR(addStepsAndPhases(conn, {&d}));
  return d;
}

// The deployment a request names: its id checked, then loaded with its steps.
absl::StatusOr<v1::Deployment> deploymentById(db::Pool& pool, const std::string& id) {
  KRANE_RETURN_IF_ERROR(checkText("id", id, 64, true));
  KRANE_ASSIGN_OR_RETURN(auto conn, pool.acquire());
  return loadDeployment(*conn, id);
}

void fill(const services::v1::SwapLiveResponse& in, v1::LiveChange* out) {
  out->set_swapped(in.swapped());
  out->set_live_deployment_id(in.live_deployment_id());
  out->set_previous_deployment_id(in.previous_deployment_id());
  out->set_reason(in.reason());
}

}  // namespace

DeploymentServiceImpl::DeploymentServiceImpl(std::shared_ptr<db::Pool> pool,
                                             std::shared_ptr<const feed::ResourceTables> tables,
                                             workflow::Engine& engine,
                                             std::shared_ptr<const OperatorTokens> operators,
                                             DeploymentWatchLimits watch_limits)
    : CheckedRequests("krane.api.v1.DeploymentService"),
      pool_(std::move(pool)),
      tables_(std::move(tables)),
      engine_(engine),
      operators_(std::move(operators)),
      watch_limits_(watch_limits) {
  checkUnary("CreateDeployment", this, &DeploymentServiceImpl::CreateDeployment);
  checkUnary("GetDeployment", this, &DeploymentServiceImpl::GetDeployment);
  checkUnary("ListDeployments", this, &DeploymentServiceImpl::ListDeployments);
  checkServerStreaming("WatchDeployment", this, &DeploymentServiceImpl::WatchUntilFinished);
  checkUnary("CancelDeployment", this, &DeploymentServiceImpl::CancelDeployment);
  checkUnary("PromoteDeployment", this, &DeploymentServiceImpl::PromoteDeployment);
  checkUnary("RollbackEnvironment", this, &DeploymentServiceImpl::RollbackEnvironment);
}

grpc::Status DeploymentServiceImpl::CreateDeployment(grpc::ServerContext* context,
                                                     const v1::CreateDeploymentRequest* request,
                                                     v1::Deployment* response) {
  if (auto st = checkOperator(*context, *operators_); !st.ok()) return toGrpc(st);
  const v1::CreateDeploymentRequest& req = *request;
  for (const auto& [field, value, max, required] :
       std::vector<std::tuple<const char*, const std::string*, size_t, bool>>{
           {"app_id", &req.app_id(), 64, true},
           {"environment_id", &req.environment_id(), 64, true},
           {"git_branch", &req.git_branch(), 255, false},
           {"git_commit_sha", &req.git_commit_sha(), 64, false}}) {
    if (auto st = checkText(field, *value, max, required); !st.ok()) return toGrpc(st);
  }
  // It tags the image a build command makes: what an image tag allows.
  const std::string& sha = req.git_commit_sha();
  const bool tag_char_ok = std::all_of(sha.begin(), sha.end(),
                                       [](char c) {
                                         return std::isalnum(static_cast<unsigned char>(c)) ||
                                                c == '_' || c == '.' || c == '-';
                                       }) &&
                           (sha.empty() || (sha[0] != '.' && sha[0] != '-'));
  if (!tag_char_ok) {
    return toGrpc(
        invalid(strCat("git_commit_sha: ", singleQuoted(sha),
                       " is not a commit (letters, digits, '_', '.' and '-', not first)")));
  }
  auto build = buildOf(req);
  if (!build.ok()) return toGrpc(invalid(std::string(toStd(build.status().message()))));
  const std::string id = newId("dep");
  services::v1::DeployRequest deploy;
  *deploy.mutable_build() = *build;
  *deploy.mutable_spec() = req.spec();
  // The deployment and its workflow commit together: no crash or error between them can leave
  // a pending deployment that nothing deploys, cancels or finishes.
  absl::Status stored = pool_->transact(
      "create deployment",
      [&](db::Connection& conn) -> absl::Status {
        KRANE_ASSIGN_OR_RETURN(auto env,
                               conn.query("SELECT workspace_id, project_id FROM environments"
                                          " WHERE id = ? AND app_id = ? AND deleted_at IS NULL",
                                          {req.environment_id(), req.app_id()}));
        if (env.empty()) {
          return absl::NotFoundError(strCat("environment_id: no environment ",
                                            singleQuoted(req.environment_id()), " of app ",
                                            singleQuoted(req.app_id())));
        }
        KRANE_ASSIGN_OR_RETURN(auto regions,
                               conn.query("SELECT region_id, replicas FROM"
                                          " environment_regions WHERE environment_id = ?"
                                          " ORDER BY region_id LIMIT 1",
                                          {req.environment_id()}));
        if (regions.empty()) {
          return absl::FailedPreconditionError(strCat(
              "environment ", singleQuoted(req.environment_id()), " has no regions to deploy to"));
        }
        // The spec as every region will store it; refused here, nothing is written.
        feed::Resource probe;
        probe.set_type(std::string(feed::kDeploymentTopology));
        probe.set_id(id);
        probe.set_region(regions.rows[0].str("region_id"));
        auto* t = probe.mutable_deployment_topology();
        *t = req.spec();
        t->set_workspace_id(env.rows[0].str("workspace_id"));
        t->set_project_id(env.rows[0].str("project_id"));
        t->set_app_id(req.app_id());
        t->set_environment_id(req.environment_id());
        t->set_image(build->has_command() ? strCat(build->command().image_name(), ":check")
                                          : build->image());
        t->set_replicas(static_cast<uint32_t>(regions.rows[0].i64("replicas")));
        if (auto st = tables_->forType(feed::kDeploymentTopology).validate(probe); !st.ok()) {
          return invalid(strCat("spec: ", toStd(st.message())));
        }
        // The invocation id is recorded with the row, so a cancel finds it at once.
        absl::StatusOr<std::string> invocation_id = engine_.sendIn(
            conn, workflow::invocation(services::deploy::kServiceName, "Deploy", id, deploy, id));
        if (absl::IsInvalidArgument(invocation_id.status())) {
          return invalid(
              strCat("spec: the deploy workflow's ", toStd(invocation_id.status().message())));
        }
        KRANE_RETURN_IF_ERROR(invocation_id.status());
        return conn
            .exec(
                "INSERT INTO deployments (id, workspace_id, project_id, app_id, environment_id,"
                " status, git_branch, git_commit_sha, invocation_id, created_at) VALUES "
                "(?,?,?,?,?,'pending',?,?,?,?)",
                {id, env.rows[0].str("workspace_id"), env.rows[0].str("project_id"), req.app_id(),
                 req.environment_id(),
                 req.git_branch().empty() ? db::Value() : db::Value(req.git_branch()),
                 req.git_commit_sha().empty() ? db::Value() : db::Value(req.git_commit_sha()),
                 *invocation_id, unixMillis()})
            .status();
      },
      // As the engine's own sends: admission to the new key takes no gap locks.
      db::TxOptions{db::Isolation::kReadCommitted});
  if (!stored.ok()) return toGrpc(stored);
  engine_.notify();
  // Older queued siblings are superseded now. The deployment exists whatever happens here: a
  // sibling this misses and that has not started yet checks for a newer one itself.
  if (auto superseded = services::dedup::cancelOlderSiblings(*pool_, id); !superseded.ok()) {
    spdlog::warn("deployment {}: superseding older deployments of its branch failed: {}", id,
                 superseded.status().message());
  }
  auto conn = pool_->acquire();
  if (!conn.ok()) return toGrpc(conn.status());
  auto loaded = loadDeployment(**conn, id);
  if (!loaded.ok()) return toGrpc(loaded.status());
  *response = *std::move(loaded);
  return grpc::Status::OK;
}

grpc::Status DeploymentServiceImpl::GetDeployment(grpc::ServerContext* context,
                                                  const v1::DeploymentRef* request,
                                                  v1::Deployment* response) {
  if (auto st = checkOperator(*context, *operators_); !st.ok()) return toGrpc(st);
  auto loaded = deploymentById(*pool_, request->id());
  if (!loaded.ok()) return toGrpc(loaded.status());
  *response = *std::move(loaded);
  return grpc::Status::OK;
}

grpc::Status DeploymentServiceImpl::ListDeployments(grpc::ServerContext* context,
                                                    const v1::ListDeploymentsRequest* request,
                                                    v1::ListDeploymentsResponse* response) {
  if (auto st = checkOperator(*context, *operators_); !st.ok()) return toGrpc(st);
  if (request->app_id().empty() && request->environment_id().empty()) {
    return toGrpc(invalid("app_id: an app_id or an environment_id is required"));
  }
  for (const auto& [field, value] : {std::pair{"app_id", &request->app_id()},
                                     std::pair{"environment_id", &request->environment_id()}}) {
    if (auto st = checkText(field, *value, 64, false); !st.ok()) return toGrpc(st);
  }
  const uint32_t limit = request->limit() == 0 ? 50 : std::min<uint32_t>(request->limit(), 1000);
  std::string where = "1 = 1";
  db::Params params;
  if (!request->app_id().empty()) {
    where += " AND d.app_id = ?";
    params.emplace_back(request->app_id());
  }
  if (!request->environment_id().empty()) {
    where += " AND d.environment_id = ?";
    params.emplace_back(request->environment_id());
  }
  if (!request->page_token().empty()) {
    // "<created_at ms>/<id>" of the last deployment of the previous page: the next page starts
    // below it, whatever was created since (newer ones are on earlier pages).
    const std::string& token = request->page_token();
    const size_t slash = token.find('/');
    const std::optional<uint64_t> ms = slash == std::string::npos
                                           ? std::nullopt
                                           : parseUint64(std::string_view(token).substr(0, slash));
    if (!ms || *ms > static_cast<uint64_t>(INT64_MAX) || slash + 1 >= token.size()) {
      return toGrpc(invalid("page_token: not a token this server issued"));
    }
    const auto created_at = static_cast<int64_t>(*ms);
    where += " AND (d.created_at < ? OR (d.created_at = ? AND d.id < ?))";
    params.emplace_back(created_at);
    params.emplace_back(created_at);
    params.emplace_back(token.substr(slash + 1));
  }
  params.emplace_back(static_cast<uint64_t>(limit) + 1);  // one more: is there a next page?
  auto conn = pool_->acquire();
  if (!conn.ok()) return toGrpc(conn.status());
  // The page, then the steps and phases of all its deployments: three queries for any page.
  auto rows = (*conn)->query(strCat("SELECT ", kDeploymentColumns,
                                    " FROM deployments d JOIN apps a ON a.id = d.app_id WHERE ",
                                    where, " ORDER BY d.created_at DESC, d.id DESC LIMIT ?"),
                             params);
  if (!rows.ok()) return toGrpc(rows.status());
  std::vector<v1::Deployment*> page;
  for (size_t i = 0; i < rows->rows.size() && i < limit; ++i) {
    v1::Deployment* d = response->add_deployments();
    *d = deploymentOf(rows->rows[i]);
    page.push_back(d);
  }
  if (auto st = addStepsAndPhases(**conn, page); !st.ok()) return toGrpc(st);
  if (rows->rows.size() > limit) {
    const db::Row& last = rows->rows[limit - 1];
    response->set_next_page_token(strCat(last.i64("created_at"), "/", last.str("id")));
  }
  return grpc::Status::OK;
}

grpc::Status DeploymentServiceImpl::WatchUntilFinished(
    grpc::ServerContext* context, const v1::DeploymentRef* request,
    grpc::ServerWriterInterface<v1::Deployment>* writer) {
  if (auto st = checkOperator(*context, *operators_); !st.ok()) return toGrpc(st);
  // Each watch polls the database while it lives: their number is bounded, and so is how long
  // one lives (a client that watches for good, or that went away unseen, holds no slot for ever).
  struct Slot {
    std::atomic<size_t>& open;
    ~Slot() { open.fetch_sub(1); }
  };
  const size_t others = watches_.fetch_add(1);
  const Slot slot{watches_};
  if (others >= watch_limits_.max_streams) {
    return toGrpc(absl::ResourceExhaustedError(strCat(
        "too many deployment watches: this krane-ctrl serves at most ", watch_limits_.max_streams,
        " at once (deploy.watch_max_streams); watch again later, or read the deployment"
        " with GetDeployment")));
  }
  const auto ends = std::chrono::steady_clock::now() + watch_limits_.max_lifetime;
  std::string last;
  // Polled, since steps are written by whichever replica runs the deploy: every 200 ms after a
  // change, backing off to 1.6 s while nothing changes (a long build or wait costs a watcher a
  // few queries a second, not fifteen).
  std::chrono::milliseconds pause = kWatchPoll;
  for (;;) {
    auto d = deploymentById(*pool_, request->id());
    if (!d.ok()) return toGrpc(d.status());
    // Sent when anything an operator sees changed (status, a step, live).
    std::string now = d->SerializeAsString();
    if (now != last) {
      if (!writer->Write(*d)) return grpc::Status::OK;  // the client went away
      last = std::move(now);
      pause = kWatchPoll;
    } else {
      pause = std::min(pause * 2, kWatchPoll * 8);
    }
    if (finished(d->status())) return grpc::Status::OK;
    if (context->IsCancelled()) return grpc::Status::CANCELLED;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        ends - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      const int64_t limit_ms = watch_limits_.max_lifetime.count();
      return toGrpc(absl::OutOfRangeError(
          strCat("this watch of deployment ", singleQuoted(request->id()),
                 " reached its maximum lifetime (",
                 limit_ms % 1000 == 0 ? strCat(limit_ms / 1000, " s") : strCat(limit_ms, " ms"),
                 ", deploy.watch_max_lifetime_s); the deployment goes on, watch it again")));
    }
    std::this_thread::sleep_for(std::min(pause, left));
  }
}

grpc::Status DeploymentServiceImpl::CancelDeployment(grpc::ServerContext* context,
                                                     const v1::DeploymentRef* request,
                                                     v1::Deployment* response) {
  if (auto st = checkOperator(*context, *operators_); !st.ok()) return toGrpc(st);
  if (auto st = checkText("id", request->id(), 64, true); !st.ok()) return toGrpc(st);
  // The status is read under the row lock that every step of the deploy takes to move on, and
  // the cancel is requested in the same transaction: a deploy that went on to move routes (or
  // went live) is never cancelled, which would remove what now serves traffic.
  absl::Status cancelled =
      pool_->transact("cancel deployment", [&](db::Connection& conn) -> absl::Status {
        // The workflow's row first, then the deployment's, in the order the deploy's steps take
        // them (the fence check, then the step): no deadlock between the two. The invocation id
        // is written with the deployment and never changes.
        KRANE_ASSIGN_OR_RETURN(auto named, conn.query("SELECT invocation_id FROM deployments"
                                                      " WHERE id = ?",
                                                      {request->id()}));
        db::ResultSet workflow;
        if (!named.empty() && !named.rows[0].isNull("invocation_id")) {
          KRANE_ASSIGN_OR_RETURN(workflow,
                                 conn.query("SELECT status FROM workflow_invocations WHERE id = ?"
                                            " FOR UPDATE",
                                            {named.rows[0].str("invocation_id")}));
        }
        KRANE_ASSIGN_OR_RETURN(auto rows, conn.query("SELECT status, invocation_id FROM"
                                                     " deployments WHERE id = ? FOR UPDATE",
                                                     {request->id()}));
        const std::string id = singleQuoted(request->id());
        if (rows.empty()) return absl::NotFoundError(strCat("deployment ", id, " not found"));
        const std::string status = rows.rows[0].str("status");
        if (finished(status)) {
          return absl::FailedPreconditionError(
              strCat("deployment ", id, " already finished (", status, "): nothing to cancel"));
        }
        const auto invocation = rows.rows[0].optStr("invocation_id");
        if (!invocation) {
          return absl::FailedPreconditionError(
              strCat("deployment ", id, " has no deploy workflow to cancel"));
        }
        const std::string ended = workflow.empty() ? "gone" : workflow.rows[0].str("status");
        if (ended == "gone" || workflow::isFinalStatus(ended)) {
          // Its workflow ended without finishing it (killed: no compensations ran): nothing else
          // ever will. The cancel finishes the deployment itself.
          return services::deploy::markFinished(
              conn, request->id(), "cancelled",
              strCat("cancelled: its deploy workflow ", *invocation, " had ended (", ended, ")"));
        }
        if (status == "network" || status == "finalizing") {
          return absl::FailedPreconditionError(
              strCat("deployment ", id, " is ", status,
                     ": its routes are moving to it, too late to cancel; once it is ready,"
                     " roll back instead (kranectl rollback)"));
        }
        return workflow::cancelInvocationIn(conn, *invocation);
      });
  if (!cancelled.ok()) return toGrpc(cancelled);
  engine_.notify();
  auto loaded = deploymentById(*pool_, request->id());
  if (!loaded.ok()) return toGrpc(loaded.status());
  *response = *std::move(loaded);
  return grpc::Status::OK;
}

grpc::Status DeploymentServiceImpl::PromoteDeployment(grpc::ServerContext* context,
                                                      const v1::DeploymentRef* request,
                                                      v1::LiveChange* response) {
  if (auto st = checkOperator(*context, *operators_); !st.ok()) return toGrpc(st);
  auto d = deploymentById(*pool_, request->id());
  if (!d.ok()) return toGrpc(d.status());
  services::v1::SwapLiveRequest swap;
  swap.set_deployment_id(d->id());
  swap.set_reason(services::v1::SWAP_REASON_PROMOTE);
  auto swapped = workflow::resultAs<services::v1::SwapLiveResponse>(
      engine_.call(workflow::invocation(services::routing::kServiceName, "SwapLiveDeployment",
                                        d->environment_id(), swap),
                   kRoutingTimeout));
  if (!swapped.ok()) return toGrpc(swapped.status());
  fill(*swapped, response);
  return grpc::Status::OK;
}

grpc::Status DeploymentServiceImpl::RollbackEnvironment(
    grpc::ServerContext* context, const v1::RollbackEnvironmentRequest* request,
    v1::LiveChange* response) {
  if (auto st = checkOperator(*context, *operators_); !st.ok()) return toGrpc(st);
  if (auto st = checkText("environment_id", request->environment_id(), 64, true); !st.ok()) {
    return toGrpc(st);
  }
  auto rolled = workflow::resultAs<services::v1::SwapLiveResponse>(
      engine_.call(workflow::invocation(services::routing::kServiceName, "Rollback",
                                        request->environment_id(), services::v1::RollbackRequest()),
                   kRoutingTimeout));
  if (!rolled.ok()) return toGrpc(rolled.status());
  fill(*rolled, response);
  return grpc::Status::OK;
}

}  // namespace krane::api
