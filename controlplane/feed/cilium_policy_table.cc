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
#include "controlplane/feed/json_check.h"
#include "controlplane/feed/single_type_table.h"
#include "controlplane/feed/tables.h"
#include "plugins/cilium/policy.h"

namespace krane::feed {
namespace {

using cluster::v1::CiliumNetworkPolicy;
using Json = nlohmann::json;

constexpr size_t kMaxNameBytes = 253;
constexpr size_t kMaxPolicyBytes = 1 << 20;

constexpr std::string_view kColumns =
    "id, workspace_id, project_id, environment_id, region_id, name, policy, version, deleted_at";

absl::Status invalid(const std::string& message) { return absl::InvalidArgumentError(message); }

bool isLowerAlnum(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }

absl::Status validatePolicy(const Resource& r) {
  if (!r.has_cilium_network_policy()) {
    return invalid(strCat("resource.cilium_network_policy: required for type ", quote(r.type())));
  }
  const CiliumNetworkPolicy& p = r.cilium_network_policy();
  if (!p.policy_id().empty() && p.policy_id() != r.id()) {
    return invalid(strCat("cilium_network_policy.policy_id: ", quote(p.policy_id()),
                          " differs from resource.id ", quote(r.id())));
  }
  if (!p.region().empty() && p.region() != r.region()) {
    return invalid(strCat("cilium_network_policy.region: ", quote(p.region()),
                          " differs from resource.region ", quote(r.region())));
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
      return invalid(strCat("cilium_network_policy.name: ", quote(name), " must be at most ",
                            kMaxNameBytes,
                            " characters of a-z, 0-9, '-' and '.', starting and ending with a "
                            "letter or digit"));
    }
  }
  KRANE_RETURN_IF_ERROR(
      checkNotEmpty("cilium_network_policy.policy_json", p.policy_json(), kMaxPolicyBytes));
  KRANE_RETURN_IF_ERROR(
      checkJsonDocument("cilium_network_policy.policy_json", p.policy_json(), JsonShape::kObject));
  // The plugin's own check, so a policy it would refuse is refused here, before it is stored,
  // rather than parked by every agent that receives it.
  auto object = cilium::policyObject(p, r.id());
  if (!object.ok()) {
    return invalid(strCat("cilium_network_policy.", toStd(object.status().message())));
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

class CiliumPolicyTable final : public SingleTypeTable {
 public:
  CiliumPolicyTable()
      : SingleTypeTable(kCiliumNetworkPolicy, "cilium_network_policies", "id", kColumns,
                        /*unique_per_region=*/false) {}

  absl::Status validate(const Resource& r) const override { return validatePolicy(r); }

 protected:
  absl::StatusOr<Resource> decode(const db::Row& row) const override { return fromRow(row); }

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
};

}  // namespace

std::unique_ptr<ResourceTable> makeCiliumPolicyTable() {
  return std::make_unique<CiliumPolicyTable>();
}

}  // namespace krane::feed
