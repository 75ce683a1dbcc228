// A deployment topology as Kubernetes objects: what the deployment plugin server-side applies on
// the Kubernetes runtime. Pure: no I/O, the same topology always gives the same objects.
//
// Per topology, in the namespace of its workspace (dnsLabel(namespace_prefix, workspace_id)):
//   Namespace                 the workspace's, created with its first deployment, never deleted
//                             by the plugin (it may hold what others put there)
//   Deployment                apps/v1, the instances (why not a ReplicaSet: kube_objects.cc)
//   Service                   ClusterIP on the topology's port (none without a port)
//   HorizontalPodAutoscaler   autoscaling/v2 on CPU, only when min and max replicas differ
//   NetworkPolicy             only pods of the sentinel namespace reach the app port
// Every object carries app.kubernetes.io/managed-by=krane, app.kubernetes.io/component=deployment
// (the Namespace: component=workspace) and krane.dev/{workspace,project,app,environment,
// deployment}.id and krane.dev/region, over the topology's own `labels`.
//
// Every field of DeploymentTopology reaches an object, or is listed in kNotOnKubernetes with the
// reason (tests/plugins/deployment_fields_test.cc fails for a field that is neither).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "krane/cluster/v1/state.pb.h"
#include "nlohmann/json.hpp"

namespace krane::deployment {

inline constexpr char kComponent[] = "deployment";
inline constexpr char kContainerName[] = "app";
inline constexpr char kDeploymentIdLabel[] = "krane.dev/deployment.id";
inline constexpr char kManagedBySelector[] =
    "app.kubernetes.io/managed-by=krane,app.kubernetes.io/component=deployment";

struct KubeOptions {
  // Workspace namespaces are named "<prefix>-<workspace id>" (DNS-safe, see kube/names.h).
  std::string namespace_prefix = "ws";
  // The namespace whose pods (the sentinels) may reach the app port.
  std::string sentinel_namespace = "sentinel";
};

// The namespace of a workspace and the name of a deployment's objects.
std::string workspaceNamespace(const std::string& workspace_id, const KubeOptions& options);
std::string objectName(const std::string& deployment_id);

// The objects of deployment `deployment_id` (the resource id), the Namespace first.
// INVALID_ARGUMENT naming the field for a topology Kubernetes would refuse or that cannot work
// (no image or workspace, an id or label that is not a label value, an unknown shutdown signal,
// min_replicas above max_replicas, a probe without a port).
absl::StatusOr<std::vector<nlohmann::json>> kubeObjects(
    const cluster::v1::DeploymentTopology& topology, const std::string& deployment_id,
    const KubeOptions& options = {});

// The kinds kubeObjects may produce per deployment (besides the Namespace), as
// {apiVersion, kind}: what delete and garbage collection look for.
const std::vector<std::pair<std::string, std::string>>& deploymentKinds();

// Fields of DeploymentTopology that reach no Kubernetes object, with the reason.
extern const std::vector<std::pair<std::string, std::string>> kNotOnKubernetes;

}  // namespace krane::deployment
