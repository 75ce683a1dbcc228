#include "controlplane/api/rollouts.h"

#include <thread>

#include "common/grpc_status.h"
#include "common/status.h"
#include "common/strings.h"
#include "controlplane/api/services.h"
#include "controlplane/services/sentinelrollout/rollout.h"
#include "controlplane/workflow/operations.h"
#include "controlplane/workflow/typed.h"

namespace krane::api {
namespace {

namespace rollout = services::sentinelrollout;
using services::v1::RolloutOperationRequest;
using services::v1::RolloutResponse;
using services::v1::RolloutStartRequest;

constexpr auto kStartTimeout = std::chrono::seconds(120);
constexpr auto kWatchPoll = std::chrono::milliseconds(250);
// RollbackAll answers when every reverted sentinel converged; past this (or the client's
// deadline) the call answers DEADLINE_EXCEEDED and the rollback goes on.
constexpr auto kRollbackTimeout = std::chrono::hours(1);

absl::Status invalid(const std::string& message) { return absl::InvalidArgumentError(message); }

std::chrono::milliseconds untilDeadline(const grpc::ServerContext& context,
                                        std::chrono::milliseconds cap) {
  const auto deadline = context.deadline();
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::system_clock::now());
  if (left <= std::chrono::milliseconds(0)) return cap;  // no deadline (far future overflows)
  // A fifth of it (at most 2 s) is left for the answer, which says whether anything was done.
  return std::min(left - std::min<std::chrono::milliseconds>(left / 5, std::chrono::seconds(2)),
                  cap);
}

absl::StatusOr<services::v1::SentinelRollout> readRollout(db::Pool& pool) {
  KRANE_ASSIGN_OR_RETURN(auto raw, workflow::readState(pool, rollout::kServiceName, rollout::kKey,
                                                       rollout::kStateName));
  if (!raw) return services::v1::SentinelRollout();
  return workflow::decodeAs<services::v1::SentinelRollout>(*raw, "rollout state");
}

std::string waveStatus(const services::v1::SentinelRollout& r, uint32_t index) {
  const auto& w = r.waves(index);
  if (index < r.current_wave()) return w.failed() > 0 ? "failed" : "done";
  if (index > r.current_wave()) return "pending";
  if (w.failed() > 0 && r.state() == services::v1::ROLLOUT_STATE_PAUSED) return "failed";
  if (r.baking()) return "baking";
  if (r.state() == services::v1::ROLLOUT_STATE_COMPLETED) return "done";
  return r.wave_started() > 0 || r.state() == services::v1::ROLLOUT_STATE_IN_PROGRESS ? "running"
                                                                                      : "pending";
}

}  // namespace

v1::SentinelRollout publicRollout(const services::v1::SentinelRollout& r) {
  v1::SentinelRollout out;
  out.set_rollout_id(r.rollout_id());
  out.set_state(rollout::stateName(r.state()));
  out.set_image(r.image());
  *out.mutable_wave_percentages() = r.wave_percentages();
  for (int i = 0; i < r.waves_size(); ++i) {
    const auto& in = r.waves(i);
    auto* w = out.add_waves();
    w->set_number(i + 1);
    w->set_sentinels(in.sentinel_ids_size());
    const bool current = static_cast<uint32_t>(i) == r.current_wave();
    w->set_ready(current && in.finished_at_ms() == 0 ? r.wave_ready() : in.ready());
    w->set_failed(in.failed());
    w->set_started(static_cast<uint32_t>(i) < r.current_wave() ? in.sentinel_ids_size()
                                                               : (current ? r.wave_started() : 0));
    w->set_status(waveStatus(r, i));
    w->set_started_at_ms(in.started_at_ms());
    w->set_finished_at_ms(in.finished_at_ms());
  }
  out.set_current_wave(
      r.waves_size() == 0 ? 0 : std::min<uint32_t>(r.current_wave() + 1, r.waves_size()));
  out.set_total(r.total());
  out.set_already_on_image(r.already_on_image());
  *out.mutable_failed_sentinel_ids() = r.failed_ids();
  out.set_slack_notifications(!r.slack_webhook_url().empty());
  out.set_bake_seconds(r.bake_ms() / 1000);
  out.set_max_parallel(r.max_parallel());
  out.set_started_at_ms(r.started_at_ms());
  out.set_updated_at_ms(r.updated_at_ms());
  out.set_message(r.message());
  out.set_reverted(r.reverted());
  return out;
}

RolloutServiceImpl::RolloutServiceImpl(std::shared_ptr<db::Pool> pool, workflow::Engine& engine,
                                       std::shared_ptr<const OperatorTokens> operators)
    : CheckedRequests("krane.api.v1.RolloutService"),
      pool_(std::move(pool)),
      engine_(engine),
      operators_(std::move(operators)) {
  checkUnary("StartSentinelRollout", this, &RolloutServiceImpl::StartSentinelRollout);
  checkUnary("GetSentinelRollout", this, &RolloutServiceImpl::GetSentinelRollout);
  checkServerStreaming("WatchSentinelRollout", this, &RolloutServiceImpl::Watch);
  checkUnary("ResumeSentinelRollout", this, &RolloutServiceImpl::ResumeSentinelRollout);
  checkUnary("CancelSentinelRollout", this, &RolloutServiceImpl::CancelSentinelRollout);
  checkUnary("RollbackSentinelRollout", this, &RolloutServiceImpl::RollbackSentinelRollout);
}

grpc::Status RolloutServiceImpl::StartSentinelRollout(
    grpc::ServerContext* context, const v1::StartSentinelRolloutRequest* request,
    v1::SentinelRollout* response) {
  if (auto st = checkOperator(*context, *operators_); !st.ok()) return toGrpc(st);
  const auto& req = *request;
  if (req.bake_seconds() < 0) return toGrpc(invalid("bake_seconds: must not be negative"));
  if (req.sentinel_timeout_seconds() < 0) {
    return toGrpc(invalid("sentinel_timeout_seconds: must not be negative"));
  }
  if (req.bake_seconds() > 24 * 3600) return toGrpc(invalid("bake_seconds: at most 86400"));
  if (req.sentinel_timeout_seconds() > 24 * 3600) {
    return toGrpc(invalid("sentinel_timeout_seconds: at most 86400"));
  }
  RolloutStartRequest start;
  start.set_image(req.image());
  *start.mutable_wave_percentages() = req.wave_percentages();
  start.set_slack_webhook_url(req.slack_webhook_url());
  start.set_bake_ms(req.bake_seconds() * 1000);
  start.set_max_parallel(req.max_parallel());
  start.set_deploy_timeout_ms(req.sentinel_timeout_seconds() * 1000);
  // Checked here too, so a bad request never becomes an invocation (whose input is kept).
  if (auto st = rollout::checkStartRequest(start); !st.ok()) {
    return toGrpc(invalid(std::string(toStd(st.message()))));
  }
  auto result = workflow::resultAs<RolloutResponse>(
      callOrWithdraw(workflow::invocation(rollout::kServiceName, "Rollout", rollout::kKey, start),
                     untilDeadline(*context, kStartTimeout)));
  if (!result.ok()) return toGrpc(result.status());
  *response = publicRollout(result->rollout());
  return grpc::Status::OK;
}

absl::StatusOr<std::string> RolloutServiceImpl::callOrWithdraw(
    const workflow::InvokeRequest& invoke, std::chrono::milliseconds timeout) {
  KRANE_ASSIGN_OR_RETURN(std::string id, engine_.send(invoke));
  absl::StatusOr<std::string> result = engine_.awaitResult(id, timeout);
  if (!absl::IsDeadlineExceeded(result.status())) return result;
  bool withdrawn = false;
  KRANE_RETURN_IF_ERROR(
      pool_->transact("withdraw rollout operation", [&](db::Connection& conn) -> absl::Status {
        withdrawn = false;
        KRANE_ASSIGN_OR_RETURN(auto rows, conn.query("SELECT status FROM workflow_invocations"
                                                     " WHERE id = ? FOR UPDATE",
                                                     {id}));
        if (rows.empty() || rows.rows[0].str("status") != "queued") return absl::OkStatus();
        withdrawn = true;
        return workflow::cancelInvocationIn(conn, id);
      }));
  if (withdrawn) {
    engine_.notify();
    return absl::AbortedError(
        strCat(invoke.handler, ": another rollout operation still holds the rollout after ",
               timeout.count(),
               " ms; nothing was done (kranectl rollout status shows what runs; try again)"));
  }
  return absl::DeadlineExceededError(
      strCat(invoke.handler, ": not finished after ", timeout.count(),
             " ms; it goes on (kranectl rollout status follows it)"));
}

grpc::Status RolloutServiceImpl::GetSentinelRollout(grpc::ServerContext* context,
                                                    const v1::GetSentinelRolloutRequest*,
                                                    v1::SentinelRollout* response) {
  if (auto st = checkOperator(*context, *operators_); !st.ok()) return toGrpc(st);
  auto r = readRollout(*pool_);
  if (!r.ok()) return toGrpc(r.status());
  *response = publicRollout(*r);
  return grpc::Status::OK;
}

grpc::Status RolloutServiceImpl::Watch(grpc::ServerContext* context,
                                       const v1::GetSentinelRolloutRequest*,
                                       grpc::ServerWriterInterface<v1::SentinelRollout>* writer) {
  if (auto st = checkOperator(*context, *operators_); !st.ok()) return toGrpc(st);
  std::string last;
  for (;;) {
    auto r = readRollout(*pool_);
    if (!r.ok()) return toGrpc(r.status());
    const v1::SentinelRollout shown = publicRollout(*r);
    std::string bytes = shown.SerializeAsString();
    if (bytes != last) {
      if (!writer->Write(shown)) return grpc::Status::OK;  // the client went away
      last = std::move(bytes);
    }
    if (r->state() != services::v1::ROLLOUT_STATE_IN_PROGRESS &&
        r->state() != services::v1::ROLLOUT_STATE_ROLLING_BACK) {
      return grpc::Status::OK;
    }
    if (context->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
    std::this_thread::sleep_for(kWatchPoll);
  }
}

grpc::Status RolloutServiceImpl::operation(grpc::ServerContext* context, const char* handler,
                                           v1::SentinelRollout* response) {
  if (auto st = checkOperator(*context, *operators_); !st.ok()) return toGrpc(st);
  workflow::InvokeRequest invoke = workflow::invocation(rollout::kServiceName, handler,
                                                        rollout::kKey, RolloutOperationRequest());
  const auto timeout = std::string_view(handler) == "RollbackAll"
                           ? untilDeadline(*context, kRollbackTimeout)
                           : untilDeadline(*context, kStartTimeout);
  // A start or resume that never got its turn is withdrawn; a cancel or rollback stays queued
  // and takes effect when the operation ahead of it ends.
  const bool withdraw = std::string_view(handler) == "Resume";
  auto result = workflow::resultAs<RolloutResponse>(withdraw ? callOrWithdraw(invoke, timeout)
                                                             : engine_.call(invoke, timeout));
  if (!result.ok()) return toGrpc(result.status());
  *response = publicRollout(result->rollout());
  return grpc::Status::OK;
}

grpc::Status RolloutServiceImpl::ResumeSentinelRollout(grpc::ServerContext* context,
                                                       const v1::GetSentinelRolloutRequest*,
                                                       v1::SentinelRollout* response) {
  return operation(context, "Resume", response);
}

grpc::Status RolloutServiceImpl::CancelSentinelRollout(grpc::ServerContext* context,
                                                       const v1::GetSentinelRolloutRequest*,
                                                       v1::SentinelRollout* response) {
  return operation(context, "Cancel", response);
}

grpc::Status RolloutServiceImpl::RollbackSentinelRollout(grpc::ServerContext* context,
                                                         const v1::GetSentinelRolloutRequest*,
                                                         v1::SentinelRollout* response) {
  return operation(context, "RollbackAll", response);
}

// --- sentinels -----------------------------------------------------------------------------------

namespace {

constexpr char kSentinelColumns[] =
    "id, environment_id, region_id, image, replicas, desired_state, deploy_status,"
    " running_image, health, available_replicas, ready_replicas, updated_replicas,"
    " observed_generation, status_reported_at, version, live_deployment_id";

v1::Sentinel sentinelOf(const db::Row& r) {
  v1::Sentinel s;
  s.set_id(r.str("id"));
  s.set_environment_id(r.str("environment_id"));
  s.set_region(r.str("region_id"));
  s.set_image(r.str("image"));
  s.set_replicas(static_cast<uint32_t>(r.u64("replicas")));
  s.set_desired_state(r.str("desired_state"));
  s.set_deploy_status(r.str("deploy_status"));
  s.set_running_image(r.optStr("running_image").value_or(""));
  s.set_health(r.str("health"));
  s.set_available_replicas(static_cast<uint32_t>(r.u64("available_replicas")));
  s.set_ready_replicas(static_cast<uint32_t>(r.u64("ready_replicas")));
  s.set_updated_replicas(static_cast<uint32_t>(r.u64("updated_replicas")));
  s.set_observed_generation(r.i64("observed_generation"));
  s.set_status_reported_at_ms(r.optI64("status_reported_at").value_or(0));
  s.set_version(r.u64("version"));
  s.set_live_deployment_id(r.optStr("live_deployment_id").value_or(""));
  return s;
}

}  // namespace

SentinelApiImpl::SentinelApiImpl(std::shared_ptr<db::Pool> pool,
                                 std::shared_ptr<const OperatorTokens> operators)
    : CheckedRequests("krane.api.v1.SentinelService"),
      pool_(std::move(pool)),
      operators_(std::move(operators)) {
  checkUnary("GetSentinel", this, &SentinelApiImpl::GetSentinel);
  checkUnary("ListSentinels", this, &SentinelApiImpl::ListSentinels);
}

grpc::Status SentinelApiImpl::GetSentinel(grpc::ServerContext* context,
                                          const v1::GetSentinelRequest* request,
                                          v1::Sentinel* response) {
  if (auto st = checkOperator(*context, *operators_); !st.ok()) return toGrpc(st);
  if (request->id().empty() || request->id().size() > 64) {
    return toGrpc(invalid("id: required, at most 64 bytes"));
  }
  auto conn = pool_->acquire();
  if (!conn.ok()) return toGrpc(conn.status());
  auto rows = (*conn)->query(
      strCat("SELECT ", kSentinelColumns, " FROM sentinels WHERE id = ? AND deleted_at IS NULL"),
      {request->id()});
  if (!rows.ok()) return toGrpc(rows.status());
  if (rows->empty()) {
    return toGrpc(absl::NotFoundError(strCat("no sentinel ", quote(request->id()))));
  }
  *response = sentinelOf(rows->rows[0]);
  return grpc::Status::OK;
}

grpc::Status SentinelApiImpl::ListSentinels(grpc::ServerContext* context,
                                            const v1::ListSentinelsRequest* request,
                                            v1::ListSentinelsResponse* response) {
  if (auto st = checkOperator(*context, *operators_); !st.ok()) return toGrpc(st);
  const auto& req = *request;
  if (req.page_size() > 1000) return toGrpc(invalid("page_size: at most 1000"));
  for (const auto& [field, value] : std::vector<std::pair<const char*, const std::string*>>{
           {"environment_id", &req.environment_id()},
           {"region", &req.region()},
           {"page_token", &req.page_token()}}) {
    if (value->size() > 64) return toGrpc(invalid(strCat(field, ": at most 64 bytes")));
  }
  const auto& status = req.deploy_status();
  if (!status.empty() && status != "idle" && status != "progressing" && status != "ready" &&
      status != "failed") {
    return toGrpc(invalid("deploy_status: idle, progressing, ready or failed"));
  }
  const uint32_t limit = req.page_size() == 0 ? 100 : req.page_size();
  auto conn = pool_->acquire();
  if (!conn.ok()) return toGrpc(conn.status());
  auto rows =
      (*conn)->query(strCat("SELECT ", kSentinelColumns,
                            " FROM sentinels WHERE deleted_at IS NULL AND id > ?"
                            " AND (? = '' OR environment_id = ?) AND (? = '' OR region_id = ?)"
                            " AND (? = '' OR deploy_status = ?) ORDER BY id LIMIT ?"),
                     {req.page_token(), req.environment_id(), req.environment_id(), req.region(),
                      req.region(), status, status, static_cast<uint64_t>(limit + 1)});
  if (!rows.ok()) return toGrpc(rows.status());
  for (size_t i = 0; i < rows->rows.size() && i < limit; ++i) {
    *response->add_sentinels() = sentinelOf(rows->rows[i]);
  }
  if (rows->rows.size() > limit) {
    response->set_next_page_token(response->sentinels(static_cast<int>(limit) - 1).id());
  }
  return grpc::Status::OK;
}

}  // namespace krane::api
