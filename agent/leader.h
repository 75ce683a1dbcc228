// Only one agent of a region applies changes; the others stand by (DaemonSet-style rollouts
// run several). Two implementations of one interface:
// - FileLockElector (process runtime): an exclusive flock on <state_dir>/leader.lock. The kernel
//   drops the lock when its holder dies, however it dies, so a standby takes over within one
//   poll interval.
// - LeaseElector (Kubernetes runtime): a coordination.k8s.io Lease through a LeaseClient, as
//   Kubernetes' client-go elects leaders. Clocks of different nodes differ, so nobody compares
//   its own wall clock with the renewTime another node wrote: a candidate notes, on its own
//   steady clock, when it last saw the Lease record change (holder, renewTime or
//   resourceVersion), and takes the Lease only once the record's own leaseDurationSeconds
//   passed on that clock without a change. The holder renews every lease_duration / 3 and gives
//   leadership up (on_change(false)) when no renewal succeeded within its renew deadline,
//   2/3 of the duration counted on its steady clock from the start of the last successful
//   renewal, even while a call to the API server hangs: it stops before anyone may take over.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
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
  // The steady clock, replaceable in tests.
  using Clock = std::function<std::chrono::steady_clock::time_point()>;

  LeaseElector(std::shared_ptr<LeaseClient> client, std::string identity,
               std::chrono::seconds lease_duration = std::chrono::seconds(15),
               Clock clock = &std::chrono::steady_clock::now);
  ~LeaseElector() override;
  // `on_change` runs on the elector's threads, never two at once; leadership is not renewed
  // meanwhile, so it must return within the lease duration.
  void start(std::function<void(bool)> on_change) override;
  // Gives leadership up (on_change(false) returns first), then hands the Lease back with no
  // holder, so a standby takes it at its next look.
  void stop() override;
  bool isLeader() const override { return leader_; }
  // One round: acquire or renew (for tests; start() runs it every lease_duration / 3).
  void tick();
  // How long after the start of its last successful renewal the holder gives leadership up.
  std::chrono::milliseconds renewDeadline() const;

 private:
  // Leader while the renew deadline has not passed; calls on_change when that flips.
  void updateLeadership();
  void watchDeadline();

  std::shared_ptr<LeaseClient> client_;
  std::string identity_;
  std::chrono::seconds duration_;
  Clock clock_;
  std::atomic<bool> leader_{false};
  std::atomic<bool> stopping_{false};
  std::function<void(bool)> on_change_;

  // The record as last seen, and when (steady clock) it was seen to change. Tick thread only.
  std::optional<LeaseClient::Lease> observed_;
  std::chrono::steady_clock::time_point observed_at_{};

  std::mutex change_mutex_;  // held while leader_ flips and on_change runs
  std::mutex mutex_;         // guards deadline_
  std::condition_variable wake_;
  // Leadership lapses at this point unless renewed; time_point{} when never held.
  std::chrono::steady_clock::time_point deadline_{};
  std::thread thread_;    // renews or campaigns
  std::thread watchdog_;  // gives leadership up at the deadline even while a renewal hangs
};

}  // namespace krane::agent
