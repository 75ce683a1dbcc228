// The plugin calls of one krane-plugin-host, run on a few worker threads and never on the
// ZeroMQ thread, so that the host keeps answering (heartbeats, cancels) during a long call.
//
// Calls start in the order the plugin ABI allows:
// - calls of one resource (type, id) run one at a time, in the order they arrived;
// - calls of different resources run in parallel, up to the number of workers;
// - an exclusive call (sync_begin, sync_end) runs alone: after every call that arrived before
//   it, and before any call that arrived after it starts.
// A call that has not started can be cancelled: it never starts, and its `cancelled` callback
// answers it instead. A running call cannot be interrupted (the plugin ABI has no hook for it);
// it runs to its end and answers as usual.
//
// Thread-safe. `run` and `cancelled` are called on a worker or on the thread that calls cancel()
// or close(), never with the queue's lock held.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace krane::agent {

class HostCallQueue {
 public:
  struct Call {
    uint64_t sequence = 0;  // the agent's sequence; what cancel() names
    std::string key;        // "type/id"; empty: an exclusive call
    std::function<void()> run;
    std::function<void()> cancelled;
  };
  enum class CancelOutcome {
    kDropped,  // it had not started and never will; `cancelled` ran
    kRunning,  // it is running and answers when it returns
    kUnknown,  // no such call: already answered (or never received)
  };

  explicit HostCallQueue(size_t workers);
  // Calls close().
  ~HostCallQueue();
  HostCallQueue(const HostCallQueue&) = delete;
  HostCallQueue& operator=(const HostCallQueue&) = delete;

  void submit(Call call);
  CancelOutcome cancel(uint64_t sequence);
  // Calls received and not yet answered (queued or running).
  uint32_t inFlight() const;
  // Cancels every queued call, waits for the running ones and stops the workers. Later calls
  // are cancelled at once.
  void close();

 private:
  void work();
  // The first queued call that may start now, or queue_.end().
  std::deque<Call>::iterator nextLocked();

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Call> queue_;
  std::multiset<std::string> running_keys_;
  std::set<uint64_t> running_;
  bool exclusive_running_ = false;
  bool closing_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace krane::agent
