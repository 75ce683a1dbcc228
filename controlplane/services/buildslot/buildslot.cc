#include "controlplane/services/buildslot/buildslot.h"

#include <algorithm>

#include "absl/strings/str_split.h"
#include "common/status.h"
#include "common/strings.h"
#include "controlplane/workflow/operations.h"
#include "controlplane/workflow/typed.h"

namespace krane::services::buildslot {
namespace {

using workflow::Context;
using workflow::terminalError;

constexpr char kStateKey[] = "slots";
// The three state keys of the first version, each a JSON array, read once and then replaced.
constexpr const char* kLegacyKeys[] = {"active_slots", "prod_wait_list", "preview_wait_list"};
constexpr const char* kLegacyFields[] = {"active", "production", "preview"};

absl::Status required(const std::string& value, std::string_view field) {
  if (!value.empty()) return absl::OkStatus();
  return terminalError(absl::StatusCode::kInvalidArgument,
                       strCat(field, ": required, a non-empty string"));
}

// The state of one workspace, read through the context (journaled). `was_legacy` tells whether it
// came from the first version's keys, which the next save() removes.
absl::StatusOr<BuildSlots> load(Context& ctx, bool* was_legacy = nullptr) {
  KRANE_ASSIGN_OR_RETURN(std::optional<BuildSlots> slots,
                         workflow::getState<BuildSlots>(ctx, kStateKey));
  if (slots) return *slots;
  // State written by the first version: its arrays are the fields of BuildSlots.
  std::string legacy;
  for (size_t i = 0; i < std::size(kLegacyKeys); ++i) {
    if (auto v = ctx.get(kLegacyKeys[i])) {
      legacy += strCat(legacy.empty() ? "{" : ",", "\"", kLegacyFields[i], "\":", *v);
    }
  }
  if (legacy.empty()) return BuildSlots();
  if (was_legacy != nullptr) *was_legacy = true;
  return workflow::decodeAs<BuildSlots>(legacy + "}", "state 'active_slots'");
}

void save(Context& ctx, const BuildSlots& s, bool legacy) {
  workflow::setState(ctx, kStateKey, s);
  if (!legacy) return;
  for (const char* key : kLegacyKeys) ctx.clear(key);
}

absl::StatusOr<int> maxConcurrentBuilds(Context& ctx, db::Pool& pool) {
  auto limit = ctx.run("read quota", [&]() -> absl::StatusOr<std::string> {
    KRANE_ASSIGN_OR_RETURN(auto conn, pool.acquire());
    KRANE_ASSIGN_OR_RETURN(auto rows, conn->query("SELECT max_concurrent_builds FROM quotas"
                                                  " WHERE workspace_id = ?",
                                                  {ctx.key()}));
    if (rows.empty()) return std::to_string(kDefaultMaxConcurrentBuilds);
    return std::to_string(rows.rows[0].i64(0));
  });
  if (!limit.ok()) return limit.status();
  return std::stoi(*limit);
}

bool holds(const BuildSlots& s, const std::string& deployment_id) {
  return std::find(s.active().begin(), s.active().end(), deployment_id) != s.active().end();
}

SlotWaiter* findWaiter(google::protobuf::RepeatedPtrField<SlotWaiter>& list,
                       const std::string& deployment_id) {
  for (SlotWaiter& w : list) {
    if (w.deployment_id() == deployment_id) return &w;
  }
  return nullptr;
}

bool removeWaiter(google::protobuf::RepeatedPtrField<SlotWaiter>& list,
                  const std::string& deployment_id) {
  auto it = std::find_if(list.begin(), list.end(),
                         [&](const SlotWaiter& w) { return w.deployment_id() == deployment_id; });
  if (it == list.end()) return false;
  list.erase(it);
  return true;
}

// Holders and waiters whose deploy workflow ended without releasing (killed: a kill runs no
// compensations) are dropped, so that a workspace does not lose a slot to each of them for good.
// One journaled query over the deployments the state names; true when it dropped any.
absl::StatusOr<bool> dropEnded(Context& ctx, db::Pool& pool, BuildSlots& s) {
  std::vector<std::string> named(s.active().begin(), s.active().end());
  for (const auto* list : {&s.production(), &s.preview()}) {
    for (const SlotWaiter& w : *list) named.push_back(w.deployment_id());
  }
  if (named.empty()) return false;
  auto ended = ctx.run("ended holders", [&]() -> absl::StatusOr<std::string> {
    KRANE_ASSIGN_OR_RETURN(auto conn, pool.acquire());
    const std::string in = db::placeholders(named.size());
    KRANE_ASSIGN_OR_RETURN(
        auto rows,
        // A workflow row gone (removed by retention) ended long ago.
        conn->query(
            strCat("SELECT d.id FROM deployments d LEFT JOIN workflow_invocations i ON"
                   " i.id = d.invocation_id WHERE d.id IN (",
                   in, ") AND d.invocation_id IS NOT NULL AND (i.id IS NULL OR i.status IN (",
                   workflow::kFinalStatuses, ")) ORDER BY d.id"),
            db::Params(named.begin(), named.end())));
    std::string out;
    for (const db::Row& r : rows.rows) strAppend(&out, out.empty() ? "" : ",", r.str("id"));
    return out;
  });
  if (!ended.ok()) return ended.status();
  if (ended->empty()) return false;
  const std::vector<std::string> ids = absl::StrSplit(*ended, ',');
  for (const std::string& id : ids) {
    auto& active = *s.mutable_active();
    active.erase(std::remove(active.begin(), active.end(), id), active.end());
    removeWaiter(*s.mutable_production(), id);
    removeWaiter(*s.mutable_preview(), id);
  }
  return true;
}

// Gives free slots to the waiters, production first.
void promote(Context& ctx, BuildSlots& s, int limit, ReleaseSlotResponse* out) {
  while (s.active_size() < limit && (s.production_size() > 0 || s.preview_size() > 0)) {
    auto& list = s.production_size() > 0 ? *s.mutable_production() : *s.mutable_preview();
    SlotWaiter next = list.Get(0);
    list.erase(list.begin());
    s.add_active(next.deployment_id());
    ctx.resolveAwakeable(next.awakeable_id(), "");
    if (out != nullptr) out->add_promoted(next.deployment_id());
  }
}

absl::StatusOr<AcquireSlotResponse> acquireOrWait(Context& ctx, db::Pool& pool,
                                                  const AcquireSlotRequest& req) {
  KRANE_RETURN_IF_ERROR(required(req.deployment_id(), "deployment_id"));
  KRANE_RETURN_IF_ERROR(required(req.awakeable_id(), "awakeable_id"));
  bool legacy = false;
  KRANE_ASSIGN_OR_RETURN(BuildSlots s, load(ctx, &legacy));
  AcquireSlotResponse out;
  if (holds(s, req.deployment_id())) {
    ctx.resolveAwakeable(req.awakeable_id(), "");
    out.set_acquired(true);
    return out;
  }
  for (auto* list : {s.mutable_production(), s.mutable_preview()}) {
    if (SlotWaiter* w = findWaiter(*list, req.deployment_id())) {
      // A retried acquire waits on its newest awakeable.
      w->set_awakeable_id(req.awakeable_id());
      save(ctx, s, legacy);
      return out;
    }
  }
  KRANE_ASSIGN_OR_RETURN(int limit, maxConcurrentBuilds(ctx, pool));
  if (s.active_size() >= limit) {
    // Full: perhaps of deploys that ended without releasing. Waiters first, in their order.
    KRANE_ASSIGN_OR_RETURN(bool dropped, dropEnded(ctx, pool, s));
    if (dropped) promote(ctx, s, limit, nullptr);
  }
  if (s.active_size() < limit) {
    s.add_active(req.deployment_id());
    save(ctx, s, legacy);
    ctx.resolveAwakeable(req.awakeable_id(), "");
    out.set_acquired(true);
    return out;
  }
  SlotWaiter* w = req.is_production() ? s.add_production() : s.add_preview();
  w->set_deployment_id(req.deployment_id());
  w->set_awakeable_id(req.awakeable_id());
  save(ctx, s, legacy);
  return out;
}

absl::StatusOr<ReleaseSlotResponse> release(Context& ctx, db::Pool& pool,
                                            const ReleaseSlotRequest& req) {
  KRANE_RETURN_IF_ERROR(required(req.deployment_id(), "deployment_id"));
  bool legacy = false;
  KRANE_ASSIGN_OR_RETURN(BuildSlots s, load(ctx, &legacy));
  ReleaseSlotResponse out;
  if (holds(s, req.deployment_id())) {
    auto& active = *s.mutable_active();
    active.erase(std::find(active.begin(), active.end(), req.deployment_id()));
    out.set_released(true);
    KRANE_ASSIGN_OR_RETURN(int limit, maxConcurrentBuilds(ctx, pool));
    // No slot goes to a waiter whose deploy already ended (looked up only when someone waits).
    if (s.production_size() + s.preview_size() > 0) {
      KRANE_RETURN_IF_ERROR(dropEnded(ctx, pool, s).status());
    }
    promote(ctx, s, limit, &out);
    save(ctx, s, legacy);
  } else if (removeWaiter(*s.mutable_production(), req.deployment_id()) ||
             removeWaiter(*s.mutable_preview(), req.deployment_id())) {
    out.set_removed_waiter(true);
    save(ctx, s, legacy);
  }
  return out;
}

}  // namespace

workflow::ServiceDefinition buildSlotService(const std::shared_ptr<db::Pool>& pool) {
  using workflow::typed;
  return workflow::ServiceDefinition::virtualObject(kServiceName)
      .exclusive("AcquireOrWait", typed<AcquireSlotRequest, AcquireSlotResponse>(
                                      [pool](Context& ctx, const AcquireSlotRequest& req) {
                                        return acquireOrWait(ctx, *pool, req);
                                      }))
      .exclusive("Release", typed<ReleaseSlotRequest, ReleaseSlotResponse>(
                                [pool](Context& ctx, const ReleaseSlotRequest& req) {
                                  return release(ctx, *pool, req);
                                }))
      .shared("Slots", typed<SlotsRequest, BuildSlots>(
                           [](Context& ctx, const SlotsRequest&) { return load(ctx); }))
      .retry(workflow::RetryPolicy::deployPreset());
}

}  // namespace krane::services::buildslot
