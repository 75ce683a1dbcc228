// The files `kranectl apply -f` and `delete -f` read: YAML documents, one resource each (fanned
// out to every region it names).
//
//   kind: Deployment              # Deployment, Sentinel, CiliumNetworkPolicy or Resource
//   id: demo                      # the resource id (the deployment, sentinel or policy id)
//   regions: [local-1, local-2]   # or `region: local-1`
//   type: example.krane.dev/site  # Resource only: the plugin's resource type
//   spec:                         # the fields of krane.cluster.v1.DeploymentTopology, Sentinel
//     image: krane-demo-app:v1    # or CiliumNetworkPolicy (camelCase or snake_case names); for
//     replicas: 3                 # Resource any YAML, sent to the plugin as JSON
//
// The id and region fields inside `spec` are filled in from the document; a spec that names
// another id or region is refused.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "krane/cluster/v1/state.pb.h"

namespace krane::cli {

struct ManifestEntry {
  std::string origin;  // "demo.yaml: document 2 (Deployment demo)", for messages
  cluster::v1::Resource resource;
};

// INVALID_ARGUMENT "<source>: document N: <field>: <what>" for the first problem found.
absl::StatusOr<std::vector<ManifestEntry>> parseManifests(const std::string& yaml,
                                                          const std::string& source);
absl::StatusOr<std::vector<ManifestEntry>> loadManifests(const std::string& path);

// "deployment", "deployments", "deploy", "deployment_topology" -> "deployment_topology";
// "sentinel(s)", "cnp", "ciliumnetworkpolicy", ... ; anything else is taken as a plugin type.
std::string resourceType(const std::string& name);

}  // namespace krane::cli
