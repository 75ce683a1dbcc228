// A fixed set of threads running queued tasks in order of arrival. Thread-safe.
// The destructor finishes queued tasks, then joins.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace krane {

class ThreadPool {
 public:
  explicit ThreadPool(size_t threads) {
    for (size_t i = 0; i < threads; ++i) {
      workers_.emplace_back([this] { work(); });
    }
  }
  ~ThreadPool() { join(); }

  // Runs what is queued (and what those tasks post), then stops the threads. Idempotent; tasks
  // posted afterwards never run.
  void join() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    ready_.notify_all();
    for (auto& t : workers_) {
      if (t.joinable()) t.join();
    }
  }
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void post(std::function<void()> task) {
    {
      std::lock_guard lock(mutex_);
      tasks_.push_back(std::move(task));
    }
    ready_.notify_one();
  }

  size_t queued() const {
    std::lock_guard lock(mutex_);
    return tasks_.size();
  }

 private:
  void work() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock lock(mutex_);
        ready_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
        if (tasks_.empty()) return;
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
  }

  mutable std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace krane
