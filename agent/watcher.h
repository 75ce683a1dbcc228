// Streams the region's changes from krane-ctrl and hands them to the dispatcher.
//
// Resumes from the durable watermark (so a restarted agent does not resync), does a full sync
// when it has no cursor, when the server says the cursor expired, and every `resync_interval`
// counted from the end of the last full sync (saved, so restarts do not push it back),
// and reconnects with jittered backoff when the stream breaks. It never advances the cursor
// itself: the sink acknowledges what was applied and the watermark follows (watermark.h).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "common/backoff.h"
#include "krane/cluster/v1/cluster.grpc.pb.h"

namespace krane::agent {

// Receives the stream in order, on the watcher's thread. Calls may block to push back.
class ChangeSink {
 public:
  virtual ~ChangeSink() = default;
  virtual void syncBegin(uint64_t snapshot_version) = 0;
  // A change; during a sync, the resources of the snapshot (as APPLY changes).
  virtual void change(const cluster::v1::Change& change, bool in_sync) = 0;
  // The sync ended; `resource_count` is how many resources the server sent in it. False: the
  // sync was not taken (fewer or more resources arrived than were sent); the watcher starts
  // over with a new full sync.
  virtual bool syncEnd(uint64_t version, uint64_t resource_count) = 0;
  virtual void bookmark(uint64_t version) = 0;
};

struct WatcherOptions {
  std::string region;
  std::string agent_id;
  std::string token;
  std::vector<std::string> resource_types;  // empty: all
  std::chrono::seconds resync_interval{300};
  // When the last full sync ended (Unix ms, as saved in the cursor store), so that the periodic
  // resync falls due on time across restarts and reconnects; 0: unknown, counted from now.
  int64_t last_full_sync_unix_ms = 0;
  // The feed epoch of the cursor (saved in the cursor store; 0: not known), sent with each Watch;
  // `on_epoch` is told the epoch of each full sync taken, to save it.
  uint64_t epoch = 0;
  std::function<void(uint64_t epoch)> on_epoch;
  BackoffPolicy reconnect{std::chrono::milliseconds(1000), 2.0, std::chrono::milliseconds(5000),
                          0.8};
  // A preferred channel (preferChannel) whose streams fail this many times in a row before
  // their first event, while the first channel is connected, is left for the first channel for
  // `fallback_for` (twice as long after each further fallback in a row, up to eight times), or
  // until a stream fails there too; then tried again.
  int preferred_failures = 3;
  std::chrono::seconds fallback_for{300};
};

struct WatcherStats {
  uint64_t connects = 0;
  uint64_t full_syncs = 0;
  uint64_t cursor_expired = 0;
  uint64_t changes = 0;
  std::string last_error;
  // Where the last stream went: "" for the first channel, else preferChannel's `where`.
  std::string watching;
  // Times a preferred channel was left for the first one (preferred_failures).
  uint64_t fallbacks = 0;
};

class Watcher {
 public:
  // `resume_from` returns the durable watermark (0: full sync) each time the watcher connects.
  Watcher(std::shared_ptr<grpc::Channel> channel, WatcherOptions options, ChangeSink& sink,
          std::function<uint64_t()> resume_from);
  ~Watcher();

  void start();
  void stop();
  // Forces a full sync on the next connection.
  void requestResync();
  // Watches through `channel` (`where`: its address, for logs and stats) instead of the first
  // channel: the open stream ends once all it delivered is applied (a full sync under way
  // included), and the next resumes from that cursor there. Null: back to the first channel.
  void preferChannel(std::shared_ptr<grpc::Channel> channel, std::string where);
  WatcherStats stats() const;

 private:
  void run();
  // The periodic full sync is due (resync_interval since the last one ended).
  bool resyncDue() const;
  // One stream on `stub`, until it ends (or, from `leave_at` on, until it is caught up); returns
  // whether it ended asking for a resync. `events`: whether any event arrived.
  bool streamOnce(cluster::v1::ClusterService::Stub& stub, uint64_t version,
                  std::chrono::steady_clock::time_point leave_at, bool* events);
  // What the open stream delivered (up to `received`) is applied; waits up to `patience` for it.
  bool caughtUp(uint64_t received, std::chrono::milliseconds patience);

  std::shared_ptr<grpc::Channel> channel_;  // the first channel
  std::unique_ptr<cluster::v1::ClusterService::Stub> stub_;
  // preferChannel's, and how its streams fare.
  std::shared_ptr<cluster::v1::ClusterService::Stub> preferred_;
  std::string preferred_where_;
  int preferred_failed_ = 0;
  int fallbacks_in_a_row_ = 0;
  std::chrono::steady_clock::time_point fallback_until_{};
  std::atomic<bool> switch_{false};  // preferChannel: end the open stream, reconnect at once
  WatcherOptions options_;
  ChangeSink& sink_;
  std::function<uint64_t()> resume_from_;

  std::atomic<bool> stopping_{false};
  std::atomic<bool> resync_{false};
  // This agent cancelled the current stream (a stop, a resync, a channel switch), not krane-ctrl.
  std::atomic<bool> cancelled_here_{false};
  // Ends the current stream from this side (every cancel of the agent's own goes through here).
  void cancelStream(grpc::ClientContext& context);
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  grpc::ClientContext* context_ = nullptr;  // of the open stream, for cancellation
  int64_t last_sync_unix_ms_ = 0;           // when the last full sync ended
  uint64_t epoch_ = 0;                      // the feed epoch of the cursor
  WatcherStats stats_;
  std::thread thread_;
};

}  // namespace krane::agent
