// The configuration format of the test plugins: `key=value` lines, e.g.
//
//   log=/tmp/calls.txt
//   types=widget,gadget
//
// Unknown keys are refused so that a typo in a test fails loudly.
#pragma once

#include <map>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/strings.h"

namespace krane::test_plugins {

using Config = std::map<std::string, std::string>;

inline absl::StatusOr<Config> parseConfig(std::string_view plugin, std::string_view text,
                                          const std::set<std::string>& known) {
  Config config;
  std::istringstream in{std::string(text)};
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const auto eq = line.find('=');
    if (eq == std::string::npos) {
      return absl::InvalidArgumentError(
          strCat(plugin, ": config line \"", line, "\" is not key=value"));
    }
    std::string key = line.substr(0, eq);
    if (!known.count(key)) {
      return absl::InvalidArgumentError(strCat(plugin, ": unknown config key \"", key, "\""));
    }
    config[key] = line.substr(eq + 1);
  }
  return config;
}

// `types=a,b` as a list; `fallback` when the key is absent.
inline std::vector<std::string> typesFrom(const Config& config, const std::string& fallback) {
  auto it = config.find("types");
  if (it == config.end()) return {fallback};
  std::vector<std::string> types;
  std::istringstream in(it->second);
  std::string type;
  while (std::getline(in, type, ',')) types.push_back(type);
  return types;
}

inline std::string valueOr(const Config& config, const std::string& key,
                           const std::string& fallback = "") {
  auto it = config.find(key);
  return it == config.end() ? fallback : it->second;
}

}  // namespace krane::test_plugins
