// Strict YAML configuration reading: every key known, unknown keys and bad values refused with
// the key's path ("agent.yaml: plugins[1].workers: must be between 1 and 64, got 0").
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <type_traits>

#include <yaml-cpp/yaml.h>

#include "absl/status/statusor.h"
#include "common/host_port.h"
#include "common/strings.h"

namespace krane::config {

using Handler = std::function<absl::Status(const YAML::Node&, const std::string& path)>;

absl::Status bad(const std::string& source, const std::string& path, const std::string& what);

// Parses YAML text; errors name the source and line.
absl::StatusOr<YAML::Node> parse(const std::string& yaml, const std::string& source);

// Walks a mapping, calling the handler of each key; refuses unknown keys by their path.
absl::Status walk(const YAML::Node& node, const std::string& source, const std::string& prefix,
                  const std::map<std::string, Handler>& keys);

Handler text(std::string& out, const std::string& source);
Handler flag(bool& out, const std::string& source);
Handler oneOf(std::string& out, const std::string& source, std::vector<std::string> allowed);

template <typename T>
Handler number(T& out, const std::string& source, int64_t min, int64_t max) {
  return [&out, source, min, max](const YAML::Node& n, const std::string& path) -> absl::Status {
    int64_t value = 0;
    if (!n.IsScalar() || !YAML::convert<int64_t>::decode(n, value)) {
      return bad(source, path,
                 strCat("must be a whole number, got \"", n.IsScalar() ? n.Scalar() : "a structure",
                        "\""));
    }
    if (value < min || value > max)
      return bad(source, path, strCat("must be between ", min, " and ", max, ", got ", value));
    if constexpr (std::is_integral_v<T>) {
      out = static_cast<T>(value);
    } else {
      out = T(value);
    }
    return absl::OkStatus();
  };
}

// host:port checks live in common/host_port.h; config readers call them as config::.
using ::krane::validHostPort;

}  // namespace krane::config
