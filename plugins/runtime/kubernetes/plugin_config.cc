#include "plugins/runtime/kubernetes/plugin_config.h"

#include <algorithm>

#include "common/status.h"
#include "common/strings.h"

namespace krane::kube {

using nlohmann::json;

absl::StatusOr<json> kubernetesSection(std::string_view config_text) {
  const json config = json::parse(config_text.empty() ? "{}" : config_text, nullptr, false);
  if (!config.is_object()) return absl::InvalidArgumentError("not a JSON object");
  for (const auto& [key, _] : config.items()) {
    if (key != "runtime" && key != "process" && key != "kubernetes") {
      return absl::InvalidArgumentError(strCat(key, ": unknown key"));
    }
  }
  if (!config.contains("kubernetes")) {
    return absl::InvalidArgumentError("kubernetes: required with runtime kubernetes");
  }
  return config["kubernetes"];
}

absl::StatusOr<std::string> stringAt(const json& section, const std::string& path,
                                     const std::string& key, const std::string& fallback) {
  if (!section.contains(key)) return fallback;
  if (!section[key].is_string()) {
    return absl::InvalidArgumentError(strCat(path, ".", key, ": must be a string"));
  }
  return section[key].get<std::string>();
}

absl::StatusOr<Connection> connectionFromJson(const json& section, const std::string& path,
                                              std::initializer_list<std::string_view> plugin_keys) {
  if (!section.is_object()) return absl::InvalidArgumentError(strCat(path, ": must be a mapping"));
  static constexpr std::string_view kKeys[] = {"in_cluster", "kubeconfig", "context", "qps",
                                               "burst"};
  for (const auto& [key, _] : section.items()) {
    const bool known = std::find(std::begin(kKeys), std::end(kKeys), key) != std::end(kKeys) ||
                       std::find(plugin_keys.begin(), plugin_keys.end(), key) != plugin_keys.end();
    if (!known) return absl::InvalidArgumentError(strCat(path, ".", key, ": unknown key"));
  }
  Connection c;
  bool in_cluster = false;
  if (section.contains("in_cluster")) {
    if (!section["in_cluster"].is_boolean()) {
      return absl::InvalidArgumentError(strCat(path, ".in_cluster: must be true or false"));
    }
    in_cluster = section["in_cluster"].get<bool>();
  }
  KRANE_ASSIGN_OR_RETURN(std::string kubeconfig, stringAt(section, path, "kubeconfig", ""));
  KRANE_ASSIGN_OR_RETURN(std::string context, stringAt(section, path, "context", ""));
  if (in_cluster == !kubeconfig.empty()) {
    return absl::InvalidArgumentError(
        strCat(path,
               ": set exactly one of in_cluster: true (the pod's service account) and kubeconfig "
               "(a file)"));
  }
  if (!context.empty() && in_cluster) {
    return absl::InvalidArgumentError(strCat(path, ".context: only with kubeconfig"));
  }
  if (section.contains("qps")) {
    const json& q = section["qps"];
    if (!q.is_number() || q.get<double>() <= 0) {
      return absl::InvalidArgumentError(
          strCat(path, ".qps: must be a number above 0, got ", q.dump()));
    }
    c.options.qps = q.get<double>();
  }
  if (section.contains("burst")) {
    const json& b = section["burst"];
    if (!b.is_number_integer() || b.get<int64_t>() < 1 || b.get<int64_t>() > 100000) {
      return absl::InvalidArgumentError(
          strCat(path, ".burst: must be a whole number between 1 and 100000, got ", b.dump()));
    }
    c.options.burst = b.get<int>();
  }
  if (in_cluster) {
    KRANE_ASSIGN_OR_RETURN(c.cluster, inClusterConfig());
  } else {
    KRANE_ASSIGN_OR_RETURN(c.cluster, kubeconfigFromFile(kubeconfig, context));
  }
  return c;
}

}  // namespace krane::kube
