// Desired state for tests that need a resource to exist (reports are stored only about resources
// the control plane holds; swaps schedule changes of a deployment's topology).
#pragma once

#include <string>

#include "krane/cluster/v1/state.pb.h"

namespace krane::testing {

// A valid, running deployment topology of `id` in `region`, one replica.
inline cluster::v1::Resource topologyResource(const std::string& id, const std::string& region) {
  cluster::v1::Resource r;
  r.set_type("deployment_topology");
  r.set_id(id);
  r.set_region(region);
  auto* t = r.mutable_deployment_topology();
  for (auto* field : {t->mutable_workspace_id(), t->mutable_project_id(), t->mutable_app_id(),
                      t->mutable_environment_id()}) {
    *field = "x";
  }
  t->set_image("registry.example.com/app:v1");
  t->set_port(8080);
  t->set_cpu_millicores(100);
  t->set_memory_mib(64);
  t->set_replicas(1);
  t->set_desired_status(cluster::v1::DESIRED_STATUS_RUNNING);
  return r;
}

}  // namespace krane::testing
