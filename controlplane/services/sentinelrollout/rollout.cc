#include "controlplane/services/sentinelrollout/rollout.h"

#include <algorithm>
#include <limits>
#include <map>
#include <set>

#include "absl/strings/str_join.h"
#include "common/clock.h"
#include "common/status.h"
#include "common/strings.h"
#include "controlplane/services/sentinel/sentinel.h"
#include "controlplane/workflow/typed.h"
#include "spdlog/spdlog.h"

namespace krane::services::sentinelrollout {
namespace {

using services::v1::RolloutStepRequest;
using services::v1::RolloutWave;
using services::v1::SentinelPage;
using workflow::Context;
using workflow::terminalError;
using RS = services::v1::RolloutState;
using sentinel::SentinelDeployRequest;
using sentinel::SentinelDeployResponse;

const std::vector<uint32_t> kDefaultWaves = {1, 5, 25, 50, 100};

absl::Status invalid(std::string_view message) {
  return terminalError(absl::StatusCode::kInvalidArgument, message);
}

absl::Status wrongState(const SentinelRollout& r, std::string_view operation,
                        std::string_view allowed) {
  return terminalError(
      absl::StatusCode::kFailedPrecondition,
      strCat(operation, " needs a rollout that is ", allowed, "; the rollout",
             r.image().empty() ? "" : strCat(" to ", r.image()), " is ", stateName(r.state())));
}

int64_t now(Context& ctx, std::string_view name) {
  auto value =
      ctx.run(name, [] { return absl::StatusOr<std::string>(std::to_string(unixMillis())); });
  return value.ok() ? std::stoll(*value) : 0;
}

SentinelRollout load(Context& ctx) {
  auto state = workflow::getState<SentinelRollout>(ctx, kStateName);
  if (!state.ok() || !*state) return SentinelRollout();  // idle
  return **state;
}

// Posts `text` to the rollout's webhook as a journaled step; never fails.
void notify(Context& ctx, const SentinelRollout& r, const SlackOptions& options,
            const std::string& text) {
  if (r.slack_webhook_url().empty()) return;
  (void)ctx.run(strCat("slack: ", text), [&]() -> absl::StatusOr<std::string> {
    if (auto posted = postSlack(r.slack_webhook_url(), text, options); !posted.ok()) {
      spdlog::warn("rollout: {} (the rollout goes on)", posted.message());
      return std::string("failed");
    }
    return std::string("posted");
  });
}

std::string waveLabel(const SentinelRollout& r, uint32_t wave) {
  return strCat("wave ", wave + 1, "/", r.waves_size(), " (", r.waves(wave).sentinel_ids_size(),
                " sentinels)");
}

// Sentinels of the rollout given the new image: those of the waves that ran and the started part
// of the current one. The failed ones too: a Deploy commits the image before it waits, and one
// that failed its wait runs (or tries to run) the new image as much as the others.
std::vector<std::string> started(const SentinelRollout& r) {
  std::vector<std::string> out;
  for (uint32_t w = 0; w < static_cast<uint32_t>(r.waves_size()) && w <= r.current_wave(); ++w) {
    const auto& ids = r.waves(w).sentinel_ids();
    const int started =
        w < r.current_wave() ? ids.size() : std::min<int>(ids.size(), r.wave_started());
    out.insert(out.end(), ids.begin(), ids.begin() + started);
  }
  return out;
}

// Deploys `image` (or each one's previous image when `previous` is given) to `ids`, at most
// `parallel` at once, each batch collected in one wait. Returns the ids that did not become
// ready.
std::vector<std::string> deployAll(Context& ctx, const std::vector<std::string>& ids,
                                   const std::function<std::string(const std::string&)>& image_of,
                                   int64_t timeout_ms, uint32_t parallel, absl::Status* cancelled) {
  std::vector<std::string> failed;
  for (size_t start = 0; start < ids.size(); start += parallel) {
    const size_t end = std::min(ids.size(), start + parallel);
    std::vector<workflow::TypedFuture<SentinelDeployResponse>> futures;
    for (size_t i = start; i < end; ++i) {
      SentinelDeployRequest req;
      req.set_image(image_of(ids[i]));
      req.set_timeout_ms(timeout_ms);
      futures.push_back(workflow::call<SentinelDeployResponse>(ctx, sentinel::kServiceName,
                                                               "Deploy", ids[i], req));
    }
    auto results = workflow::awaitAll(ctx, futures);
    if (!results.ok()) {
      *cancelled = results.status();
      return failed;
    }
    for (size_t i = 0; i < results->size(); ++i) {
      const auto& result = (*results)[i];
      if (!result.ok() || result->outcome() != services::v1::SENTINEL_DEPLOY_OUTCOME_READY) {
        failed.push_back(ids[start + i]);
      }
    }
  }
  return failed;
}

absl::Status save(Context& ctx, SentinelRollout& r, std::string_view step) {
  r.set_updated_at_ms(now(ctx, strCat("clock: ", step)));
  workflow::setState(ctx, kStateName, r);
  return absl::OkStatus();
}

void sendStep(Context& ctx, const SentinelRollout& r,
              std::chrono::milliseconds delay = std::chrono::milliseconds(0)) {
  RolloutStepRequest step;
  step.set_rollout_id(r.rollout_id());
  workflow::send(ctx, kServiceName, "Step", kKey, step, delay);
}

// Moves to the next wave, or completes the rollout.
void nextWave(Context& ctx, SentinelRollout& r, const RolloutOptions& options) {
  r.set_current_wave(r.current_wave() + 1);
  r.set_wave_started(0);
  r.set_wave_ready(0);
  r.set_baking(false);
  if (r.current_wave() >= static_cast<uint32_t>(r.waves_size())) {
    r.set_state(RS::ROLLOUT_STATE_COMPLETED);
    r.set_message(
        strCat(r.total() - r.failed_ids_size(), " of ", r.total(), " sentinels on ", r.image()));
    (void)save(ctx, r, "complete");
    notify(ctx, r, options.slack,
           strCat("Sentinel rollout to ", r.image(), " completed: ", r.message()));
    return;
  }
  (void)save(ctx, r, strCat("start wave ", r.current_wave() + 1));
  sendStep(ctx, r);
}

absl::StatusOr<RolloutResponse> start(Context& ctx, db::Pool& pool, const RolloutOptions& options,
                                      const RolloutStartRequest& req) {
  KRANE_RETURN_IF_ERROR(checkStartRequest(req));
  SentinelRollout current = load(ctx);
  if (current.state() == RS::ROLLOUT_STATE_IN_PROGRESS ||
      current.state() == RS::ROLLOUT_STATE_PAUSED ||
      current.state() == RS::ROLLOUT_STATE_ROLLING_BACK) {
    return terminalError(
        absl::StatusCode::kFailedPrecondition,
        strCat("a rollout to ", current.image(), " is ", stateName(current.state()),
               ": resume, cancel or roll it back before starting another"));
  }

  // The running sentinels, page by page, each page a journaled step.
  std::vector<std::string> ids;
  std::map<std::string, std::vector<std::string>> previous;  // image -> ids
  uint32_t already = 0;
  int64_t started_at = 0;
  std::string after;
  for (int page = 0;; ++page) {
    auto listed = workflow::run<SentinelPage>(
        ctx, strCat("list sentinels, page ", page + 1), [&]() -> absl::StatusOr<SentinelPage> {
          KRANE_ASSIGN_OR_RETURN(auto conn, pool.acquire());
          KRANE_ASSIGN_OR_RETURN(auto rows,
                                 conn->query("SELECT id, image FROM sentinels WHERE desired_state ="
                                             " 'running' AND deleted_at IS NULL AND id > ?"
                                             " ORDER BY id LIMIT ?",
                                             {after, static_cast<uint64_t>(options.page_size)}));
          SentinelPage out;
          for (const db::Row& row : rows.rows) {
            out.add_sentinel_ids(row.str(0));
            out.add_images(row.str(1));
          }
          out.set_now_ms(unixMillis());
          return out;
        });
    if (!listed.ok()) return listed.status();
    if (page == 0) started_at = listed->now_ms();
    for (int i = 0; i < listed->sentinel_ids_size(); ++i) {
      if (listed->images(i) == req.image()) {
        ++already;
        continue;
      }
      ids.push_back(listed->sentinel_ids(i));
      previous[listed->images(i)].push_back(listed->sentinel_ids(i));
    }
    if (listed->sentinel_ids_size() < static_cast<int>(options.page_size)) break;
    after = listed->sentinel_ids(listed->sentinel_ids_size() - 1);
  }

  SentinelRollout r;
  r.set_rollout_id(ctx.invocationId());
  r.set_state(RS::ROLLOUT_STATE_IN_PROGRESS);
  r.set_image(req.image());
  const std::vector<uint32_t> percentages =
      req.wave_percentages().empty()
          ? kDefaultWaves
          : std::vector<uint32_t>(req.wave_percentages().begin(), req.wave_percentages().end());
  for (uint32_t p : percentages) r.add_wave_percentages(p);
  for (auto& wave : computeWaves(ids, percentages)) {
    auto* w = r.add_waves();
    for (auto& id : wave) w->add_sentinel_ids(std::move(id));
  }
  for (auto& [image, members] : previous) {
    auto* p = r.add_previous_images();
    p->set_image(image);
    for (auto& id : members) p->add_sentinel_ids(std::move(id));
  }
  r.set_slack_webhook_url(req.slack_webhook_url());
  r.set_bake_ms(req.bake_ms());
  r.set_max_parallel(req.max_parallel() > 0 ? req.max_parallel() : options.max_parallel);
  r.set_deploy_timeout_ms(req.deploy_timeout_ms());
  r.set_started_at_ms(started_at);
  r.set_updated_at_ms(started_at);
  r.set_total(static_cast<uint32_t>(ids.size()));
  r.set_already_on_image(already);
  workflow::setState(ctx, kStateName, r);
  spdlog::info("rollout: {} started: {} sentinels in {} waves, {} already on the image", r.image(),
               r.total(), r.waves_size(), already);
  notify(ctx, r, options.slack,
         strCat("Sentinel rollout to ", r.image(), " started: ", r.total(), " sentinels in ",
                r.waves_size(), " waves (", already, " already on the image)"));
  if (r.waves_size() == 0) {
    r.set_current_wave(0);
    r.set_state(RS::ROLLOUT_STATE_COMPLETED);
    r.set_message(strCat("every running sentinel is already on ", r.image()));
    workflow::setState(ctx, kStateName, r);
    notify(ctx, r, options.slack,
           strCat("Sentinel rollout to ", r.image(), " completed: ", r.message()));
  } else {
    sendStep(ctx, r);
  }
  RolloutResponse out;
  *out.mutable_rollout() = redacted(r);
  return out;
}

absl::StatusOr<RolloutResponse> step(Context& ctx, db::Pool& pool, const RolloutOptions& options,
                                     const RolloutStepRequest& req) {
  SentinelRollout r = load(ctx);
  RolloutResponse out;
  if (r.state() != RS::ROLLOUT_STATE_IN_PROGRESS || r.rollout_id() != req.rollout_id() ||
      r.current_wave() >= static_cast<uint32_t>(r.waves_size())) {
    *out.mutable_rollout() = redacted(r);
    return out;  // cancelled, paused or replaced meanwhile
  }
  const uint32_t w = r.current_wave();
  RolloutWave* wave = r.mutable_waves(w);
  const std::vector<std::string> ids(wave->sentinel_ids().begin(), wave->sentinel_ids().end());

  if (r.baking()) {
    // The wave's sentinels must still be healthy on the image after the bake.
    const std::set<std::string> failed_before(r.failed_ids().begin(), r.failed_ids().end());
    auto unhealthy = workflow::run<SentinelPage>(
        ctx, strCat("bake check of wave ", w + 1), [&]() -> absl::StatusOr<SentinelPage> {
          SentinelPage out;
          KRANE_ASSIGN_OR_RETURN(auto conn, pool.acquire());
          for (size_t start = 0; start < ids.size(); start += 500) {
            db::Params params = {r.image()};
            for (size_t i = start; i < std::min(ids.size(), start + 500); ++i) {
              params.emplace_back(ids[i]);
            }
            const std::string sql = strCat(
                "SELECT id FROM sentinels WHERE (health <> 'healthy' OR running_image IS NULL OR"
                " running_image <> ?) AND id IN (",
                db::placeholders(params.size() - 1), ") ORDER BY id");
            KRANE_ASSIGN_OR_RETURN(auto rows, conn->query(sql, params));
            for (const db::Row& row : rows.rows) {
              if (!failed_before.count(row.str(0))) out.add_sentinel_ids(row.str(0));
            }
          }
          return out;
        });
    if (!unhealthy.ok()) return unhealthy.status();
    if (unhealthy->sentinel_ids_size() > 0) {
      for (const auto& id : unhealthy->sentinel_ids()) r.add_failed_ids(id);
      wave->set_failed(wave->failed() + unhealthy->sentinel_ids_size());
      wave->set_ready(wave->ready() -
                      std::min<uint32_t>(wave->ready(), unhealthy->sentinel_ids_size()));
      r.set_state(RS::ROLLOUT_STATE_PAUSED);
      r.set_message(strCat(unhealthy->sentinel_ids_size(), " sentinels of ", waveLabel(r, w),
                           " did not stay healthy for the bake time: ",
                           absl::StrJoin(unhealthy->sentinel_ids(), ", ")));
      (void)save(ctx, r, strCat("pause after the bake of wave ", w + 1));
      notify(ctx, r, options.slack,
             strCat("Sentinel rollout to ", r.image(), " paused: ", r.message()));
      *out.mutable_rollout() = redacted(r);
      return out;
    }
    nextWave(ctx, r, options);
    *out.mutable_rollout() = redacted(r);
    return out;
  }

  if (r.wave_started() == 0) {
    wave->set_started_at_ms(now(ctx, strCat("clock: wave ", w + 1, " starts")));
    notify(ctx, r, options.slack,
           strCat("Sentinel rollout to ", r.image(), ": ", waveLabel(r, w), " started"));
  }
  const size_t begin = r.wave_started();
  const size_t end = std::min(ids.size(), begin + std::max<uint32_t>(1, r.max_parallel()));
  const std::vector<std::string> chunk(ids.begin() + begin, ids.begin() + end);
  absl::Status cancelled;
  const std::string image = r.image();
  auto failed = deployAll(
      ctx, chunk, [&](const std::string&) { return image; }, r.deploy_timeout_ms(),
      static_cast<uint32_t>(chunk.size()), &cancelled);
  if (!cancelled.ok()) return cancelled;
  for (const auto& id : failed) r.add_failed_ids(id);
  r.set_wave_started(static_cast<uint32_t>(end));
  r.set_wave_ready(r.wave_ready() + static_cast<uint32_t>(chunk.size() - failed.size()));
  wave->set_failed(wave->failed() + static_cast<uint32_t>(failed.size()));
  if (end < ids.size()) {
    (void)save(ctx, r, strCat("wave ", w + 1, " at ", end));
    sendStep(ctx, r);
    *out.mutable_rollout() = redacted(r);
    return out;
  }

  wave->set_ready(r.wave_ready());
  wave->set_finished_at_ms(now(ctx, strCat("clock: wave ", w + 1, " ends")));
  if (wave->failed() > 0) {
    std::vector<std::string> wave_failed;
    const std::set<std::string> in_wave(ids.begin(), ids.end());
    for (const auto& id : r.failed_ids()) {
      if (in_wave.count(id)) wave_failed.push_back(id);
    }
    r.set_state(RS::ROLLOUT_STATE_PAUSED);
    r.set_message(strCat(wave->failed(), " of ", ids.size(), " sentinels of wave ", w + 1,
                         " did not become ready: ", absl::StrJoin(wave_failed, ", ")));
    (void)save(ctx, r, strCat("pause in wave ", w + 1));
    notify(ctx, r, options.slack,
           strCat("Sentinel rollout to ", r.image(), " paused: ", r.message()));
    *out.mutable_rollout() = redacted(r);
    return out;
  }
  notify(ctx, r, options.slack,
         strCat("Sentinel rollout to ", r.image(), ": ", waveLabel(r, w), " completed"));
  if (r.bake_ms() > 0) {
    r.set_baking(true);
    (void)save(ctx, r, strCat("bake wave ", w + 1));
    sendStep(ctx, r, std::chrono::milliseconds(r.bake_ms()));
  } else {
    nextWave(ctx, r, options);
  }
  *out.mutable_rollout() = redacted(r);
  return out;
}

absl::StatusOr<RolloutResponse> resume(Context& ctx, const RolloutOptions& options,
                                       const RolloutOperationRequest&) {
  SentinelRollout r = load(ctx);
  if (r.state() != RS::ROLLOUT_STATE_PAUSED) return wrongState(r, "resume", "paused");
  r.set_state(RS::ROLLOUT_STATE_IN_PROGRESS);
  r.set_message("");
  notify(
      ctx, r, options.slack,
      strCat("Sentinel rollout to ", r.image(), " resumed after ", waveLabel(r, r.current_wave()),
             " (", r.failed_ids_size(), " failed sentinels are not retried)"));
  nextWave(ctx, r, options);
  RolloutResponse out;
  *out.mutable_rollout() = redacted(r);
  return out;
}

absl::StatusOr<RolloutResponse> cancel(Context& ctx, const RolloutOptions& options,
                                       const RolloutOperationRequest&) {
  SentinelRollout r = load(ctx);
  if (r.state() != RS::ROLLOUT_STATE_IN_PROGRESS && r.state() != RS::ROLLOUT_STATE_PAUSED) {
    return wrongState(r, "cancel", "in progress or paused");
  }
  r.set_state(RS::ROLLOUT_STATE_CANCELLED);
  r.set_message("cancelled by an operator; sentinels stay on the image they run");
  (void)save(ctx, r, "cancel");
  notify(ctx, r, options.slack, strCat("Sentinel rollout to ", r.image(), " cancelled"));
  RolloutResponse out;
  *out.mutable_rollout() = redacted(r);
  return out;
}

absl::StatusOr<RolloutResponse> rollbackAll(Context& ctx, const RolloutOptions& options,
                                            const RolloutOperationRequest&) {
  SentinelRollout r = load(ctx);
  if (r.state() != RS::ROLLOUT_STATE_PAUSED && r.state() != RS::ROLLOUT_STATE_CANCELLED &&
      r.state() != RS::ROLLOUT_STATE_ROLLING_BACK) {
    return wrongState(r, "rollback", "paused or cancelled");
  }
  const std::vector<std::string> ids = started(r);
  std::map<std::string, std::string> previous;
  for (const auto& group : r.previous_images()) {
    for (const auto& id : group.sentinel_ids()) previous[id] = group.image();
  }
  r.set_state(RS::ROLLOUT_STATE_ROLLING_BACK);
  (void)save(ctx, r, "rollback starts");
  notify(ctx, r, options.slack,
         strCat("Sentinel rollback from ", r.image(), " started: ", ids.size(), " sentinels"));
  absl::Status cancelled;
  auto failed = deployAll(
      ctx, ids, [&](const std::string& id) { return previous[id]; }, r.deploy_timeout_ms(),
      std::max<uint32_t>(1, r.max_parallel()), &cancelled);
  if (!cancelled.ok()) return cancelled;
  r.set_reverted(static_cast<uint32_t>(ids.size() - failed.size()));
  r.set_state(RS::ROLLOUT_STATE_CANCELLED);
  r.set_message(strCat(
      "rolled back: ", r.reverted(), " of ", ids.size(), " sentinels back on their previous image",
      failed.empty() ? "" : strCat("; not converged: ", absl::StrJoin(failed, ", "))));
  (void)save(ctx, r, "rollback ends");
  notify(ctx, r, options.slack,
         strCat("Sentinel rollback from ", r.image(), " completed: ", r.message()));
  RolloutResponse out;
  *out.mutable_rollout() = redacted(r);
  return out;
}

absl::StatusOr<RolloutResponse> get(Context& ctx, const RolloutOperationRequest&) {
  RolloutResponse out;
  *out.mutable_rollout() = redacted(load(ctx));
  return out;
}

}  // namespace

std::vector<std::vector<std::string>> computeWaves(const std::vector<std::string>& ids,
                                                   const std::vector<uint32_t>& percentages) {
  std::vector<std::vector<std::string>> waves;
  size_t begin = 0;
  for (uint32_t p : percentages) {
    const size_t end = std::min(ids.size(), (ids.size() * p + 99) / 100);
    if (end > begin) waves.emplace_back(ids.begin() + begin, ids.begin() + end);
    begin = std::max(begin, end);
  }
  return waves;
}

absl::Status checkStartRequest(const RolloutStartRequest& req) {
  if (req.image().empty()) return invalid("image: required");
  if (req.image().size() > 512) return invalid("image: at most 512 bytes");
  uint32_t last = 0;
  for (int i = 0; i < req.wave_percentages_size(); ++i) {
    const uint32_t p = req.wave_percentages(i);
    if (p == 0 || p > 100 || p <= last) {
      return invalid(strCat("wave_percentages[", i,
                            "]: percentages must increase, each from 1 to 100 (got ", p,
                            i == 0 ? "" : strCat(" after ", last), ")"));
    }
    last = p;
  }
  if (req.wave_percentages_size() > 0 && last != 100) {
    return invalid("wave_percentages: the last wave must end at 100");
  }
  if (req.wave_percentages_size() > 100) return invalid("wave_percentages: at most 100 waves");
  if (!req.slack_webhook_url().empty()) {
    if (auto st = checkWebhookUrl("slack_webhook_url", req.slack_webhook_url()); !st.ok()) {
      return invalid(toStd(st.message()));
    }
  }
  if (req.bake_ms() < 0) return invalid("bake_ms: must not be negative");
  if (req.bake_ms() > 24LL * 3600 * 1000) return invalid("bake_ms: at most 24 hours");
  if (req.max_parallel() > 10000) return invalid("max_parallel: at most 10000");
  if (req.deploy_timeout_ms() < 0) return invalid("deploy_timeout_ms: must not be negative");
  return absl::OkStatus();
}

SentinelRollout redacted(SentinelRollout rollout) {
  rollout.clear_slack_webhook_url();
  return rollout;
}

std::string stateName(RolloutState state) {
  switch (state) {
    case RS::ROLLOUT_STATE_IDLE:
      return "idle";
    case RS::ROLLOUT_STATE_IN_PROGRESS:
      return "in_progress";
    case RS::ROLLOUT_STATE_PAUSED:
      return "paused";
    case RS::ROLLOUT_STATE_ROLLING_BACK:
      return "rolling_back";
    case RS::ROLLOUT_STATE_CANCELLED:
      return "cancelled";
    case RS::ROLLOUT_STATE_COMPLETED:
      return "completed";
    default:
      return "unknown";
  }
}

workflow::ServiceDefinition sentinelRolloutService(std::shared_ptr<db::Pool> pool,
                                                   RolloutOptions options) {
  using workflow::typed;
  using Op = RolloutOperationRequest;
  return workflow::ServiceDefinition::virtualObject(kServiceName)
      .exclusive("Rollout", typed<RolloutStartRequest, RolloutResponse>(
                                [pool, options](Context& ctx, const RolloutStartRequest& req) {
                                  return start(ctx, *pool, options, req);
                                }))
      .exclusive("Step", typed<RolloutStepRequest, RolloutResponse>(
                             [pool, options](Context& ctx, const RolloutStepRequest& req) {
                               return step(ctx, *pool, options, req);
                             }))
      .exclusive("Resume", typed<Op, RolloutResponse>([options](Context& ctx, const Op& req) {
                   return resume(ctx, options, req);
                 }))
      .exclusive("Cancel", typed<Op, RolloutResponse>([options](Context& ctx, const Op& req) {
                   return cancel(ctx, options, req);
                 }))
      .exclusive("RollbackAll", typed<Op, RolloutResponse>([options](Context& ctx, const Op& req) {
                   return rollbackAll(ctx, options, req);
                 }))
      .shared("Get", typed<Op, RolloutResponse>(get))
      // A step that gave up would leave the rollout in progress with nothing to move it on
      // (Resume takes a paused one, a new Rollout is refused): a database outage is waited out,
      // retried every minute at most, for as long as it lasts.
      .retry(workflow::RetryPolicy{std::chrono::seconds(1), 2.0, std::chrono::seconds(60),
                                   std::numeric_limits<int>::max(), workflow::OnExhausted::kPause});
}

}  // namespace krane::services::sentinelrollout
