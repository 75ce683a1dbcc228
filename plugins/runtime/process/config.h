// The process runtime's settings as plugins take them from their JSON configuration:
//
//   state_dir: /var/lib/krane/deployments   # required: instances, logs, stored specs
//   ports: {from: 20000, to: 20999}          # one port per instance, given as PORT (and one more
//                                            # for a workload's health port, if it asks)
//   images:                                  # image name -> argv, "{tag}" replaced
//     krane.dev/demo-app: [/usr/lib/krane/krane-demo-app, --version, "{tag}"]
//   restart_backoff_ms: {min: 1000, max: 60000}
//   stop_instances_on_shutdown: false        # true: a stopping agent stops its instances
//
// Errors name the key's path, starting with `at` (e.g. "process.ports.from: ...").
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "plugins/runtime/process/process_runtime.h"

namespace krane::runtime {

absl::StatusOr<ProcessRuntimeOptions> processOptionsFromJson(const nlohmann::json& config,
                                                             const std::string& at);

// INVALID_ARGUMENT naming `<path>.<key>` for a key of `object` not in `known` (or `path` when
// `object` is not a mapping).
absl::Status onlyKeys(const nlohmann::json& object, const std::string& path,
                      std::initializer_list<std::string_view> known);

// object[key] as an int in [min, max]; `fallback` when absent.
absl::StatusOr<int> intAt(const nlohmann::json& object, const std::string& key,
                          const std::string& path, int fallback, int min, int max);

}  // namespace krane::runtime
