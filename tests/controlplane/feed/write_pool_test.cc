// The write pool: every scheduled stream gets its writes started once per schedule, on a pool
// thread, never on the thread that scheduled it (the tailer's, in the server).
#include "controlplane/feed/write_pool.h"

#include <atomic>
#include <set>
#include <thread>

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
