// A leader Lease store in memory with compare-and-swap, as the Kubernetes API server keeps a
// coordination.k8s.io Lease, for tests of the agent's LeaseElector. Thread-safe.
#pragma once

#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>

#include "common/strings.h"
#include "plugins/runtime/lease.h"

namespace krane::testing {

class FakeLeases : public runtime::LeaseClient {
 public:
  absl::StatusOr<Lease> get() override {
    std::unique_lock lock(mutex);
    resume.wait(lock, [&] { return !hang; });
    if (!lease) return absl::NotFoundError("no lease");
    return *lease;
  }
  absl::Status write(const Lease& next, const std::string& expected) override {
    std::lock_guard lock(mutex);
    if (down) return absl::UnavailableError("api server down");
    if (lease && lease->resource_version != expected) return absl::AbortedError("conflict");
    lease = next;
    lease->resource_version = strCat(++version);
    return absl::OkStatus();
  }
  // Writes fail with UNAVAILABLE while down.
  void setDown(bool value) {
    std::lock_guard lock(mutex);
    down = value;
  }
  // Calls to get() block while hanging (an API server that does not answer).
  void setHang(bool value) {
    {
      std::lock_guard lock(mutex);
      hang = value;
    }
    resume.notify_all();
  }

  std::mutex mutex;
  std::condition_variable resume;
  std::optional<Lease> lease;
  int version = 0;
  bool down = false;
  bool hang = false;
};

}  // namespace krane::testing
