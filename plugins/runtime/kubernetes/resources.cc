#include "plugins/runtime/kubernetes/resources.h"

#include "common/strings.h"

namespace krane::kube {

const std::vector<ResourceType>& knownResources() {
  static const std::vector<ResourceType> table = {
      {"", "v1", "Namespace", "namespaces", false},
      {"", "v1", "Service", "services", true},
      {"", "v1", "ConfigMap", "configmaps", true},
      {"", "v1", "Pod", "pods", true},
      {"apps", "v1", "Deployment", "deployments", true},
      {"apps", "v1", "ReplicaSet", "replicasets", true},
      {"autoscaling", "v2", "HorizontalPodAutoscaler", "horizontalpodautoscalers", true},
      {"networking.k8s.io", "v1", "NetworkPolicy", "networkpolicies", true},
      {"policy", "v1", "PodDisruptionBudget", "poddisruptionbudgets", true},
      {"cilium.io", "v2", "CiliumNetworkPolicy", "ciliumnetworkpolicies", true},
      {"coordination.k8s.io", "v1", "Lease", "leases", true},
  };
  return table;
}

std::string ResourceType::groupVersionPath() const {
  return group.empty() ? strCat("/api/", version) : strCat("/apis/", group, "/", version);
}

std::string ResourceType::collectionPath(std::string_view ns) const {
  if (!namespaced || ns.empty()) return strCat(groupVersionPath(), "/", plural);
  return strCat(groupVersionPath(), "/namespaces/", ns, "/", plural);
}

std::string ResourceType::objectPath(std::string_view ns, std::string_view name) const {
  return strCat(collectionPath(ns), "/", name);
}

absl::StatusOr<ResourceType> resourceFor(std::string_view api_version, std::string_view kind) {
  std::string_view group;
  std::string_view version = api_version;
  if (const auto slash = api_version.find('/'); slash != std::string_view::npos) {
    group = api_version.substr(0, slash);
    version = api_version.substr(slash + 1);
    if (group.empty() || version.find('/') != std::string_view::npos) version = {};
  }
  if (version.empty()) {
    return absl::InvalidArgumentError(
        strCat("apiVersion \"", api_version, "\" is not of the form [group/]version"));
  }
  for (const auto& type : knownResources()) {
    if (type.group == group && type.kind == kind) {
      ResourceType out = type;
      out.version = std::string(version);
      return out;
    }
  }
  return absl::InvalidArgumentError(
      strCat("unknown kind \"", kind, "\" in apiVersion \"", api_version, "\""));
}

absl::StatusOr<ResourceType> resourceForPlural(std::string_view group, std::string_view version,
                                               std::string_view plural) {
  for (const auto& type : knownResources()) {
    if (type.group == group && type.plural == plural) {
      ResourceType out = type;
      out.version = std::string(version);
      return out;
    }
  }
  return absl::NotFoundError(strCat("the server could not find the requested resource \"", plural,
                                    "\" in group \"", group, "\""));
}

}  // namespace krane::kube
