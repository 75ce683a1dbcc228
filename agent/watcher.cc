#include "agent/watcher.h"

#include <algorithm>
#include <limits>

#include "common/clock.h"
#include "common/strings.h"
#include "spdlog/spdlog.h"

namespace krane::agent {

Watcher::Watcher(std::shared_ptr<grpc::Channel> channel, WatcherOptions options, ChangeSink& sink,
                 std::function<uint64_t()> resume_from)
    : channel_(channel),
      stub_(cluster::v1::ClusterService::NewStub(std::move(channel))),
      options_(std::move(options)),
      sink_(sink),
      resume_from_(std::move(resume_from)),
      last_sync_unix_ms_(options_.last_full_sync_unix_ms > 0 ? options_.last_full_sync_unix_ms
                                                             : unixMillis()),
      epoch_(options_.epoch) {}

Watcher::~Watcher() { stop(); }

void Watcher::cancelStream(grpc::ClientContext& context) {
  cancelled_here_ = true;
  context.TryCancel();
}

void Watcher::start() {
  thread_ = std::thread([this] { run(); });
}

void Watcher::stop() {
  stopping_ = true;
  {
    std::lock_guard lock(mutex_);
    if (context_ != nullptr) cancelStream(*context_);
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Watcher::requestResync() {
  resync_ = true;
  std::lock_guard lock(mutex_);
  if (context_ != nullptr) cancelStream(*context_);
}

void Watcher::preferChannel(std::shared_ptr<grpc::Channel> channel, std::string where) {
  std::lock_guard lock(mutex_);
  preferred_ = channel ? std::shared_ptr<cluster::v1::ClusterService::Stub>(
                             cluster::v1::ClusterService::NewStub(std::move(channel)))
                       : nullptr;
  preferred_where_ = preferred_ ? std::move(where) : std::string();
  preferred_failed_ = 0;
  fallbacks_in_a_row_ = 0;
  fallback_until_ = {};
  // The open stream ends in its read loop, at a message after which all it delivered is applied
  // (a bookmark comes at least every bookmark_interval); a stream not open yet picks it up.
  switch_ = true;
  wake_.notify_all();
}

bool Watcher::caughtUp(uint64_t received, std::chrono::milliseconds patience) {
  // The sink may apply on threads of its own: give it a moment.
  const auto deadline = std::chrono::steady_clock::now() + patience;
  while (resume_from_() < received) {
    if (stopping_ || std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

WatcherStats Watcher::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

bool Watcher::resyncDue() const {
  if (options_.resync_interval.count() <= 0) return false;
  std::lock_guard lock(mutex_);
  return unixMillis() - last_sync_unix_ms_ >=
         std::chrono::duration_cast<std::chrono::milliseconds>(options_.resync_interval).count();
}

void Watcher::run() {
  Backoff backoff(options_.reconnect);
  while (!stopping_) {
    const bool due = resyncDue();
    const uint64_t version = (resync_.exchange(false) || due) ? 0 : resume_from_();
    const auto started = std::chrono::steady_clock::now();
    // The preferred channel, unless its streams kept failing lately.
    std::shared_ptr<cluster::v1::ClusterService::Stub> preferred;
    std::string where;
    // On the first channel during a fallback: when to leave it for the preferred one again.
    auto fallback_over = std::chrono::steady_clock::time_point::max();
    {
      std::lock_guard lock(mutex_);
      switch_ = false;
      if (preferred_ && started >= fallback_until_) {
        preferred = preferred_;
        where = preferred_where_;
      } else if (preferred_) {
        fallback_over = fallback_until_;
      }
      stats_.watching = where;
    }
    bool events = false;
    const bool expired =
        streamOnce(preferred ? *preferred : *stub_, version, fallback_over, &events);
    if (stopping_) break;
    if (preferred) {
      std::lock_guard lock(mutex_);
      // A failure counts only while the first channel is connected (heartbeats go there): with
      // krane-ctrl down, both fail, and the listener stays the channel to come back to.
      if (events) {
        preferred_failed_ = 0;
        fallbacks_in_a_row_ = 0;
      } else if (switch_ || preferred != preferred_) {
        // Ended for another channel: not a failure of this one.
      } else if (channel_->GetState(false) != GRPC_CHANNEL_READY) {
        preferred_failed_ = 0;  // krane-ctrl itself is unreachable: failures prove nothing
      } else if (++preferred_failed_ >= options_.preferred_failures) {
        // Five minutes the first time, twice as long each time after (up to eight times), so
        // that a listener that never answers costs little.
        const auto fallback = options_.fallback_for * (1 << std::min(fallbacks_in_a_row_, 3));
        ++fallbacks_in_a_row_;
        preferred_failed_ = 0;
        fallback_until_ = std::chrono::steady_clock::now() + fallback;
        ++stats_.fallbacks;
        spdlog::warn(
            "agent: {} Watch streams at {} failed before their first event; watching through "
            "control_plane.address for {} s",
            options_.preferred_failures, where,
            std::chrono::duration_cast<std::chrono::seconds>(fallback).count());
        // The next stream (after the usual wait) goes to the first channel.
      }
    } else {
      std::lock_guard lock(mutex_);
      if (!events && !switch_ && preferred_ && started < fallback_until_) {
        // The first channel fails as well (krane-ctrl is down, say): the preferred one was not
        // the trouble; the next stream goes there again.
        fallback_until_ = {};
      }
    }
    const bool switching = switch_.exchange(false);
    if (expired) resync_ = true;  // the server told us to start over
    if (switching || expired) {
      backoff.reset();
      continue;  // at once
    }
    // A stream that lived a while was healthy: start the backoff over.
    if (std::chrono::steady_clock::now() - started > std::chrono::seconds(30)) backoff.reset();
    std::unique_lock lock(mutex_);
    wake_.wait_for(lock, backoff.next(), [&] { return stopping_.load() || switch_.load(); });
  }
}

bool Watcher::streamOnce(cluster::v1::ClusterService::Stub& stub, uint64_t version,
                         std::chrono::steady_clock::time_point leave_at, bool* events) {
  grpc::ClientContext context;
  context.AddMetadata("authorization", "Bearer " + options_.token);
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return false;
    context_ = &context;
    cancelled_here_ = false;
    ++stats_.connects;
  }
  cluster::v1::WatchRequest request;
  request.set_region(options_.region);
  request.set_version(version);
  request.set_agent_id(options_.agent_id);
  request.set_accept_batches(true);
  {
    std::lock_guard lock(mutex_);
    // A full sync starts a cursor of whatever epoch the feed is in.
    request.set_epoch(version == 0 ? 0 : epoch_);
  }
  for (const auto& t : options_.resource_types) request.add_resource_types(t);
  const std::string where = stats().watching;
  spdlog::info("agent: watching region={} from version={}{}{}", options_.region, version,
               version == 0 ? " (full sync)" : "", where.empty() ? "" : strCat(" at ", where));

  auto reader = stub.Watch(&context, request);
  cluster::v1::WatchEvent message;
  bool in_sync = false;
  bool expired = false;
  // The version the stream delivered up to; nothing to resume from before a full sync's end.
  uint64_t received = version == 0 ? std::numeric_limits<uint64_t>::max() : version;
  // Waiting at a message for the sink to catch up, before another channel: not again for a
  // while once a wait was in vain (a change being retried holds the cursor, maybe for long, and
  // reading must not slow down to a message a second meanwhile).
  auto patient_from = std::chrono::steady_clock::time_point{};
  // Takes one event; false once the stream is being cancelled (nothing after it is taken).
  auto take = [&](const cluster::v1::WatchEvent& event) {
    switch (event.event_case()) {
      case cluster::v1::WatchEvent::kSyncBegin:
        in_sync = true;
        sink_.syncBegin(event.sync_begin().snapshot_version());
        return true;
      case cluster::v1::WatchEvent::kChange: {
        {
          std::lock_guard lock(mutex_);
          ++stats_.changes;
        }
        sink_.change(event.change(), in_sync);
        if (!in_sync) received = event.change().version();
        return true;
      }
      case cluster::v1::WatchEvent::kSyncEnd: {
        in_sync = false;
        if (!sink_.syncEnd(event.sync_end().version(), event.sync_end().resource_count())) {
          spdlog::error("agent: full sync of region={} at version={} was not taken; starting over",
                        options_.region, event.sync_end().version());
          resync_ = true;
          cancelStream(context);
          return false;
        }
        if (options_.on_epoch) options_.on_epoch(event.sync_end().epoch());
        received = event.sync_end().version();
        std::lock_guard lock(mutex_);
        ++stats_.full_syncs;
        last_sync_unix_ms_ = unixMillis();
        epoch_ = event.sync_end().epoch();
        return true;
      }
      case cluster::v1::WatchEvent::kBookmark:
        sink_.bookmark(event.bookmark().version());
        received = event.bookmark().version();
        return true;
      case cluster::v1::WatchEvent::kCursorExpired: {
        spdlog::warn("agent: cursor expired region={} reason=\"{}\": full sync now",
                     options_.region, event.cursor_expired().message());
        std::lock_guard lock(mutex_);
        ++stats_.cursor_expired;
        expired = true;
        return true;
      }
      default:
        // An event this agent does not know (or a batch inside a batch) is an error, never
        // silently skipped.
        spdlog::error("agent: unknown watch event case {}; reconnecting",
                      static_cast<int>(event.event_case()));
        cancelStream(context);
        return false;
    }
  };
  while (reader->Read(&message)) {
    *events = true;
    bool going = true;
    if (message.has_batch()) {
      for (const auto& event : message.batch().events()) {
        if (!(going = take(event))) break;
      }
    } else {
      going = take(message);
    }
    if (going && !in_sync && resyncDue()) {
      resync_ = true;  // periodic full sync: a safety net for drift in the cluster itself
      cancelStream(context);
    }
    // Another channel is wanted (preferChannel, or a fallback is over): once what this stream
    // delivered is applied, so that the next resumes where it stopped (never within a full
    // sync, nor before its snapshot is applied).
    const auto now = std::chrono::steady_clock::now();
    if (going && !in_sync && (switch_ || now >= leave_at)) {
      const bool patient = now >= patient_from;
      if (caughtUp(received, patient ? std::chrono::seconds(1) : std::chrono::seconds(0))) {
        cancelStream(context);
      } else if (patient) {
        patient_from = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      }
    }
  }
  const grpc::Status status = reader->Finish();
  {
    std::lock_guard lock(mutex_);
    context_ = nullptr;
    if (!status.ok() && !stopping_) stats_.last_error = status.error_message();
  }
  if (in_sync && !stopping_) {
    // A full sync cut off before its end: the sink holds the cursor until a sync ends, and
    // resuming from the cursor would never end one. The full sync starts over.
    spdlog::warn("agent: full sync of region={} ended before its end; starting it over",
                 options_.region);
    resync_ = true;
  }
  if (!status.ok() && !stopping_ && status.error_code() != grpc::StatusCode::CANCELLED) {
    spdlog::warn("agent: watch stream ended region={} code={} error=\"{}\"", options_.region,
                 static_cast<int>(status.error_code()), status.error_message());
  } else if (status.error_code() == grpc::StatusCode::CANCELLED && !stopping_ && !cancelled_here_) {
    // Not this agent's doing: the control plane reset the stream (one that had ended while this
    // agent took nothing of it for feed.sync_stall_ms, its apply loop stuck), or went away.
    spdlog::warn(
        "agent: watch stream reset by the control plane region={}: it had ended, or krane-ctrl"
        " stopped; watching again",
        options_.region);
  }
  return expired;
}

}  // namespace krane::agent
