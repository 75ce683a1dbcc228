// One agent's Watch stream: full sync or catch-up from the database, then live changes from
// the hub, written through gRPC's callback API (no thread is held by a stream).
//
// Life of a stream:
//   1. setup (on a worker thread): authorize, check the cursor, subscribe to the hub (live
//      batches are buffered from here on), then either a full sync from one consistent snapshot
//      or a catch-up of the changes the hub had published before the subscription;
//   2. live: batches from the hub are filtered and queued; bookmarks keep idle agents current.
// A stream whose queue grows past `max_queued` (a slow agent) is told to resync and closed, so
// it cannot hold memory or slow anyone else.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include <grpcpp/grpcpp.h>

#include "common/thread_pool.h"
#include "controlplane/db/pool.h"
#include "controlplane/feed/hub.h"
#include "controlplane/feed/resource_table.h"
#include "krane/cluster/v1/cluster.pb.h"

namespace krane::feed {

struct WatchOptions {
  // Events queued for one stream before it is told to resync.
  size_t max_queued = 20000;
  // A full sync or catch-up pauses while more than this many events wait to be written.
  size_t setup_high_water = 1024;
  // An idle stream gets a bookmark this often.
  std::chrono::milliseconds bookmark_interval{5000};
  // Changes read per catch-up query.
  size_t catch_up_batch = 2000;
};

// Counters shared by all streams of a server; read by /metrics.
struct WatchCounters {
  std::atomic<uint64_t> streams_open{0};
  std::atomic<uint64_t> streams_total{0};
  std::atomic<uint64_t> events_sent{0};
  std::atomic<uint64_t> bookmarks_sent{0};
  std::atomic<uint64_t> full_syncs{0};
  std::atomic<uint64_t> resyncs_requested{0};  // cursor expired or too slow
};

// What a stream needs from the server. Shared by every stream; outlives them.
struct WatchContext {
  std::shared_ptr<db::Pool> pool;
  std::shared_ptr<const ResourceTables> tables;
  std::shared_ptr<Hub> hub;
  std::shared_ptr<ThreadPool> setup_pool;
  WatchOptions options;
  // Returns the region the bearer token may watch (UNAUTHENTICATED / PERMISSION_DENIED).
  std::function<absl::StatusOr<std::string>(const std::string& bearer)> authorize;
  WatchCounters counters;

  // Streams alive, for bookmarks.
  std::mutex streams_mutex;
  std::set<std::shared_ptr<class WatchStream>> streams;
};

class WatchStream final : public grpc::ServerWriteReactor<cluster::v1::WatchEvent>,
                          public Subscriber,
                          public std::enable_shared_from_this<WatchStream> {
 public:
  // Starts a stream; gRPC owns the returned reactor until OnDone.
  static grpc::ServerWriteReactor<cluster::v1::WatchEvent>* start(
      std::shared_ptr<WatchContext> context, const cluster::v1::WatchRequest& request,
      std::string bearer, std::string peer);

  // Subscriber
  void deliver(const std::shared_ptr<const EventBatch>& batch) override;
  void expire(const std::string& reason) override;

  // Queues a bookmark if nothing was written for bookmark_interval.
  void tick(std::chrono::steady_clock::time_point now);
  // Ends the stream with UNAUTHENTICATED (its token was revoked).
  void endUnauthenticated(const std::string& message);
  // The bearer token the stream was opened with.
  const std::string& bearer() const { return bearer_; }

  // grpc::ServerWriteReactor
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

  WatchStream(std::shared_ptr<WatchContext> context, cluster::v1::WatchRequest request,
              std::string bearer, std::string peer);

 private:
  enum class Phase { kSetup, kLive, kClosing };

  void setup();
  absl::Status setupOrError();
  absl::Status fullSync(db::Connection& conn, uint64_t* cursor);
  absl::Status catchUp(db::Connection& conn, uint64_t* cursor, uint64_t through);
  bool wants(const std::string& type) const;
  // Queues during setup, waiting while the queue is above the high-water mark.
  bool pushWaiting(std::shared_ptr<const cluster::v1::WatchEvent> event);
  // Under mutex_: queue and remember what to start.
  void queueLocked(std::shared_ptr<const cluster::v1::WatchEvent> event);
  void queueBatchLocked(const EventBatch& batch);
  void resyncLocked(cluster::v1::CursorExpiredReason reason, const std::string& message);
  void finishLocked(grpc::Status status);
  // Outside mutex_: starts the write or finish decided under the lock.
  void kick();

  std::shared_ptr<WatchContext> context_;
  const cluster::v1::WatchRequest request_;
  const std::string bearer_;
  const std::string peer_;
  std::set<std::string> types_;
  std::string region_;
  uint64_t epoch_ = 0;  // the feed's epoch, read at setup

  std::mutex mutex_;
  std::condition_variable drained_;
  Phase phase_ = Phase::kSetup;
  std::deque<std::shared_ptr<const cluster::v1::WatchEvent>> queue_;
  std::deque<std::shared_ptr<const EventBatch>> buffered_;  // live batches during setup
  size_t buffered_events_ = 0;
  uint64_t queued_through_ = 0;  // every version up to here is queued (or filtered out)
  bool writing_ = false;         // a write is in flight (queue_.front())
  bool start_write_ = false;     // kick() must start a write
  bool finish_pending_ = false;  // finish once the queue is written
  bool finished_ = false;        // Finish() was called
  bool cancelled_ = false;
  bool done_ = false;
  grpc::Status final_status_;
  std::chrono::steady_clock::time_point last_write_ = std::chrono::steady_clock::now();
  std::shared_ptr<WatchStream> self_;  // keeps the stream alive until OnDone
};

}  // namespace krane::feed
