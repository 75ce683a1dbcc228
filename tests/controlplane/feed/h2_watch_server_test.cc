// The feed's HTTP/2 listener as gRPC's client sees it, past what every transport must do
// (watch_loops_test.cc): the opener gets the request, its authorization header and the peer;
// other methods, oversized and compressed requests are refused with a status that says why;
// messages larger than a frame arrive whole; an agent that stops reading stops completing
// writes (so its stream's queue grows and it is told to resync); many calls share a
// connection; a connection that never asks, or that speaks something else, is closed.
#include "controlplane/feed/h2_watch_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <nghttp2/nghttp2.h>

#include "krane/cluster/v1/cluster.grpc.pb.h"
#include "tests/controlplane/feed/event_writer.h"
#include "tests/support/certificates.h"
#include "tests/support/tcp_relay.h"
#include "tests/support/wait.h"

namespace krane::feed {
namespace {

using namespace std::chrono_literals;
using cluster::v1::ClusterService;
using cluster::v1::WatchEvent;
using cluster::v1::WatchRequest;
using krane::feed::testing::eventOf;
using krane::testing::eventually;
using Writer = krane::feed::testing::EventWriter;

struct Opened {
  std::string request;
  std::string authorization;
  std::string peer;
};

// Made once for the test binary.
const krane::testing::TestCertificates& certificates() {
  static const auto certs = krane::testing::makeTestCertificates(std::getenv("TEST_TMPDIR"));
  return certs;
}

// A listener whose calls get a Writer of `count` events of `filler` bytes; with `tls`, it
// serves TLS with the test's server certificate, and its channels trust the test's CA.
class Listener {
 public:
  explicit Listener(size_t count = 3, size_t filler = 0, H2WatchOptions options = {},
                    bool tls = false)
      : tls_(tls) {
    if (tls) {
      options.tls.cert_file = certificates().server_cert;
      options.tls.key_file = certificates().server_key;
    }
    auto server = H2WatchServer::start(
        options, [this, count, filler](WatchCall* call, std::string_view request,
                                       std::string authorization, std::string peer) {
          auto writer = std::make_shared<Writer>(call, count, filler);
          call->serve(writer.get());
          {
            std::lock_guard lock(mutex);
            opened.push_back({std::string(request), authorization, peer});
            writers.push_back(writer);
          }
          writer->begin();
        });
    REQUIRE(server.ok());
    server_ = std::move(*server);
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(server_->port()); }
  // A channel to the listener, or to `via` (a relay in front of it).
  std::shared_ptr<grpc::Channel> channel(grpc::ChannelArguments args = {}, std::string via = "") {
    const std::string target = via.empty() ? address() : via;
    if (!tls_) return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
    grpc::SslCredentialsOptions trust;
    trust.pem_root_certs = krane::testing::fileText(certificates().ca_cert);
    return grpc::CreateCustomChannel(target, grpc::SslCredentials(trust), args);
  }
  H2WatchServer& server() { return *server_; }
  size_t openedCount() {
    std::lock_guard lock(mutex);
    return opened.size();
  }

  std::mutex mutex;
  std::vector<Opened> opened;
  std::vector<std::shared_ptr<Writer>> writers;

 private:
  const bool tls_;
  std::unique_ptr<H2WatchServer> server_;
};

// A TCP connection to `port` on 127.0.0.1, with a receive buffer of `rcvbuf` bytes if given.
int dial(int port, int rcvbuf = 0) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (rcvbuf > 0) setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  timeval timeout{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  return fd;
}

// Reads until the server closes the connection: true if it did within the socket's timeout.
bool closedByServer(int fd) {
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n == 0) return true;
    if (n < 0) return errno == ECONNRESET;
  }
}

TEST_CASE("the opener gets the request message, the authorization header and the peer") {
  Listener listener;
  auto stub = ClusterService::NewStub(listener.channel());
  grpc::ClientContext context;
  context.AddMetadata("authorization", "Bearer token-123");
  WatchRequest request;
  request.set_region("eu-1");
  request.set_version(42);
  request.add_resource_types("krane.sentinel");
  auto reader = stub->Watch(&context, request);
  WatchEvent event;
  std::vector<uint64_t> versions;
  while (reader->Read(&event)) versions.push_back(event.bookmark().version());
  CHECK(reader->Finish().ok());
  CHECK(versions == std::vector<uint64_t>{1, 2, 3});

  std::lock_guard lock(listener.mutex);
  REQUIRE(listener.opened.size() == 1);
  WatchRequest got;
  REQUIRE(got.ParseFromString(listener.opened[0].request));
  CHECK(got.region() == "eu-1");
  CHECK(got.version() == 42);
  CHECK(got.resource_types_size() == 1);
  CHECK(listener.opened[0].authorization == "Bearer token-123");
  CHECK_THAT(listener.opened[0].peer, Catch::StartsWith("ipv4:127.0.0.1:"));
}

TEST_CASE("other methods, oversized and compressed requests are refused with a reason") {
  H2WatchOptions options;
  options.max_request_bytes = 1024;
  Listener listener(3, 0, options);

  SECTION("another method of the service") {
    auto stub = ClusterService::NewStub(listener.channel());
    grpc::ClientContext context;
    cluster::v1::HeartbeatRequest beat;
    cluster::v1::HeartbeatResponse answer;
    const grpc::Status status = stub->Heartbeat(&context, beat, &answer);
    CHECK(status.error_code() == grpc::StatusCode::UNIMPLEMENTED);
    CHECK_THAT(status.error_message(),
               Catch::Contains("/krane.cluster.v1.ClusterService/Heartbeat"));
  }
  SECTION("a request above max_request_bytes") {
    auto stub = ClusterService::NewStub(listener.channel());
    grpc::ClientContext context;
    WatchRequest request;
    request.set_region(std::string(2000, 'r'));
    auto reader = stub->Watch(&context, request);
    WatchEvent event;
    CHECK_FALSE(reader->Read(&event));
    const grpc::Status status = reader->Finish();
    CHECK(status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
    CHECK_THAT(status.error_message(), Catch::Contains("more than the 1024"));
  }
  SECTION("a compressed request") {
    grpc::ChannelArguments args;
    args.SetCompressionAlgorithm(GRPC_COMPRESS_GZIP);
    auto stub = ClusterService::NewStub(listener.channel(args));
    grpc::ClientContext context;
    WatchRequest request;
    request.set_region(std::string(500, 'r'));
    auto reader = stub->Watch(&context, request);
    WatchEvent event;
    CHECK_FALSE(reader->Read(&event));
    const grpc::Status status = reader->Finish();
    CHECK(status.error_code() == grpc::StatusCode::UNIMPLEMENTED);
    CHECK_THAT(status.error_message(), Catch::Contains("compressed"));
  }
  CHECK(listener.openedCount() == 0);
  CHECK(eventually([&] { return listener.server().calls() == 0; }, 5s));
}

TEST_CASE("messages larger than a frame arrive whole and in order") {
  const size_t filler = GENERATE(size_t{20000}, size_t{1} << 20);
  const bool tls = GENERATE(false, true);
  CAPTURE(filler, tls);
  Listener listener(6, filler, {}, tls);
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(4 << 20);
  auto stub = ClusterService::NewStub(listener.channel(args));
  grpc::ClientContext context;
  auto reader = stub->Watch(&context, WatchRequest());
  // Read late: the socket fills, the server holds the rest of a write, and goes on from there
  // when there is room again.
  std::this_thread::sleep_for(300ms);
  WatchEvent event;
  std::vector<uint64_t> versions;
  while (reader->Read(&event)) {
    CHECK(event.cursor_expired().message() == std::string(filler, 'x'));
    versions.push_back(event.cursor_expired().requested_version());
  }
  CHECK(reader->Finish().ok());
  CHECK(versions == std::vector<uint64_t>{1, 2, 3, 4, 5, 6});
}

TEST_CASE("an agent that stops reading stops completing writes; leaving fails the last one") {
  // 1 MiB events without end: a client that reads none takes what the windows and socket
  // buffers hold, then nothing more.
  const bool tls = GENERATE(false, true);
  CAPTURE(tls);
  Listener listener(1000000, 1 << 20, {}, tls);
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(4 << 20);
  auto stub = ClusterService::NewStub(listener.channel(args));
  grpc::ClientContext context;
  auto reader = stub->Watch(&context, WatchRequest());
  REQUIRE(eventually([&] { return listener.openedCount() == 1; }, 5s));
  std::shared_ptr<Writer> writer;
  {
    std::lock_guard lock(listener.mutex);
    writer = listener.writers[0];
  }
  // Completions stop.
  size_t before = 0;
  REQUIRE(eventually(
      [&] {
        const size_t now = writer->completed;
        const bool settled = now > 0 && now == before;
        before = now;
        if (!settled) std::this_thread::sleep_for(200ms);
        return settled;
      },
      20s));
  std::this_thread::sleep_for(300ms);
  CHECK(writer->completed == before);
  CHECK(writer->completed < 64);  // well under 64 MiB held for one agent
  // The client goes: the write in flight fails, the handler hears it, and the call ends.
  context.TryCancel();
  reader->Finish();
  REQUIRE(eventually([&] { return writer->dones == 1; }, 5s));
  CHECK(writer->failed == 1);
  CHECK(writer->cancels == 1);
  CHECK(listener.server().calls() == 0);
}

TEST_CASE("a client that vanished is found by a ping and its call ends; one that answers stays") {
  const bool tls = GENERATE(false, true);
  CAPTURE(tls);
  H2WatchOptions options;
  options.keepalive = 1s;
  options.keepalive_timeout = 1s;
  Listener listener(0, 0, options, tls);  // writes nothing: the call waits for the client
  krane::testing::TcpRelay relay(listener.address());
  auto stub = ClusterService::NewStub(listener.channel({}, relay.address()));
  grpc::ClientContext context;
  auto reader = stub->Watch(&context, WatchRequest());
  // Reading, as an agent's watcher does: a gRPC client that is not in a call's Read answers
  // pings only from its backup poller, every 5 s.
  std::thread client([&] {
    WatchEvent event;
    while (reader->Read(&event)) {
    }
  });
  REQUIRE(eventually([&] { return listener.openedCount() == 1; }, 5s));
  std::shared_ptr<Writer> writer;
  {
    std::lock_guard lock(listener.mutex);
    writer = listener.writers[0];
  }
  // Three seconds with nothing to say: pinged, and gRPC's client answers.
  std::this_thread::sleep_for(3s);
  CHECK(listener.server().calls() == 1);
  CHECK(writer->cancels == 0);
  // The client's host vanishes: no FIN, no RST, nothing comes back.
  relay.blackHole();
  REQUIRE(eventually([&] { return listener.server().calls() == 0; }, 10s));
  CHECK(writer->cancels == 1);
  CHECK(listener.server().connections() == 0);
  context.TryCancel();
  client.join();
  reader->Finish();
}

TEST_CASE("many calls share one connection") {
  const bool tls = GENERATE(false, true);
  CAPTURE(tls);
  Listener listener(5, 0, {}, tls);
  auto stub = ClusterService::NewStub(listener.channel());
  constexpr int kCalls = 50;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientReader<WatchEvent>>> readers;
  for (int i = 0; i < kCalls; ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    readers.push_back(stub->Watch(contexts.back().get(), WatchRequest()));
  }
  for (auto& reader : readers) {
    WatchEvent event;
    std::vector<uint64_t> versions;
    while (reader->Read(&event)) versions.push_back(event.bookmark().version());
    CHECK(reader->Finish().ok());
    CHECK(versions == std::vector<uint64_t>{1, 2, 3, 4, 5});
  }
  CHECK(listener.openedCount() == kCalls);
  CHECK(listener.server().connections() == 1);
}

TEST_CASE("a connection that never asks, or speaks something else, is closed") {
  H2WatchOptions options;
  options.idle_timeout = 300ms;
  Listener listener(3, 0, options);

  SECTION("silent") {
    const int fd = dial(listener.server().port());
    REQUIRE(eventually([&] { return listener.server().connections() == 1; }, 5s));
    const auto start = std::chrono::steady_clock::now();
    CHECK(closedByServer(fd));
    CHECK(std::chrono::steady_clock::now() - start >= 250ms);
    ::close(fd);
  }
  SECTION("not HTTP/2") {
    const int fd = dial(listener.server().port());
    const std::string junk = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    REQUIRE(::send(fd, junk.data(), junk.size(), 0) == static_cast<ssize_t>(junk.size()));
    CHECK(closedByServer(fd));
    ::close(fd);
  }
  CHECK(eventually([&] { return listener.server().connections() == 0; }, 5s));
  // And it still serves.
  auto stub = ClusterService::NewStub(listener.channel());
  grpc::ClientContext context;
  auto reader = stub->Watch(&context, WatchRequest());
  WatchEvent event;
  int read = 0;
  while (reader->Read(&event)) ++read;
  CHECK(read == 3);
  CHECK(reader->Finish().ok());
}

// A Watch call whose client never half-closes its side (gRPC's generic stub, as a bidi stream):
// what a misbehaving client can do.
class OpenSidedCall {
 public:
  explicit OpenSidedCall(const std::shared_ptr<grpc::Channel>& channel) : stub_(channel) {
    context_.set_deadline(std::chrono::system_clock::now() + 20s);
    call_ = stub_.PrepareCall(&context_, "/krane.cluster.v1.ClusterService/Watch", &cq_);
    call_->StartCall(tag(1));
    wait(1);
  }
  ~OpenSidedCall() {
    context_.TryCancel();
    cq_.Shutdown();
    void* got = nullptr;
    bool ok = false;
    while (cq_.Next(&got, &ok)) {
    }
  }
  void write(const WatchRequest& request) {
    const std::string bytes = request.SerializeAsString();
    grpc::Slice slice(bytes);
    grpc::ByteBuffer buffer(&slice, 1);
    call_->Write(buffer, tag(2));
    wait(2);
  }
  grpc::Status finish() {
    grpc::Status status;
    call_->Finish(&status, tag(3));
    wait(3);
    return status;
  }

 private:
  static void* tag(intptr_t n) { return reinterpret_cast<void*>(n); }
  void wait(intptr_t n) {
    void* got = nullptr;
    bool ok = false;
    REQUIRE(cq_.Next(&got, &ok));
    REQUIRE(got == tag(n));
  }

  grpc::GenericStub stub_;
  grpc::ClientContext context_;
  grpc::CompletionQueue cq_;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call_;
};

// A bare HTTP/2 client (nghttp2) that sends one Watch request and never ends its side of the
// stream, which gRPC's own client does not allow. With `window`, its HTTP/2 windows (stream and
// connection) are that large; with `rcvbuf`, its socket's receive buffer that small.
class BareClient {
 public:
  explicit BareClient(int port, int32_t window = 0, int rcvbuf = 0) : fd_(dial(port, rcvbuf)) {
    nghttp2_session_callbacks* callbacks = nullptr;
    nghttp2_session_callbacks_new(&callbacks);
    nghttp2_session_callbacks_set_send_callback(
        callbacks, [](nghttp2_session*, const uint8_t* data, size_t length, int, void* user) {
          return static_cast<ssize_t>(
              ::send(static_cast<BareClient*>(user)->fd_, data, length, MSG_NOSIGNAL));
        });
    nghttp2_session_callbacks_set_on_frame_recv_callback(
        callbacks, [](nghttp2_session*, const nghttp2_frame* frame, void* user) {
          auto* self = static_cast<BareClient*>(user);
          if (frame->hd.type == NGHTTP2_HEADERS && frame->headers.cat == NGHTTP2_HCAT_HEADERS &&
              (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0) {
            self->trailers = true;
          }
          if (frame->hd.type == NGHTTP2_RST_STREAM) {
            self->reset = true;
            self->reset_code = frame->rst_stream.error_code;
          }
          return 0;
        });
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(
        callbacks, [](nghttp2_session*, uint8_t, int32_t, const uint8_t*, size_t len, void* user) {
          static_cast<BareClient*>(user)->data_bytes += len;
          return 0;
        });
    nghttp2_session_client_new(&session_, callbacks, this);
    nghttp2_session_callbacks_del(callbacks);
    if (window > 0) {
      const nghttp2_settings_entry settings[] = {
          {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, static_cast<uint32_t>(window)}};
      nghttp2_submit_settings(session_, NGHTTP2_FLAG_NONE, settings, 1);
      nghttp2_session_set_local_window_size(session_, NGHTTP2_FLAG_NONE, 0, window);
    } else {
      nghttp2_submit_settings(session_, NGHTTP2_FLAG_NONE, nullptr, 0);
    }
    const std::string message = WatchRequest().SerializeAsString();
    body_ = std::string(5, '\0');
    body_[4] = static_cast<char>(message.size());
    body_ += message;
    auto nv = [](const char* name, const char* value) {
      return nghttp2_nv{reinterpret_cast<uint8_t*>(const_cast<char*>(name)),
                        reinterpret_cast<uint8_t*>(const_cast<char*>(value)), std::strlen(name),
                        std::strlen(value), NGHTTP2_NV_FLAG_NONE};
    };
    const nghttp2_nv headers[] = {nv(":method", "POST"),
                                  nv(":scheme", "http"),
                                  nv(":path", "/krane.cluster.v1.ClusterService/Watch"),
                                  nv(":authority", "127.0.0.1"),
                                  nv("content-type", "application/grpc"),
                                  nv("te", "trailers")};
    nghttp2_data_provider provider{};
    provider.source.ptr = this;
    provider.read_callback = [](nghttp2_session*, int32_t, uint8_t* buf, size_t length,
                                uint32_t* flags, nghttp2_data_source* source, void*) {
      auto* self = static_cast<BareClient*>(source->ptr);
      const size_t n = std::min(length, self->body_.size());
      std::memcpy(buf, self->body_.data(), n);
      self->body_.erase(0, n);
      // The request's bytes, then nothing more, without ending the stream.
      if (self->body_.empty()) *flags |= NGHTTP2_DATA_FLAG_EOF | NGHTTP2_DATA_FLAG_NO_END_STREAM;
      return static_cast<ssize_t>(n);
    };
    nghttp2_submit_request(session_, nullptr, headers, 6, &provider, nullptr);
    nghttp2_session_send(session_);
  }
  ~BareClient() {
    nghttp2_session_del(session_);
    ::close(fd_);
  }

  // Reads and answers until `done` holds (false after `timeout` or when the server closes).
  template <typename Pred>
  bool runUntil(Pred done, std::chrono::seconds timeout = 5s) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    uint8_t buffer[16384];
    timeval tick{0, 100000};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tick, sizeof(tick));
    while (!done() && std::chrono::steady_clock::now() < deadline) {
      const ssize_t n = ::recv(fd_, buffer, sizeof(buffer), 0);
      if (n == 0) return done();
      if (n > 0 && nghttp2_session_mem_recv(session_, buffer, static_cast<size_t>(n)) < 0) {
        return false;
      }
      nghttp2_session_send(session_);
    }
    return done();
  }

  bool trailers = false;
  bool reset = false;
  uint32_t reset_code = 0;
  size_t data_bytes = 0;  // of the response's DATA frames

 private:
  int fd_;
  nghttp2_session* session_ = nullptr;
  std::string body_;
};

TEST_CASE("a client that keeps its side open cannot pin a stream") {
  H2WatchOptions options;
  options.stall_timeout = 300ms;
  SECTION("a request that never comes is refused after stall_timeout") {
    Listener listener(3, 0, options);
    OpenSidedCall call(listener.channel());
    const grpc::Status status = call.finish();
    CHECK(status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED);
    CHECK_THAT(status.error_message(), Catch::Contains("not complete in time"));
    CHECK(listener.openedCount() == 0);
  }
  SECTION("a call that ended while the client still sends ends on the server too") {
    Listener listener(2, 0, options);  // two bookmarks, then OK
    BareClient client(listener.server().port());
    REQUIRE(eventually([&] { return listener.openedCount() == 1; }, 5s));
    REQUIRE(client.runUntil([&] { return client.reset; }));
    CHECK(client.trailers);
    CHECK(client.reset_code == NGHTTP2_NO_ERROR);
    CHECK(eventually([&] { return listener.server().calls() == 0; }, 5s));
    std::lock_guard lock(listener.mutex);
    CHECK(listener.writers[0]->dones == 1);
  }
}

TEST_CASE("what the socket does not take waits, and goes out in order when there is room") {
  // Six 1 MiB messages against windows that allow them all and a client that reads nothing for
  // a while through a small receive buffer: the server's socket fills, and the rest of the
  // frames nghttp2 made waits in the connection's buffer.
  constexpr size_t kMessages = 6;
  constexpr size_t kFiller = size_t{1} << 20;
  Listener listener(kMessages, kFiller);
  BareClient client(listener.server().port(), /*window=*/(1 << 30) - 1, /*rcvbuf=*/4096);
  REQUIRE(eventually([&] { return listener.openedCount() == 1; }, 5s));
  std::this_thread::sleep_for(300ms);
  size_t expected = 0;
  for (size_t v = 1; v <= kMessages; ++v) expected += 5 + eventOf(v, kFiller).Length();
  CHECK(client.runUntil([&] { return client.trailers; }, 20s));
  CHECK(client.data_bytes == expected);
  std::shared_ptr<Writer> writer;
  {
    std::lock_guard lock(listener.mutex);
    writer = listener.writers[0];
  }
  CHECK(writer->completed == kMessages);
}

TEST_CASE("an address that cannot be bound is an error that names it") {
  Listener first;
  H2WatchOptions options;
  options.listen = first.address();
  auto second =
      H2WatchServer::start(options, [](WatchCall*, std::string_view, std::string, std::string) {});
  REQUIRE_FALSE(second.ok());
  CHECK_THAT(std::string(second.status().message()), Catch::Contains(first.address()));
  options.listen = "nonsense";
  auto bad =
      H2WatchServer::start(options, [](WatchCall*, std::string_view, std::string, std::string) {});
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(std::string(bad.status().message()), Catch::Contains("not host:port"));
}

}  // namespace
}  // namespace krane::feed
