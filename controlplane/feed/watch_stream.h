// One agent's Watch stream: full sync or catch-up from the database, then live changes from
// the hub, written on the loop of the transport that accepted the call (watch_call.h: gRPC's
// completion queues or the feed's HTTP/2 listener; no thread is held by a stream).
//
// Life of a stream:
//   1. set-up, in steps on the set-up pool: authorize, check the cursor, subscribe to the hub
//      (live batches are buffered from here on), then either a full sync from one consistent
//      snapshot or a catch-up of the changes the hub had published before the subscription.
//      Each step reads one page; a step that finds `setup_high_water` events waiting returns,
//      and the stream's writes post the next one when half of them are written, so a set-up
//      waiting for a slow agent holds no thread;
//   2. live: batches from the hub are filtered and queued; bookmarks keep idle agents current.
// A stream whose queue grows past `max_queued` (a slow agent) is told to resync and closed, so
// it cannot hold memory or slow anyone else.
//
// Writing: the stream is served as raw bytes (WatchEvent messages). A live change is queued as a
// reference to the bytes the tailer encoded once for every stream (encoded_event.h); a stream
// that was idle is handed to its loop, whose thread starts its write (never the tailer's thread)
// and takes the write's completion. Everything queued goes out in one flush: to an agent that
// accepts batches (WatchRequest.accept_batches) as one message carrying all of it, framed around
// the shared bytes; to one that does not, one message per event, each but the last written with
// gRPC's buffer hint so that the transport sends them together.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "common/thread_pool.h"
#include "controlplane/db/pool.h"
#include "controlplane/feed/hub.h"
#include "controlplane/feed/resource_table.h"
#include "controlplane/feed/watch_call.h"
#include "krane/cluster/v1/cluster.pb.h"

namespace krane::feed {

struct WatchOptions {
  // Events queued for one stream before it is told to resync.
  size_t max_queued = 20000;
  // A full sync or catch-up pauses while this many events wait to be written.
  size_t setup_high_water = 1024;
  // Full syncs holding a snapshot (and its connection) at once; the others wait in line.
  size_t max_open_snapshots = 4;
  // A full sync holding a snapshot slot whose client reads nothing (no write completes) for
  // this long, while another full sync waits for a slot, ends with UNAVAILABLE and gives its
  // slot back; after ten times as long it ends whoever waits (the snapshot's read view holds
  // back the database's purge).
  std::chrono::milliseconds setup_stall{120000};
  // An idle stream gets a bookmark this often.
  std::chrono::milliseconds bookmark_interval{5000};
  // Rows or changes read per set-up step.
  size_t catch_up_batch = 2000;
  // The largest message a stream that accepts batches gets (an event larger than this still
  // goes, alone). Well under the 4 MiB a gRPC client takes by default.
  size_t max_batch_bytes = 1 << 20;
};

// Counters shared by all streams of a server; read by /metrics.
struct WatchCounters {
  std::atomic<uint64_t> streams_open{0};
  std::atomic<uint64_t> streams_total{0};
  std::atomic<uint64_t> events_sent{0};
  std::atomic<uint64_t> flushes{0};       // writes without the buffer hint: one per queue drained
  std::atomic<uint64_t> batches_sent{0};  // messages carrying several events
  // Events queued on all streams now, written or not (each a reference to shared bytes);
  // bounded by streams x stream_max_queued.
  std::atomic<int64_t> queued_events{0};
  std::atomic<uint64_t> bookmarks_sent{0};
  std::atomic<uint64_t> full_syncs{0};
  std::atomic<uint64_t> full_syncs_waiting{0};  // for a snapshot slot
  std::atomic<uint64_t> resyncs_requested{0};   // cursor expired or too slow
  std::atomic<uint64_t> setups_stalled{0};      // ended: the agent read nothing for setup_stall
  std::atomic<uint64_t> calls_reset{0};  // ended, then reset: the agent took nothing for as long
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

  // Snapshot slots of full syncs: how many are taken, and the streams waiting for one.
  std::mutex snapshots_mutex;
  size_t open_snapshots = 0;
  std::deque<std::weak_ptr<class WatchStream>> snapshot_waiters;
};

class WatchStream final : public WatchCallHandler,
                          public Subscriber,
                          public Writable,
                          public std::enable_shared_from_this<WatchStream> {
 public:
  // Starts a stream serving `call`; it lives until the call's OnDone.
  static void start(std::shared_ptr<WatchContext> context, const cluster::v1::WatchRequest& request,
                    std::string bearer, std::string peer, WatchCall* call);

  // Subscriber
  void deliver(const std::shared_ptr<const EventBatch>& batch) override;
  void expire(const std::string& reason) override;
  // Writable: the loop starts what deliver() queued.
  void startWrites() override { kick(); }

  // Queues a bookmark if nothing was written for bookmark_interval; ends a set-up whose client
  // read nothing for setup_stall; resets a call that ended setup_stall ago and whose client
  // still takes nothing of the write in flight, which its finish waits for.
  void tick(std::chrono::steady_clock::time_point now);
  // Ends the stream with UNAUTHENTICATED (its token was revoked).
  void endUnauthenticated(const std::string& message);
  // The bearer token the stream was opened with.
  const std::string& bearer() const { return bearer_; }

  // WatchCallHandler
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

  WatchStream(std::shared_ptr<WatchContext> context, cluster::v1::WatchRequest request,
              std::string bearer, std::string peer, WatchCall* call);

 private:
  enum class Phase { kSetup, kLive, kClosing };
  enum class Stage { kCheck, kAwaitSnapshot, kSync, kCatchUp };

  // One set-up step; `granted` when a snapshot slot was handed to this stream.
  void runSetup(bool granted);
  // Runs set-up stages until live, paused at high water, waiting for a slot, or failed.
  absl::Status advance();
  // Authorizes, checks the cursor, subscribes; OK with the stream closing on a resync answer.
  absl::Status check();
  absl::Status openSnapshot();
  absl::Status syncPage();
  absl::Status catchUpPage();
  void goLive();
  // Ends the snapshot transaction and frees its slot (handing it to the next waiter).
  void closeSnapshot();
  bool takeSnapshotSlot();
  void releaseSnapshotSlot();
  void post(bool granted);
  bool wants(const std::string& type) const;
  // Queues a set-up event (no-op once the stream is closing).
  void push(const cluster::v1::WatchEvent& event);
  void pushWire(grpc::Slice wire);
  // Queues a page of set-up events at once: one write starts for all of them, not one for the
  // first and another for the rest.
  void pushWires(std::vector<grpc::Slice> wires);
  // Under mutex_: queue encoded bytes and remember what to start.
  void queueLocked(grpc::Slice wire);
  // Under mutex_: something is queued; kick() starts a write unless one is in flight.
  void markWritingLocked();
  void queueBookmarkLocked(uint64_t version);
  size_t pendingLocked() const { return queue_.size() - head_; }
  // Under mutex_: drops everything queued but the write in flight.
  void dropQueuedLocked();
  // Under mutex_: keeps the first `keep` events queued, drops the rest.
  void truncateLocked(size_t keep);
  void queueBatchLocked(const EventBatch& batch);
  void resyncLocked(cluster::v1::CursorExpiredReason reason, const std::string& message);
  void finishLocked(grpc::Status status);
  // Under mutex_: the stream ends with `status` once what is queued is written.
  void closeLocked(grpc::Status status);
  // Outside mutex_: starts the write or finish decided under the lock, and posts the set-up
  // step that waited for the queue to drain.
  void kick();
  // kick() on the call's loop, when deliver() left something to start.
  void scheduleKick();
  // Under mutex_: something to start, and no kick() is on its way yet.
  bool needsKickLocked() const;

  std::shared_ptr<WatchContext> context_;
  WatchCall* const call_;  // until OnDone; only for operations decided under mutex_
  // The call's loop, which outlives every stream: scheduleKick() uses it outside the lock, when
  // the call may already be gone.
  WatchScheduler* const loop_;
  const cluster::v1::WatchRequest request_;
  const std::string bearer_;
  const std::string peer_;
  std::set<std::string> types_;
  std::string region_;
  uint64_t epoch_ = 0;  // the feed's epoch, read at setup

  // Set-up state; touched only by the set-up step, and steps of a stream never overlap.
  Stage stage_ = Stage::kCheck;
  uint64_t cursor_ = 0;                 // everything up to here is queued
  uint64_t published_ = 0;              // catch up to here (the hub's position when subscribing)
  db::PooledConnection snapshot_conn_;  // the full sync's snapshot transaction
  std::atomic<bool> has_slot_{false};   // a snapshot slot; read by tick() too
  uint64_t snapshot_ = 0;
  size_t table_ = 0;  // full sync position: tables()->all()[table_], rows after after_
  ListCursor after_;
  uint64_t sent_ = 0;

  std::mutex mutex_;
  Phase phase_ = Phase::kSetup;
  bool parked_ = false;  // the set-up step waits for the queue to drain
  // Encoded events to write, from queue_[head_]; a vector, since an idle stream should hold
  // no memory for it (an empty deque allocates).
  std::vector<grpc::Slice> queue_;
  size_t head_ = 0;
  grpc::ByteBuffer in_flight_;   // the message being written
  size_t in_flight_events_ = 0;  // the events it carries, from queue_[head_]
  size_t round_left_ = 0;        // messages of the current round (one flush) not started yet
  bool wrote_first_ = false;
  std::vector<std::shared_ptr<const EventBatch>> buffered_;  // live batches during setup
  size_t buffered_events_ = 0;
  uint64_t queued_through_ = 0;  // every version up to here is queued (or filtered out)
  bool writing_ = false;         // a write is in flight (queue_[head_])
  bool kick_scheduled_ = false;  // a kick() waits on the loop
  bool start_write_ = false;     // kick() must start a write
  bool finish_pending_ = false;  // finish once the queue is written
  bool finished_ = false;        // Finish() was called
  bool reset_ = false;           // the call was reset (WatchCall::cancel)
  bool cancelled_ = false;
  bool done_ = false;
  grpc::Status final_status_;
  std::chrono::steady_clock::time_point last_write_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point closing_since_;  // when finish_pending_ was set
  std::shared_ptr<WatchStream> self_;                    // keeps the stream alive until OnDone
};

}  // namespace krane::feed
