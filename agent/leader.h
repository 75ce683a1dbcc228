// Only one agent of a region applies changes; the others stand by (DaemonSet-style rollouts
// run several). Two implementations of one interface:
// - FileLockElector (process runtime): an exclusive flock on <state_dir>/leader.lock. The kernel
//   drops the lock when its holder dies, however it dies, so a standby takes over within one
//   poll interval.
// - LeaseElector (Kubernetes runtime): a coordination.k8s.io Lease through a LeaseClient,
//   renewed every lease_duration / 3; leadership is given up when a renewal has not succeeded
//   within the lease duration, before anyone else may take it.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "plugins/runtime/lease.h"

namespace krane::agent {

class LeaderElector {
 public:
  virtual ~LeaderElector() = default;
  // Starts campaigning; `on_change(true)` when this agent becomes leader, `(false)` when it stops.
  virtual void start(std::function<void(bool leader)> on_change) = 0;
  // Stops campaigning and gives leadership up.
  virtual void stop() = 0;
  virtual bool isLeader() const = 0;
};

class FileLockElector final : public LeaderElector {
 public:
  FileLockElector(std::string state_dir, std::string identity,
                  std::chrono::milliseconds poll = std::chrono::milliseconds(200));
  ~FileLockElector() override;
  void start(std::function<void(bool)> on_change) override;
  void stop() override;
  bool isLeader() const override { return leader_; }
  // Who holds the lock now, as written in the file ("identity pid"), for `krane inspect`.
  static std::string holder(const std::string& state_dir);

 private:
  bool tryAcquire();

  std::string path_;
  std::string identity_;
  std::chrono::milliseconds poll_;
  int fd_ = -1;
  std::atomic<bool> leader_{false};
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

// The Lease interface lives with the runtimes that implement it (plugins/runtime/lease.h).
using LeaseClient = runtime::LeaseClient;

class LeaseElector final : public LeaderElector {
 public:
  LeaseElector(std::shared_ptr<LeaseClient> client, std::string identity,
               std::chrono::seconds lease_duration = std::chrono::seconds(15));
  ~LeaseElector() override;
  void start(std::function<void(bool)> on_change) override;
  void stop() override;
  bool isLeader() const override { return leader_; }
  // One round: try to acquire or renew (for tests).
  void tick();

 private:
  std::shared_ptr<LeaseClient> client_;
  std::string identity_;
  std::chrono::seconds duration_;
  std::atomic<bool> leader_{false};
  std::atomic<bool> stopping_{false};
  std::chrono::steady_clock::time_point last_renewal_{};
  std::function<void(bool)> on_change_;
  std::thread thread_;
};

}  // namespace krane::agent
