// The transports of Watch calls (watch_call.h), gRPC's completion queues (WatchLoops) and the
// feed's HTTP/2 listener (H2WatchServer), each read by gRPC's client: every write of a call
// completes once, writes started on other threads race a client going away without losing a
// call, schedule() runs work on the loop's thread in order; a client that goes away is reported
// before the call ends, a refused call carries its status, and stopping after the server's
// shutdown neither hangs nor loses a call that finishes.
#include "controlplane/feed/watch_loops.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <grpcpp/grpcpp.h>

#include "controlplane/feed/h2_watch_server.h"
#include "krane/cluster/v1/cluster.grpc.pb.h"
#include "tests/controlplane/feed/event_writer.h"
#include "tests/support/wait.h"

namespace krane::feed {
namespace {

using namespace std::chrono_literals;
using cluster::v1::ClusterService;
using cluster::v1::WatchEvent;
using krane::testing::eventually;
// Bookmarks 1..count (EventWriter without filler).
using Bookmarks = krane::feed::testing::EventWriter;

class RawWatch final : public ClusterService::WithRawMethod_Watch<ClusterService::Service> {
 public:
  void request(grpc::ServerContext* context, grpc::ByteBuffer* request,
               grpc::ServerAsyncWriter<grpc::ByteBuffer>* writer, grpc::ServerCompletionQueue* cq,
               void* tag) {
    RequestWatch(context, request, writer, cq, cq, tag);
  }
};

enum class Transport { kGrpc, kH2 };

// A server whose Watch calls are served by two loops of `transport`; `open` decides what a call
// becomes.
class Harness {
 public:
  Harness(Transport transport, std::function<void(WatchCall*)> open) : transport_(transport) {
    if (transport == Transport::kH2) {
      H2WatchOptions options;
      options.threads = 2;
      auto server = H2WatchServer::start(options, [open](WatchCall* call, std::string_view,
                                                         std::string, std::string) { open(call); });
      REQUIRE(server.ok());
      h2_ = std::move(*server);
      port_ = h2_->port();
    } else {
      grpc::ServerBuilder builder;
      builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
      builder.RegisterService(&service_);
      loops_ = std::make_unique<WatchLoops>(builder, 2);
      server_ = builder.BuildAndStart();
      REQUIRE(server_ != nullptr);
      loops_->start(
          [this](grpc::ServerContext* context, grpc::ByteBuffer* request,
                 grpc::ServerAsyncWriter<grpc::ByteBuffer>* writer, grpc::ServerCompletionQueue* cq,
                 void* tag) { service_.request(context, request, writer, cq, tag); },
          [open](GrpcWatchCall* call) { open(call); });
    }
    stub_ = ClusterService::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port_),
                                                        grpc::InsecureChannelCredentials()));
  }
  ~Harness() { shutdown(); }

  // The server's shutdown (cancelling what is open), then the loops'.
  void shutdown(std::chrono::milliseconds grace = 5s) {
    if (h2_) {
      h2_->stop(grace);
      return;
    }
    if (!server_) return;
    server_->Shutdown(std::chrono::system_clock::now() + 100ms);
    loops_->stop(grace);
    server_.reset();
  }

  // Calls accepted and not over.
  size_t calls() const { return h2_ ? h2_->calls() : loops_->calls(); }
  ClusterService::Stub& stub() { return *stub_; }
  int port() const { return port_; }
  Transport transport() const { return transport_; }

 private:
  const Transport transport_;
  RawWatch service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<WatchLoops> loops_;
  std::unique_ptr<H2WatchServer> h2_;
  std::unique_ptr<ClusterService::Stub> stub_;
};

Transport anyTransport() { return GENERATE(Transport::kGrpc, Transport::kH2); }

TEST_CASE("every write of a Watch call completes once and in order, then the call ends") {
  std::mutex mutex;
  std::vector<std::shared_ptr<Bookmarks>> handlers;
  Harness h(anyTransport(), [&](WatchCall* call) {
    auto handler = std::make_shared<Bookmarks>(call, 5);
    call->serve(handler.get());
    {
      std::lock_guard lock(mutex);
      handlers.push_back(handler);
    }
    handler->begin();
  });
  for (int i = 0; i < 4; ++i) {
    grpc::ClientContext context;
    auto reader = h.stub().Watch(&context, cluster::v1::WatchRequest());
    WatchEvent event;
    std::vector<uint64_t> versions;
    while (reader->Read(&event)) versions.push_back(event.bookmark().version());
    CHECK(versions == std::vector<uint64_t>{1, 2, 3, 4, 5});
    CHECK(reader->Finish().ok());
  }
  REQUIRE(eventually([&] { return h.calls() == 0; }, 5s));
  std::lock_guard lock(mutex);
  REQUIRE(handlers.size() == 4);
  for (auto& handler : handlers) {
    CHECK(handler->dones == 1);
    CHECK(handler->cancels == 0);
    CHECK(handler->writeThreads().size() == 5);
  }
}

// Writes from a thread of its own, one write at a time as fast as they complete, until the
// client goes away; then finishes from that thread.
class Flood final : public WatchCallHandler {
 public:
  explicit Flood(WatchCall* call) : call_(call), thread_([this] { run(); }) {}
  ~Flood() override {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    changed_.notify_all();
    thread_.join();
  }
  void OnWriteDone(bool ok) override {
    std::lock_guard lock(mutex_);
    writing_ = false;
    failed_ = failed_ || !ok;
    changed_.notify_all();
  }
  void OnCancel() override {
    ++cancels;
    std::lock_guard lock(mutex_);
    cancelled_ = true;
    changed_.notify_all();
  }
  void OnDone() override { ++dones; }

  std::atomic<int> cancels{0};
  std::atomic<int> dones{0};

 private:
  void run() {
    std::unique_lock lock(mutex_);
    for (uint64_t version = 1;; ++version) {
      changed_.wait(lock, [&] { return !writing_ || stop_; });
      if (stop_) return;
      if (cancelled_ || failed_) {
        call_->finish(grpc::Status(grpc::StatusCode::CANCELLED, "gone"));
        return;  // the call may be gone from here on
      }
      writing_ = true;
      message_ = krane::feed::testing::eventOf(version);
      call_->write(&message_, grpc::WriteOptions());
    }
  }

  WatchCall* const call_;
  std::mutex mutex_;
  std::condition_variable changed_;
  grpc::ByteBuffer message_;
  bool writing_ = false;
  bool failed_ = false;
  bool cancelled_ = false;
  bool stop_ = false;
  std::thread thread_;  // last: starts once the rest is ready
};

TEST_CASE("writes started on another thread race a client going away: every call ends once") {
  std::mutex mutex;
  std::vector<std::unique_ptr<Flood>> handlers;
  Harness h(anyTransport(), [&](WatchCall* call) {
    auto handler = std::make_unique<Flood>(call);
    call->serve(handler.get());
    std::lock_guard lock(mutex);
    handlers.push_back(std::move(handler));
  });
  for (int i = 0; i < 20; ++i) {
    grpc::ClientContext context;
    auto reader = h.stub().Watch(&context, cluster::v1::WatchRequest());
    WatchEvent event;
    for (int read = 0; read < 1 + i % 5 && reader->Read(&event); ++read) {
    }
    context.TryCancel();
    CHECK(reader->Finish().error_code() == grpc::StatusCode::CANCELLED);
  }
  REQUIRE(eventually([&] { return h.calls() == 0; }, 10s));
  std::lock_guard lock(mutex);
  REQUIRE(handlers.size() == 20);
  for (auto& handler : handlers) {
    CHECK(handler->cancels == 1);
    CHECK(handler->dones == 1);
  }
}

// Records the order and the thread it ran in.
class Step final : public Writable {
 public:
  Step(int index, std::vector<int>* order, std::vector<std::thread::id>* threads, std::mutex* mutex)
      : index_(index), order_(order), threads_(threads), mutex_(mutex) {}
  void startWrites() override {
    std::lock_guard lock(*mutex_);
    order_->push_back(index_);
    threads_->push_back(std::this_thread::get_id());
  }

 private:
  const int index_;
  std::vector<int>* order_;
  std::vector<std::thread::id>* threads_;
  std::mutex* mutex_;
};

// A server with one Watch call open, served by a handler that writes nothing and waits.
class OneCall {
 public:
  OneCall() : reader(h.stub().Watch(&context, cluster::v1::WatchRequest())) {
    REQUIRE(eventually([&] { return opened.load(); }, 5s));
  }

  std::shared_ptr<Bookmarks> handler;
  std::atomic<bool> opened{false};
  Harness h{anyTransport(), [this](WatchCall* call) {
              handler = std::make_shared<Bookmarks>(call, 0);
              call->serve(handler.get());
              handler->begin();
              opened = true;
            }};
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReader<WatchEvent>> reader;
};

TEST_CASE("schedule() runs work on the loop's thread, in the order it was scheduled") {
  OneCall one;
  auto& handler = one.handler;

  std::mutex mutex;
  std::vector<int> order;
  std::vector<std::thread::id> threads;
  // From two threads at once; each thread's own steps keep their order.
  std::thread other([&] {
    for (int i = 1000; i < 1200; ++i) {
      handler->call()->loop().schedule(std::make_shared<Step>(i, &order, &threads, &mutex));
    }
  });
  for (int i = 0; i < 200; ++i) {
    handler->call()->loop().schedule(std::make_shared<Step>(i, &order, &threads, &mutex));
  }
  other.join();
  REQUIRE(eventually(
      [&] {
        std::lock_guard lock(mutex);
        return order.size() == 400;
      },
      5s));
  std::lock_guard lock(mutex);
  std::vector<int> mine, theirs, want_mine, want_theirs;
  for (int i : order) (i < 1000 ? mine : theirs).push_back(i);
  for (int i = 0; i < 200; ++i) {
    want_mine.push_back(i);
    want_theirs.push_back(1000 + i);
  }
  CHECK(mine == want_mine);
  CHECK(theirs == want_theirs);
  CHECK(std::count(threads.begin(), threads.end(), handler->loopThread()) == 400);
  one.context.TryCancel();
}

TEST_CASE("a client that goes away is reported, and the call ends after the handler's finish") {
  OneCall one;
  auto& handler = one.handler;
  auto& h = one.h;
  CHECK(h.calls() == 1);
  one.context.TryCancel();
  CHECK(one.reader->Finish().error_code() == grpc::StatusCode::CANCELLED);
  REQUIRE(eventually([&] { return h.calls() == 0; }, 5s));
  CHECK(handler->cancels == 1);
  CHECK(handler->dones == 1);
}

TEST_CASE("a refused Watch call ends with the refusal's status") {
  Harness h(anyTransport(), [](WatchCall* call) {
    call->refuse(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "region: required"));
  });
  grpc::ClientContext context;
  auto reader = h.stub().Watch(&context, cluster::v1::WatchRequest());
  WatchEvent event;
  CHECK_FALSE(reader->Read(&event));
  const grpc::Status status = reader->Finish();
  CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(status.error_message() == "region: required");
  CHECK(eventually([&] { return h.calls() == 0; }, 5s));
}

TEST_CASE("stopping after the server's shutdown ends the open calls, or gives up on them") {
  const bool finishes = GENERATE(true, false);
  CAPTURE(finishes);
  std::mutex mutex;
  std::vector<std::shared_ptr<Bookmarks>> handlers;
  Harness h(anyTransport(), [&](WatchCall* call) {
    auto handler = std::make_shared<Bookmarks>(call, 0, /*filler=*/0, /*ignore_cancel=*/!finishes);
    call->serve(handler.get());
    handler->begin();
    std::lock_guard lock(mutex);
    handlers.push_back(handler);
  });
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientReader<WatchEvent>>> readers;
  for (int i = 0; i < 3; ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    readers.push_back(h.stub().Watch(contexts.back().get(), cluster::v1::WatchRequest()));
  }
  REQUIRE(eventually([&] { return h.calls() == 3; }, 5s));
  const auto start = std::chrono::steady_clock::now();
  h.shutdown(/*grace=*/500ms);
  const auto took = std::chrono::steady_clock::now() - start;
  std::lock_guard lock(mutex);
  for (auto& handler : handlers) CHECK(handler->cancels == 1);
  if (finishes) {
    CHECK(h.calls() == 0);
    for (auto& handler : handlers) CHECK(handler->dones == 1);
  } else {
    // Abandoned after the grace period: the stop returns, nothing more is delivered.
    CHECK(h.calls() == 3);
    CHECK(took >= 500ms);
    for (auto& handler : handlers) CHECK(handler->dones == 0);
  }
  for (auto& context : contexts) context->TryCancel();
}

}  // namespace
}  // namespace krane::feed
