// Runs tools/schema/validate.mjs (the kubernetes-models validator) from a test.
//
// The script is a runfile of the test (//tools/schema:validator); its runfile is a symlink into
// the source tree, where `./dev setup` installed the npm packages (tools/schema/node_modules).
// Node resolves the script's imports from its real location, so nothing is copied. When the
// packages or node are missing the functions return FAILED_PRECONDITION saying to run
// ./dev setup: the tests fail, they never skip.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"

namespace krane::schema {

struct NodeValidation {
  int exit_code = -1;                   // 0 all valid, 1 violations, 2 unreadable input
  std::vector<std::string> violations;  // "<Kind> <ns>/<name>: <path>: <message>  (<where>)"
  std::string output;                   // everything printed, for failure messages
};

// Validates `objects` (written to a temporary JSON file under `tmp_dir`).
absl::StatusOr<NodeValidation> validateObjects(const std::vector<nlohmann::json>& objects,
                                               const std::string& tmp_dir);
// Validates the YAML documents of `files`.
absl::StatusOr<NodeValidation> validateYamlFiles(const std::vector<std::string>& files);

}  // namespace krane::schema
