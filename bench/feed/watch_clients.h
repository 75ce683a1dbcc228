// Many agents' Watch streams, each on its own gRPC connection (or a few per connection, to reach
// 10,000 streams with fewer sockets), read with the callback API (no thread per stream),
// recording when each change arrived.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "bench/feed/measure.h"
#include "krane/cluster/v1/cluster.grpc.pb.h"

namespace krane::bench {

// A channel with a connection of its own (a local subchannel pool), as a separate agent has.
std::shared_ptr<grpc::Channel> ownChannel(const std::string& target);

class WatchStreams {
 public:
  // Opens `count` streams of `region` resuming after `version` (0: full sync first), each a
  // Watch call of its own, `per_connection` of them sharing one connection; accepting batches
  // as agents do, unless `accept_batches` is false.
  WatchStreams(const std::string& target, const std::string& token, const std::string& region,
               uint64_t version, size_t count, size_t per_connection = 1,
               bool accept_batches = true);
  ~WatchStreams();
  WatchStreams(const WatchStreams&) = delete;
  WatchStreams& operator=(const WatchStreams&) = delete;

  // Waits until every stream is live: it got its first bookmark (or the end of its sync).
  // False on timeout, or when a stream ended.
  bool waitLive(std::chrono::milliseconds timeout);
  size_t live() const { return shared_.live.load(); }
  size_t ended() const;
  uint64_t expired() const { return shared_.expired.load(); }
  uint64_t changes() const { return shared_.changes.load(); }
  uint64_t bookmarks() const { return shared_.bookmarks.load(); }
  // Messages read, each one event or a batch of them.
  uint64_t messages() const { return shared_.messages.load(); }

  // Changes are kept as samples only while recording.
  void setRecording(bool on) { shared_.recording = on; }
  // Every stream's samples (and clears them).
  std::vector<std::vector<Sample>> takeSamples();

  // Cancels every stream and waits until gRPC is done with them.
  void close();
  // First failure status of a stream that ended on its own, for messages.
  std::string firstError() const;

 private:
  class Stream;
  struct Shared {
    std::atomic<size_t> live{0};
    std::atomic<uint64_t> expired{0};
    std::atomic<uint64_t> changes{0};
    std::atomic<uint64_t> bookmarks{0};
    std::atomic<uint64_t> messages{0};
    std::atomic<bool> recording{false};
    mutable std::mutex mutex;
    std::condition_variable changed;
    size_t done = 0;
    std::string first_error;
  };

  Shared shared_;
  std::vector<std::unique_ptr<Stream>> streams_;
  bool closed_ = false;
};

}  // namespace krane::bench
