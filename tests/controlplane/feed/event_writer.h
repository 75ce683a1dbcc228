// A Watch call handler for transport tests (watch_call.h): writes events 1..count one after the
// other and finishes OK, counting what the transport reported.
#pragma once

#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "controlplane/feed/watch_call.h"
#include "krane/cluster/v1/cluster.pb.h"

namespace krane::feed::testing {

// A WatchEvent: with `filler`, a cursor_expired whose message is that many bytes (and whose
// requested_version is `version`); else a bookmark at `version`. In two slices, as the feed's
// batches are (framing around shared bytes).
inline grpc::ByteBuffer eventOf(uint64_t version, size_t filler = 0) {
  cluster::v1::WatchEvent event;
  if (filler > 0) {
    event.mutable_cursor_expired()->set_message(std::string(filler, 'x'));
    event.mutable_cursor_expired()->set_requested_version(version);
  } else {
    event.mutable_bookmark()->set_version(version);
  }
  const std::string bytes = event.SerializeAsString();
  grpc::Slice slices[] = {grpc::Slice(bytes.substr(0, bytes.size() / 2)),
                          grpc::Slice(bytes.substr(bytes.size() / 2))};
  return grpc::ByteBuffer(slices, 2);
}

// Writes `count` events of `filler` bytes (eventOf) one after the other, then finishes OK; with
// `count` 0 it writes nothing and waits for the client to go away. Told the client went away, it
// finishes CANCELLED, unless it ignores cancels. Records the threads its events came on.
class EventWriter final : public WatchCallHandler {
 public:
  EventWriter(WatchCall* call, size_t count, size_t filler = 0, bool ignore_cancel = false)
      : call_(call), count_(count), filler_(filler), ignore_cancel_(ignore_cancel) {}

  // From the opener, on the call's loop thread.
  void begin() {
    std::lock_guard lock(mutex_);
    loop_thread_ = std::this_thread::get_id();
    if (count_ > 0) writeNextLocked();
  }
  void OnWriteDone(bool ok) override {
    std::lock_guard lock(mutex_);
    write_threads_.push_back(std::this_thread::get_id());
    if (!ok) {
      ++failed;
      return;
    }
    ++completed;
    if (sent_ < count_) {
      writeNextLocked();
    } else {
      call_->finish(grpc::Status::OK);
    }
  }
  void OnCancel() override {
    ++cancels;
    if (!ignore_cancel_) call_->finish(grpc::Status(grpc::StatusCode::CANCELLED, "gone"));
  }
  void OnDone() override { ++dones; }

  std::vector<std::thread::id> writeThreads() {
    std::lock_guard lock(mutex_);
    return write_threads_;
  }
  std::thread::id loopThread() {
    std::lock_guard lock(mutex_);
    return loop_thread_;
  }
  WatchCall* call() { return call_; }

  std::atomic<size_t> completed{0};
  std::atomic<int> failed{0};
  std::atomic<int> cancels{0};
  std::atomic<int> dones{0};

 private:
  void writeNextLocked() {
    message_ = eventOf(++sent_, filler_);
    call_->write(&message_, grpc::WriteOptions());
  }

  WatchCall* const call_;
  const size_t count_;
  const size_t filler_;
  const bool ignore_cancel_;
  std::mutex mutex_;
  grpc::ByteBuffer message_;
  size_t sent_ = 0;
  std::thread::id loop_thread_;
  std::vector<std::thread::id> write_threads_;
};

}  // namespace krane::feed::testing
