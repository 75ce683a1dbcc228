#include "controlplane/strategy/rolling.h"

#include <algorithm>

#include "common/strings.h"

namespace krane::strategy {
namespace {

int rank(InstanceState s) {
  // Drained first: what serves least.
  switch (s) {
    case InstanceState::kFailed:
      return 0;
    case InstanceState::kUnhealthy:
      return 1;
    case InstanceState::kProvisioning:
      return 2;
    case InstanceState::kHealthy:
      return 3;
    case InstanceState::kTerminating:
      return 4;
  }
  return 4;
}

bool oldActive(const Instance& i) {
  return !i.is_new && i.state != InstanceState::kTerminating && i.state != InstanceState::kFailed;
}

}  // namespace

absl::Status checkSpec(const RollingSpec& spec, std::string_view prefix) {
  for (const auto& [name, v] : {std::pair<const char*, IntOrPercent>{"max_surge", spec.max_surge},
                                {"max_unavailable", spec.max_unavailable}}) {
    if (v.percent && v.value > 100) {
      return absl::InvalidArgumentError(strCat(prefix, name, ": at most 100%, got ", v.value, "%"));
    }
    if (!v.percent && v.value > 10000) {
      return absl::InvalidArgumentError(strCat(prefix, name, ": at most 10000, got ", v.value));
    }
  }
  if (spec.max_surge.value == 0 && spec.max_unavailable.value == 0) {
    return absl::InvalidArgumentError(
        strCat(prefix, "max_surge, ", prefix,
               "max_unavailable: at least one must be positive, or a rollout could never move"));
  }
  return absl::OkStatus();
}

ResolvedSpec resolve(const RollingSpec& spec, uint32_t desired) {
  auto of = [desired](IntOrPercent v, bool round_up) -> uint32_t {
    if (!v.percent) return v.value;
    const uint64_t scaled = static_cast<uint64_t>(desired) * v.value;
    return static_cast<uint32_t>(round_up ? (scaled + 99) / 100 : scaled / 100);
  };
  ResolvedSpec out{of(spec.max_surge, true), of(spec.max_unavailable, false)};
  if (out.max_surge == 0 && out.max_unavailable == 0) out.max_unavailable = 1;
  return out;
}

RollingSpec specOf(const cluster::v1::RollingUpdate& update) {
  RollingSpec spec;
  if (update.has_max_surge())
    spec.max_surge = {update.max_surge().value(), update.max_surge().percent()};
  if (update.has_max_unavailable()) {
    spec.max_unavailable = {update.max_unavailable().value(), update.max_unavailable().percent()};
  }
  return spec;
}

absl::Status checkRollingUpdate(const cluster::v1::RollingUpdate& update, std::string_view prefix) {
  if (auto st = checkSpec(specOf(update), prefix); !st.ok()) return st;
  if (update.min_ready_seconds() > 3600) {
    return absl::InvalidArgumentError(
        strCat(prefix, "min_ready_seconds: at most 3600, got ", update.min_ready_seconds()));
  }
  if (update.progress_deadline_seconds() > 86400) {
    return absl::InvalidArgumentError(strCat(prefix,
                                             "progress_deadline_seconds: at most 86400, got ",
                                             update.progress_deadline_seconds()));
  }
  if (update.progress_deadline_seconds() != 0 &&
      update.progress_deadline_seconds() <= update.min_ready_seconds()) {
    return absl::InvalidArgumentError(
        strCat(prefix, "progress_deadline_seconds: must be above min_ready_seconds (",
               update.min_ready_seconds(), ")"));
  }
  return absl::OkStatus();
}

Counts classify(const std::vector<Instance>& instances) {
  Counts c;
  for (const auto& i : instances) {
    if (!i.is_new) {
      if (oldActive(i)) ++c.old_active;
      continue;
    }
    switch (i.state) {
      case InstanceState::kProvisioning:
        ++c.new_provisioning;
        break;
      case InstanceState::kHealthy:
        ++c.new_healthy;
        break;
      case InstanceState::kUnhealthy:
        ++c.new_unhealthy;
        break;
      case InstanceState::kFailed:
      case InstanceState::kTerminating:
        ++c.new_failed;
        break;
    }
  }
  return c;
}

std::string_view resultName(Result result) {
  switch (result) {
    case Result::kProvisioning:
      return "provisioning";
    case Result::kProgressing:
      return "progressing";
    case Result::kCompleted:
      return "completed";
  }
  return "unknown";
}

Evaluation evaluate(const std::vector<Instance>& instances, uint32_t desired,
                    const ResolvedSpec& spec) {
  Evaluation e;
  e.counts = classify(instances);
  const Counts& c = e.counts;
  e.max_total = desired + spec.max_surge;
  e.min_available = desired > spec.max_unavailable ? desired - spec.max_unavailable : 0;
  if (c.new_provisioning > 0) return e;  // wait for them
  if (c.old_active == 0 && c.new_healthy >= desired) {
    e.result = Result::kCompleted;
    return e;
  }
  const uint32_t total = c.total_active();
  const uint32_t can_create = e.max_total > total ? e.max_total - total : 0;
  const uint32_t need_create = desired > c.new_healthy ? desired - c.new_healthy : 0;
  e.to_create = std::min(can_create, need_create);

  const uint32_t healthy = c.new_healthy + c.old_active;
  const uint32_t can_terminate = healthy > e.min_available ? healthy - e.min_available : 0;
  uint32_t to_terminate = std::min(can_terminate, c.old_active);
  // Zero-downtime guard: the last old instance stays until a new one is healthy.
  if (spec.max_unavailable < desired && c.new_healthy == 0 && c.old_active > 0) {
    to_terminate = std::min(to_terminate, c.old_active - 1);
  }
  if (to_terminate > 0) {
    std::vector<const Instance*> old;
    for (const auto& i : instances) {
      if (oldActive(i)) old.push_back(&i);
    }
    std::sort(old.begin(), old.end(), [](const Instance* a, const Instance* b) {
      return rank(a->state) != rank(b->state) ? rank(a->state) < rank(b->state) : a->id < b->id;
    });
    for (uint32_t k = 0; k < to_terminate; ++k) e.drain_ids.push_back(old[k]->id);
  }
  e.result = e.to_create > 0 || !e.drain_ids.empty() ? Result::kProgressing : Result::kProvisioning;
  return e;
}

}  // namespace krane::strategy
