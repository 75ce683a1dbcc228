#include "controlplane/services/deploy/environment_resources.h"

#include "common/random_id.h"
#include "common/status.h"
#include "nlohmann/json.hpp"
#include "plugins/cilium/policy.h"

namespace krane::services::deploy {

using services::v1::DeploymentInfo;
using services::v1::EnvironmentResources;

feed::Resource newSentinel(const DeploymentInfo& info, const std::string& region,
                           const std::string& sentinel_id,
                           const EnvironmentResourceOptions& options) {
  feed::Resource r;
  r.set_type(std::string(feed::kSentinel));
  r.set_id(sentinel_id);
  r.set_region(region);
  auto* s = r.mutable_sentinel();
  s->set_sentinel_id(sentinel_id);
  s->set_workspace_id(info.workspace_id());
  s->set_project_id(info.project_id());
  s->set_app_id(info.app_id());
  s->set_environment_id(info.environment_id());
  s->set_region(region);
  s->set_image(options.sentinel_image);
  s->set_replicas(options.sentinel_replicas);
  s->set_cpu_millicores(options.sentinel_cpu_millicores);
  s->set_memory_mib(options.sentinel_memory_mib);
  s->set_desired_state(cluster::v1::SENTINEL_DESIRED_STATE_RUNNING);
  return r;
}

std::string environmentPolicyName(const std::string& environment_id) {
  return cilium::dnsLabel("krane-env", environment_id);
}

feed::Resource environmentPolicy(const DeploymentInfo& info, const std::string& region,
                                 const std::string& policy_id) {
  const nlohmann::json spec = {
      {"endpointSelector",
       {{"matchLabels",
         {{"app.kubernetes.io/component", "deployment"},
          {"krane.dev/environment.id", info.environment_id()}}}}},
      {"ingress", nlohmann::json::array(
                      {{{"fromEndpoints",
                         nlohmann::json::array(
                             {{{"matchLabels",
                                {{"k8s:io.kubernetes.pod.namespace", "sentinel"},
                                 {"app.kubernetes.io/component", "sentinel"},
                                 {"krane.dev/environment.id", info.environment_id()}}}}})}}})},
  };
  feed::Resource r;
  r.set_type(std::string(feed::kCiliumNetworkPolicy));
  r.set_id(policy_id);
  r.set_region(region);
  auto* p = r.mutable_cilium_network_policy();
  p->set_policy_id(policy_id);
  p->set_workspace_id(info.workspace_id());
  p->set_project_id(info.project_id());
  p->set_environment_id(info.environment_id());
  p->set_region(region);
  p->set_name(environmentPolicyName(info.environment_id()));
  p->set_policy_json(spec.dump());
  return r;
}

absl::StatusOr<EnvironmentResources> ensureEnvironmentResources(
    feed::WriteTx& tx, const DeploymentInfo& info, const EnvironmentResourceOptions& options) {
  EnvironmentResources created;
  for (const auto& region : info.regions()) {
    KRANE_ASSIGN_OR_RETURN(
        auto sentinels,
        tx.connection().query("SELECT id FROM sentinels WHERE environment_id = ?"
                              " AND region_id = ? AND deleted_at IS NULL LIMIT 1 FOR UPDATE",
                              {info.environment_id(), region.region_id()}));
    if (sentinels.empty()) {
      const std::string id = newId("sen");
      KRANE_RETURN_IF_ERROR(tx.put(newSentinel(info, region.region_id(), id, options)));
      created.add_created_sentinel_ids(id);
    }
    if (!options.cilium_policy) continue;
    KRANE_ASSIGN_OR_RETURN(
        auto policies,
        tx.connection().query("SELECT id FROM cilium_network_policies WHERE environment_id = ?"
                              " AND region_id = ? AND name = ? AND deleted_at IS NULL LIMIT 1"
                              " FOR UPDATE",
                              {info.environment_id(), region.region_id(),
                               environmentPolicyName(info.environment_id())}));
    if (policies.empty()) {
      const std::string id = newId("cnp");
      KRANE_RETURN_IF_ERROR(tx.put(environmentPolicy(info, region.region_id(), id)));
      created.add_created_policy_ids(id);
    }
  }
  return created;
}

}  // namespace krane::services::deploy
