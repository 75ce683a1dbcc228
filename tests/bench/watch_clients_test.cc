// The feed benchmark's two Watch clients, against a small gRPC server: both read single events
// and batches, count them, record a sample per change and see their streams go live; both report
// a stream the server ends with an error; the lean HTTP/2 client fails clearly when nothing
// listens and when the server goes away. Their figures are only as good as this.
#include "bench/feed/watch_clients.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include <catch2/catch.hpp>
#include <grpcpp/grpcpp.h>

#include "bench/feed/h2_watch_streams.h"
#include "krane/cluster/v1/cluster.grpc.pb.h"
#include "tests/support/wait.h"

namespace krane::bench {
namespace {

using namespace std::chrono_literals;
using cluster::v1::WatchEvent;
using krane::testing::eventually;

WatchEvent changeAt(uint64_t version, int64_t send_ns) {
  WatchEvent e;
  auto* change = e.mutable_change();
  change->set_version(version);
  *change->mutable_resource() = timedResource("r1", "item", send_ns);
  change->mutable_resource()->set_version(version);
  return e;
}

// Per stream: a bookmark (the stream is live), a batch of two changes, one change alone; then it
// waits until the client goes away. A wrong token gets UNAUTHENTICATED at once.
class FakeCluster final : public cluster::v1::ClusterService::Service {
 public:
  grpc::Status Watch(grpc::ServerContext* context, const cluster::v1::WatchRequest* request,
                     grpc::ServerWriter<WatchEvent>* writer) override {
    const auto auth = context->client_metadata().find("authorization");
    if (auth == context->client_metadata().end() || auth->second != "Bearer good") {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "token not accepted");
    }
    if (!request->accept_batches()) return grpc::Status(grpc::StatusCode::INTERNAL, "no batches");
    WatchEvent bookmark;
    bookmark.mutable_bookmark()->set_version(10);
    writer->Write(bookmark);
    while (!release && !context->IsCancelled()) std::this_thread::sleep_for(2ms);
    WatchEvent batch;
    *batch.mutable_batch()->add_events() = changeAt(11, 1000);
    *batch.mutable_batch()->add_events() = changeAt(12, 2000);
    writer->Write(batch);
    writer->Write(changeAt(13, 3000));
    while (!context->IsCancelled()) std::this_thread::sleep_for(2ms);
    ++cancelled;
    return grpc::Status::CANCELLED;
  }
  std::atomic<bool> release{false};
  std::atomic<int> cancelled{0};
};

class Server {
 public:
  Server() {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&service);
    server_ = builder.BuildAndStart();
  }
  ~Server() { stop(); }
  void stop() {
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + 1s);
  }
  std::string target() const { return "127.0.0.1:" + std::to_string(port_); }
  FakeCluster service;

 private:
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

std::unique_ptr<WatchStreams> open(bool h2, const std::string& target, const std::string& token,
                                   size_t count) {
  if (h2) return std::make_unique<H2WatchStreams>(target, token, "r1", 10, count, 2);
  return std::make_unique<GrpcWatchStreams>(target, token, "r1", 10, count, 2);
}

TEST_CASE("both Watch clients read events and batches and record every change", "[bench]") {
  const bool h2 = GENERATE(true, false);
  CAPTURE(h2);
  Server server;
  auto streams = open(h2, server.target(), "good", 3);
  REQUIRE(streams->waitLive(10s));
  CHECK(streams->bookmarks() == 3);
  streams->setRecording(true);
  server.service.release = true;
  REQUIRE(eventually([&] { return streams->changes() == 9; }, 10s));
  CHECK(streams->messages() == 3 * 3);  // bookmark, batch, change
  const auto samples = streams->takeSamples();
  REQUIRE(samples.size() == 3);
  for (const auto& s : samples) {
    REQUIRE(s.size() == 3);
    CHECK(s[0].version == 11);
    CHECK(s[0].send_ns == 1000);
    CHECK(s[1].send_ns == 2000);
    CHECK(s[2].version == 13);
    CHECK(s[2].send_ns == 3000);
    CHECK(s[2].receive_ns > 0);
  }
  CHECK(streams->ended() == 0);
  streams->close();
  CHECK(streams->ended() == 3);
  CHECK(streams->firstError().empty());
  CHECK(eventually([&] { return server.service.cancelled == 3; }, 10s));
}

TEST_CASE("both Watch clients report a stream the server ends with an error", "[bench]") {
  const bool h2 = GENERATE(true, false);
  CAPTURE(h2);
  Server server;
  auto streams = open(h2, server.target(), "bad", 2);
  CHECK_FALSE(streams->waitLive(10s));
  CHECK(eventually([&] { return streams->ended() == 2; }, 10s));
  CHECK_THAT(streams->firstError(), Catch::Contains("token not accepted"));
  CHECK(streams->live() == 0);
}

TEST_CASE("the HTTP/2 client says when nothing listens", "[bench]") {
  int port = 0;
  {
    Server gone;  // a port that was just free
    port = std::stoi(gone.target().substr(gone.target().rfind(':') + 1));
    gone.stop();
  }
  CHECK_THROWS_WITH(H2WatchStreams("127.0.0.1:" + std::to_string(port), "good", "r1", 10, 1),
                    Catch::Contains("connect 127.0.0.1:"));
}

TEST_CASE("the HTTP/2 client ends its streams when the server goes away", "[bench]") {
  Server server;
  H2WatchStreams streams(server.target(), "good", "r1", 10, 4, 2);
  REQUIRE(streams.waitLive(10s));
  server.stop();
  CHECK(eventually([&] { return streams.ended() == 4; }, 10s));
  CHECK_FALSE(streams.firstError().empty());
}

}  // namespace
}  // namespace krane::bench
