#include "controlplane/services/sentinel/sentinel.h"

#include <google/protobuf/util/message_differencer.h>

#include "common/status.h"
#include "common/strings.h"
#include "controlplane/workflow/operations.h"
#include "controlplane/workflow/typed.h"
#include "spdlog/spdlog.h"

namespace krane::services::sentinel {
namespace {

using services::v1::SENTINEL_DEPLOY_OUTCOME_FAILED;
using services::v1::SENTINEL_DEPLOY_OUTCOME_READY;
using workflow::Context;
using workflow::terminalError;

absl::Status invalid(std::string_view message) {
  return terminalError(absl::StatusCode::kInvalidArgument, message);
}

std::string seconds(std::chrono::milliseconds d) {
  return d.count() % 1000 == 0 ? strCat(d.count() / 1000, " s") : strCat(d.count(), " ms");
}

absl::Status checkRequest(const SentinelDeployRequest& req) {
  if (req.image().size() > 512) return invalid("image: at most 512 bytes");
  if (req.timeout_ms() < 0) return invalid("timeout_ms: must not be negative");
  return absl::OkStatus();
}

// Merges the set fields of `req` over `s`.
void merge(const SentinelDeployRequest& req, cluster::v1::Sentinel* s) {
  if (!req.image().empty()) s->set_image(req.image());
  if (req.has_replicas()) s->set_replicas(req.replicas());
  if (req.has_cpu_millicores()) s->set_cpu_millicores(req.cpu_millicores());
  if (req.has_memory_mib()) s->set_memory_mib(req.memory_mib());
  if (req.has_config_json()) s->set_config_json(req.config_json());
}

// The write step: merge, and either answer READY (nothing to do) or write the change (if any)
// and `progressing`, on the step's journal transaction.
absl::StatusOr<SentinelDeployResponse> write(feed::Writer& writer, db::Connection& conn,
                                             const std::string& id,
                                             const SentinelDeployRequest& req,
                                             std::vector<feed::WriteResult>* written) {
  written->clear();
  KRANE_ASSIGN_OR_RETURN(auto rows, conn.query("SELECT region_id, health, running_image"
                                               " FROM sentinels WHERE id = ? AND deleted_at IS NULL"
                                               " FOR UPDATE",
                                               {id}));
  if (rows.empty()) {
    return terminalError(absl::StatusCode::kNotFound, strCat("sentinel ", quote(id), " not found"));
  }
  const db::Row& row = rows.rows[0];
  const feed::ResourceTable& table = writer.tables().forType(feed::kSentinel);
  const feed::ResourceKey key{std::string(feed::kSentinel), id, row.str("region_id")};
  KRANE_ASSIGN_OR_RETURN(auto stored, table.load(conn, key));
  if (!stored || stored->deleted) {
    return terminalError(absl::StatusCode::kNotFound, strCat("sentinel ", quote(id), " not found"));
  }
  feed::Resource next = stored->resource;
  merge(req, next.mutable_sentinel());
  if (auto st = table.validate(next); !st.ok()) return invalid(toStd(st.message()));

  SentinelDeployResponse out;
  out.set_region(key.region);
  out.set_previous_image(stored->resource.sentinel().image());
  out.set_image(next.sentinel().image());
  const bool changed = !google::protobuf::util::MessageDifferencer::Equals(
      next.sentinel(), stored->resource.sentinel());
  const bool healthy = row.str("health") == "healthy" && !row.isNull("running_image") &&
                       row.str("running_image") == next.sentinel().image();
  if (!changed && healthy) {
    KRANE_RETURN_IF_ERROR(
        conn.exec("UPDATE sentinels SET deploy_status = 'ready' WHERE id = ?", {id}).status());
    out.set_outcome(SENTINEL_DEPLOY_OUTCOME_READY);
    out.set_unchanged(true);
    return out;
  }
  KRANE_RETURN_IF_ERROR(
      conn.exec("UPDATE sentinels SET deploy_status = 'progressing' WHERE id = ?", {id}).status());
  if (changed) {
    KRANE_ASSIGN_OR_RETURN(*written, writer.transactIn(conn, [&](feed::WriteTx& tx) {
      return tx.put(next, stored->resource.version());
    }));
  }
  return out;
}

absl::StatusOr<SentinelDeployResponse> deploy(Context& ctx, db::Pool& pool, feed::Writer& writer,
                                              const SentinelOptions& options,
                                              const SentinelDeployRequest& req) {
  KRANE_RETURN_IF_ERROR(checkRequest(req));
  // Stored before the change is written, so that a report arriving at once finds it.
  const workflow::Awakeable ready = ctx.awakeable();
  ctx.set(kReadyAwakeableState, ready.id);
  std::vector<feed::WriteResult> written;
  auto result = workflow::runTx<SentinelDeployResponse>(
      ctx, "write config", [&](db::Connection& conn) -> absl::StatusOr<SentinelDeployResponse> {
        return write(writer, conn, ctx.key(), req, &written);
      });
  writer.committed(written);  // empty when the step was replayed
  if (!result.ok() || result->outcome() == SENTINEL_DEPLOY_OUTCOME_READY) {
    ctx.clear(kReadyAwakeableState);
    return result;
  }

  const auto timeout =
      req.timeout_ms() > 0 ? std::chrono::milliseconds(req.timeout_ms()) : options.deploy_timeout;
  auto selected = ctx.select({ready.future, ctx.timer(timeout)});
  if (!selected.ok()) return selected.status();  // cancelled
  ctx.clear(kReadyAwakeableState);
  SentinelDeployResponse out = *result;
  if (selected->index == 0 && selected->result.ok()) {
    out.set_outcome(SENTINEL_DEPLOY_OUTCOME_READY);  // the ingestor made the row ready
    return out;
  }
  // Timed out: failed, unless a report flipped the row meanwhile (its notification lost).
  // The final deploy_status, as a journaled step.
  auto status = ctx.run("settle", [&]() -> absl::StatusOr<std::string> {
    KRANE_ASSIGN_OR_RETURN(auto conn, pool.acquire());
    KRANE_RETURN_IF_ERROR(conn->exec("UPDATE sentinels SET deploy_status = 'failed'"
                                     " WHERE id = ? AND deploy_status = 'progressing'",
                                     {ctx.key()})
                              .status());
    KRANE_ASSIGN_OR_RETURN(
        auto rows, conn->query("SELECT deploy_status FROM sentinels WHERE id = ?", {ctx.key()}));
    return rows.empty() ? std::string("failed") : rows.rows[0].str(0);
  });
  if (!status.ok()) return status.status();
  if (*status == "ready") {
    out.set_outcome(SENTINEL_DEPLOY_OUTCOME_READY);
  } else {
    out.set_outcome(SENTINEL_DEPLOY_OUTCOME_FAILED);
    out.set_message(strCat("sentinel ", ctx.key(), " in ", out.region(),
                           " did not report healthy on ", out.image(), " within ",
                           seconds(timeout)));
  }
  return out;
}

absl::StatusOr<SentinelNotifyReadyResponse> notifyReady(Context& ctx,
                                                        const SentinelNotifyReadyRequest&) {
  SentinelNotifyReadyResponse out;
  auto waiting = ctx.get(kReadyAwakeableState);
  if (!waiting) return out;  // nobody waits: the next Deploy reads the row itself
  ctx.resolveAwakeable(*waiting, "");
  out.set_resolved(true);
  return out;
}

}  // namespace

workflow::ServiceDefinition sentinelService(std::shared_ptr<db::Pool> pool,
                                            std::shared_ptr<feed::Writer> writer,
                                            SentinelOptions options) {
  using workflow::typed;
  return workflow::ServiceDefinition::virtualObject(kServiceName)
      .exclusive("Deploy",
                 typed<SentinelDeployRequest, SentinelDeployResponse>(
                     [pool, writer, options](Context& ctx, const SentinelDeployRequest& req) {
                       return deploy(ctx, *pool, *writer, options, req);
                     }))
      .shared("NotifyReady",
              typed<SentinelNotifyReadyRequest, SentinelNotifyReadyResponse>(notifyReady));
}

void ReadyNotifier::onSentinelReady(const std::string& sentinel_id, const std::string& region) {
  auto waiting = workflow::readState(*pool_, kServiceName, sentinel_id, kReadyAwakeableState);
  if (!waiting.ok() || !*waiting) return;  // not waiting: Deploy reads the row when it starts
  auto sent =
      workflow::sendOncePerWait(engine_, kServiceName, "NotifyReady", sentinel_id, **waiting);
  if (!sent.ok()) {
    spdlog::warn("sentinel: notifying sentinel={} region={} of its convergence failed: {}",
                 sentinel_id, region, sent.status().message());
  }
}

}  // namespace krane::services::sentinel
