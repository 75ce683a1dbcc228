// The leader Lease as the agent's LeaseElector uses it, apart from any implementation: the
// Kubernetes runtime implements it (plugins/runtime/kubernetes/lease_client.h), the agent
// (agent/leader.h) campaigns through it. Both depend on this header; the runtime layer never
// depends on the agent.
#pragma once

#include <chrono>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace krane::runtime {

// A coordination.k8s.io/v1 Lease reduced to what an elector needs. Implementations are
// thread-safe.
class LeaseClient {
 public:
  virtual ~LeaseClient() = default;
  struct Lease {
    std::string holder;
    std::chrono::system_clock::time_point renewed;
    std::chrono::seconds duration{15};
    std::string resource_version;  // for compare-and-swap updates
  };
  // NOT_FOUND when there is no lease yet.
  virtual absl::StatusOr<Lease> get() = 0;
  // Creates or updates the lease; ABORTED when `expected_resource_version` no longer matches.
  virtual absl::Status write(const Lease& lease, const std::string& expected_resource_version) = 0;
};

}  // namespace krane::runtime
