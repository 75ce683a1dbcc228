#include "agent/host_calls.h"

#include <utility>

namespace krane::agent {

HostCallQueue::HostCallQueue(size_t workers) {
  for (size_t i = 0; i < std::max<size_t>(1, workers); ++i) {
    workers_.emplace_back([this] { work(); });
  }
}

HostCallQueue::~HostCallQueue() { close(); }

void HostCallQueue::submit(Call call) {
  {
    std::lock_guard lock(mutex_);
    if (!closing_) {
      queue_.push_back(std::move(call));
      changed_.notify_all();
      return;
    }
  }
  if (call.cancelled) call.cancelled();
}

HostCallQueue::CancelOutcome HostCallQueue::cancel(uint64_t sequence) {
  Call dropped;
  {
    std::lock_guard lock(mutex_);
    if (running_.count(sequence)) return CancelOutcome::kRunning;
    auto it = queue_.begin();
    while (it != queue_.end() && it->sequence != sequence) ++it;
    if (it == queue_.end()) return CancelOutcome::kUnknown;
    dropped = std::move(*it);
    queue_.erase(it);
    // A dropped exclusive call (or a dropped call of a resource) may unblock what waited on it.
    changed_.notify_all();
  }
  if (dropped.cancelled) dropped.cancelled();
  return CancelOutcome::kDropped;
}

uint32_t HostCallQueue::inFlight() const {
  std::lock_guard lock(mutex_);
  return static_cast<uint32_t>(queue_.size() + running_.size());
}

void HostCallQueue::close() {
  std::deque<Call> dropped;
  {
    std::lock_guard lock(mutex_);
    if (closing_) return;
    closing_ = true;
    dropped.swap(queue_);
    changed_.notify_all();
  }
  for (auto& call : dropped) {
    if (call.cancelled) call.cancelled();
  }
  for (auto& t : workers_) t.join();
}

std::deque<HostCallQueue::Call>::iterator HostCallQueue::nextLocked() {
  if (exclusive_running_) return queue_.end();
  // Resources with an earlier call still queued keep their order: their later calls wait.
  std::set<std::string> waiting;
  for (auto it = queue_.begin(); it != queue_.end(); ++it) {
    if (it->key.empty()) {
      // Exclusive: only first in line and with nothing running; nothing behind it passes it.
      return it == queue_.begin() && running_.empty() ? it : queue_.end();
    }
    if (!waiting.count(it->key) && !running_keys_.count(it->key)) return it;
    waiting.insert(it->key);
  }
  return queue_.end();
}

void HostCallQueue::work() {
  for (;;) {
    Call call;
    {
      std::unique_lock lock(mutex_);
      auto it = queue_.end();
      changed_.wait(lock, [&] {
        if (closing_ && queue_.empty()) {
          it = queue_.end();
          return true;
        }
        it = nextLocked();
        return it != queue_.end();
      });
      if (it == queue_.end()) return;  // closing, nothing left
      call = std::move(*it);
      queue_.erase(it);
      running_.insert(call.sequence);
      if (call.key.empty()) {
        exclusive_running_ = true;
      } else {
        running_keys_.insert(call.key);
      }
    }
    call.run();
    std::lock_guard lock(mutex_);
    running_.erase(call.sequence);
    if (call.key.empty()) {
      exclusive_running_ = false;
    } else {
      running_keys_.erase(running_keys_.find(call.key));
    }
    changed_.notify_all();
  }
}

}  // namespace krane::agent
