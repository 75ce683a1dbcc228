#include "controlplane/api/resource_watch.h"

#include "common/strings.h"

namespace krane::api {
namespace {

// Ends at once with the status it was made with.
class Refused final : public grpc::ServerWriteReactor<v1::ResourceChange> {
 public:
  explicit Refused(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

grpc::ServerWriteReactor<v1::ResourceChange>* ResourceWatchStream::refuse(
    const grpc::Status& status) {
  return new Refused(status);
}

ResourceWatchStream::ResourceWatchStream(std::shared_ptr<feed::Hub> hub,
                                         v1::WatchResourcesRequest request, size_t max_queued)
    : hub_(std::move(hub)), request_(std::move(request)), max_queued_(max_queued) {}

grpc::ServerWriteReactor<v1::ResourceChange>* ResourceWatchStream::start(
    std::shared_ptr<feed::Hub> hub, const v1::WatchResourcesRequest& request, size_t max_queued) {
  auto stream = std::make_shared<ResourceWatchStream>(hub, request, max_queued);
  stream->self_ = stream;
  // Subscribed before anything is written: every batch after these positions arrives.
  auto positions = hub->subscribeAll(stream);
  {
    std::lock_guard lock(stream->mutex_);
    for (auto& [region, version] : positions) {
      if (stream->positions_.count(region) == 0) stream->positions_[region] = version;
    }
    v1::ResourceChange hello;
    hello.set_op("watching");
    stream->queue_.push_front(std::move(hello));
    if (!stream->writing_) {
      stream->writing_ = true;
      stream->start_write_ = true;
    }
  }
  stream->kick();
  return stream.get();
}

void ResourceWatchStream::deliver(const std::shared_ptr<const feed::EventBatch>& batch) {
  {
    std::lock_guard lock(mutex_);
    if (done_ || finish_pending_) return;
    auto known = positions_.find(batch->region);
    uint64_t at = known == positions_.end() ? batch->after : known->second;
    if (batch->through <= at) return;  // already streamed
    if (batch->after > at) {
      finishLocked(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                strCat("the watch missed versions ", at + 1, " to ", batch->after,
                                       " of region ", batch->region, ": watch again")));
    } else {
      const bool wanted_region = request_.region().empty() || request_.region() == batch->region;
      for (const auto& event : batch->events) {
        if (event.version <= at || !wanted_region) continue;
        if (!request_.type().empty() && request_.type() != event.type) continue;
        v1::ResourceChange change;
        change.set_region(batch->region);
        change.set_type(event.type);
        change.set_id(event.event->change().resource().id());
        change.set_op(event.op);
        change.set_version(event.version);
        change.set_committed_ms(event.committed_ms);
        queueLocked(std::move(change));
      }
      positions_[batch->region] = batch->through;
      if (queue_.size() > max_queued_) {
        finishLocked(grpc::Status(
            grpc::StatusCode::RESOURCE_EXHAUSTED,
            strCat("the watcher fell more than ", max_queued_, " changes behind: watch again")));
      }
    }
  }
  kick();
}

void ResourceWatchStream::expire(const std::string& reason) {
  {
    std::lock_guard lock(mutex_);
    finishLocked(grpc::Status(grpc::StatusCode::UNAVAILABLE, strCat(reason, ": watch again")));
  }
  kick();
}

void ResourceWatchStream::queueLocked(v1::ResourceChange change) {
  queue_.push_back(std::move(change));
  if (!writing_) {
    writing_ = true;
    start_write_ = true;
  }
}

void ResourceWatchStream::finishLocked(grpc::Status status) {
  if (finish_pending_) return;
  // What is queued is dropped (except the write in flight): the watcher starts over anyway.
  if (writing_) {
    queue_.erase(queue_.begin() + 1, queue_.end());
  } else {
    queue_.clear();
  }
  finish_pending_ = true;
  final_status_ = std::move(status);
}

void ResourceWatchStream::kick() {
  const v1::ResourceChange* to_write = nullptr;
  bool finish = false;
  grpc::Status status;
  {
    std::lock_guard lock(mutex_);
    if (done_) return;
    if (start_write_) {
      start_write_ = false;
      to_write = &queue_.front();
    } else if (finish_pending_ && !writing_ && !finished_) {
      finished_ = true;
      finish = true;
      status = final_status_;
    }
  }
  if (to_write != nullptr) StartWrite(to_write);
  if (finish) Finish(status);
}

void ResourceWatchStream::OnWriteDone(bool ok) {
  {
    std::lock_guard lock(mutex_);
    writing_ = false;
    if (!queue_.empty()) queue_.pop_front();
    if (!ok && !finish_pending_) {
      queue_.clear();
      finish_pending_ = true;
      final_status_ = grpc::Status(grpc::StatusCode::CANCELLED, "write failed");
    }
    if (!queue_.empty() && !finished_) {
      writing_ = true;
      start_write_ = true;
    }
  }
  kick();
}

void ResourceWatchStream::OnCancel() {
  {
    std::lock_guard lock(mutex_);
    finishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client"));
  }
  kick();
}

void ResourceWatchStream::OnDone() {
  hub_->unsubscribeAll(this);
  std::shared_ptr<ResourceWatchStream> keep;
  {
    std::lock_guard lock(mutex_);
    done_ = true;
    keep = std::move(self_);
  }
}

}  // namespace krane::api
