#include "common/yaml_config.h"

#include <fstream>
#include <sstream>

namespace krane::config {

absl::Status bad(const std::string& source, const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(strCat(source, ": ", path, ": ", what));
}

absl::StatusOr<YAML::Node> parse(const std::string& yaml, const std::string& source) {
  try {
    return YAML::Load(yaml);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        strCat(source, ": not valid YAML: line ", e.mark.line + 1, ": ", e.msg));
  }
}

absl::Status walk(const YAML::Node& node, const std::string& source, const std::string& prefix,
                  const std::map<std::string, Handler>& keys) {
  if (!node || node.IsNull()) return absl::OkStatus();
  if (!node.IsMap())
    return bad(source, prefix.empty() ? "(top level)" : prefix, "must be a mapping");
  for (const auto& entry : node) {
    const std::string key = entry.first.as<std::string>();
    const std::string path = prefix.empty() ? key : strCat(prefix, ".", key);
    auto it = keys.find(key);
    if (it == keys.end()) {
      std::string known;
      for (const auto& [name, fn] : keys) strAppend(&known, known.empty() ? "" : ", ", name);
      return bad(source, path, strCat("unknown key (known here: ", known, ")"));
    }
    if (auto st = it->second(entry.second, path); !st.ok()) return st;
  }
  return absl::OkStatus();
}

Handler text(std::string& out, const std::string& source) {
  return [&out, source](const YAML::Node& n, const std::string& path) -> absl::Status {
    if (!n.IsScalar()) return bad(source, path, "must be a string");
    out = n.as<std::string>();
    return absl::OkStatus();
  };
}

Handler flag(bool& out, const std::string& source) {
  return [&out, source](const YAML::Node& n, const std::string& path) -> absl::Status {
    if (!n.IsScalar() || !YAML::convert<bool>::decode(n, out))
      return bad(source, path, "must be true or false");
    return absl::OkStatus();
  };
}

Handler oneOf(std::string& out, const std::string& source, std::vector<std::string> allowed) {
  return [&out, source, allowed](const YAML::Node& n, const std::string& path) -> absl::Status {
    if (!n.IsScalar()) return bad(source, path, "must be a string");
    const std::string value = n.as<std::string>();
    std::string list;
    for (const auto& a : allowed) {
      if (a == value) {
        out = value;
        return absl::OkStatus();
      }
      strAppend(&list, list.empty() ? "" : ", ", a);
    }
    return bad(source, path, strCat("\"", value, "\" is not one of: ", list));
  };
}

}  // namespace krane::config
