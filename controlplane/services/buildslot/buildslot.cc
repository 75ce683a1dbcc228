#include "controlplane/services/buildslot/buildslot.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "common/strings.h"

namespace krane::services::buildslot {
namespace {

using nlohmann::json;
using workflow::Context;
using workflow::terminalError;

absl::Status invalid(std::string_view message) {
  return terminalError(absl::StatusCode::kInvalidArgument, message);
}

absl::StatusOr<json> parseObject(const std::string& input, std::string_view what) {
  json j = json::parse(input, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return invalid(strCat(what, ": input is not a JSON object"));
  }
  return j;
}

absl::StatusOr<std::string> requiredString(const json& j, const char* field) {
  auto it = j.find(field);
  if (it == j.end() || !it->is_string() || it->get<std::string>().empty()) {
    return invalid(strCat(field, ": required, a non-empty string"));
  }
  return it->get<std::string>();
}

json waitersToJson(const std::vector<Waiter>& waiters) {
  json out = json::array();
  for (const Waiter& w : waiters) {
    out.push_back({{"deployment_id", w.deployment_id}, {"awakeable_id", w.awakeable_id}});
  }
  return out;
}

std::vector<Waiter> waitersFromJson(const json& j) {
  std::vector<Waiter> out;
  for (const json& w : j) {
    out.push_back(Waiter{w.value("deployment_id", ""), w.value("awakeable_id", "")});
  }
  return out;
}

json slotsToJson(const Slots& s) {
  return {{"active", s.active},
          {"production", waitersToJson(s.production)},
          {"preview", waitersToJson(s.preview)}};
}

// The state of one workspace, read through the context (journaled).
Slots load(Context& ctx) {
  Slots s;
  if (auto v = ctx.get("active_slots")) s.active = json::parse(*v).get<std::vector<std::string>>();
  if (auto v = ctx.get("prod_wait_list")) s.production = waitersFromJson(json::parse(*v));
  if (auto v = ctx.get("preview_wait_list")) s.preview = waitersFromJson(json::parse(*v));
  return s;
}

void save(Context& ctx, const Slots& s) {
  ctx.set("active_slots", json(s.active).dump());
  ctx.set("prod_wait_list", waitersToJson(s.production).dump());
  ctx.set("preview_wait_list", waitersToJson(s.preview).dump());
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

bool contains(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

Waiter* findWaiter(std::vector<Waiter>& list, const std::string& deployment_id) {
  for (Waiter& w : list) {
    if (w.deployment_id == deployment_id) return &w;
  }
  return nullptr;
}

bool removeWaiter(std::vector<Waiter>& list, const std::string& deployment_id) {
  auto it = std::remove_if(list.begin(), list.end(),
                           [&](const Waiter& w) { return w.deployment_id == deployment_id; });
  const bool removed = it != list.end();
  list.erase(it, list.end());
  return removed;
}

absl::StatusOr<std::string> acquireOrWait(Context& ctx, db::Pool& pool, const std::string& input) {
  KRANE_ASSIGN_OR_RETURN(AcquireRequest req, decodeAcquire(input));
  Slots s = load(ctx);
  if (contains(s.active, req.deployment_id)) {
    ctx.resolveAwakeable(req.awakeable_id, "");
    return json{{"acquired", true}}.dump();
  }
  for (auto* list : {&s.production, &s.preview}) {
    if (Waiter* w = findWaiter(*list, req.deployment_id)) {
      // A retried acquire waits on its newest awakeable.
      w->awakeable_id = req.awakeable_id;
      save(ctx, s);
      return json{{"acquired", false}}.dump();
    }
  }
  KRANE_ASSIGN_OR_RETURN(int limit, maxConcurrentBuilds(ctx, pool));
  if (static_cast<int>(s.active.size()) < limit) {
    s.active.push_back(req.deployment_id);
    save(ctx, s);
    ctx.resolveAwakeable(req.awakeable_id, "");
    return json{{"acquired", true}}.dump();
  }
  (req.is_production ? s.production : s.preview)
      .push_back(Waiter{req.deployment_id, req.awakeable_id});
  save(ctx, s);
  return json{{"acquired", false}}.dump();
}

absl::StatusOr<std::string> release(Context& ctx, db::Pool& pool, const std::string& input) {
  KRANE_ASSIGN_OR_RETURN(json j, parseObject(input, "Release"));
  KRANE_ASSIGN_OR_RETURN(std::string deployment_id, requiredString(j, "deployment_id"));
  Slots s = load(ctx);
  json out = {{"released", false}, {"promoted", nullptr}, {"removed_waiter", false}};
  if (contains(s.active, deployment_id)) {
    s.active.erase(std::find(s.active.begin(), s.active.end(), deployment_id));
    out["released"] = true;
    KRANE_ASSIGN_OR_RETURN(int limit, maxConcurrentBuilds(ctx, pool));
    json promoted = json::array();
    while (static_cast<int>(s.active.size()) < limit &&
           (!s.production.empty() || !s.preview.empty())) {
      auto& list = !s.production.empty() ? s.production : s.preview;
      Waiter next = list.front();
      list.erase(list.begin());
      s.active.push_back(next.deployment_id);
      ctx.resolveAwakeable(next.awakeable_id, "");
      promoted.push_back(next.deployment_id);
    }
    if (!promoted.empty()) out["promoted"] = promoted.size() == 1 ? promoted[0] : promoted;
    save(ctx, s);
  } else if (removeWaiter(s.production, deployment_id) || removeWaiter(s.preview, deployment_id)) {
    out["removed_waiter"] = true;
    save(ctx, s);
  }
  return out.dump();
}

}  // namespace

std::string encodeAcquire(const AcquireRequest& r) {
  return json{{"deployment_id", r.deployment_id},
              {"awakeable_id", r.awakeable_id},
              {"is_production", r.is_production}}
      .dump();
}

absl::StatusOr<AcquireRequest> decodeAcquire(const std::string& input) {
  KRANE_ASSIGN_OR_RETURN(json j, parseObject(input, "AcquireOrWait"));
  AcquireRequest r;
  KRANE_ASSIGN_OR_RETURN(r.deployment_id, requiredString(j, "deployment_id"));
  KRANE_ASSIGN_OR_RETURN(r.awakeable_id, requiredString(j, "awakeable_id"));
  auto it = j.find("is_production");
  if (it != j.end()) {
    if (!it->is_boolean()) return invalid("is_production: must be true or false");
    r.is_production = it->get<bool>();
  }
  return r;
}

std::string encodeRelease(const std::string& deployment_id) {
  return json{{"deployment_id", deployment_id}}.dump();
}

absl::StatusOr<Slots> decodeSlots(const std::string& text) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError("slots: not JSON");
  Slots s;
  s.active = j.value("active", std::vector<std::string>{});
  s.production = waitersFromJson(j.value("production", json::array()));
  s.preview = waitersFromJson(j.value("preview", json::array()));
  return s;
}

workflow::ServiceDefinition buildSlotService(const std::shared_ptr<db::Pool>& pool) {
  return workflow::ServiceDefinition::virtualObject(kServiceName)
      .exclusive("AcquireOrWait",
                 [pool](Context& ctx, const std::string& input) {
                   return acquireOrWait(ctx, *pool, input);
                 })
      .exclusive("Release", [pool](Context& ctx,
                                   const std::string& input) { return release(ctx, *pool, input); })
      .shared("Slots",
              [](Context& ctx, const std::string&) -> absl::StatusOr<std::string> {
                return slotsToJson(load(ctx)).dump();
              })
      .retry(workflow::RetryPolicy::deployPreset());
}

}  // namespace krane::services::buildslot
