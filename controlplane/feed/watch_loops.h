// The threads that serve the agents' Watch calls, on gRPC's completion-queue API.
//
// Each loop owns a completion queue. It accepts Watch calls on it, starts the writes of the
// streams it accepted when something made them ready (schedule(): a list and one alarm per loop,
// not a wake-up per stream), and takes their completions from its own queue. The thread that
// starts a stream's live writes therefore also sees them end, and wakes nobody while it is busy
// (set-up pages and a few finishes start on other threads; their completions come here too): on
// gRPC's callback API every completion went to gRPC's shared callback threads, which cost a
// quarter more CPU per delivered change and doubled the tail at 1000 streams (bench/README.md,
// "the floors").
//
// A call is gRPC's objects for one Watch and the handler that serves it (a WatchStream); the
// handler starts writes and the finish from any thread, and its events come on the loop's thread
// in the order gRPC reports them. Thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <thread>
#include <vector>

#include <grpcpp/alarm.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/support/async_stream.h>

#include "controlplane/feed/watch_call.h"

namespace krane::feed {

class WatchLoop;

// A Watch call on gRPC: its server context, the request's bytes, and the writer.
class GrpcWatchCall final : public WatchCall {
 public:
  grpc::ServerContext& context() { return context_; }
  // The request's bytes; the opener parses and clears them (they pin the connection's buffer).
  grpc::ByteBuffer& request() { return request_; }

  WatchScheduler& loop() override;
  void serve(WatchCallHandler* handler) override { handler_ = handler; }
  void write(const grpc::ByteBuffer* message, grpc::WriteOptions options) override;
  void finish(const grpc::Status& status) override;
  void cancel() override { context_.TryCancel(); }

 private:
  friend class WatchLoop;
  enum class Kind { kAccepted, kWritten, kFinished, kDone };
  struct Tag {
    GrpcWatchCall* call;
    Kind kind;
  };

  explicit GrpcWatchCall(WatchLoop* loop) : loop_(loop) {}
  // One event from the queue; deletes the call after its last.
  void handle(Kind kind, bool ok);
  void releaseIfOver();

  WatchLoop* const loop_;
  grpc::ServerContext context_;
  grpc::ByteBuffer request_;
  grpc::ServerAsyncWriter<grpc::ByteBuffer> writer_{&context_};
  WatchCallHandler* handler_ = nullptr;
  Tag accepted_{this, Kind::kAccepted};
  Tag written_{this, Kind::kWritten};
  Tag finished_{this, Kind::kFinished};
  Tag done_{this, Kind::kDone};
  bool finish_completed_ = false;
  bool done_seen_ = false;
};

// Asks gRPC for the next Watch call on `cq` (the service's RequestWatch).
using RequestWatchFn = std::function<void(grpc::ServerContext*, grpc::ByteBuffer*,
                                          grpc::ServerAsyncWriter<grpc::ByteBuffer>*,
                                          grpc::ServerCompletionQueue*, void* tag)>;
// Takes an accepted call: serve() it, or refuse() it.
using OpenWatchFn = std::function<void(GrpcWatchCall*)>;

class WatchLoop final : public WatchScheduler {
 public:
  void schedule(std::shared_ptr<Writable> target) override;

 private:
  friend class WatchLoops;
  friend class GrpcWatchCall;
  static constexpr size_t kAcceptsInFlight = 4;

  WatchLoop(std::unique_ptr<grpc::ServerCompletionQueue> cq, const RequestWatchFn& request,
            const OpenWatchFn& open, std::function<void(int)> count);
  void run();
  void accept();
  // Starts a gRPC operation unless the queue is closing (then nothing may start on it).
  // Operations of many threads proceed together; only close() waits for them.
  template <typename F>
  void startOp(F op) {
    std::shared_lock lock(ops_mutex_);
    if (!ops_closed_) op();
  }
  void close();

  std::unique_ptr<grpc::ServerCompletionQueue> cq_;
  const RequestWatchFn& request_;
  const OpenWatchFn& open_;
  std::function<void(int)> count_;  // calls alive: +1 accepted, -1 released
  std::shared_mutex ops_mutex_;
  bool ops_closed_ = false;
  // What schedule() queued, apart from the operations' lock: the tailer schedules a thousand
  // streams while the loop's thread writes to them.
  std::mutex mutex_;
  bool closed_ = false;
  std::vector<std::shared_ptr<Writable>> ready_;
  bool alarm_set_ = false;
  grpc::Alarm alarm_;
  int wake_tag_ = 0;
};

class WatchLoops {
 public:
  // Adds one completion queue per thread to `builder`; call before BuildAndStart.
  WatchLoops(grpc::ServerBuilder& builder, size_t threads);
  ~WatchLoops();  // stop()
  WatchLoops(const WatchLoops&) = delete;
  WatchLoops& operator=(const WatchLoops&) = delete;

  // After BuildAndStart: the threads start accepting calls.
  void start(RequestWatchFn request, OpenWatchFn open);
  // After the server's Shutdown (which cancels the calls): waits up to `grace` for the calls to
  // end, then closes the queues and joins the threads. Calls still alive then are abandoned.
  void stop(std::chrono::milliseconds grace = std::chrono::seconds(5));
  // Calls accepted and not yet over.
  size_t calls() const;

 private:
  RequestWatchFn request_;
  OpenWatchFn open_;
  std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> queues_;  // until start()
  std::vector<std::unique_ptr<WatchLoop>> loops_;
  std::vector<std::thread> threads_;
  mutable std::mutex mutex_;
  std::condition_variable calls_changed_;
  size_t calls_ = 0;
  bool stopped_ = false;
};

}  // namespace krane::feed
