#include "agent/host_calls.h"

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

namespace krane::agent {
namespace {

// What ran, in order, as "start X" / "end X".
class Trace {
 public:
  void add(std::string line) {
    std::lock_guard lock(mutex_);
    lines_.push_back(std::move(line));
  }
  std::vector<std::string> lines() const {
    std::lock_guard lock(mutex_);
    return lines_;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<std::string> lines_;
};

HostCallQueue::Call traced(Trace& trace, uint64_t sequence, std::string key, std::string name,
                           std::chrono::milliseconds takes = std::chrono::milliseconds(50)) {
  return {sequence, std::move(key),
          [&trace, name, takes] {
            trace.add("start " + name);
            std::this_thread::sleep_for(takes);
            trace.add("end " + name);
          },
          [&trace, name] { trace.add("cancelled " + name); }};
}

void waitIdle(const HostCallQueue& calls) {
  for (int i = 0; i < 500 && calls.inFlight() > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

TEST_CASE("calls of one resource run one at a time in arrival order", "[host-calls]") {
  Trace trace;
  {
    HostCallQueue calls(4);
    calls.submit(traced(trace, 1, "bucket/a", "a1"));
    calls.submit(traced(trace, 2, "bucket/a", "a2"));
    calls.submit(traced(trace, 3, "bucket/a", "a3"));
    waitIdle(calls);
  }
  CHECK(trace.lines() ==
        std::vector<std::string>{"start a1", "end a1", "start a2", "end a2", "start a3", "end a3"});
}

TEST_CASE("an exclusive call runs alone between what came before and after it", "[host-calls]") {
  Trace trace;
  {
    HostCallQueue calls(4);
    calls.submit(traced(trace, 1, "bucket/a", "a"));
    calls.submit(traced(trace, 2, "", "sync"));
    calls.submit(traced(trace, 3, "bucket/b", "b"));
    waitIdle(calls);
  }
  CHECK(trace.lines() ==
        std::vector<std::string>{"start a", "end a", "start sync", "end sync", "start b", "end b"});
}

TEST_CASE("a cancelled call that had not started never runs; a running one finishes",
          "[host-calls]") {
  Trace trace;
  HostCallQueue calls(1);
  calls.submit(traced(trace, 1, "bucket/a", "a", std::chrono::milliseconds(200)));
  calls.submit(traced(trace, 2, "bucket/b", "b"));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(calls.inFlight() == 2u);
  CHECK(calls.cancel(1) == HostCallQueue::CancelOutcome::kRunning);
  CHECK(calls.cancel(2) == HostCallQueue::CancelOutcome::kDropped);
  CHECK(calls.cancel(3) == HostCallQueue::CancelOutcome::kUnknown);
  calls.close();
  CHECK(calls.inFlight() == 0u);
  CHECK(trace.lines() == std::vector<std::string>{"start a", "cancelled b", "end a"});
}

TEST_CASE("closing answers queued calls as cancelled and waits for running ones", "[host-calls]") {
  Trace trace;
  HostCallQueue calls(1);
  calls.submit(traced(trace, 1, "bucket/a", "a", std::chrono::milliseconds(100)));
  calls.submit(traced(trace, 2, "bucket/b", "b"));
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  calls.close();
  calls.submit(traced(trace, 3, "bucket/c", "c"));
  CHECK(trace.lines() ==
        std::vector<std::string>{"start a", "cancelled b", "end a", "cancelled c"});
}

}  // namespace
}  // namespace krane::agent
