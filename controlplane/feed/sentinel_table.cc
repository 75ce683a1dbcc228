// Resource type "sentinel", in table `sentinels` keyed by id alone. Only the desired columns
// belong to the resource; the observed ones (replica counts, running image, health, ...) and
// deploy_status are written by status reports and the sentinel service, never from here.
#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "common/strings.h"
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
// MariaDB's JSON_VALID (the CHECK of JSON columns) refuses documents nested 32 levels deep or
// more; MySQL allows 100.
constexpr size_t kMaxJsonDepth = 31;

constexpr std::string_view kColumns =
    "id, workspace_id, project_id, app_id, environment_id, region_id, image, desired_state,"
    " replicas, cpu_millicores, memory_mib, config, version, deleted_at";

absl::Status invalid(const std::string& message) { return absl::InvalidArgumentError(message); }

absl::Status checkRange(std::string_view field, uint64_t value, uint64_t min, uint64_t max) {
  if (value < min || value > max) {
    return invalid(strCat(field, ": must be between ", min, " and ", max, ", got ", value));
  }
  return absl::OkStatus();
}

// Walks a JSON document without building it, tracking the nesting depth.
class JsonChecker final : public nlohmann::json_sax<Json> {
 public:
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return enter(); }
  bool key(string_t&) override { return true; }
  bool end_object() override { return leave(); }
  bool start_array(std::size_t) override { return enter(); }
  bool end_array() override { return leave(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    if (error_.empty()) error_ = strCat("not valid JSON: ", e.what());
    return false;
  }
  const std::string& error() const { return error_; }

 private:
  bool enter() {
    if (++depth_ > kMaxJsonDepth) {
      error_ = strCat("nested deeper than ", kMaxJsonDepth, " levels");
      return false;
    }
    return true;
  }
  bool leave() {
    --depth_;
    return true;
  }
  size_t depth_ = 0;
  std::string error_;
};

absl::Status checkJson(std::string_view field, std::string_view text, size_t max_size) {
  if (text.size() > max_size) {
    return invalid(strCat(field, ": at most ", max_size, " bytes, got ", text.size()));
  }
  JsonChecker checker;
  bool ok = false;
  try {
    ok = Json::sax_parse(text.begin(), text.end(), &checker);
  } catch (const Json::exception& e) {
    return invalid(strCat(field, ": not valid JSON: ", e.what()));
  }
  if (!ok) {
    return invalid(
        strCat(field, ": ", checker.error().empty() ? "not valid JSON" : checker.error()));
  }
  return absl::OkStatus();
}

absl::Status validateSentinel(const Resource& r) {
  if (!r.has_sentinel()) {
    return invalid(strCat("resource.sentinel: required for type \"", r.type(), "\""));
  }
  const Sentinel& s = r.sentinel();
  if (!s.sentinel_id().empty() && s.sentinel_id() != r.id()) {
    return invalid(strCat("sentinel.sentinel_id: \"", s.sentinel_id(),
                          "\" differs from resource.id \"", r.id(), "\""));
  }
  if (!s.region().empty() && s.region() != r.region()) {
    return invalid(strCat("sentinel.region: \"", s.region(), "\" differs from resource.region \"",
                          r.region(), "\""));
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
  return absl::OkStatus();
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

Resource fromRow(const db::Row& row) {
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
  return r;
}

class SentinelTable final : public ResourceTable {
 public:
  std::string_view type() const override { return kSentinel; }

  absl::Status validate(const Resource& r) const override { return validateSentinel(r); }

  absl::StatusOr<std::optional<RowInfo>> lock(db::Connection& conn,
                                              const ResourceKey& key) const override {
    KRANE_ASSIGN_OR_RETURN(auto rows,
                           conn.query("SELECT region_id, version, deleted_at IS NOT NULL AS deleted"
                                      " FROM sentinels WHERE id = ? FOR UPDATE",
                                      {key.id}));
    if (rows.empty()) return std::optional<RowInfo>();
    const auto& row = rows.rows[0];
    return std::optional<RowInfo>(RowInfo{row.str(0), row.u64(1), row.i64(2) != 0});
  }

  absl::StatusOr<std::optional<StoredResource>> load(db::Connection& conn,
                                                     const ResourceKey& key) const override {
    KRANE_ASSIGN_OR_RETURN(
        auto rows,
        conn.query(strCat("SELECT ", kColumns, " FROM sentinels WHERE id = ? AND region_id = ?"),
                   {key.id, key.region}));
    if (rows.empty()) return std::optional<StoredResource>();
    return std::optional<StoredResource>(
        StoredResource{fromRow(rows.rows[0]), !rows.rows[0].isNull("deleted_at")});
  }

  absl::Status scanRegion(
      db::Connection& conn, std::string_view region,
      const std::function<absl::Status(Resource&&)>& on_resource) const override {
    return conn.queryEach(
        strCat("SELECT ", kColumns,
               " FROM sentinels WHERE region_id = ? AND deleted_at IS NULL ORDER BY id"),
        {region}, [&](const db::Row& row) { return on_resource(fromRow(row)); });
  }

  absl::StatusOr<std::vector<Resource>> list(db::Connection& conn, std::string_view region,
                                             std::string_view type, const ListCursor& after,
                                             size_t limit) const override {
    std::vector<Resource> out;
    if (!type.empty() && type != kSentinel) return out;
    if (after.type > kSentinel) return out;
    std::string sql = strCat("SELECT ", kColumns,
                             " FROM sentinels WHERE deleted_at IS NULL"
                             " AND (? = '' OR region_id = ?)");
    db::Params params = {region, region};
    if (after.type == kSentinel) {
      sql += " AND (region_id, id) > (?, ?)";
      params.emplace_back(after.region);
      params.emplace_back(after.id);
    }
    sql += " ORDER BY region_id, id LIMIT ?";
    params.emplace_back(static_cast<uint64_t>(limit));
    KRANE_RETURN_IF_ERROR(conn.queryEach(sql, params, [&](const db::Row& row) {
      out.push_back(fromRow(row));
      return absl::OkStatus();
    }));
    return out;
  }

  absl::StatusOr<uint64_t> purgeDeleted(db::Connection& conn, int64_t cutoff_ms,
                                        size_t limit) const override {
    return conn.exec(
        "DELETE FROM sentinels WHERE deleted_at IS NOT NULL AND deleted_at < ? LIMIT ?",
        {cutoff_ms, static_cast<uint64_t>(limit)});
  }

 protected:
  absl::Status write(db::Connection& conn, const Resource& r, uint64_t version,
                     int64_t now_ms) const override {
    if (!r.has_sentinel()) return validateSentinel(r);
    const Sentinel& s = r.sentinel();
    return conn
        .exec(
            "INSERT INTO sentinels (id, workspace_id, project_id, app_id, environment_id,"
            " region_id, image, desired_state, replicas, cpu_millicores, memory_mib, config,"
            " version, created_at, updated_at, deleted_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL)"
            " ON DUPLICATE KEY UPDATE workspace_id = VALUES(workspace_id),"
            " project_id = VALUES(project_id), app_id = VALUES(app_id),"
            " environment_id = VALUES(environment_id), region_id = VALUES(region_id),"
            " image = VALUES(image), desired_state = VALUES(desired_state),"
            " replicas = VALUES(replicas), cpu_millicores = VALUES(cpu_millicores),"
            " memory_mib = VALUES(memory_mib), config = VALUES(config),"
            " version = VALUES(version), updated_at = VALUES(updated_at), deleted_at = NULL",
            {r.id(), s.workspace_id(), s.project_id(), s.app_id(), s.environment_id(), r.region(),
             s.image(), desiredStateName(s.desired_state()), s.replicas(), s.cpu_millicores(),
             s.memory_mib(), s.config_json().empty() ? db::Value() : db::Value(s.config_json()),
             version, now_ms, now_ms})
        .status();
  }

  absl::Status markDeleted(db::Connection& conn, const ResourceKey& key, uint64_t version,
                           int64_t now_ms) const override {
    return conn
        .exec(
            "UPDATE sentinels SET deleted_at = ?, updated_at = ?, version = ?"
            " WHERE id = ? AND region_id = ?",
            {now_ms, now_ms, version, key.id, key.region})
        .status();
  }
};

}  // namespace

std::unique_ptr<ResourceTable> makeSentinelTable() { return std::make_unique<SentinelTable>(); }

}  // namespace krane::feed
