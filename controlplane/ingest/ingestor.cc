#include "controlplane/ingest/ingestor.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "common/clock.h"
#include "common/status.h"
#include "common/strings.h"
#include "controlplane/feed/resource_table.h"
#include "controlplane/feed/writer.h"
#include "google/protobuf/util/json_util.h"

namespace krane::ingest {
namespace {

using cluster::v1::HeartbeatRequest;
using cluster::v1::HeartbeatResponse;
using cluster::v1::Instance;
using cluster::v1::InstanceStatus;
using cluster::v1::PluginInfo;
using cluster::v1::ReportDeploymentStatusRequest;
using cluster::v1::ReportResourceStatusRequest;
using cluster::v1::ReportSentinelStatusRequest;
using cluster::v1::ResourcePhase;
using cluster::v1::SentinelHealth;
using Json = nlohmann::json;

constexpr size_t kMaxInstances = 1000;
constexpr size_t kMaxInstanceIdBytes = 253;
constexpr size_t kMaxAddressBytes = 255;
constexpr size_t kMaxMessageBytes = 4 * 1024;
constexpr size_t kMaxDetailBytes = 64 * 1024;
constexpr size_t kMaxContentTypeBytes = 255;
constexpr size_t kMaxImageBytes = 512;
constexpr uint32_t kMaxReplicas = 10000;
constexpr size_t kMaxAgentIdBytes = 128;
constexpr size_t kMaxBuildVersionBytes = 128;
constexpr size_t kMaxPluginNameBytes = 128;
constexpr size_t kMaxPlugins = 64;
constexpr size_t kMaxPluginResourceTypes = 64;
// Rows per multi-row statement. Chunks are cut from these sizes only, so a connection caches
// at most three prepared texts per statement kind.
constexpr size_t kChunkSizes[] = {100, 10, 1};

absl::Status invalid(std::string message) { return absl::InvalidArgumentError(std::move(message)); }

// Visible ASCII without spaces: ids and images compare byte for byte and the columns' collation
// ignores trailing spaces.
bool isToken(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u > 0x20 && u < 0x7F;
  });
}

absl::Status checkToken(std::string_view field, std::string_view value, size_t max_size) {
  KRANE_RETURN_IF_ERROR(feed::checkNotEmpty(field, value, max_size));
  if (!isToken(value)) return invalid(strCat(field, ": must be printable ASCII without spaces"));
  return absl::OkStatus();
}

absl::Status checkSize(std::string_view field, std::string_view value, size_t max_size) {
  if (value.size() > max_size) {
    return invalid(strCat(field, ": at most ", max_size, " bytes, got ", value.size()));
  }
  return absl::OkStatus();
}

// "host:port", "1.2.3.4:port" or "[v6]:port", port 1-65535.
bool isHostPort(std::string_view a) {
  std::string_view host;
  std::string_view port;
  if (!a.empty() && a.front() == '[') {
    const size_t close = a.find(']');
    if (close == std::string_view::npos || close + 1 >= a.size() || a[close + 1] != ':') {
      return false;
    }
    host = a.substr(1, close - 1);
    port = a.substr(close + 2);
    const bool v6 = std::all_of(host.begin(), host.end(), [](char c) {
      return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F') ||
             c == ':' || c == '.';
    });
    if (!v6 || host.find(':') == std::string_view::npos) return false;
  } else {
    const size_t colon = a.rfind(':');
    if (colon == std::string_view::npos) return false;
    host = a.substr(0, colon);
    port = a.substr(colon + 1);
    const bool name = std::all_of(host.begin(), host.end(), [](char c) {
      return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
             c == '.' || c == '-' || c == '_';
    });
    if (!name) return false;
  }
  if (host.empty() || port.empty() || port.size() > 5) return false;
  uint32_t value = 0;
  for (char c : port) {
    if (c < '0' || c > '9') return false;
    value = value * 10 + static_cast<uint32_t>(c - '0');
  }
  return value >= 1 && value <= 65535;
}

// The region a report is about: required, and the token's (a token reports for its own region
// only). An empty region is refused rather than taken to mean the token's: the report says
// which region it is about.
absl::Status checkRegion(const std::string& token_region, const std::string& requested) {
  if (token_region.empty()) return absl::PermissionDeniedError("the caller's token has no region");
  if (requested.empty()) {
    return absl::InvalidArgumentError(strCat("region: required (the region the report is about, ",
                                             token_region, " for this token)"));
  }
  if (requested != token_region) {
    return absl::PermissionDeniedError(
        strCat("token for region ", token_region, " cannot report for region ", requested));
  }
  return absl::OkStatus();
}

std::vector<size_t> chunks(size_t n) {
  std::vector<size_t> out;
  for (size_t size : kChunkSizes) {
    while (n >= size) {
      out.push_back(size);
      n -= size;
    }
  }
  return out;
}

std::string_view instanceStatusName(InstanceStatus s) {
  switch (s) {
    case cluster::v1::INSTANCE_STATUS_RUNNING:
      return "running";
    case cluster::v1::INSTANCE_STATUS_FAILED:
      return "failed";
    default:
      return "pending";
  }
}

std::string_view healthName(SentinelHealth h) {
  switch (h) {
    case cluster::v1::SENTINEL_HEALTH_HEALTHY:
      return "healthy";
    case cluster::v1::SENTINEL_HEALTH_UNHEALTHY:
      return "unhealthy";
    case cluster::v1::SENTINEL_HEALTH_PAUSED:
      return "paused";
    default:
      return "unknown";
  }
}

std::string_view phaseName(ResourcePhase p) {
  switch (p) {
    case cluster::v1::RESOURCE_PHASE_PENDING:
      return "pending";
    case cluster::v1::RESOURCE_PHASE_PROGRESSING:
      return "progressing";
    case cluster::v1::RESOURCE_PHASE_READY:
      return "ready";
    case cluster::v1::RESOURCE_PHASE_DEGRADED:
      return "degraded";
    case cluster::v1::RESOURCE_PHASE_FAILED:
      return "failed";
    case cluster::v1::RESOURCE_PHASE_DELETED:
      return "deleted";
    default:
      return "unspecified";
  }
}

absl::Status validateInstance(const std::string& field, const Instance& in) {
  KRANE_RETURN_IF_ERROR(checkToken(strCat(field, ".id"), in.id(), kMaxInstanceIdBytes));
  switch (in.status()) {
    case cluster::v1::INSTANCE_STATUS_PENDING:
    case cluster::v1::INSTANCE_STATUS_RUNNING:
    case cluster::v1::INSTANCE_STATUS_FAILED:
      break;
    case cluster::v1::INSTANCE_STATUS_UNSPECIFIED:
      return invalid(strCat(field, ".status: required"));
    default:
      return invalid(strCat(field, ".status: unknown value ", static_cast<int>(in.status())));
  }
  // A pending (or failed) instance may not have an address yet; a running one serves traffic.
  if (in.address().empty()) {
    if (in.status() == cluster::v1::INSTANCE_STATUS_RUNNING) {
      return invalid(strCat(field, ".address: required for a running instance"));
    }
  } else if (in.address().size() > kMaxAddressBytes || !isHostPort(in.address())) {
    return invalid(strCat(field, ".address: ", quote(in.address()), " is not host:port (at most ",
                          kMaxAddressBytes, " bytes)"));
  }
  return checkSize(strCat(field, ".failure_reason"), in.failure_reason(), kMaxMessageBytes);
}

// The reporting agent (optional: older agents do not say).
absl::Status checkReporter(const std::string& agent_id) {
  if (agent_id.empty()) return absl::OkStatus();
  return checkToken("agent_id", agent_id, kMaxAgentIdBytes);
}

absl::Status validateDeploymentReport(const ReportDeploymentStatusRequest& r) {
  KRANE_RETURN_IF_ERROR(feed::checkId("deployment_id", r.deployment_id()));
  KRANE_RETURN_IF_ERROR(checkReporter(r.agent_id()));
  switch (r.state_case()) {
    case ReportDeploymentStatusRequest::kDeleted:
      if (!r.deleted()) return invalid("deleted: must be true when set");
      return absl::OkStatus();
    case ReportDeploymentStatusRequest::kInstances:
      break;
    default:
      return invalid("state: required (instances or deleted)");
  }
  const auto& instances = r.instances().instances();
  if (static_cast<size_t>(instances.size()) > kMaxInstances) {
    return invalid(
        strCat("instances: at most ", kMaxInstances, " per report, got ", instances.size()));
  }
  std::unordered_map<std::string_view, int> seen;
  for (int i = 0; i < instances.size(); ++i) {
    const std::string field = strCat("instances[", i, "]");
    KRANE_RETURN_IF_ERROR(validateInstance(field, instances[i]));
    auto [it, inserted] = seen.emplace(instances[i].id(), i);
    if (!inserted) {
      return invalid(strCat(field, ".id: ", quote(instances[i].id()),
                            " is listed twice (also instances[", it->second, "])"));
    }
  }
  return absl::OkStatus();
}

absl::Status validateSentinelReport(const ReportSentinelStatusRequest& r) {
  KRANE_RETURN_IF_ERROR(checkReporter(r.agent_id()));
  KRANE_RETURN_IF_ERROR(feed::checkId("sentinel_id", r.sentinel_id()));
  KRANE_RETURN_IF_ERROR(feed::checkMax("available_replicas", r.available_replicas(), kMaxReplicas));
  KRANE_RETURN_IF_ERROR(feed::checkMax("updated_replicas", r.updated_replicas(), kMaxReplicas));
  KRANE_RETURN_IF_ERROR(feed::checkMax("ready_replicas", r.ready_replicas(), kMaxReplicas));
  if (r.observed_generation() < 0) {
    return invalid(
        strCat("observed_generation: must not be negative, got ", r.observed_generation()));
  }
  if (!r.running_image().empty()) {
    KRANE_RETURN_IF_ERROR(checkToken("running_image", r.running_image(), kMaxImageBytes));
  }
  switch (r.health()) {
    case cluster::v1::SENTINEL_HEALTH_UNSPECIFIED:
    case cluster::v1::SENTINEL_HEALTH_HEALTHY:
    case cluster::v1::SENTINEL_HEALTH_UNHEALTHY:
    case cluster::v1::SENTINEL_HEALTH_PAUSED:
      return absl::OkStatus();
    default:
      return invalid(strCat("health: unknown value ", static_cast<int>(r.health())));
  }
}

absl::Status validateResourceReport(const ReportResourceStatusRequest& r) {
  KRANE_RETURN_IF_ERROR(checkReporter(r.agent_id()));
  KRANE_RETURN_IF_ERROR(feed::checkType("type", r.type()));
  KRANE_RETURN_IF_ERROR(feed::checkId("id", r.id()));
  switch (r.phase()) {
    case cluster::v1::RESOURCE_PHASE_PENDING:
    case cluster::v1::RESOURCE_PHASE_PROGRESSING:
    case cluster::v1::RESOURCE_PHASE_READY:
    case cluster::v1::RESOURCE_PHASE_DEGRADED:
    case cluster::v1::RESOURCE_PHASE_FAILED:
    case cluster::v1::RESOURCE_PHASE_DELETED:
      break;
    case cluster::v1::RESOURCE_PHASE_UNSPECIFIED:
      return invalid("phase: required");
    default:
      return invalid(strCat("phase: unknown value ", static_cast<int>(r.phase())));
  }
  KRANE_RETURN_IF_ERROR(checkSize("message", r.message(), kMaxMessageBytes));
  KRANE_RETURN_IF_ERROR(checkSize("detail", r.detail(), kMaxDetailBytes));
  KRANE_RETURN_IF_ERROR(
      checkSize("detail_content_type", r.detail_content_type(), kMaxContentTypeBytes));
  KRANE_RETURN_IF_ERROR(checkSize("plugin", r.plugin(), kMaxPluginNameBytes));
  if (r.has_apply_error()) {
    KRANE_RETURN_IF_ERROR(
        checkSize("apply_error.message", r.apply_error().message(), kMaxMessageBytes));
  }
  return absl::OkStatus();
}

absl::Status validateHeartbeat(const HeartbeatRequest& r) {
  KRANE_RETURN_IF_ERROR(checkToken("agent_id", r.agent_id(), kMaxAgentIdBytes));
  KRANE_RETURN_IF_ERROR(checkSize("build_version", r.build_version(), kMaxBuildVersionBytes));
  if (static_cast<size_t>(r.plugins_size()) > kMaxPlugins) {
    return invalid(strCat("plugins: at most ", kMaxPlugins, ", got ", r.plugins_size()));
  }
  for (int i = 0; i < r.plugins_size(); ++i) {
    const PluginInfo& p = r.plugins(i);
    const std::string field = strCat("plugins[", i, "]");
    KRANE_RETURN_IF_ERROR(
        feed::checkNotEmpty(strCat(field, ".name"), p.name(), kMaxPluginNameBytes));
    KRANE_RETURN_IF_ERROR(checkSize(strCat(field, ".version"), p.version(), kMaxBuildVersionBytes));
    if (static_cast<size_t>(p.resource_types_size()) > kMaxPluginResourceTypes) {
      return invalid(strCat(field, ".resource_types: at most ", kMaxPluginResourceTypes, ", got ",
                            p.resource_types_size()));
    }
    for (int j = 0; j < p.resource_types_size(); ++j) {
      KRANE_RETURN_IF_ERROR(
          feed::checkType(strCat(field, ".resource_types[", j, "]"), p.resource_types(j)));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> pluginsJson(const HeartbeatRequest& r) {
  std::string out = "[";
  for (int i = 0; i < r.plugins_size(); ++i) {
    std::string one;
    const auto status = google::protobuf::util::MessageToJsonString(r.plugins(i), &one);
    if (!status.ok()) {
      return invalid(strCat("plugins[", i, "]: cannot encode as JSON: ", status.ToString()));
    }
    strAppend(&out, i == 0 ? "" : ",", one);
  }
  out.push_back(']');
  return out;
}

absl::StatusOr<std::vector<PluginInfo>> parsePlugins(const std::string& text) {
  std::vector<PluginInfo> out;
  Json doc;
  try {
    doc = Json::parse(text);
  } catch (const Json::exception& e) {
    return absl::DataLossError(strCat("not valid JSON: ", e.what()));
  }
  if (!doc.is_array()) return absl::DataLossError("not a JSON array");
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;
  for (const auto& element : doc) {
    PluginInfo p;
    const auto status = google::protobuf::util::JsonStringToMessage(element.dump(), &p, options);
    if (!status.ok()) return absl::DataLossError(status.ToString());
    out.push_back(std::move(p));
  }
  return out;
}

// Counts a failed call: refused input (or an unknown object) as rejected, anything else as a
// database error.
// Whether the resource a report is about is held (live, in that region). Locks its row, so a
// delete through the writer (which purges the status) and this report are decided one after the
// other; the resource row is always locked before the status rows, by both.
absl::StatusOr<bool> held(db::Connection& conn, const feed::ResourceTables& tables,
                          const std::string& type, const std::string& id,
                          const std::string& region) {
  KRANE_ASSIGN_OR_RETURN(auto row,
                         tables.forType(type).lock(conn, feed::ResourceKey{type, id, region}));
  return row.has_value() && !row->deleted && row->region == region;
}

// The stored status of a resource, locked for the transaction.
struct StoredStatus {
  uint64_t applied_version = 0;
  int64_t observed_at = 0;
  uint64_t failed_version = 0;  // a parked apply failure of this version; 0: none

  // Whether an observation at (version, observed_at) is older than the one stored.
  bool newerThan(uint64_t version, int64_t at) const {
    return version < applied_version || (version == applied_version && at < observed_at);
  }
  // Whether an observation of `version` still runs under a failed apply of a later version:
  // it is stored (instances, message), the failure stays shown.
  bool failsAfter(uint64_t version) const { return failed_version > version; }
};

absl::StatusOr<std::optional<StoredStatus>> storedStatus(db::Connection& conn,
                                                         const std::string& region,
                                                         const std::string& type,
                                                         const std::string& id) {
  KRANE_ASSIGN_OR_RETURN(auto rows,
                         conn.query("SELECT applied_version, observed_at, failed_version FROM"
                                    " resource_status WHERE region_id = ? AND"
                                    " resource_type = ? AND resource_id = ? FOR UPDATE",
                                    {region, type, id}));
  if (rows.empty()) return std::optional<StoredStatus>();
  const db::Row& r = rows.rows[0];
  return std::optional<StoredStatus>(StoredStatus{r.u64(0), r.i64(1), r.u64(2)});
}

// The part of an observation's upsert that ends a failure on record, unless the observation is
// of a version older than the failed one.
std::string endsFailure(bool failing) {
  return failing ? ""
                 : ", phase = VALUES(phase), apply_error = VALUES(apply_error),"
                   " apply_attempts = VALUES(apply_attempts), failed_version = 0";
}

absl::Status counted(IngestCounters& counters, absl::Status status) {
  if (status.ok()) return status;
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kNotFound:
      counters.rejected.fetch_add(1, std::memory_order_relaxed);
      break;
    default:
      counters.errors.fetch_add(1, std::memory_order_relaxed);
      break;
  }
  return status;
}

}  // namespace

Ingestor::Ingestor(std::shared_ptr<db::Pool> pool) : pool_(std::move(pool)) {}

void Ingestor::addSentinelReadyHook(std::shared_ptr<SentinelReadyHook> hook) {
  std::lock_guard lock(hooks_mutex_);
  sentinel_hooks_.push_back(std::move(hook));
}

void Ingestor::addDeploymentInstancesHook(std::shared_ptr<DeploymentInstancesHook> hook) {
  std::lock_guard lock(hooks_mutex_);
  deployment_hooks_.push_back(std::move(hook));
}

// ---------------------------------------------------------------------------------------------
// Deployment status

absl::Status Ingestor::reportDeploymentStatus(const std::string& region,
                                              const ReportDeploymentStatusRequest& request) {
  counters_.deployment_reports.fetch_add(1, std::memory_order_relaxed);
  if (auto st = checkRegion(region, request.region()); !st.ok()) return counted(counters_, st);
  if (auto st = validateDeploymentReport(request); !st.ok()) return counted(counters_, st);

  const std::string& deployment = request.deployment_id();
  std::vector<const Instance*> reported;
  uint32_t running = 0, pending = 0, failed = 0, current = 0;
  bool knows_current = false;
  if (request.has_instances()) {
    for (const Instance& in : request.instances().instances()) {
      reported.push_back(&in);
      if (in.has_current()) knows_current = true;
      if (in.current() && in.status() == cluster::v1::INSTANCE_STATUS_RUNNING) ++current;
      switch (in.status()) {
        case cluster::v1::INSTANCE_STATUS_RUNNING:
          ++running;
          break;
        case cluster::v1::INSTANCE_STATUS_FAILED:
          ++failed;
          break;
        default:
          ++pending;
          break;
      }
    }
  }

  bool dropped = false;
  const auto status =
      pool_->transact("ingest.deployment_status", [&](db::Connection& conn) -> absl::Status {
        dropped = false;
        const int64_t now = unixMillis();
        const std::string type(feed::kDeploymentTopology);
        KRANE_ASSIGN_OR_RETURN(bool known, held(conn, tables_, type, deployment, region));
        if (!known) {
          dropped = true;
          return request.has_deleted()
                     ? feed::purgeStatus(conn, feed::ResourceKey{type, deployment, region})
                     : absl::OkStatus();
        }
        KRANE_ASSIGN_OR_RETURN(auto status, storedStatus(conn, region, type, deployment));
        if (status && status->newerThan(request.applied_version(), request.observed_at_ms())) {
          dropped = true;
          return absl::OkStatus();
        }
        const bool failing = status && status->failsAfter(request.applied_version());
        KRANE_ASSIGN_OR_RETURN(
            auto stored,
            conn.query("SELECT id FROM instances WHERE deployment_id = ? AND region_id = ?"
                       " FOR UPDATE",
                       {deployment, region}));
        std::unordered_set<std::string_view> keep;
        for (const Instance* in : reported) keep.insert(in->id());
        std::vector<std::string> gone;
        for (const auto& row : stored.rows) {
          if (!keep.count(row.str(0))) gone.push_back(row.str(0));
        }

        size_t next = 0;
        for (size_t size : chunks(reported.size())) {
          std::string sql =
              "INSERT INTO instances (deployment_id, region_id, id, address, status, "
              "failure_reason, running_since,"
              " cpu_millicores, memory_mib, created_at, updated_at) VALUES ";
          db::Params params;
          params.reserve(size * 11);
          for (size_t i = 0; i < size; ++i, ++next) {
            const Instance& in = *reported[next];
            strAppend(&sql, i == 0 ? "" : ", ", "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)");
            params.insert(
                params.end(),
                {deployment, region, in.id(), in.address(), instanceStatusName(in.status()),
                 in.failure_reason().empty() ? db::Value() : db::Value(in.failure_reason()),
                 in.status() == cluster::v1::INSTANCE_STATUS_RUNNING ? db::Value(now) : db::Value(),
                 in.has_cpu_millicores() ? db::Value(in.cpu_millicores()) : db::Value(),
                 in.has_memory_mib() ? db::Value(in.memory_mib()) : db::Value(), now, now});
          }
          sql +=
              // running_since first: it compares with the stored status, before that changes.
              " ON DUPLICATE KEY UPDATE running_since = IF(status = 'running' AND"
              " VALUES(status) = 'running', running_since, VALUES(running_since)),"
              " address = VALUES(address), status = VALUES(status),"
              " failure_reason = VALUES(failure_reason), cpu_millicores = VALUES(cpu_millicores),"
              " memory_mib = VALUES(memory_mib), updated_at = VALUES(updated_at)";
          KRANE_RETURN_IF_ERROR(conn.exec(sql, params).status());
        }

        next = 0;
        for (size_t size : chunks(gone.size())) {
          const std::string sql =
              strCat("DELETE FROM instances WHERE deployment_id = ? AND region_id = ? AND id IN (",
                     db::placeholders(size), ")");
          db::Params params{deployment, region};
          for (size_t i = 0; i < size; ++i, ++next) params.emplace_back(gone[next]);
          KRANE_RETURN_IF_ERROR(conn.exec(sql, params).status());
        }
        if (request.has_deleted())
          return feed::purgeStatus(conn, feed::ResourceKey{type, deployment, region});
        // The deployment's phase for operators (`kranectl status`): ready when every instance
        // runs; the counts go in the message and, as JSON, in the detail.
        const char* phase = failed > 0                      ? "degraded"
                            : (pending > 0 || running == 0) ? "progressing"
                                                            : "ready";
        if (!knows_current) current = running;
        const std::string message = strCat(running, " running, ", pending, " pending, ", failed,
                                           " failed, ", current, " on the applied spec");
        const std::string detail = strCat("{\"running\":", running, ",\"pending\":", pending,
                                          ",\"failed\":", failed, ",\"current\":", current, "}");
        return conn
            .exec(strCat("INSERT INTO resource_status (region_id, resource_type, resource_id,"
                         " applied_version, phase, message, detail, apply_error, apply_attempts,"
                         " agent_id, observed_at, updated_at)"
                         " VALUES (?, 'deployment_topology', ?, ?, ?, ?, ?, NULL, 0, ?, ?, ?)"
                         " ON DUPLICATE KEY UPDATE applied_version = VALUES(applied_version),"
                         " message = VALUES(message), detail = VALUES(detail),"
                         " agent_id = VALUES(agent_id), observed_at = VALUES(observed_at),"
                         " updated_at = VALUES(updated_at)",
                         endsFailure(failing)),
                  {region, deployment, request.applied_version(), phase, message,
                   db::Value(db::Blob{detail}), request.agent_id(), request.observed_at_ms(), now})
            .status();
      });
  if (!status.ok()) {
    spdlog::error("ingest: deployment status not stored region={} deployment={} error=\"{}\"",
                  region, deployment, status.message());
    return counted(counters_, status);
  }
  if (dropped) {
    counters_.dropped.fetch_add(1, std::memory_order_relaxed);
    return absl::OkStatus();
  }

  std::vector<std::shared_ptr<DeploymentInstancesHook>> hooks;
  {
    std::lock_guard lock(hooks_mutex_);
    hooks = deployment_hooks_;
  }
  for (const auto& hook : hooks)
    hook->onInstancesReported(deployment, region, running, pending, failed);
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Sentinel status

absl::Status Ingestor::reportSentinelStatus(const std::string& region,
                                            const ReportSentinelStatusRequest& request) {
  counters_.sentinel_reports.fetch_add(1, std::memory_order_relaxed);
  if (auto st = checkRegion(region, request.region()); !st.ok()) return counted(counters_, st);
  if (auto st = validateSentinelReport(request); !st.ok()) return counted(counters_, st);

  const std::string& id = request.sentinel_id();
  const std::string& running_image = request.running_image();
  bool flipped = false;
  bool dropped = false;
  const auto status =
      pool_->transact("ingest.sentinel_status", [&](db::Connection& conn) -> absl::Status {
        flipped = false;
        dropped = false;
        // Locks the row first: concurrent reports of one sentinel are decided one after the other.
        KRANE_ASSIGN_OR_RETURN(auto rows,
                               conn.query("SELECT image, replicas, deploy_status, deleted_at,"
                                          " observed_generation, status_observed_at, version"
                                          " FROM sentinels"
                                          " WHERE id = ? AND region_id = ? FOR UPDATE",
                                          {id, region}));
        if (rows.empty() || !rows.rows[0].isNull("deleted_at")) {
          dropped = true;  // not held: the observed columns go with the row
          return absl::OkStatus();
        }
        const int64_t stored_generation = rows.rows[0].i64("observed_generation");
        if (request.observed_generation() < stored_generation ||
            (request.observed_generation() == stored_generation &&
             request.observed_at_ms() < rows.rows[0].i64("status_observed_at"))) {
          dropped = true;
          return absl::OkStatus();
        }
        KRANE_RETURN_IF_ERROR(
            conn.exec("UPDATE sentinels SET available_replicas = ?, updated_replicas = ?,"
                      " ready_replicas = ?, observed_generation = ?, running_image = ?, health = ?,"
                      " status_reported_at = ?, status_agent_id = ?, status_observed_at = ?"
                      " WHERE id = ? AND region_id = ?",
                      {request.available_replicas(), request.updated_replicas(),
                       request.ready_replicas(), request.observed_generation(),
                       running_image.empty() ? db::Value() : db::Value(running_image),
                       healthName(request.health()), unixMillis(), request.agent_id(),
                       request.observed_at_ms(), id, region})
                .status());

        const db::Row& row = rows.rows.front();
        const uint64_t desired_replicas = row.u64("replicas");
        const bool converged =
            row.str("deploy_status") == "progressing" && row.isNull("deleted_at") &&
            !running_image.empty() && running_image == row.str("image") &&
            request.health() == cluster::v1::SENTINEL_HEALTH_HEALTHY && desired_replicas > 0 &&
            request.available_replicas() >= desired_replicas &&
            // The agent has applied the latest change: a report about an earlier config of the
            // same image (say, fewer replicas) is not convergence.
            request.applied_version() >= row.u64("version");
        if (!converged) return absl::OkStatus();
        // Compare-and-set: only the report that moves the row out of `progressing` notifies.
        KRANE_ASSIGN_OR_RETURN(
            const uint64_t changed,
            conn.exec("UPDATE sentinels SET deploy_status = 'ready'"
                      " WHERE id = ? AND deploy_status = 'progressing' AND image = ?",
                      {id, running_image}));
        flipped = changed > 0;
        return absl::OkStatus();
      });
  if (!status.ok()) {
    spdlog::error("ingest: sentinel status not stored region={} sentinel={} error=\"{}\"", region,
                  id, status.message());
    return counted(counters_, status);
  }
  if (dropped) counters_.dropped.fetch_add(1, std::memory_order_relaxed);
  if (!flipped) return absl::OkStatus();

  spdlog::info("ingest: sentinel ready region={} sentinel={} image={} available_replicas={}",
               region, id, running_image, request.available_replicas());
  std::vector<std::shared_ptr<SentinelReadyHook>> hooks;
  {
    std::lock_guard lock(hooks_mutex_);
    hooks = sentinel_hooks_;
  }
  for (const auto& hook : hooks) hook->onSentinelReady(id, region);
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Resource status

absl::Status Ingestor::reportResourceStatus(const std::string& region,
                                            const ReportResourceStatusRequest& request) {
  counters_.resource_reports.fetch_add(1, std::memory_order_relaxed);
  if (auto st = checkRegion(region, request.region()); !st.ok()) return counted(counters_, st);
  if (auto st = validateResourceReport(request); !st.ok()) return counted(counters_, st);

  db::Value apply_error;
  uint32_t attempts = 0;
  if (request.has_apply_error()) {
    std::string text;
    const auto encoded = google::protobuf::util::MessageToJsonString(request.apply_error(), &text);
    if (!encoded.ok()) {
      return counted(counters_,
                     invalid(strCat("apply_error: cannot encode as JSON: ", encoded.ToString())));
    }
    apply_error = db::Value(std::move(text));
    attempts = request.apply_error().attempts();
  }

  bool dropped = false;
  const auto status =
      pool_->transact("ingest.resource_status", [&](db::Connection& conn) -> absl::Status {
        dropped = false;
        KRANE_ASSIGN_OR_RETURN(bool known,
                               held(conn, tables_, request.type(), request.id(), region));
        if (!known) {
          dropped = true;
          return request.phase() == cluster::v1::RESOURCE_PHASE_DELETED
                     ? feed::purgeStatus(conn,
                                         feed::ResourceKey{request.type(), request.id(), region})
                     : absl::OkStatus();
        }
        KRANE_ASSIGN_OR_RETURN(auto stored,
                               storedStatus(conn, region, request.type(), request.id()));
        const uint64_t version = request.version();
        const db::Value message =
            request.message().empty() ? db::Value() : db::Value(request.message());
        const db::Value detail =
            request.detail().empty() ? db::Value() : db::Value(db::Blob{request.detail()});
        if (request.has_apply_error()) {
          // A change the agent could not apply (parked): the resource still runs what was
          // applied before, so the applied version and its observation order stay.
          if (stored && (stored->newerThan(version, request.observed_at_ms()) ||
                         version < stored->failed_version)) {
            dropped = true;
            return absl::OkStatus();
          }
          return conn
              .exec(
                  "INSERT INTO resource_status (region_id, resource_type, resource_id,"
                  " applied_version, failed_version, phase, message, detail, apply_error,"
                  " apply_attempts, agent_id, observed_at, updated_at)"
                  " VALUES (?, ?, ?, 0, ?, ?, ?, ?, ?, ?, ?, 0, ?)"
                  " ON DUPLICATE KEY UPDATE failed_version = VALUES(failed_version),"
                  " phase = VALUES(phase), message = VALUES(message), detail = VALUES(detail),"
                  " apply_error = VALUES(apply_error), apply_attempts = VALUES(apply_attempts),"
                  " agent_id = VALUES(agent_id), updated_at = VALUES(updated_at)",
                  {region, request.type(), request.id(), version, phaseName(request.phase()),
                   message, detail, apply_error, attempts, request.agent_id(), unixMillis()})
              .status();
        }
        if (stored && stored->newerThan(version, request.observed_at_ms())) {
          dropped = true;
          return absl::OkStatus();
        }
        return conn
            .exec(strCat("INSERT INTO resource_status (region_id, resource_type, resource_id,"
                         " applied_version, phase, message, detail, apply_error, apply_attempts,"
                         " agent_id, observed_at, updated_at)"
                         " VALUES (?, ?, ?, ?, ?, ?, ?, NULL, 0, ?, ?, ?)"
                         " ON DUPLICATE KEY UPDATE applied_version = VALUES(applied_version),"
                         " message = VALUES(message), detail = VALUES(detail),"
                         " agent_id = VALUES(agent_id), observed_at = VALUES(observed_at),"
                         " updated_at = VALUES(updated_at)",
                         endsFailure(stored && stored->failsAfter(version))),
                  {region, request.type(), request.id(), version, phaseName(request.phase()),
                   message, detail, request.agent_id(), request.observed_at_ms(), unixMillis()})
            .status();
      });
  if (!status.ok()) {
    spdlog::error("ingest: resource status not stored region={} type={} id={} error=\"{}\"", region,
                  request.type(), request.id(), status.message());
    return counted(counters_, status);
  }
  if (dropped) counters_.dropped.fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Heartbeats and agents

absl::StatusOr<HeartbeatResponse> Ingestor::heartbeat(const std::string& region,
                                                      const HeartbeatRequest& request) {
  counters_.heartbeats.fetch_add(1, std::memory_order_relaxed);
  if (auto st = checkRegion(region, request.region()); !st.ok()) return counted(counters_, st);
  if (auto st = validateHeartbeat(request); !st.ok()) return counted(counters_, st);
  auto plugins = pluginsJson(request);
  if (!plugins.ok()) return counted(counters_, plugins.status());

  HeartbeatResponse response;
  const auto status =
      pool_->transact("ingest.heartbeat", [&](db::Connection& conn) -> absl::Status {
        response.Clear();
        const int64_t now = unixMillis();
        KRANE_RETURN_IF_ERROR(
            conn.exec("INSERT INTO agents (region_id, agent_id, build_version, applied_version,"
                      " is_leader, plugins, parked_events, retrying_events, first_seen_at,"
                      " last_seen_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                      " ON DUPLICATE KEY UPDATE build_version = VALUES(build_version),"
                      " applied_version = VALUES(applied_version), is_leader = VALUES(is_leader),"
                      " plugins = VALUES(plugins), parked_events = VALUES(parked_events),"
                      " retrying_events = VALUES(retrying_events),"
                      " last_seen_at = VALUES(last_seen_at)",
                      {region, request.agent_id(), request.build_version(),
                       request.applied_version(), request.is_leader(), *plugins,
                       request.parked_events(), request.retrying_events(), now, now})
                .status());
        KRANE_ASSIGN_OR_RETURN(
            auto latest,
            conn.query("SELECT version FROM region_versions WHERE region_id = ?", {region}));
        if (!latest.empty()) response.set_latest_version(latest.rows.front().u64(0));
        KRANE_ASSIGN_OR_RETURN(
            auto oldest,
            conn.query("SELECT MIN(version) FROM resource_changes WHERE region_id = ?", {region}));
        if (!oldest.empty() && !oldest.rows.front().isNull(0)) {
          response.set_oldest_version(oldest.rows.front().u64(0));
        }
        response.set_server_time_unix_ms(now);
        return absl::OkStatus();
      });
  if (!status.ok()) {
    spdlog::error("ingest: heartbeat not stored region={} agent={} error=\"{}\"", region,
                  request.agent_id(), status.message());
    return counted(counters_, status);
  }
  return response;
}

absl::StatusOr<int64_t> Ingestor::removeAgent(const std::string& region,
                                              const std::string& agent_id, bool force,
                                              std::chrono::milliseconds alive_within) {
  int64_t last_seen = 0;
  auto status = pool_->transact("agents.remove", [&](db::Connection& conn) -> absl::Status {
    KRANE_ASSIGN_OR_RETURN(auto rows, conn.query("SELECT last_seen_at FROM agents WHERE"
                                                 " region_id = ? AND agent_id = ? FOR UPDATE",
                                                 {region, agent_id}));
    if (rows.empty()) {
      return absl::NotFoundError(strCat("no agent \"", agent_id, "\" in region \"", region,
                                        "\" (kranectl agents lists them)"));
    }
    last_seen = rows.rows[0].i64(0);
    const int64_t ago = unixMillis() - last_seen;
    if (!force && ago < alive_within.count()) {
      return absl::FailedPreconditionError(
          strCat("agent \"", agent_id, "\" of region \"", region, "\" sent a heartbeat ",
                 ago / 1000, " s ago: it is running and would come back; stop it first, or force"));
    }
    return conn.exec("DELETE FROM agents WHERE region_id = ? AND agent_id = ?", {region, agent_id})
        .status();
  });
  if (!status.ok()) return status;
  spdlog::info("ingest: agent removed region={} agent={} last_seen_ms={}", region, agent_id,
               last_seen);
  return last_seen;
}

absl::StatusOr<std::vector<AgentInfo>> Ingestor::listAgents(const std::string& region) {
  std::string sql =
      "SELECT a.region_id, a.agent_id, a.build_version, a.applied_version, a.is_leader, a.plugins,"
      " a.parked_events, a.retrying_events, a.first_seen_at, a.last_seen_at,"
      " v.version AS latest_version"
      " FROM agents a LEFT JOIN region_versions v ON v.region_id = a.region_id";
  db::Params params;
  if (!region.empty()) {
    sql += " WHERE a.region_id = ?";
    params.emplace_back(region);
  }
  sql += " ORDER BY a.last_seen_at DESC, a.region_id, a.agent_id";

  auto conn = pool_->acquire();
  if (!conn.ok()) return conn.status();
  KRANE_ASSIGN_OR_RETURN(auto rows, (*conn)->query(sql, params));
  std::vector<AgentInfo> out;
  out.reserve(rows.rows.size());
  for (const auto& row : rows.rows) {
    AgentInfo a;
    a.region = row.str("region_id");
    a.agent_id = row.str("agent_id");
    a.build_version = row.str("build_version");
    a.applied_version = row.u64("applied_version");
    a.latest_version = row.isNull("latest_version") ? 0 : row.u64("latest_version");
    a.lag = a.latest_version > a.applied_version ? a.latest_version - a.applied_version : 0;
    a.is_leader = row.i64("is_leader") != 0;
    a.parked_events = row.u64("parked_events");
    a.retrying_events = row.u64("retrying_events");
    if (!row.isNull("plugins")) {
      auto plugins = parsePlugins(row.str("plugins"));
      if (!plugins.ok()) {
        return absl::DataLossError(strCat("agent ", a.agent_id, " in region ", a.region,
                                          ": column plugins: ", plugins.status().message()));
      }
      a.plugins = *std::move(plugins);
    }
    a.first_seen_ms = row.i64("first_seen_at");
    a.last_seen_ms = row.i64("last_seen_at");
    out.push_back(std::move(a));
  }
  return out;
}

}  // namespace krane::ingest
