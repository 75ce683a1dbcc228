// fanout_server: the least a gRPC server on this machine's gRPC can spend on the change feed's
// fan-out, for the feed benchmark's gRPC floor (bench/README.md).
//
// It serves any method as a server stream (a generic service), so the benchmark's Watch clients
// connect to it as to krane-ctrl: each stream gets a bookmark, then every change the server's
// ticker makes (`--rate` a second), each one WatchEvent serialized once and written to every
// stream as its own message. No database, no tailer, no authentication: only gRPC's per-message
// path, in one of two shapes:
//
//   --mode callback  gRPC's callback API as krane-ctrl used it: a pool of threads (one per core)
//                    starts the writes of idle streams; the next write of a stream starts from
//                    its write completion, on gRPC's threads.
//   --mode async     gRPC's completion-queue API, as krane-ctrl uses it (watch_loops.h): one
//                    thread per core, each with a completion queue of its own and the streams
//                    accepted on it; a change reaches a thread with one alarm, and the thread
//                    starts its streams' writes and handles their completions itself.
//
// Prints "listening on PORT" once it serves; runs until killed.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/alarm.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/support/byte_buffer.h>

#include "bench/feed/measure.h"
#include "krane/cluster/v1/cluster.pb.h"

namespace krane::bench {
namespace {

grpc::Slice serialized(const cluster::v1::WatchEvent& event) {
  const std::string bytes = event.SerializeAsString();
  return grpc::Slice(bytes);
}

grpc::Slice bookmark() {
  cluster::v1::WatchEvent event;
  event.mutable_bookmark()->set_version(1);
  return serialized(event);
}

grpc::Slice changeAt(uint64_t version) {
  cluster::v1::WatchEvent event;
  auto* change = event.mutable_change();
  change->set_op(cluster::v1::CHANGE_OP_APPLY);
  change->set_version(version);
  *change->mutable_resource() = timedResource("bench-1", "item-0000", nowNs());
  change->mutable_resource()->set_version(version);
  return serialized(event);
}

// Calls `tick(version)` `rate` times a second, on a fixed schedule, from its own thread.
void runTicker(double rate, const std::function<void(grpc::Slice)>& tick) {
  const auto period = std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::duration<double>(1.0 / rate));
  const auto start = std::chrono::steady_clock::now();
  for (uint64_t k = 1;; ++k) {
    std::this_thread::sleep_until(start + k * period);
    tick(changeAt(1 + k));
  }
}

// ---------------------------------------------------------------------------------------------
// The callback API.

class CallbackStream final : public grpc::ServerGenericBidiReactor {
 public:
  CallbackStream() { push(bookmark()); }

  // Queues one message; starts writing when the stream is idle (any thread).
  void push(grpc::Slice message) {
    std::lock_guard lock(mutex_);
    if (done_) return;
    pending_.push_back(std::move(message));
    if (!writing_) startLocked();
  }

  bool done() {
    std::lock_guard lock(mutex_);
    return done_;
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard lock(mutex_);
    writing_ = false;
    if (!ok) {
      pending_.clear();
      finishLocked();
      return;
    }
    if (!pending_.empty()) startLocked();
  }
  void OnCancel() override {
    std::lock_guard lock(mutex_);
    pending_.clear();
    if (!writing_) finishLocked();
  }
  void OnDone() override {
    std::lock_guard lock(mutex_);
    done_ = true;
  }

 private:
  void startLocked() {
    in_flight_ = grpc::ByteBuffer(&pending_.front(), 1);
    pending_.pop_front();
    writing_ = true;
    StartWrite(&in_flight_);
  }
  void finishLocked() {
    if (finished_) return;
    finished_ = true;
    Finish(grpc::Status::CANCELLED);
  }

  std::mutex mutex_;
  std::deque<grpc::Slice> pending_;
  grpc::ByteBuffer in_flight_;
  bool writing_ = false;
  bool finished_ = false;
  bool done_ = false;
};

class CallbackService final : public grpc::CallbackGenericService {
 public:
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext*) override {
    auto* stream = new CallbackStream();
    std::lock_guard lock(mutex_);
    streams_.push_back(stream);
    return stream;
  }
  std::vector<CallbackStream*> streams() {
    std::lock_guard lock(mutex_);
    return streams_;
  }

 private:
  std::mutex mutex_;
  std::vector<CallbackStream*> streams_;  // never freed: the process is killed at the end
};

int serveCallback(const std::string& address, double rate, size_t threads) {
  CallbackService service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &port);
  builder.RegisterCallbackGenericService(&service);
  auto server = builder.BuildAndStart();
  if (!server) return 1;
  std::printf("listening on %d\n", port);
  std::fflush(stdout);

  // The write pool: each change goes to every thread, which pushes it to its share of streams.
  std::mutex mutex;
  std::condition_variable ready;
  std::vector<std::deque<grpc::Slice>> inbox(threads);
  std::vector<std::thread> pool;
  for (size_t t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (;;) {
        grpc::Slice message;
        {
          std::unique_lock lock(mutex);
          ready.wait(lock, [&] { return !inbox[t].empty(); });
          message = std::move(inbox[t].front());
          inbox[t].pop_front();
        }
        const auto streams = service.streams();
        for (size_t i = t; i < streams.size(); i += threads) {
          if (!streams[i]->done()) streams[i]->push(message);
        }
      }
    });
  }
  runTicker(rate, [&](grpc::Slice message) {
    {
      std::lock_guard lock(mutex);
      for (auto& queue : inbox) queue.push_back(message);
    }
    ready.notify_all();
  });
  return 0;
}

// ---------------------------------------------------------------------------------------------
// The completion-queue API.

class AsyncLoop;

struct AsyncCall {
  enum class Tag { kAccepted, kWritten, kDone };
  struct Event {
    AsyncCall* call;
    Tag tag;
  };
  grpc::GenericServerContext context;
  grpc::GenericServerAsyncReaderWriter stream{&context};
  Event accepted{this, Tag::kAccepted};
  Event written{this, Tag::kWritten};
  Event done_event{this, Tag::kDone};
  std::deque<grpc::Slice> pending;
  grpc::ByteBuffer in_flight;
  bool writing = false;
  bool done = false;

  void write(grpc::Slice message) {
    if (done) return;
    if (writing) {
      pending.push_back(std::move(message));
      return;
    }
    in_flight = grpc::ByteBuffer(&message, 1);
    writing = true;
    stream.Write(in_flight, &written);
  }
};

class AsyncLoop {
 public:
  AsyncLoop(grpc::AsyncGenericService* service, std::unique_ptr<grpc::ServerCompletionQueue> cq)
      : service_(service), cq_(std::move(cq)) {}

  // From the ticker: the thread writes `message` to all its streams.
  void post(grpc::Slice message) {
    std::lock_guard lock(mutex_);
    inbox_.push_back(std::move(message));
    if (!wake_set_) {
      wake_set_ = true;
      alarm_.Set(cq_.get(), gpr_now(GPR_CLOCK_MONOTONIC), &wake_);
    }
  }

  void run() {
    accept();
    void* tag = nullptr;
    bool ok = false;
    while (cq_->Next(&tag, &ok)) {
      if (tag == &wake_) {
        std::deque<grpc::Slice> messages;
        {
          std::lock_guard lock(mutex_);
          messages.swap(inbox_);
          wake_set_ = false;
        }
        for (auto& message : messages) {
          for (AsyncCall* call : calls_) call->write(message);
        }
        continue;
      }
      auto* event = static_cast<AsyncCall::Event*>(tag);
      AsyncCall* call = event->call;
      switch (event->tag) {
        case AsyncCall::Tag::kAccepted:
          if (!ok) {
            delete call;
            break;
          }
          calls_.push_back(call);
          call->write(bookmark());
          accept();
          break;
        case AsyncCall::Tag::kWritten:
          call->writing = false;
          if (!ok) {
            call->done = true;
          } else if (!call->pending.empty()) {
            grpc::Slice next = std::move(call->pending.front());
            call->pending.pop_front();
            call->write(std::move(next));
          }
          break;
        case AsyncCall::Tag::kDone:
          call->done = true;  // kept: the process is killed at the end
          break;
      }
    }
  }

 private:
  void accept() {
    auto* call = new AsyncCall();
    call->context.AsyncNotifyWhenDone(&call->done_event);
    service_->RequestCall(&call->context, &call->stream, cq_.get(), cq_.get(), &call->accepted);
  }

  grpc::AsyncGenericService* service_;
  std::unique_ptr<grpc::ServerCompletionQueue> cq_;
  std::vector<AsyncCall*> calls_;
  std::mutex mutex_;
  std::deque<grpc::Slice> inbox_;
  bool wake_set_ = false;
  grpc::Alarm alarm_;
  int wake_ = 0;
};

int serveAsync(const std::string& address, double rate, size_t threads) {
  grpc::AsyncGenericService service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &port);
  builder.RegisterAsyncGenericService(&service);
  std::vector<std::unique_ptr<AsyncLoop>> loops;
  std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> queues;
  for (size_t t = 0; t < threads; ++t) queues.push_back(builder.AddCompletionQueue());
  auto server = builder.BuildAndStart();
  if (!server) return 1;
  for (auto& cq : queues) loops.push_back(std::make_unique<AsyncLoop>(&service, std::move(cq)));
  std::vector<std::thread> workers;
  for (auto& loop : loops) workers.emplace_back([&loop] { loop->run(); });
  std::printf("listening on %d\n", port);
  std::fflush(stdout);
  runTicker(rate, [&](const grpc::Slice& message) {
    for (auto& loop : loops) loop->post(message);
  });
  return 0;
}

int run(int argc, char** argv) {
  std::string mode = "async";
  std::string address = "127.0.0.1:0";
  double rate = 50;
  size_t threads = std::max(1u, std::thread::hardware_concurrency());
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--mode") {
      mode = argv[i + 1];
    } else if (flag == "--listen") {
      address = argv[i + 1];
    } else if (flag == "--rate") {
      rate = std::stod(argv[i + 1]);
    } else if (flag == "--threads") {
      threads = std::stoul(argv[i + 1]);
    } else {
      std::fprintf(stderr, "fanout_server: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (mode == "callback") return serveCallback(address, rate, threads);
  if (mode == "async") return serveAsync(address, rate, threads);
  std::fprintf(stderr, "fanout_server: --mode is callback or async, not %s\n", mode.c_str());
  return 2;
}

}  // namespace
}  // namespace krane::bench

int main(int argc, char** argv) { return krane::bench::run(argc, argv); }
