#include "controlplane/feed/watch_stream.h"

#include "common/grpc_status.h"
#include "common/status.h"
#include "common/strings.h"
#include "controlplane/feed/change_reader.h"
#include "controlplane/feed/encoded_event.h"
#include "controlplane/feed/writer.h"
#include "spdlog/spdlog.h"

namespace krane::feed {
namespace {

using cluster::v1::WatchEvent;

grpc::Slice bookmark(uint64_t version) {
  WatchEvent event;
  event.mutable_bookmark()->set_version(version);
  return encodeEvent(event);
}

// A drained queue keeps at most this much capacity, so an idle stream holds little.
constexpr size_t kKeptQueueCapacity = 16;

}  // namespace

void WatchStream::start(std::shared_ptr<WatchContext> context,
                        const cluster::v1::WatchRequest& request, std::string bearer,
                        std::string peer, WatchCall* call) {
  auto stream =
      std::make_shared<WatchStream>(context, request, std::move(bearer), std::move(peer), call);
  stream->self_ = stream;
  call->serve(stream.get());
  ++context->counters.streams_open;
  ++context->counters.streams_total;
  {
    std::lock_guard lock(context->streams_mutex);
    context->streams.insert(stream);
  }
  stream->post(/*granted=*/false);
}

WatchStream::WatchStream(std::shared_ptr<WatchContext> context, cluster::v1::WatchRequest request,
                         std::string bearer, std::string peer, WatchCall* call)
    : context_(std::move(context)),
      call_(call),
      loop_(&call->loop()),
      request_(std::move(request)),
      bearer_(std::move(bearer)),
      peer_(std::move(peer)),
      types_(request_.resource_types().begin(), request_.resource_types().end()),
      region_(request_.region()) {}

bool WatchStream::wants(const std::string& type) const {
  return types_.empty() || types_.count(type) > 0;
}

void WatchStream::post(bool granted) {
  context_->setup_pool->post([self = shared_from_this(), granted] { self->runSetup(granted); });
}

void WatchStream::runSetup(bool granted) {
  if (granted) has_slot_ = true;
  absl::Status status = advance();
  if (!status.ok()) {
    closeSnapshot();
    if (absl::IsOutOfRange(status)) {
      std::lock_guard lock(mutex_);
      resyncLocked(cluster::v1::CURSOR_EXPIRED_REASON_PRUNED, std::string(toStd(status.message())));
    } else {
      if (!absl::IsUnauthenticated(status) && !absl::IsPermissionDenied(status) &&
          !absl::IsInvalidArgument(status) && !absl::IsNotFound(status) &&
          !absl::IsCancelled(status)) {
        spdlog::warn("feed: watch setup failed region={} peer={} error=\"{}\"", region_, peer_,
                     status.message());
      }
      std::lock_guard lock(mutex_);
      finishLocked(toGrpc(status));
    }
  }
  kick();
}

absl::Status WatchStream::advance() {
  for (;;) {
    {
      std::lock_guard lock(mutex_);
      if (done_ || phase_ != Phase::kSetup)
        return absl::CancelledError("stream ended during setup");
      if (pendingLocked() >= context_->options.setup_high_water) {
        parked_ = true;  // kick() posts the next step once the client has read half
        return absl::OkStatus();
      }
    }
    switch (stage_) {
      case Stage::kCheck:
        KRANE_RETURN_IF_ERROR(check());
        stage_ = cursor_ == 0 ? Stage::kAwaitSnapshot : Stage::kCatchUp;
        break;
      case Stage::kAwaitSnapshot:
        if (!has_slot_ && !takeSnapshotSlot()) return absl::OkStatus();  // posted when freed
        KRANE_RETURN_IF_ERROR(openSnapshot());
        stage_ = Stage::kSync;
        break;
      case Stage::kSync:
        KRANE_RETURN_IF_ERROR(syncPage());
        if (table_ == context_->tables->all().size()) stage_ = Stage::kCatchUp;
        break;
      case Stage::kCatchUp:
        if (cursor_ >= published_) {
          goLive();
          return absl::OkStatus();
        }
        KRANE_RETURN_IF_ERROR(catchUpPage());
        break;
    }
  }
}

absl::Status WatchStream::check() {
  for (int i = 0; i < request_.resource_types_size(); ++i) {
    KRANE_RETURN_IF_ERROR(checkType(strCat("resource_types[", i, "]"), request_.resource_types(i)));
  }
  KRANE_RETURN_IF_ERROR(checkId("region", region_));
  KRANE_ASSIGN_OR_RETURN(std::string allowed, context_->authorize(bearer_));
  if (allowed != region_) {
    return absl::PermissionDeniedError(
        strCat("this agent token is for region ", quote(allowed), ", not ", quote(region_)));
  }
  KRANE_ASSIGN_OR_RETURN(auto conn, context_->pool->acquire());
  KRANE_ASSIGN_OR_RETURN(
      auto rows, conn->query("SELECT COALESCE(v.version, 0), COALESCE(v.pruned_version, 0)"
                             " FROM regions r LEFT JOIN region_versions v ON v.region_id = r.id"
                             " WHERE r.id = ?",
                             {region_}));
  if (rows.empty())
    return absl::NotFoundError(strCat("region ", quote(region_), " is not registered"));
  const uint64_t head = rows.rows[0].u64(0);
  const uint64_t pruned = rows.rows[0].u64(1);
  const uint64_t cursor = request_.version();
  KRANE_ASSIGN_OR_RETURN(auto epochs, conn->query("SELECT epoch FROM feed_epoch WHERE id = 1"));
  epoch_ = epochs.empty() ? 0 : epochs.rows[0].u64(0);
  if (request_.epoch() != 0 && epoch_ != 0 && request_.epoch() != epoch_) {
    std::lock_guard lock(mutex_);
    resyncLocked(cluster::v1::CURSOR_EXPIRED_REASON_EPOCH_CHANGED,
                 strCat("the feed's history was replaced (epoch ", epoch_, ", the cursor is of ",
                        request_.epoch(), "): the database was restored or replaced"));
    return absl::OkStatus();
  }
  if (cursor > head) {
    if (request_.epoch() != 0 && request_.epoch() == epoch_) {
      // This epoch's history went backwards (a restore nobody announced): a new epoch, so that
      // agents whose cursors are not ahead (and would silently skip the versions written again)
      // resync too.
      KRANE_RETURN_IF_ERROR(
          conn->exec("UPDATE feed_epoch SET epoch = CONV(SUBSTRING(MD5(UUID()), 1, 15), 16, 10) + 1"
                     " WHERE id = 1 AND epoch = ?",
                     {epoch_})
              .status());
      spdlog::warn(
          "feed: region={} agent={} is at version {}, ahead of the region ({}): the"
          " database went back in time; the feed's epoch changes",
          region_, request_.agent_id(), cursor, head);
    }
    std::lock_guard lock(mutex_);
    resyncLocked(cluster::v1::CURSOR_EXPIRED_REASON_FUTURE_VERSION,
                 strCat("version ", cursor, " is ahead of region ", region_, " (at ", head,
                        "): the database was restored or replaced"));
    return absl::OkStatus();
  }
  if (cursor != 0 && cursor < pruned) {
    std::lock_guard lock(mutex_);
    resyncLocked(
        cluster::v1::CURSOR_EXPIRED_REASON_PRUNED,
        strCat("changes after version ", cursor, " were pruned (kept from ", pruned + 1, ")"));
    return absl::OkStatus();
  }
  cursor_ = cursor;
  published_ = context_->hub->subscribe(region_, shared_from_this());
  bool done;
  {
    std::lock_guard lock(mutex_);
    done = done_;
  }
  if (done) {
    // OnDone already ran (and unsubscribed before this subscription).
    context_->hub->unsubscribe(region_, this);
    return absl::CancelledError("stream ended during setup");
  }
  return absl::OkStatus();
}

bool WatchStream::takeSnapshotSlot() {
  std::lock_guard lock(context_->snapshots_mutex);
  if (context_->open_snapshots < context_->options.max_open_snapshots) {
    ++context_->open_snapshots;
    has_slot_ = true;
    return true;
  }
  context_->snapshot_waiters.push_back(weak_from_this());
  ++context_->counters.full_syncs_waiting;
  return false;
}

void WatchStream::releaseSnapshotSlot() {
  if (!has_slot_) return;
  has_slot_ = false;
  std::shared_ptr<WatchStream> next;
  {
    std::lock_guard lock(context_->snapshots_mutex);
    while (!next && !context_->snapshot_waiters.empty()) {
      next = context_->snapshot_waiters.front().lock();
      context_->snapshot_waiters.pop_front();
      --context_->counters.full_syncs_waiting;
    }
    if (!next) --context_->open_snapshots;
  }
  if (next) next->post(/*granted=*/true);  // the slot passes on without being freed
}

absl::Status WatchStream::openSnapshot() {
  ++context_->counters.full_syncs;
  KRANE_ASSIGN_OR_RETURN(snapshot_conn_, context_->pool->acquire());
  KRANE_RETURN_IF_ERROR(
      snapshot_conn_->execText("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY"));
  KRANE_ASSIGN_OR_RETURN(
      auto rows,
      snapshot_conn_->query("SELECT version FROM region_versions WHERE region_id = ?", {region_}));
  snapshot_ = rows.empty() ? 0 : rows.rows[0].u64(0);
  table_ = 0;
  after_ = ListCursor();
  sent_ = 0;
  WatchEvent begin;
  begin.mutable_sync_begin()->set_snapshot_version(snapshot_);
  push(begin);
  return absl::OkStatus();
}

absl::Status WatchStream::syncPage() {
  const auto& tables = context_->tables->all();
  const auto& table = tables[table_];
  if (table->type().empty() || wants(std::string(table->type()))) {
    const size_t limit = context_->options.catch_up_batch;
    KRANE_ASSIGN_OR_RETURN(auto page, table->list(*snapshot_conn_, region_, "", after_, limit));
    std::vector<grpc::Slice> wires;
    wires.reserve(page.size());
    for (auto& resource : page) {
      after_ = ListCursor{resource.region(), resource.type(), resource.id()};
      if (!wants(resource.type())) continue;
      WatchEvent event;
      auto* change = event.mutable_change();
      change->set_op(cluster::v1::CHANGE_OP_APPLY);
      change->set_version(resource.version());
      *change->mutable_resource() = std::move(resource);
      wires.push_back(encodeEvent(event));
      ++sent_;
    }
    pushWires(std::move(wires));
    if (page.size() == limit) return absl::OkStatus();  // more rows in this table
  }
  ++table_;
  after_ = ListCursor();
  if (table_ < tables.size()) return absl::OkStatus();
  WatchEvent end;
  end.mutable_sync_end()->set_version(snapshot_);
  end.mutable_sync_end()->set_resource_count(sent_);
  end.mutable_sync_end()->set_epoch(epoch_);
  push(end);
  cursor_ = snapshot_;
  closeSnapshot();
  return absl::OkStatus();
}

void WatchStream::closeSnapshot() {
  if (snapshot_conn_.operator->() != nullptr) {
    (void)snapshot_conn_->execText("ROLLBACK");
    snapshot_conn_ = db::PooledConnection();
  }
  releaseSnapshotSlot();
}

absl::Status WatchStream::catchUpPage() {
  KRANE_ASSIGN_OR_RETURN(auto conn, context_->pool->acquire());
  KRANE_ASSIGN_OR_RETURN(auto batch, readChanges(*conn, *context_->tables, region_, cursor_,
                                                 published_, context_->options.catch_up_batch));
  bool last_sent = false;
  std::vector<grpc::Slice> wires;
  wires.reserve(batch.events.size() + 1);
  for (auto& event : batch.events) {
    last_sent = wants(event.type);
    if (last_sent) wires.push_back(event.wire);
  }
  if (!last_sent) wires.push_back(bookmark(batch.through));
  pushWires(std::move(wires));
  cursor_ = batch.through;
  return absl::OkStatus();
}

void WatchStream::goLive() {
  std::lock_guard lock(mutex_);
  if (phase_ != Phase::kSetup) return;
  queued_through_ = cursor_;
  for (const auto& batch : buffered_) queueBatchLocked(*batch);
  buffered_.clear();
  buffered_events_ = 0;
  if (phase_ == Phase::kSetup) phase_ = Phase::kLive;
  if (pendingLocked() == 0 && !writing_ && !finish_pending_) queueBookmarkLocked(queued_through_);
  spdlog::debug("feed: watch live region={} peer={} version={}", region_, peer_, queued_through_);
}

void WatchStream::push(const WatchEvent& event) { pushWire(encodeEvent(event)); }

void WatchStream::pushWire(grpc::Slice wire) {
  std::vector<grpc::Slice> wires;
  wires.push_back(std::move(wire));
  pushWires(std::move(wires));
}

void WatchStream::pushWires(std::vector<grpc::Slice> wires) {
  if (wires.empty()) return;
  {
    std::lock_guard lock(mutex_);
    if (done_ || phase_ != Phase::kSetup) return;
    for (auto& wire : wires) queueLocked(std::move(wire));
  }
  kick();
}

void WatchStream::queueLocked(grpc::Slice wire) {
  if (finished_ || cancelled_) return;
  queue_.push_back(std::move(wire));
  context_->counters.queued_events.fetch_add(1, std::memory_order_relaxed);
  markWritingLocked();
}

void WatchStream::markWritingLocked() {
  if (!writing_) {
    writing_ = true;
    start_write_ = true;
  }
}

void WatchStream::queueBookmarkLocked(uint64_t version) {
  if (finished_ || cancelled_) return;
  ++context_->counters.bookmarks_sent;
  queueLocked(bookmark(version));
}

void WatchStream::truncateLocked(size_t keep) {
  const size_t pending = pendingLocked();
  round_left_ = 0;  // what is left (the write in flight, then new events) starts a new round
  if (pending <= keep) return;
  context_->counters.queued_events.fetch_sub(static_cast<int64_t>(pending - keep),
                                             std::memory_order_relaxed);
  queue_.resize(head_ + keep);
  if (keep == 0) {
    queue_.clear();
    head_ = 0;
  }
  if (queue_.capacity() > kKeptQueueCapacity && queue_.size() <= kKeptQueueCapacity) {
    queue_.shrink_to_fit();
  }
}

void WatchStream::dropQueuedLocked() {
  // The write in flight is queue_[head_, head_ + in_flight_events_); it stays until its
  // completion pops it.
  truncateLocked(writing_ && !start_write_ ? in_flight_events_ : 0);
  if (start_write_) {
    // Nothing was started yet: nothing to write.
    start_write_ = false;
    writing_ = false;
  }
}

void WatchStream::queueBatchLocked(const EventBatch& batch) {
  if (batch.through <= queued_through_) return;
  if (batch.after > queued_through_) {
    // Versions (queued_through_, after] would never reach this agent: end the stream with a
    // resync rather than stream past a gap.
    spdlog::error("feed: watch region={} peer={} got changes after {} while at {}: resync", region_,
                  peer_, batch.after, queued_through_);
    resyncLocked(cluster::v1::CURSOR_EXPIRED_REASON_RESYNC_REQUIRED,
                 strCat("the stream missed versions ", queued_through_ + 1, " to ", batch.after,
                        " of region ", region_));
    return;
  }
  bool last_sent = false;
  int64_t queued = 0;
  const bool open = !finished_ && !cancelled_;  // as queueLocked() checks for one event
  for (const auto& event : batch.events) {
    if (event.version <= queued_through_) continue;
    last_sent = wants(event.type);
    if (last_sent && open) {
      queue_.push_back(event.wire);
      ++queued;
    }
  }
  if (queued > 0) {
    // One update of the shared gauge per batch, not per event: every stream's tailer and
    // write threads touch it.
    context_->counters.queued_events.fetch_add(queued, std::memory_order_relaxed);
    markWritingLocked();
  }
  if (!last_sent) queueBookmarkLocked(batch.through);
  queued_through_ = batch.through;
  if (pendingLocked() > context_->options.max_queued) {
    resyncLocked(
        cluster::v1::CURSOR_EXPIRED_REASON_RESYNC_REQUIRED,
        strCat("the agent fell more than ", context_->options.max_queued, " events behind"));
  }
}

void WatchStream::deliver(const std::shared_ptr<const EventBatch>& batch) {
  // Called on the tailer's thread: queue only, and leave the write to the stream's loop.
  {
    std::lock_guard lock(mutex_);
    if (done_ || phase_ == Phase::kClosing) return;
    if (phase_ == Phase::kSetup) {
      buffered_.push_back(batch);
      buffered_events_ += batch->events.size();
      if (buffered_events_ > context_->options.max_queued) {
        resyncLocked(
            cluster::v1::CURSOR_EXPIRED_REASON_RESYNC_REQUIRED,
            strCat("more than ", context_->options.max_queued, " changes arrived during the sync"));
      }
    } else {
      queueBatchLocked(*batch);
    }
    if (!needsKickLocked()) return;
  }
  scheduleKick();
}

void WatchStream::expire(const std::string& reason) {
  {
    std::lock_guard lock(mutex_);
    resyncLocked(cluster::v1::CURSOR_EXPIRED_REASON_PRUNED, reason);
  }
  scheduleKick();
}

bool WatchStream::needsKickLocked() const {
  const bool work = !done_ && (start_write_ || (finish_pending_ && !writing_ && !finished_));
  return work && !kick_scheduled_;
}

void WatchStream::scheduleKick() {
  {
    std::lock_guard lock(mutex_);
    if (!needsKickLocked()) return;
    kick_scheduled_ = true;
  }
  loop_->schedule(shared_from_this());
}

void WatchStream::tick(std::chrono::steady_clock::time_point now) {
  bool resume = false;
  {
    std::lock_guard lock(mutex_);
    if (phase_ == Phase::kClosing) {
      // Ended (cut for lag, stalled, revoked...), the finish waits for the write in flight, and
      // the client takes none of it: its HTTP/2 stack still answers pings, so nothing else ends
      // the call. Reset after as long again, or it stays open, with its message, for good.
      const auto limit = context_->options.setup_stall;
      if (!finish_pending_ || !writing_ || start_write_ || finished_ || reset_ || done_ ||
          now - closing_since_ < limit || now - last_write_ < limit) {
        return;
      }
      reset_ = true;
      ++context_->counters.calls_reset;
      spdlog::warn(
          "feed: watch call reset region={} peer={}: it ended {} s ago and the agent still takes"
          " nothing of the write in flight (feed.sync_stall_ms)",
          region_, peer_,
          std::chrono::duration_cast<std::chrono::seconds>(now - closing_since_).count());
      call_->cancel();
      return;
    }
    if (phase_ == Phase::kSetup) {
      // A full sync whose write in flight has waited for the client's window since it started
      // (start_write_: one about to start, last_write_ is older): the agent is stuck, or reads
      // very slowly. It yields its slot to a sync that waits for one, and ends anyway after ten
      // times as long. Closing ends the set-up, whose parked step then gives back the snapshot;
      // the status reaches the agent if it reads within as long again, or the call is reset.
      const auto stalled = now - last_write_;
      const auto limit = context_->options.setup_stall;
      if (!has_slot_ || !writing_ || start_write_ || stalled < limit ||
          (context_->counters.full_syncs_waiting.load() == 0 && stalled < 10 * limit)) {
        return;
      }
      const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(stalled).count();
      ++context_->counters.setups_stalled;
      spdlog::warn(
          "feed: watch set-up ended region={} peer={}: the agent read nothing for {} s"
          " (feed.sync_stall_ms)",
          region_, peer_, seconds);
      finishLocked(grpc::Status(
          grpc::StatusCode::UNAVAILABLE,
          strCat("the agent read nothing of its full sync for ", seconds, " s; watch again")));
      // A parked step is not resumed by a write completing (none will): it runs now, sees the
      // stream closing and gives the snapshot back.
      resume = parked_;
      parked_ = false;
    } else {
      if (phase_ != Phase::kLive || writing_ || pendingLocked() > 0) return;
      if (now - last_write_ < context_->options.bookmark_interval) return;
      queueBookmarkLocked(queued_through_);
    }
  }
  if (resume) post(/*granted=*/false);
  scheduleKick();
}

void WatchStream::endUnauthenticated(const std::string& message) {
  {
    std::lock_guard lock(mutex_);
    finishLocked(grpc::Status(grpc::StatusCode::UNAUTHENTICATED, message));
  }
  spdlog::info("feed: watch ended region={} peer={}: {}", region_, peer_, message);
  kick();
}

void WatchStream::resyncLocked(cluster::v1::CursorExpiredReason reason,
                               const std::string& message) {
  if (finish_pending_ || done_) return;
  ++context_->counters.resyncs_requested;
  // Drop what is queued (except the write in flight); the agent starts over anyway.
  dropQueuedLocked();
  buffered_.clear();
  buffered_.shrink_to_fit();
  WatchEvent event;
  auto* expired = event.mutable_cursor_expired();
  expired->set_requested_version(request_.version());
  expired->set_reason(reason);
  expired->set_message(message);
  queueLocked(encodeEvent(event));
  closeLocked(grpc::Status::OK);
  spdlog::info("feed: watch told to resync region={} peer={} reason=\"{}\"", region_, peer_,
               message);
}

void WatchStream::finishLocked(grpc::Status status) {
  if (finish_pending_) return;
  dropQueuedLocked();
  closeLocked(std::move(status));
}

void WatchStream::closeLocked(grpc::Status status) {
  phase_ = Phase::kClosing;
  finish_pending_ = true;
  closing_since_ = std::chrono::steady_clock::now();
  final_status_ = std::move(status);
}

void WatchStream::kick() {
  const grpc::ByteBuffer* to_write = nullptr;
  grpc::WriteOptions options;
  bool finish = false;
  bool resume = false;
  grpc::Status status;
  {
    std::lock_guard lock(mutex_);
    kick_scheduled_ = false;
    if (parked_ && (done_ || phase_ != Phase::kSetup ||
                    pendingLocked() <= context_->options.setup_high_water / 2)) {
      parked_ = false;
      resume = true;
    }
    if (!done_) {
      if (start_write_) {
        start_write_ = false;
        size_t count = 1;
        if (request_.accept_batches()) {
          // Everything waiting goes in one message (up to max_batch_bytes): a stream that is
          // behind catches up in a few writes, and each write is one flush.
          const size_t pending = pendingLocked();
          size_t bytes = queue_[head_].size() + kBatchFramingPerEvent;
          while (count < pending) {
            const size_t next = queue_[head_ + count].size() + kBatchFramingPerEvent;
            if (bytes + next > context_->options.max_batch_bytes) break;
            bytes += next;
            ++count;
          }
          ++context_->counters.flushes;
          if (count > 1) ++context_->counters.batches_sent;
          in_flight_ =
              count == 1 ? messageOf(queue_[head_]) : batchMessageOf(&queue_[head_], count);
        } else if (!wrote_first_) {
          // One event per message. A round is what was queued when it started: every message
          // of it but the last waits in the transport, so that the round goes out in one flush
          // (the transport flushes by itself past 64 KiB). What arrives meanwhile waits for the
          // next round, so a stream that keeps getting changes still flushes once per round.
          // The first write carries the initial metadata, which the transport would hold back
          // with a hinted message until some later write: it goes alone.
          wrote_first_ = true;
          ++context_->counters.flushes;
          in_flight_ = messageOf(queue_[head_]);
        } else {
          if (round_left_ == 0) round_left_ = pendingLocked();
          if (--round_left_ > 0) {
            options.set_buffer_hint();
          } else {
            ++context_->counters.flushes;
          }
          in_flight_ = messageOf(queue_[head_]);
        }
        in_flight_events_ = count;
        to_write = &in_flight_;
        last_write_ = std::chrono::steady_clock::now();
      } else if (finish_pending_ && !writing_ && !finished_) {
        finished_ = true;
        finish = true;
        status = final_status_;
      }
    }
  }
  if (resume) post(/*granted=*/false);
  if (to_write != nullptr) call_->write(to_write, options);
  if (finish) call_->finish(status);
}

void WatchStream::OnWriteDone(bool ok) {
  {
    std::lock_guard lock(mutex_);
    writing_ = false;
    in_flight_.Clear();
    // The events written (none are left when the stream was cut short meanwhile).
    const size_t written = std::min(in_flight_events_, pendingLocked());
    in_flight_events_ = 0;
    for (size_t i = 0; i < written; ++i) queue_[head_++] = grpc::Slice();
    context_->counters.queued_events.fetch_sub(static_cast<int64_t>(written),
                                               std::memory_order_relaxed);
    if (pendingLocked() == 0) {
      queue_.clear();
      head_ = 0;
      if (queue_.capacity() > kKeptQueueCapacity) queue_.shrink_to_fit();
    } else if (head_ >= 64 && 2 * head_ >= queue_.size()) {
      // A stream that never drains completely drops the written prefix now and then.
      queue_.erase(queue_.begin(), queue_.begin() + static_cast<ptrdiff_t>(head_));
      head_ = 0;
    }
    if (ok) {
      context_->counters.events_sent.fetch_add(written, std::memory_order_relaxed);
    } else {
      cancelled_ = true;
      truncateLocked(0);
      if (!finish_pending_) closeLocked(grpc::Status(grpc::StatusCode::CANCELLED, "write failed"));
    }
    if (pendingLocked() > 0 && !finished_) {
      writing_ = true;
      start_write_ = true;
    }
  }
  kick();
}

void WatchStream::OnCancel() {
  {
    std::lock_guard lock(mutex_);
    cancelled_ = true;
    finishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client"));
  }
  kick();
}

void WatchStream::OnDone() {
  {
    std::lock_guard lock(mutex_);
    done_ = true;
    truncateLocked(0);
    in_flight_.Clear();
  }
  kick();  // a parked set-up step runs once more to give back its snapshot
  context_->hub->unsubscribe(region_, this);
  {
    std::lock_guard lock(context_->streams_mutex);
    context_->streams.erase(self_);
  }
  --context_->counters.streams_open;
  auto keep = std::move(self_);  // may destroy this stream when the scope ends
}

}  // namespace krane::feed
