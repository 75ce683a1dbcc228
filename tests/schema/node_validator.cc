#include "tests/schema/node_validator.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/strings.h"
#include "tests/support/process.h"

namespace krane::schema {
namespace {

namespace fs = std::filesystem;

absl::StatusOr<std::string> findNode() {
  std::string path = std::getenv("PATH") ? std::getenv("PATH") : "";
  path += ":/usr/bin:/usr/local/bin";
  std::stringstream dirs(path);
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    if (dir.empty()) continue;
    const fs::path node = fs::path(dir) / "node";
    if (::access(node.c_str(), X_OK) == 0) return node.string();
  }
  return absl::FailedPreconditionError(
      "node is not installed: run ./dev setup (it installs Node.js and the npm packages of "
      "tools/schema)");
}

// The validator's real path, once its npm packages are known to be installed next to it.
absl::StatusOr<std::string> script() {
  std::error_code ec;
  const fs::path real = fs::canonical(testing::runfile("tools/schema/validate.mjs"), ec);
  if (ec) {
    return absl::FailedPreconditionError(
        "tools/schema/validate.mjs is not among the test's runfiles (data: "
        "//tools/schema:validator)");
  }
  const fs::path modules = real.parent_path() / "node_modules";
  for (const char* package : {"kubernetes-models", "yaml"}) {
    if (!fs::exists(modules / package / "package.json")) {
      return absl::FailedPreconditionError(strCat("the npm package ", package,
                                                  " is not installed in ", modules.string(),
                                                  ": run ./dev setup"));
    }
  }
  return real.string();
}

absl::StatusOr<NodeValidation> run(std::vector<std::string> args) {
  auto node = findNode();
  if (!node.ok()) return node.status();
  auto path = script();
  if (!path.ok()) return path.status();
  args.insert(args.begin(), {*node, *path});
  const auto result = testing::runCommand(args, {}, std::chrono::seconds(120));
  NodeValidation out;
  out.exit_code = result.exit_code;
  out.output = result.out + result.err;
  if (result.exit_code == 2 || result.exit_code < 0 || result.exit_code > 2) {
    return absl::InternalError(
        strCat("the validator failed (exit ", result.exit_code, "): ", out.output));
  }
  std::stringstream lines(result.out);
  std::string line;
  while (std::getline(lines, line)) {
    if (!line.empty() && line.rfind("validate: ", 0) != 0) out.violations.push_back(line);
  }
  return out;
}

}  // namespace

absl::StatusOr<NodeValidation> validateObjects(const std::vector<nlohmann::json>& objects,
                                               const std::string& tmp_dir) {
  const std::string file = strCat(tmp_dir, "/objects-", ::getpid(), "-", objects.size(), ".json");
  {
    std::ofstream out(file);
    out << nlohmann::json(objects).dump();
    if (!out) return absl::InternalError(strCat("cannot write ", file));
  }
  return run({file});
}

absl::StatusOr<NodeValidation> validateYamlFiles(const std::vector<std::string>& files) {
  std::vector<std::string> args = {"--yaml"};
  args.insert(args.end(), files.begin(), files.end());
  return run(args);
}

}  // namespace krane::schema
