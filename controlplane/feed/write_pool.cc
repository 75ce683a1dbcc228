#include "controlplane/feed/write_pool.h"

#include <algorithm>

namespace krane::feed {
namespace {
// A thread takes at most this many streams at a time, so that the others share a big batch.
constexpr size_t kMaxTake = 256;
}  // namespace

WritePool::WritePool(size_t threads) : threads_count_(std::max<size_t>(1, threads)) {
  for (size_t i = 0; i < threads_count_; ++i) threads_.emplace_back([this] { run(); });
}

WritePool::~WritePool() { stop(); }

void WritePool::schedule(std::shared_ptr<Writable> target) {
  {
    std::lock_guard lock(mutex_);
    if (!stopping_) {
      const bool was_empty = ready_.empty();
      ready_.push_back(std::move(target));
      if (was_empty) ready_cv_.notify_one();
      return;
    }
  }
  target->startWrites();  // shutting down: nobody else will
}

void WritePool::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  ready_cv_.notify_all();
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
}

void WritePool::run() {
  std::vector<std::shared_ptr<Writable>> mine;
  std::unique_lock lock(mutex_);
  for (;;) {
    ready_cv_.wait(lock, [&] { return stopping_ || !ready_.empty(); });
    if (ready_.empty()) return;  // stopping, and everything queued ran
    const size_t share = (ready_.size() + threads_count_ - 1) / threads_count_;
    const size_t take = std::min({ready_.size(), std::max<size_t>(share, 1), kMaxTake});
    const auto end = ready_.begin() + static_cast<ptrdiff_t>(take);
    mine.assign(std::make_move_iterator(ready_.begin()), std::make_move_iterator(end));
    ready_.erase(ready_.begin(), end);
    if (!ready_.empty()) ready_cv_.notify_one();  // another thread takes the next share
    lock.unlock();
    for (auto& target : mine) target->startWrites();
    mine.clear();
    lock.lock();
  }
}

}  // namespace krane::feed
