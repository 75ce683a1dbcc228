#include "plugins/runtime/process/config.h"

#include <algorithm>

#include "common/status.h"
#include "common/strings.h"

namespace krane::runtime {

using nlohmann::json;

// Refuses keys of `object` (at `path`) that are not in `known`.
absl::Status onlyKeys(const json& object, const std::string& path,
                      std::initializer_list<std::string_view> known) {
  if (!object.is_object()) return absl::InvalidArgumentError(strCat(path, ": must be a mapping"));
  for (const auto& [key, _] : object.items()) {
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      return absl::InvalidArgumentError(
          strCat(path.empty() ? "" : strCat(path, "."), key, ": unknown key"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int> intAt(const json& object, const std::string& key, const std::string& path,
                          int fallback, int min, int max) {
  if (!object.contains(key)) return fallback;
  const json& v = object.at(key);
  if (!v.is_number_integer() || v.get<int64_t>() < min || v.get<int64_t>() > max) {
    return absl::InvalidArgumentError(strCat(path, ".", key, ": must be a whole number between ",
                                             min, " and ", max, ", got ", v.dump()));
  }
  return v.get<int>();
}

absl::StatusOr<ProcessRuntimeOptions> processOptionsFromJson(const json& config,
                                                             const std::string& at) {
  KRANE_RETURN_IF_ERROR(onlyKeys(config, "process",
                                 {"state_dir", "ports", "images", "restart_backoff_ms",
                                  "stop_instances_on_shutdown", "deregistration_delay_ms"}));
  ProcessRuntimeOptions o;
  if (!config.contains("state_dir") || !config["state_dir"].is_string() ||
      config["state_dir"].get<std::string>().empty()) {
    return absl::InvalidArgumentError(strCat(at, ".state_dir: required (a directory)"));
  }
  o.state_dir = config["state_dir"].get<std::string>();
  if (config.contains("ports")) {
    const json& ports = config["ports"];
    KRANE_RETURN_IF_ERROR(onlyKeys(ports, strCat(at, ".ports"), {"from", "to"}));
    KRANE_ASSIGN_OR_RETURN(o.port_from,
                           intAt(ports, "from", strCat(at, ".ports"), 20000, 1, 65535));
    KRANE_ASSIGN_OR_RETURN(o.port_to, intAt(ports, "to", strCat(at, ".ports"), 20999, 1, 65535));
    if (o.port_from > o.port_to) {
      return absl::InvalidArgumentError(
          strCat(at, ".ports: from ", o.port_from, " is above to ", o.port_to));
    }
  }
  if (config.contains("images")) {
    const json& images = config["images"];
    if (!images.is_object()) {
      return absl::InvalidArgumentError(strCat(at, ".images: must be a mapping of image to argv"));
    }
    for (const auto& [name, argv] : images.items()) {
      const std::string path = strCat(at, ".images.", name);
      if (!argv.is_array() || argv.empty()) {
        return absl::InvalidArgumentError(strCat(path, ": must be a non-empty list of strings"));
      }
      for (const auto& a : argv) {
        if (!a.is_string()) {
          return absl::InvalidArgumentError(strCat(path, ": ", a.dump(), " is not a string"));
        }
        o.images[name].push_back(a.get<std::string>());
      }
      if (o.images[name][0].empty() || o.images[name][0][0] != '/') {
        return absl::InvalidArgumentError(strCat(path, ": the program must be an absolute path"));
      }
    }
  }
  if (config.contains("restart_backoff_ms")) {
    const json& b = config["restart_backoff_ms"];
    KRANE_RETURN_IF_ERROR(onlyKeys(b, strCat(at, ".restart_backoff_ms"), {"min", "max"}));
    KRANE_ASSIGN_OR_RETURN(int min,
                           intAt(b, "min", strCat(at, ".restart_backoff_ms"), 1000, 10, 600000));
    KRANE_ASSIGN_OR_RETURN(int max,
                           intAt(b, "max", strCat(at, ".restart_backoff_ms"), 60000, 10, 3600000));
    o.restart.initial = std::chrono::milliseconds(min);
    o.restart.max = std::chrono::milliseconds(std::max(min, max));
  }
  if (config.contains("stop_instances_on_shutdown")) {
    if (!config["stop_instances_on_shutdown"].is_boolean()) {
      return absl::InvalidArgumentError(
          strCat(at, ".stop_instances_on_shutdown: must be true or false"));
    }
    o.stop_instances_on_shutdown = config["stop_instances_on_shutdown"].get<bool>();
  }
  KRANE_ASSIGN_OR_RETURN(int delay, intAt(config, "deregistration_delay_ms", at, 500, 0, 60000));
  o.deregistration_delay = std::chrono::milliseconds(delay);
  return o;
}

}  // namespace krane::runtime
