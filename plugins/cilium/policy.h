// A stored Cilium network policy (krane.cluster.v1.CiliumNetworkPolicy) as the object Krane
// applies: `cilium.io/v2` `CiliumNetworkPolicy`, checked before anything reaches a cluster.
//
// `policy_json` is either a whole object ({"apiVersion", "kind", "metadata", "spec" | "specs"}) or
// just one rule (the `spec`: endpointSelector, ingress, ...). It is a whole object when it has
// any of the keys apiVersion, kind, metadata, spec or specs.
//
// Checked (INVALID_ARGUMENT, message starting with the field's path):
//   - the JSON parses and is an object; apiVersion, when given, is cilium.io/v2 and kind, when
//     given, CiliumNetworkPolicy; no other top-level keys than those and `status`;
//   - at least one rule (spec, or a non-empty specs); each rule has exactly one of
//     endpointSelector and nodeSelector, only the keys a rule has upstream (a key the API
//     server would silently prune is refused), and the right JSON type for each;
//   - the name: the message's `name`, else metadata.name, else derived from the policy id; a
//     DNS-1123 subdomain; the message's `name` and metadata.name must agree when both are set;
//   - the namespace: metadata.namespace, else `default_namespace` when not empty, else the
//     workspace's namespace (workspaceNamespace); a DNS-1123 label.
//
// Metadata Krane adds (and which win over the same keys in the JSON):
//   labels      app.kubernetes.io/managed-by=krane, app.kubernetes.io/component=cilium-policy,
//               krane.dev/workspace.id, project.id, environment.id, region and policy.id
//               (each only when the id is a valid label value);
//   annotation  krane.dev/policy.id: the resource id, always (it identifies the object for
//               deletes and garbage collection).
// metadata keys the API server manages (resourceVersion, uid, ...) are dropped.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "krane/cluster/v1/state.pb.h"
#include "nlohmann/json.hpp"

namespace krane::cilium {

inline constexpr char kResourceType[] = "cilium_network_policy";
inline constexpr char kApiVersion[] = "cilium.io/v2";
inline constexpr char kKind[] = "CiliumNetworkPolicy";
inline constexpr char kManagedByLabel[] = "app.kubernetes.io/managed-by";
inline constexpr char kComponentLabel[] = "app.kubernetes.io/component";
inline constexpr char kComponent[] = "cilium-policy";
inline constexpr char kPolicyIdKey[] = "krane.dev/policy.id";
// The region whose agent applied the object: garbage collection after a sync only considers
// its own region's objects (agents of several regions may share a cluster).
inline constexpr char kRegionLabel[] = "krane.dev/region";
// The label selector of every object this plugin manages.
inline constexpr char kManagedSelector[] =
    "app.kubernetes.io/managed-by=krane,app.kubernetes.io/component=cilium-policy";

// The complete object for `policy` (resource id `resource_id`), or INVALID_ARGUMENT naming the
// field ("policy_json.spec.ingress: must be an array").
absl::StatusOr<nlohmann::json> policyObject(const cluster::v1::CiliumNetworkPolicy& policy,
                                            const std::string& resource_id,
                                            const std::string& default_namespace = "");

// A DNS-1123 label made of `prefix` ("" for none) and `id`: lowercased, other characters turned
// into '-', at most 63 characters; an id that had to be changed gets a hash suffix, so two ids
// never share a name.
std::string dnsLabel(const std::string& prefix, const std::string& id);

// The namespace of a workspace's objects: dnsLabel("", workspace_id).
std::string workspaceNamespace(const std::string& workspace_id);

bool isDnsLabel(const std::string& s);
bool isDnsSubdomain(const std::string& s);
bool isLabelValue(const std::string& s);

}  // namespace krane::cilium
