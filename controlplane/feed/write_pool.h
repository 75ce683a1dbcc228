// A few threads that start the writes of streams a published batch made ready.
//
// The tailer only queues a batch on each stream (a reference per event) and hands the streams
// that were idle to this pool, whose threads (one per core by default) start their gRPC writes.
// Later writes of a stream chain from its own write completions on gRPC's threads. Thread-safe.
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace krane::feed {

class Writable {
 public:
  virtual ~Writable() = default;
  // Starts what the stream has to write (or its finish); called on a pool thread.
  virtual void startWrites() = 0;
};

class WritePool {
 public:
  explicit WritePool(size_t threads);
  ~WritePool();  // stop()
  WritePool(const WritePool&) = delete;
  WritePool& operator=(const WritePool&) = delete;

  // Queues one call of target->startWrites(), after those already queued; never blocks on a
  // write.
  void schedule(std::shared_ptr<Writable> target);
  // Runs what is queued, then joins the threads; later schedules run on the caller's thread.
  void stop();
  size_t threads() const { return threads_count_; }

 private:
  void run();

  const size_t threads_count_;
  std::mutex mutex_;
  std::condition_variable ready_cv_;
  // In the order scheduled: streams start in turn, so a busy stream that is rescheduled as soon
  // as it runs cannot keep the others waiting.
  std::deque<std::shared_ptr<Writable>> ready_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace krane::feed
