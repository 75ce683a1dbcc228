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

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <utility>
#include <vector>

namespace krane::workflow {

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
      if (!queue_.empty() && writing_ < writers_) queue_.front()->wake.notify_one();
      lock.unlock();
      try {
        write_(batch);
      } catch (...) {
        lock.lock();
        // Its own request may still be queued behind the batch: it must not stay there (nor be
        // the one finish() wakes).
        std::erase(queue_, &mine);
        finish(taken);
        throw;
      }
      lock.lock();
      finish(taken);
    }
  }

 private:
  struct Queued {
    explicit Queued(Request* r) : request(r) {}
    Request* request;
    bool done = false;
    std::condition_variable wake;  // notified with the lock held: it outlives every notify
  };

  // With the lock held. Wakes the callers of `taken`, and the first of the queue, which may now
  // write the next batch.
  void finish(const std::vector<Queued*>& taken) {
    for (Queued* q : taken) {
      q->done = true;
      q->wake.notify_one();
    }
    --writing_;
    if (!queue_.empty()) queue_.front()->wake.notify_one();
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
