// Factories of the ResourceTable implementations, one per state table.
#pragma once

#include <memory>

#include "controlplane/feed/resource_table.h"

namespace krane::feed {

std::unique_ptr<ResourceTable> makeGenericTable();             // table `resources`
std::unique_ptr<ResourceTable> makeDeploymentTopologyTable();  // table `deployment_topology`
std::unique_ptr<ResourceTable> makeSentinelTable();            // table `sentinels`
std::unique_ptr<ResourceTable> makeCiliumPolicyTable();        // table `cilium_network_policies`

}  // namespace krane::feed
