// Small operations the runtime plugins share on objects in their wire form.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "plugins/runtime/kubernetes/client.h"

namespace krane::kube {

// apiVersion, kind, namespace and name of `object`.
ObjectRef refOf(const Json& object);

// metadata.labels[key], or "" when absent.
std::string labelOf(const Json& object, const std::string& key);

// On a workload's Deployment (its own metadata, never the pod template, so that recording it
// restarts nothing): the resource version last applied to it. A plugin host started afresh
// reports it until the next change, since the control plane drops reports older than the ones
// it stored.
inline constexpr char kAppliedVersionAnnotation[] = "krane.dev/applied-version";
void setAppliedVersion(Json& object, uint64_t version);
// The version an apply recorded on `object`; 0 when none, or not a number.
uint64_t appliedVersionOf(const Json& object);

// Deletes `ref` (background propagation); an object already gone is OK.
absl::Status removeIfPresent(Client& client, const ObjectRef& ref);

// Objects of kind `kind` (apiVersion `api_version`) in `ns` (every namespace when empty) that
// match `label_selector`, every page.
absl::StatusOr<std::vector<Json>> listMatching(Client& client, const std::string& api_version,
                                               const std::string& kind, const std::string& ns,
                                               const std::string& label_selector);

}  // namespace krane::kube
