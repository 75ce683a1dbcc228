// Resource type "cilium_network_policy", in table `cilium_network_policies` keyed by id alone.
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

using cluster::v1::CiliumNetworkPolicy;
using Json = nlohmann::json;

constexpr size_t kMaxNameBytes = 253;
constexpr size_t kMaxPolicyBytes = 1 << 20;
// MariaDB's JSON_VALID (the CHECK of JSON columns) refuses documents nested 32 levels deep or
// more; MySQL allows 100.
constexpr size_t kMaxJsonDepth = 31;

constexpr std::string_view kColumns =
    "id, workspace_id, project_id, environment_id, region_id, name, policy, version, deleted_at";

absl::Status invalid(const std::string& message) { return absl::InvalidArgumentError(message); }

// Walks a JSON document without building it, tracking the nesting depth and the kind of the
// top-level value.
class JsonChecker final : public nlohmann::json_sax<Json> {
 public:
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override {
    if (depth_ == 0) top_is_object_ = true;
    return enter();
  }
  bool key(string_t&) override { return true; }
  bool end_object() override { return leave(); }
  bool start_array(std::size_t) override { return enter(); }
  bool end_array() override { return leave(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    if (error_.empty()) error_ = strCat("not valid JSON: ", e.what());
    return false;
  }
  const std::string& error() const { return error_; }
  bool topIsObject() const { return top_is_object_; }

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
  bool top_is_object_ = false;
  std::string error_;
};

bool isLowerAlnum(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }

absl::Status validatePolicy(const Resource& r) {
  if (!r.has_cilium_network_policy()) {
    return invalid(strCat("resource.cilium_network_policy: required for type \"", r.type(), "\""));
  }
  const CiliumNetworkPolicy& p = r.cilium_network_policy();
  if (!p.policy_id().empty() && p.policy_id() != r.id()) {
    return invalid(strCat("cilium_network_policy.policy_id: \"", p.policy_id(),
                          "\" differs from resource.id \"", r.id(), "\""));
  }
  if (!p.region().empty() && p.region() != r.region()) {
    return invalid(strCat("cilium_network_policy.region: \"", p.region(),
                          "\" differs from resource.region \"", r.region(), "\""));
  }
  KRANE_RETURN_IF_ERROR(checkId("cilium_network_policy.workspace_id", p.workspace_id()));
  KRANE_RETURN_IF_ERROR(checkId("cilium_network_policy.project_id", p.project_id()));
  KRANE_RETURN_IF_ERROR(checkId("cilium_network_policy.environment_id", p.environment_id()));
  if (!p.name().empty()) {
    // A Kubernetes object name: a DNS subdomain (RFC 1123).
    const std::string_view name = p.name();
    const bool ok = name.size() <= kMaxNameBytes && isLowerAlnum(name.front()) &&
                    isLowerAlnum(name.back()) && std::all_of(name.begin(), name.end(), [](char c) {
                      return isLowerAlnum(c) || c == '-' || c == '.';
                    });
    if (!ok) {
      return invalid(strCat("cilium_network_policy.name: \"", name, "\" must be at most ",
                            kMaxNameBytes,
                            " characters of a-z, 0-9, '-' and '.', starting and ending with a "
                            "letter or digit"));
    }
  }
  KRANE_RETURN_IF_ERROR(
      checkNotEmpty("cilium_network_policy.policy_json", p.policy_json(), kMaxPolicyBytes));
  JsonChecker checker;
  bool ok = false;
  try {
    ok = Json::sax_parse(p.policy_json().begin(), p.policy_json().end(), &checker);
  } catch (const Json::exception& e) {
    return invalid(strCat("cilium_network_policy.policy_json: not valid JSON: ", e.what()));
  }
  if (!ok) {
    return invalid(strCat("cilium_network_policy.policy_json: ",
                          checker.error().empty() ? "not valid JSON" : checker.error()));
  }
  if (!checker.topIsObject()) {
    return invalid(
        "cilium_network_policy.policy_json: must be a JSON object (a CiliumNetworkPolicy or its "
        "spec)");
  }
  return absl::OkStatus();
}

Resource fromRow(const db::Row& row) {
  Resource r;
  r.set_type(std::string(kCiliumNetworkPolicy));
  r.set_id(row.str("id"));
  r.set_region(row.str("region_id"));
  r.set_version(row.u64("version"));
  CiliumNetworkPolicy* p = r.mutable_cilium_network_policy();
  p->set_policy_id(r.id());
  p->set_region(r.region());
  p->set_workspace_id(row.str("workspace_id"));
  p->set_project_id(row.str("project_id"));
  p->set_environment_id(row.str("environment_id"));
  if (!row.isNull("name")) p->set_name(row.str("name"));
  p->set_policy_json(row.str("policy"));
  return r;
}

class CiliumPolicyTable final : public ResourceTable {
 public:
  std::string_view type() const override { return kCiliumNetworkPolicy; }

  absl::Status validate(const Resource& r) const override { return validatePolicy(r); }

  absl::StatusOr<std::optional<RowInfo>> lock(db::Connection& conn,
                                              const ResourceKey& key) const override {
    KRANE_ASSIGN_OR_RETURN(auto rows,
                           conn.query("SELECT region_id, version, deleted_at IS NOT NULL AS deleted"
                                      " FROM cilium_network_policies WHERE id = ? FOR UPDATE",
                                      {key.id}));
    if (rows.empty()) return std::optional<RowInfo>();
    const auto& row = rows.rows[0];
    return std::optional<RowInfo>(RowInfo{row.str(0), row.u64(1), row.i64(2) != 0});
  }

  absl::StatusOr<std::optional<StoredResource>> load(db::Connection& conn,
                                                     const ResourceKey& key) const override {
    KRANE_ASSIGN_OR_RETURN(auto rows, conn.query(strCat("SELECT ", kColumns,
                                                        " FROM cilium_network_policies WHERE id = ?"
                                                        " AND region_id = ?"),
                                                 {key.id, key.region}));
    if (rows.empty()) return std::optional<StoredResource>();
    return std::optional<StoredResource>(
        StoredResource{fromRow(rows.rows[0]), !rows.rows[0].isNull("deleted_at")});
  }

  absl::Status scanRegion(
      db::Connection& conn, std::string_view region,
      const std::function<absl::Status(Resource&&)>& on_resource) const override {
    return conn.queryEach(strCat("SELECT ", kColumns,
                                 " FROM cilium_network_policies WHERE region_id = ?"
                                 " AND deleted_at IS NULL ORDER BY id"),
                          {region}, [&](const db::Row& row) { return on_resource(fromRow(row)); });
  }

  absl::StatusOr<std::vector<Resource>> list(db::Connection& conn, std::string_view region,
                                             std::string_view type, const ListCursor& after,
                                             size_t limit) const override {
    std::vector<Resource> out;
    if (!type.empty() && type != kCiliumNetworkPolicy) return out;
    if (after.type > kCiliumNetworkPolicy) return out;
    std::string sql = strCat("SELECT ", kColumns,
                             " FROM cilium_network_policies WHERE deleted_at IS NULL"
                             " AND (? = '' OR region_id = ?)");
    db::Params params = {region, region};
    if (after.type == kCiliumNetworkPolicy) {
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
        "DELETE FROM cilium_network_policies WHERE deleted_at IS NOT NULL AND deleted_at < ?"
        " LIMIT ?",
        {cutoff_ms, static_cast<uint64_t>(limit)});
  }

 protected:
  absl::Status write(db::Connection& conn, const Resource& r, uint64_t version,
                     int64_t now_ms) const override {
    if (!r.has_cilium_network_policy()) return validatePolicy(r);
    const CiliumNetworkPolicy& p = r.cilium_network_policy();
    return conn
        .exec(
            "INSERT INTO cilium_network_policies (id, workspace_id, project_id, environment_id,"
            " region_id, name, policy, version, created_at, updated_at, deleted_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL)"
            " ON DUPLICATE KEY UPDATE workspace_id = VALUES(workspace_id),"
            " project_id = VALUES(project_id), environment_id = VALUES(environment_id),"
            " region_id = VALUES(region_id), name = VALUES(name), policy = VALUES(policy),"
            " version = VALUES(version), updated_at = VALUES(updated_at), deleted_at = NULL",
            {r.id(), p.workspace_id(), p.project_id(), p.environment_id(), r.region(),
             p.name().empty() ? db::Value() : db::Value(p.name()), p.policy_json(), version, now_ms,
             now_ms})
        .status();
  }

  absl::Status markDeleted(db::Connection& conn, const ResourceKey& key, uint64_t version,
                           int64_t now_ms) const override {
    return conn
        .exec(
            "UPDATE cilium_network_policies SET deleted_at = ?, updated_at = ?, version = ?"
            " WHERE id = ? AND region_id = ?",
            {now_ms, now_ms, version, key.id, key.region})
        .status();
  }
};

}  // namespace

std::unique_ptr<ResourceTable> makeCiliumPolicyTable() {
  return std::make_unique<CiliumPolicyTable>();
}

}  // namespace krane::feed
