// Where a Kubernetes object lives in the REST API: the kinds Krane manages, their API group,
// plural resource name and scope, and the URL paths computed from them.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace krane::kube {

struct ResourceType {
  std::string group;    // "" for the core API
  std::string version;  // "v1"
  std::string kind;     // "Deployment"
  std::string plural;   // "deployments"
  bool namespaced = true;

  std::string apiVersion() const { return group.empty() ? version : group + "/" + version; }
  // "/api/v1" or "/apis/apps/v1".
  std::string groupVersionPath() const;
  // The collection: "/apis/apps/v1/namespaces/ns/deployments" (cluster-wide when `ns` is empty).
  std::string collectionPath(std::string_view ns) const;
  // One object: "<collection>/<name>".
  std::string objectPath(std::string_view ns, std::string_view name) const;
};

// The kind Krane knows for `api_version` ("apps/v1", "v1") and `kind`; the version is taken from
// `api_version`, so another served version of a known group and kind works too. INVALID_ARGUMENT
// naming both for an unknown kind or a malformed apiVersion.
absl::StatusOr<ResourceType> resourceFor(std::string_view api_version, std::string_view kind);

// The kind served at `group` / `plural` (used by the fake API server to route requests).
absl::StatusOr<ResourceType> resourceForPlural(std::string_view group, std::string_view version,
                                               std::string_view plural);

// Every built-in kind, in a stable order.
const std::vector<ResourceType>& knownResources();

}  // namespace krane::kube
