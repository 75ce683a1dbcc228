// How a plugin on the Kubernetes runtime reaches its cluster, from the `kubernetes` section of
// the plugin's JSON configuration:
//
//   {"runtime": "kubernetes",
//    "kubernetes": {"in_cluster": true,            # or "kubeconfig": "/etc/krane/kubeconfig"
//                   "context": "prod",             # with kubeconfig: a context other than current
//                   "qps": 50, "burst": 100,       # client-side rate limit
//                   ...plugin keys}}
//
// Exactly one of `in_cluster: true` and `kubeconfig`. Keys a plugin reads itself are passed in
// `plugin_keys`; any other key is refused with its path ("kubernetes.qsp: unknown key").
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "plugins/runtime/kubernetes/client.h"
#include "plugins/runtime/kubernetes/config.h"

namespace krane::kube {

struct Connection {
  ClusterConfig cluster;
  ClientOptions options;
};

// INVALID_ARGUMENT naming `<path>.<key>`; FAILED_PRECONDITION / INVALID_ARGUMENT from the
// in-cluster or kubeconfig configuration.
absl::StatusOr<Connection> connectionFromJson(const nlohmann::json& section,
                                              const std::string& path,
                                              std::initializer_list<std::string_view> plugin_keys);

// The `kubernetes` section of a plugin's configuration text, after checking the text is a JSON
// object whose keys are only runtime, process and kubernetes, and that the section is there.
// INVALID_ARGUMENT naming the key otherwise (without the plugin's name: callers add it).
absl::StatusOr<nlohmann::json> kubernetesSection(std::string_view config_text);

// section[key] as a string; `fallback` when absent; INVALID_ARGUMENT naming the path otherwise.
absl::StatusOr<std::string> stringAt(const nlohmann::json& section, const std::string& path,
                                     const std::string& key, const std::string& fallback);

}  // namespace krane::kube
