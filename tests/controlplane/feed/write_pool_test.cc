// The write pool: every scheduled stream gets its writes started once per schedule, on a pool
// thread, never on the thread that scheduled it (the tailer's, in the server).
#include "controlplane/feed/write_pool.h"

#include <atomic>
#include <future>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

namespace krane::feed {
namespace {

class Counting : public Writable {
 public:
  void startWrites() override {
    ++runs;
    std::lock_guard lock(mutex);
    threads.insert(std::this_thread::get_id());
  }
  std::atomic<int> runs{0};
  std::mutex mutex;
  std::set<std::thread::id> threads;
};

TEST_CASE("the write pool starts every scheduled write once, off the scheduling thread",
          "[feed][write_pool]") {
  WritePool pool(2);
  std::vector<std::shared_ptr<Counting>> targets;
  for (int i = 0; i < 1000; ++i) targets.push_back(std::make_shared<Counting>());
  for (int round = 0; round < 3; ++round) {
    for (auto& t : targets) pool.schedule(t);
  }
  pool.stop();  // runs what is queued
  std::set<std::thread::id> used;
  for (auto& t : targets) {
    CHECK(t->runs.load() == 3);
    used.insert(t->threads.begin(), t->threads.end());
  }
  CHECK(used.count(std::this_thread::get_id()) == 0);
  CHECK(used.size() <= 2);
}

// Records the order in which targets start; the first one holds the only pool thread until
// released, so that everything else is queued behind it.
class Ordered : public Writable {
 public:
  Ordered(int id, std::vector<int>* order, std::mutex* mutex)
      : id_(id), order_(order), mutex_(mutex) {}
  void startWrites() override {
    if (gate.valid()) gate.wait();
    std::lock_guard lock(*mutex_);
    order_->push_back(id_);
  }
  std::shared_future<void> gate;

 private:
  int id_;
  std::vector<int>* order_;
  std::mutex* mutex_;
};

TEST_CASE("the write pool starts streams in the order they were scheduled", "[feed][write_pool]") {
  // Under load a stream that was just written is rescheduled at once; were the newest served
  // first, it would keep the streams scheduled before it waiting for as long as the load lasts.
  WritePool pool(1);
  std::vector<int> order;
  std::mutex mutex;
  std::promise<void> release;
  auto first = std::make_shared<Ordered>(0, &order, &mutex);
  first->gate = release.get_future().share();
  pool.schedule(first);
  std::vector<std::shared_ptr<Ordered>> rest;
  for (int i = 1; i <= 600; ++i) {  // more than one thread takes at a time
    rest.push_back(std::make_shared<Ordered>(i, &order, &mutex));
    pool.schedule(rest.back());
  }
  release.set_value();
  pool.stop();
  REQUIRE(order.size() == 601);
  for (int i = 0; i <= 600; ++i) CHECK(order[static_cast<size_t>(i)] == i);
}

TEST_CASE("after stop, a schedule runs on the caller", "[feed][write_pool]") {
  WritePool pool(1);
  pool.stop();
  auto t = std::make_shared<Counting>();
  pool.schedule(t);
  CHECK(t->runs.load() == 1);
  CHECK(t->threads.count(std::this_thread::get_id()) == 1);
}

}  // namespace
}  // namespace krane::feed
