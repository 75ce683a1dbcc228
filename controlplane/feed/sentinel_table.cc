// Resource type "sentinel", in table `sentinels` keyed by id alone. Only the desired columns
// belong to the resource; the observed ones (replica counts, running image, health, ...) and
// deploy_status are written by status reports and the sentinel service, never from here.
#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <google/protobuf/util/json_util.h>
#include <nlohmann/json.hpp>

#include "common/status.h"
#include "common/strings.h"
#include "controlplane/feed/json_check.h"
#include "controlplane/feed/single_type_table.h"
#include "controlplane/feed/tables.h"

namespace krane::feed {
namespace {

using cluster::v1::Sentinel;
using Json = nlohmann::json;

constexpr size_t kMaxImageBytes = 512;
constexpr uint32_t kMaxReplicas = 1000;
constexpr uint32_t kMaxCpuMillicores = 64000;
constexpr uint32_t kMaxMemoryMib = 1024 * 1024;  // 1 TiB
constexpr size_t kMaxConfigBytes = 1 << 20;

constexpr std::string_view kColumns =
    "id, workspace_id, project_id, app_id, environment_id, region_id, image, desired_state,"
    " replicas, cpu_millicores, memory_mib, config, live_deployment_id, rolling_deployment_id,"
    " healthcheck, version, deleted_at";

absl::Status invalid(const std::string& message) { return absl::InvalidArgumentError(message); }

absl::Status checkRange(std::string_view field, uint64_t value, uint64_t min, uint64_t max) {
  if (value < min || value > max) {
    return invalid(strCat(field, ": must be between ", min, " and ", max, ", got ", value));
  }
  return absl::OkStatus();
}

absl::Status checkJson(std::string_view field, std::string_view text, size_t max_size) {
  if (text.size() > max_size) {
    return invalid(strCat(field, ": at most ", max_size, " bytes, got ", text.size()));
  }
  return checkJsonDocument(field, text, JsonShape::kAny);
}

absl::Status validateSentinel(const Resource& r) {
  if (!r.has_sentinel()) {
    return invalid(strCat("resource.sentinel: required for type ", quote(r.type())));
  }
  const Sentinel& s = r.sentinel();
  if (!s.sentinel_id().empty() && s.sentinel_id() != r.id()) {
    return invalid(strCat("sentinel.sentinel_id: ", quote(s.sentinel_id()),
                          " differs from resource.id ", quote(r.id())));
  }
  if (!s.region().empty() && s.region() != r.region()) {
    return invalid(strCat("sentinel.region: ", quote(s.region()), " differs from resource.region ",
                          quote(r.region())));
  }
  KRANE_RETURN_IF_ERROR(checkId("sentinel.workspace_id", s.workspace_id()));
  KRANE_RETURN_IF_ERROR(checkId("sentinel.project_id", s.project_id()));
  KRANE_RETURN_IF_ERROR(checkId("sentinel.app_id", s.app_id()));
  KRANE_RETURN_IF_ERROR(checkId("sentinel.environment_id", s.environment_id()));
  KRANE_RETURN_IF_ERROR(checkNotEmpty("sentinel.image", s.image(), kMaxImageBytes));
  const bool image_ok = std::all_of(s.image().begin(), s.image().end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u > 0x20 && u < 0x7F;
  });
  if (!image_ok) {
    return invalid("sentinel.image: must be printable ASCII without spaces");
  }
  KRANE_RETURN_IF_ERROR(checkMax("sentinel.replicas", s.replicas(), kMaxReplicas));
  KRANE_RETURN_IF_ERROR(
      checkRange("sentinel.cpu_millicores", s.cpu_millicores(), 1, kMaxCpuMillicores));
  KRANE_RETURN_IF_ERROR(checkRange("sentinel.memory_mib", s.memory_mib(), 1, kMaxMemoryMib));
  switch (s.desired_state()) {
    case cluster::v1::SENTINEL_DESIRED_STATE_UNSPECIFIED:
    case cluster::v1::SENTINEL_DESIRED_STATE_RUNNING:
    case cluster::v1::SENTINEL_DESIRED_STATE_STANDBY:
    case cluster::v1::SENTINEL_DESIRED_STATE_ARCHIVED:
      break;
    default:
      return invalid(
          strCat("sentinel.desired_state: unknown value ", static_cast<int>(s.desired_state())));
  }
  if (!s.config_json().empty()) {
    KRANE_RETURN_IF_ERROR(checkJson("sentinel.config_json", s.config_json(), kMaxConfigBytes));
  }
  if (!s.live_deployment_id().empty()) {
    KRANE_RETURN_IF_ERROR(checkId("sentinel.live_deployment_id", s.live_deployment_id()));
  }
  if (!s.rolling_deployment_id().empty()) {
    KRANE_RETURN_IF_ERROR(checkId("sentinel.rolling_deployment_id", s.rolling_deployment_id()));
  }
  if (s.has_healthcheck()) {
    const auto& h = s.healthcheck();
    KRANE_RETURN_IF_ERROR(checkProbe("sentinel.healthcheck.liveness", h.liveness(), true));
    KRANE_RETURN_IF_ERROR(checkProbe("sentinel.healthcheck.readiness", h.readiness(), false));
    if (!h.liveness().path().empty() && h.liveness().path() == h.readiness().path()) {
      return invalid(strCat("sentinel.healthcheck.readiness.path: ", quote(h.readiness().path()),
                            " is the liveness path; readiness needs its own endpoint"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<db::Value> healthcheckJson(const Sentinel& s) {
  if (!s.has_healthcheck()) return db::Value();
  std::string out;
  const auto status = google::protobuf::util::MessageToJsonString(s.healthcheck(), &out);
  if (!status.ok()) {
    return invalid(strCat("sentinel.healthcheck: cannot encode as JSON: ", status.ToString()));
  }
  return db::Value(std::move(out));
}

std::string_view desiredStateName(cluster::v1::SentinelDesiredState s) {
  switch (s) {
    case cluster::v1::SENTINEL_DESIRED_STATE_STANDBY:
      return "standby";
    case cluster::v1::SENTINEL_DESIRED_STATE_ARCHIVED:
      return "archived";
    default:
      return "running";
  }
}

cluster::v1::SentinelDesiredState desiredStateOf(std::string_view name) {
  if (name == "standby") return cluster::v1::SENTINEL_DESIRED_STATE_STANDBY;
  if (name == "archived") return cluster::v1::SENTINEL_DESIRED_STATE_ARCHIVED;
  return cluster::v1::SENTINEL_DESIRED_STATE_RUNNING;
}

absl::StatusOr<Resource> fromRow(const db::Row& row) {
  Resource r;
  r.set_type(std::string(kSentinel));
  r.set_id(row.str("id"));
  r.set_region(row.str("region_id"));
  r.set_version(row.u64("version"));
  Sentinel* s = r.mutable_sentinel();
  s->set_sentinel_id(r.id());
  s->set_region(r.region());
  s->set_workspace_id(row.str("workspace_id"));
  s->set_project_id(row.str("project_id"));
  s->set_app_id(row.str("app_id"));
  s->set_environment_id(row.str("environment_id"));
  s->set_image(row.str("image"));
  s->set_replicas(static_cast<uint32_t>(row.u64("replicas")));
  s->set_cpu_millicores(static_cast<uint32_t>(row.u64("cpu_millicores")));
  s->set_memory_mib(static_cast<uint32_t>(row.u64("memory_mib")));
  s->set_desired_state(desiredStateOf(row.str("desired_state")));
  if (!row.isNull("config")) s->set_config_json(row.str("config"));
  if (!row.isNull("live_deployment_id")) s->set_live_deployment_id(row.str("live_deployment_id"));
  if (!row.isNull("rolling_deployment_id")) {
    s->set_rolling_deployment_id(row.str("rolling_deployment_id"));
  }
  if (!row.isNull("healthcheck")) {
    google::protobuf::util::JsonParseOptions options;
    options.ignore_unknown_fields = true;
    const auto status = google::protobuf::util::JsonStringToMessage(
        row.str("healthcheck"), s->mutable_healthcheck(), options);
    if (!status.ok()) {
      return absl::DataLossError(
          strCat("sentinels row ", quote(r.id()), ": column healthcheck: ", status.ToString()));
    }
  }
  return r;
}

class SentinelTable final : public SingleTypeTable {
 public:
  SentinelTable()
      : SingleTypeTable(kSentinel, "sentinels", "id", kColumns, /*unique_per_region=*/false) {}

  absl::Status validate(const Resource& r) const override { return validateSentinel(r); }

 protected:
  absl::StatusOr<Resource> decode(const db::Row& row) const override { return fromRow(row); }

  absl::Status write(db::Connection& conn, const Resource& r, uint64_t version,
                     int64_t now_ms) const override {
    if (!r.has_sentinel()) return validateSentinel(r);
    const Sentinel& s = r.sentinel();
    KRANE_ASSIGN_OR_RETURN(db::Value healthcheck, healthcheckJson(s));
    return conn
        .exec(
            "INSERT INTO sentinels (id, workspace_id, project_id, app_id, environment_id,"
            " region_id, image, desired_state, replicas, cpu_millicores, memory_mib, config,"
            " live_deployment_id, rolling_deployment_id, healthcheck, version, created_at,"
            " updated_at, deleted_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL)"
            " ON DUPLICATE KEY UPDATE workspace_id = VALUES(workspace_id),"
            " project_id = VALUES(project_id), app_id = VALUES(app_id),"
            " environment_id = VALUES(environment_id), region_id = VALUES(region_id),"
            " image = VALUES(image), desired_state = VALUES(desired_state),"
            " replicas = VALUES(replicas), cpu_millicores = VALUES(cpu_millicores),"
            " memory_mib = VALUES(memory_mib), config = VALUES(config),"
            " live_deployment_id = VALUES(live_deployment_id),"
            " rolling_deployment_id = VALUES(rolling_deployment_id),"
            " healthcheck = VALUES(healthcheck),"
            " version = VALUES(version), updated_at = VALUES(updated_at), deleted_at = NULL",
            {r.id(), s.workspace_id(), s.project_id(), s.app_id(), s.environment_id(), r.region(),
             s.image(), desiredStateName(s.desired_state()), s.replicas(), s.cpu_millicores(),
             s.memory_mib(), s.config_json().empty() ? db::Value() : db::Value(s.config_json()),
             s.live_deployment_id().empty() ? db::Value() : db::Value(s.live_deployment_id()),
             s.rolling_deployment_id().empty() ? db::Value() : db::Value(s.rolling_deployment_id()),
             healthcheck, version, now_ms, now_ms})
        .status();
  }
};

}  // namespace

std::unique_ptr<ResourceTable> makeSentinelTable() { return std::make_unique<SentinelTable>(); }

}  // namespace krane::feed
