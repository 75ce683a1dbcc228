// The Kubernetes runtime's policy store: CiliumNetworkPolicy objects, server-side applied with
// the client of plugins/runtime/kubernetes and found again by the labels Krane puts on them
// (kManagedSelector, plus krane.dev/policy.id) and the krane.dev/policy.id annotation.
#pragma once

#include <memory>

#include "plugins/cilium/store.h"
#include "plugins/runtime/kubernetes/client.h"

namespace krane::cilium {

// `client` outlives the store.
std::unique_ptr<PolicyStore> makeKubeStore(kube::Client& client);

}  // namespace krane::cilium
