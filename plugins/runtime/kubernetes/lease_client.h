// The agent's leader Lease (coordination.k8s.io/v1) through the Kubernetes client.
//
// It implements runtime::LeaseClient (plugins/runtime/lease.h, no Kubernetes dependency), which
// the agent's LeaseElector campaigns through; the agent's main links this target when its
// runtime is `kubernetes`. Dependencies point one way: the agent on the runtime layer, never the
// runtime layer on the agent.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "plugins/runtime/kubernetes/client.h"
#include "plugins/runtime/lease.h"

namespace krane::kube {

// Compare-and-swap on the Lease's resourceVersion: a first write creates the Lease (POST), later
// ones replace it (PUT) with metadata.resourceVersion as the precondition, so of two agents
// writing from the same version exactly one wins; the other gets ABORTED.
// Thread-safe; the Client must outlive it.
class KubernetesLeaseClient final : public runtime::LeaseClient {
 public:
  KubernetesLeaseClient(std::shared_ptr<Client> client, std::string ns, std::string name);

  absl::StatusOr<Lease> get() override;
  absl::Status write(const Lease& lease, const std::string& expected_resource_version) override;

 private:
  std::shared_ptr<Client> client_;
  std::string ns_;
  std::string name_;
  std::mutex mutex_;
  Json last_;  // the Lease as last read or written, for acquireTime and leaseTransitions
};

// RFC 3339 with microseconds, as Kubernetes writes MicroTime: "2026-11-22T07:35:05.123456Z".
std::string formatMicroTime(std::chrono::system_clock::time_point t);
// Accepts whole seconds or any fraction, "Z" or a numeric offset. INVALID_ARGUMENT otherwise.
absl::StatusOr<std::chrono::system_clock::time_point> parseMicroTime(const std::string& text);

}  // namespace krane::kube
