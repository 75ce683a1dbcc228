// The feed benchmark's socket floor: every stream gets every change of the window exactly once,
// whole (also when a message spans several reads), and the figures come from what arrived.
#include "bench/feed/socket_floor.h"

#include <chrono>
#include <stdexcept>

#include <catch2/catch.hpp>

namespace krane::bench {
namespace {

using namespace std::chrono_literals;

SocketFloorOptions small(size_t streams, size_t message_bytes) {
  SocketFloorOptions o;
  o.streams = streams;
  o.changes_per_s = 200;
  o.message_bytes = message_bytes;
  o.threads = 2;
  o.warmup = 100ms;
  o.window = 500ms;
  return o;
}

TEST_CASE("the socket floor delivers every change of the window to every stream once") {
  const SocketFloorResult r = runSocketFloor(small(20, 100));
  CHECK(r.streams == 20);
  // 200 changes a second for 0.5 s, give or take the edges of the window.
  CHECK(r.changes >= 95);
  CHECK(r.changes <= 101);
  CHECK(r.delivered == r.changes * 20);
  CHECK(r.p50_ms > 0);
  CHECK(r.p99_ms >= r.p50_ms);
  CHECK(r.sender_cpu_us_per_event > 0);
  CHECK(r.receiver_cpu_us_per_event > 0);
}

TEST_CASE("the socket floor reassembles messages larger than one read") {
  // 100 KB messages arrive in several reads of the receivers' 64 KiB buffer; one sender thread
  // and one receiver loop serve all three streams.
  SocketFloorOptions o = small(3, 100 * 1000);
  o.threads = 1;
  o.changes_per_s = 50;
  const SocketFloorResult r = runSocketFloor(o);
  CHECK(r.changes >= 23);
  CHECK(r.delivered == r.changes * 3);
}

TEST_CASE("the socket floor refuses a message too short for its send time") {
  CHECK_THROWS_AS(runSocketFloor(small(1, 4)), std::runtime_error);
}

}  // namespace
}  // namespace krane::bench
