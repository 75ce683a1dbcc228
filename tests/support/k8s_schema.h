// Validation of generated Kubernetes objects against upstream schemas, for plugin tests.
//
// Reads the schemas under a directory (by default tests/schema/upstream, which holds the upstream
// Cilium CRD, else the `schemas/` folder of the shared folder next to the source tree;
// KRANE_SCHEMA_DIR overrides):
// - CustomResourceDefinitions (YAML): the openAPIV3Schema of every served version;
// - OpenAPI v3 documents (JSON, as the API server publishes at /openapi/v3): each schema of
//   components.schemas carrying x-kubernetes-group-version-kind, with #/components/schemas refs.
// Checked: type (with nullable and x-kubernetes-int-or-string), properties, required, items,
// additionalProperties, enum, pattern, min/max length, items and properties, minimum / maximum,
// allOf / anyOf / oneOf / not, x-kubernetes-list-type set and map uniqueness. Stricter than an
// API server in one way, on purpose: a field the schema does not know is an error (the server
// would silently prune it, which is how generated fields get lost), unless the schema says
// x-kubernetes-preserve-unknown-fields. `format` is not checked.
//
// No Debian package covers this: valijson (libvalijson-dev) and ajv (node-ajv) implement JSON
// Schema drafts, not OpenAPI v3's nullable or the x-kubernetes-* extensions.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"

namespace krane::testing {

class K8sSchemas {
 public:
  using Json = nlohmann::json;

  // Every *.yaml, *.yml and *.json file under `dir` (recursively). INVALID_ARGUMENT naming the
  // file when one cannot be read as a CRD or an OpenAPI document.
  static absl::StatusOr<K8sSchemas> load(const std::string& dir);
  // KRANE_SCHEMA_DIR, else <source tree>/../shared/schemas found through the test's runfiles.
  static absl::StatusOr<std::string> defaultDir();

  bool has(const std::string& api_version, const std::string& kind) const;
  // "cilium.io/v2 CiliumNetworkPolicy", ...
  std::vector<std::string> kinds() const;

  // Violations of `object` against the schema of its apiVersion and kind, each as
  // "<path>: <what>" ("spec.egress[0].toPorts[0].ports[0].protocol: must be one of ..."). A kind
  // without a schema is one violation saying so.
  std::vector<std::string> violations(const Json& object) const;
  // OK, or INVALID_ARGUMENT "<kind> <name>: " followed by every violation.
  absl::Status validate(const Json& object) const;

 private:
  struct Entry {
    std::shared_ptr<const Json> document;  // for $ref
    Json schema;
  };
  std::map<std::string, Entry> schemas_;  // "<apiVersion> <kind>"
};

}  // namespace krane::testing
