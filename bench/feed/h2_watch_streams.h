// Watch streams read by a lean HTTP/2 client: nghttp2 for the protocol, one epoll loop per
// thread, each owning its connections, and the messages parsed on an arena that is reset after
// each one. It speaks gRPC's wire protocol (a POST with `content-type: application/grpc`,
// length-prefixed messages, the status in the trailers), so krane-ctrl serves it exactly as it
// serves an agent; on this 2-core machine it leaves krane-ctrl most of the CPU that gRPC's own
// client (about as costly per message as the server) would take.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/feed/watch_clients.h"

namespace krane::bench {

class H2WatchStreams final : public WatchStreams {
 public:
  // Opens `count` streams to `target` ("host:port", plaintext), `per_connection` of them on one
  // connection, served by `threads` event loops. Throws when a connection cannot be opened.
  H2WatchStreams(const std::string& target, const std::string& token, const std::string& region,
                 uint64_t version, size_t count, size_t per_connection = 1,
                 bool accept_batches = true, size_t threads = 2);
  ~H2WatchStreams() override;

  std::vector<std::vector<Sample>> takeSamples() override;
  // Stops the loops and closes the connections, which ends every stream on the server.
  void close() override;

  struct Stream;
  struct Connection;

 private:
  struct Loop;

  std::vector<std::unique_ptr<Connection>> connections_;
  std::vector<std::unique_ptr<Loop>> loops_;
  std::atomic<bool> stopping_{false};
  bool closed_ = false;
};

}  // namespace krane::bench
