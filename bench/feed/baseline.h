// The design Krane replaced, as a client: every agent polls the change table of its region once
// a second with its own cursor, then loads each changed resource by its key.
//
// The pollers share a bounded set of database connections: one worker thread per connection
// takes the next poller that is due from a schedule ordered by due time. Each poller is due once
// a second on a fixed schedule; a poller that fell behind by more than a second skips the slots
// it missed instead of bursting (so the rate is at most one poll per second per poller).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <queue>
#include <string>
#include <thread>
#include <vector>

#include "bench/feed/measure.h"
#include "controlplane/db/dsn.h"

namespace krane::bench {

class BaselinePollers {
 public:
  BaselinePollers(const db::Dsn& dsn, std::string region, size_t pollers, uint64_t start_version,
                  size_t connections, std::chrono::milliseconds interval = std::chrono::seconds(1));
  ~BaselinePollers();
  BaselinePollers(const BaselinePollers&) = delete;
  BaselinePollers& operator=(const BaselinePollers&) = delete;

  void setRecording(bool on) { recording_ = on; }
  void stop();

  uint64_t polls() const { return polls_.load(); }
  uint64_t lookups() const { return lookups_.load(); }
  uint64_t errors() const { return errors_.load(); }
  uint64_t skippedSlots() const { return skipped_.load(); }
  // Largest delay between a poll's due time and its start, in ms, since the last call.
  double takeMaxLateMs();
  // Every poller's samples (and clears them); call after stop().
  std::vector<std::vector<Sample>> takeSamples();

 private:
  struct Poller {
    uint64_t cursor = 0;
    std::vector<Sample> samples;
  };
  using Clock = std::chrono::steady_clock;
  struct Due {
    Clock::time_point at;
    size_t poller;
    bool operator>(const Due& o) const { return at > o.at; }
  };

  void work();

  const db::Dsn dsn_;
  const std::string region_;
  const std::chrono::milliseconds interval_;
  std::vector<Poller> pollers_;
  std::atomic<bool> recording_{false};
  std::atomic<uint64_t> polls_{0};
  std::atomic<uint64_t> lookups_{0};
  std::atomic<uint64_t> errors_{0};
  std::atomic<uint64_t> skipped_{0};
  std::atomic<int64_t> max_late_ns_{0};

  std::mutex mutex_;
  std::condition_variable wake_;
  std::priority_queue<Due, std::vector<Due>, std::greater<Due>> schedule_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace krane::bench
