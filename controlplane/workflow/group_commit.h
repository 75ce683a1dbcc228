// Groups the writes that threads ask for at the same moment (group commit), so that one
// statement carries the rows of several callers.
//
// No thread of its own: a caller that finds fewer than `writers` batches being written takes
// everything queued at that moment (its own request included) and writes it, while later callers
// queue behind it; the next of them writes their whole queue the same way. A caller alone writes
// at once, so grouping adds no wait when there is nothing to group.
//
// Each waiting caller sleeps on its own condition variable and is woken only when its request is
// written, or when it is first in line and a batch may start: a finished batch wakes its own
// callers and at most one more, not every caller waiting behind it.
//
// Thread-safety: submit() may be called from any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <utility>
#include <vector>

namespace krane::workflow {

// Statements a writer ran and the rows they wrote, for tests and the benchmark. Thread-safe.
class WriteCounts {
 public:
  void add(uint64_t statements, uint64_t rows) {
    statements_.fetch_add(statements, std::memory_order_relaxed);
    rows_.fetch_add(rows, std::memory_order_relaxed);
  }
  uint64_t statements() const { return statements_.load(std::memory_order_relaxed); }
  uint64_t rows() const { return rows_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> statements_{0};
  std::atomic<uint64_t> rows_{0};
};

template <typename Request>
class GroupCommit {
 public:
  // Writes a batch and records each request's outcome in the request. Should it throw, the
  // batch's requests keep the outcome they had (make it an error) and the exception reaches the
  // caller that was writing.
  using Write = std::function<void(const std::vector<Request*>&)>;
  // How much of a batch a request takes.
  using Weight = std::function<size_t(const Request&)>;

  // At most `writers` batches are written at once, each of at most `max_weight` (a request
  // heavier than that alone).
  GroupCommit(size_t writers, size_t max_weight, Weight weight, Write write)
      : writers_(writers),
        max_weight_(max_weight),
        weight_(std::move(weight)),
        write_(std::move(write)) {}

  // Returns once `request` has been written, by this thread or another.
  void submit(Request& request) {
    Queued mine(&request);
    std::unique_lock lock(mutex_);
    queue_.push_back(&mine);
    while (!mine.done) {
      if (writing_ >= writers_ || queue_.empty()) {
        mine.wake.wait(lock);
        continue;
      }
      ++writing_;
      std::vector<Queued*> taken;
      std::vector<Request*> batch;
      size_t weight = 0;
      while (!queue_.empty() &&
             (batch.empty() || weight + weight_(*queue_.front()->request) <= max_weight_)) {
        weight += weight_(*queue_.front()->request);
        taken.push_back(queue_.front());
        batch.push_back(queue_.front()->request);
        queue_.pop_front();
      }
      // What the batch left may start another one at once.
      if (writing_ < writers_) wakeNext();
      // Its own request may be queued behind the batch it writes: no wake-up may go to it.
      mine.writing = true;
      lock.unlock();
      try {
        write_(batch);
      } catch (...) {
        lock.lock();
        mine.writing = false;
        // Its own request must not stay queued; and if another caller's batch took it, that
        // caller still writes through it: the request must outlive that write.
        const bool queued = std::erase(queue_, &mine) != 0;
        finish(taken);
        while (!queued && !mine.done) mine.wake.wait(lock);
        throw;
      }
      lock.lock();
      mine.writing = false;
      finish(taken);
    }
  }

 private:
  struct Queued {
    explicit Queued(Request* r) : request(r) {}
    Request* request;
    bool done = false;
    bool writing = false;          // its caller is writing a batch (maybe not with this request)
    std::condition_variable wake;  // notified with the lock held: it outlives every notify
  };

  // With the lock held. Wakes the first caller in line that is not writing: it may write the
  // next batch. (At most `writers_` callers are writing, so few are passed over.)
  void wakeNext() {
    for (Queued* q : queue_) {
      if (!q->writing) {
        q->wake.notify_one();
        return;
      }
    }
  }

  // With the lock held. Wakes the callers of `taken`, and the next in line.
  void finish(const std::vector<Queued*>& taken) {
    for (Queued* q : taken) {
      q->done = true;
      q->wake.notify_one();
    }
    --writing_;
    wakeNext();
  }

  const size_t writers_;
  const size_t max_weight_;
  const Weight weight_;
  const Write write_;
  std::mutex mutex_;
  std::deque<Queued*> queue_;
  size_t writing_ = 0;  // callers writing a batch now
};

}  // namespace krane::workflow
