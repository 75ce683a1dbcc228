// Small operations the runtime plugins share on objects in their wire form.
#pragma once

#include <string>
#include <vector>

#include "plugins/runtime/kubernetes/client.h"

namespace krane::kube {

// apiVersion, kind, namespace and name of `object`.
ObjectRef refOf(const Json& object);

// metadata.labels[key], or "" when absent.
std::string labelOf(const Json& object, const std::string& key);

// Deletes `ref` (background propagation); an object already gone is OK.
absl::Status removeIfPresent(Client& client, const ObjectRef& ref);

// Objects of kind `kind` (apiVersion `api_version`) in `ns` (every namespace when empty) that
// match `label_selector`, every page.
absl::StatusOr<std::vector<Json>> listMatching(Client& client, const std::string& api_version,
                                               const std::string& kind, const std::string& ns,
                                               const std::string& label_selector);

}  // namespace krane::kube
