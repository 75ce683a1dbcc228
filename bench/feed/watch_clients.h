// Many agents' Watch streams, each on its own connection (or a few per connection, to reach
// 10,000 streams with fewer sockets), recording when each change arrived.
//
// Two clients open them:
//   - GrpcWatchStreams: gRPC's own client with the callback API (no thread per stream), as the
//     agents read the feed;
//   - H2WatchStreams (h2_watch_streams.h): a lean HTTP/2 client (nghttp2, one epoll loop per
//     core) speaking the same gRPC protocol, so that the load generator, which shares the
//     machine with krane-ctrl, uses a fraction of the CPU gRPC's client does per message.
// krane-ctrl cannot tell them apart: both send the same requests and read the same messages.
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

// A channel with a connection of its own (a local subchannel pool), as a separate agent has;
// plaintext unless `credentials` are given.
std::shared_ptr<grpc::Channel> ownChannel(
    const std::string& target, std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr);

// The Watch request stream `index` of a group sends.
cluster::v1::WatchRequest watchRequest(const std::string& region, uint64_t version, size_t index,
                                       bool accept_batches);

// What the streams of a group share: counters, and who ended how.
struct StreamTally {
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

  // A stream ended; `error` is empty when it ended as asked (cancelled).
  void ended(const std::string& error);
};

// One stream's view of the events it reads: counts them, marks the stream live at its first
// bookmark or SyncEnd, and keeps a sample per change while recording. Its event calls come from
// one thread at a time; takeSamples() from any.
class StreamRecorder {
 public:
  explicit StreamRecorder(StreamTally& tally) : tally_(tally) {}
  // One message read at `received` (a single event or a batch of them).
  void message(const cluster::v1::WatchEvent& message, int64_t received);
  std::vector<Sample> takeSamples();

 private:
  void take(const cluster::v1::WatchEvent& event, int64_t received);
  void markLive();

  StreamTally& tally_;
  bool live_ = false;
  std::mutex samples_mutex_;
  std::vector<Sample> samples_;
};

// A group of Watch streams to one server.
class WatchStreams {
 public:
  virtual ~WatchStreams() = default;
  WatchStreams(const WatchStreams&) = delete;
  WatchStreams& operator=(const WatchStreams&) = delete;

  // Waits until every stream is live: it got its first bookmark (or the end of its sync).
  // False on timeout, or when a stream ended.
  bool waitLive(std::chrono::milliseconds timeout);
  size_t live() const { return tally_.live.load(); }
  size_t ended() const;
  uint64_t expired() const { return tally_.expired.load(); }
  uint64_t changes() const { return tally_.changes.load(); }
  uint64_t bookmarks() const { return tally_.bookmarks.load(); }
  // Messages read, each one event or a batch of them.
  uint64_t messages() const { return tally_.messages.load(); }

  // Changes are kept as samples only while recording.
  void setRecording(bool on) { tally_.recording = on; }
  // Every stream's samples (and clears them).
  virtual std::vector<std::vector<Sample>> takeSamples() = 0;

  // Cancels every stream and waits until the client is done with them.
  virtual void close() = 0;
  // First failure status of a stream that ended on its own, for messages.
  std::string firstError() const;

 protected:
  explicit WatchStreams(size_t count) : count_(count) {}

  StreamTally tally_;
  const size_t count_;
};

// The streams read with gRPC's client. `per_connection` of the `count` streams share one
// connection; each accepts batches as agents do, unless `accept_batches` is false.
class GrpcWatchStreams final : public WatchStreams {
 public:
  GrpcWatchStreams(const std::string& target, const std::string& token, const std::string& region,
                   uint64_t version, size_t count, size_t per_connection = 1,
                   bool accept_batches = true,
                   std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr);
  ~GrpcWatchStreams() override;

  std::vector<std::vector<Sample>> takeSamples() override;
  void close() override;

 private:
  class Stream;
  std::vector<std::unique_ptr<Stream>> streams_;
  bool closed_ = false;
};

}  // namespace krane::bench
