// The socket floor: what a fan-out costs with nothing but the kernel in between.
//
// A sender delivers each change to every stream as one write of the bytes a Watch message of one
// change takes on the wire, on a loopback TCP connection of its own per stream, from one thread
// per core (as krane-ctrl's write pool); receivers read them in one epoll loop per core (as the
// lean HTTP/2 client). No HTTP/2, no gRPC, no database: the least any server could spend to give
// each agent its own connection on this machine, measured in the same run as krane-ctrl.
#pragma once

#include <chrono>
#include <cstddef>

namespace krane::bench {

struct SocketFloorOptions {
  size_t streams = 1000;
  double changes_per_s = 50;
  size_t message_bytes = 128;  // at least 8: the send time travels in the first 8 bytes
  size_t threads = 2;          // sender threads, and receiver loops
  std::chrono::milliseconds warmup{1000};
  std::chrono::milliseconds window{10000};
};

struct SocketFloorResult {
  size_t streams = 0;
  size_t changes = 0;    // changes sent inside the window
  size_t delivered = 0;  // (stream, change) pairs received inside the window
  double p50_ms = 0;
  double p99_ms = 0;
  // The sender threads' CPU (user and kernel, as the threads' own clocks count it: the
  // loopback's receiving side runs in the sender's system calls) over the window, per delivery.
  double sender_cpu_us_per_event = 0;
  double receiver_cpu_us_per_event = 0;
};

// Runs one fan-out for warmup + window; throws std::runtime_error when the sockets cannot be set
// up (a file limit too low for 2 x streams descriptors, say).
SocketFloorResult runSocketFloor(const SocketFloorOptions& options);

}  // namespace krane::bench
