// What an environment needs in a region before its deployments can serve there, besides their
// own topology (seed 001's ensureSentinels and ensureCiliumNetworkPolicy): a sentinel (the
// environment's routing proxy in the region) and a CiliumNetworkPolicy that lets only the
// environment's sentinels reach its app instances. The deploying step creates them, in the same
// transaction as the topology, in each region that has none; they belong to the environment and
// outlive the deploy (a failed deploy does not remove them, the next one finds them). Existing
// sentinels are never changed here: moving them to a new image is a fleet rollout's job.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "controlplane/feed/writer.h"
#include "krane/services/v1/deploy.pb.h"

namespace krane::services::deploy {

// Defaults for what a deploy creates (krane-ctrl's `deploy.*` settings).
struct EnvironmentResourceOptions {
  std::string sentinel_image = "krane.dev/sentinel:v1";
  uint32_t sentinel_replicas = 1;
  uint32_t sentinel_cpu_millicores = 250;
  uint32_t sentinel_memory_mib = 256;
  bool cilium_policy = true;
};

// The sentinel a deploy creates for the deployment's environment in `region`.
feed::Resource newSentinel(const services::v1::DeploymentInfo& info, const std::string& region,
                           const std::string& sentinel_id,
                           const EnvironmentResourceOptions& options);

// The object name of the environment's policy, which tells it from policies of its own that
// an operator applies: "krane-env-<environment id>" (made a DNS label).
std::string environmentPolicyName(const std::string& environment_id);

// The environment's policy in `region`: the app's instances of the environment (pods labelled
// with its environment id and component `deployment`) accept ingress only from the environment's
// sentinels (namespace `sentinel`, component `sentinel`, the same environment id).
feed::Resource environmentPolicy(const services::v1::DeploymentInfo& info,
                                 const std::string& region, const std::string& policy_id);

// Puts, in `tx`, a sentinel and (with options.cilium_policy) a policy for every region of
// `info` that has no live one of the environment yet. Reads the rows it checks with
// FOR UPDATE, so two deploys of one environment never both create one.
absl::StatusOr<services::v1::EnvironmentResources> ensureEnvironmentResources(
    feed::WriteTx& tx, const services::v1::DeploymentInfo& info,
    const EnvironmentResourceOptions& options);

}  // namespace krane::services::deploy
