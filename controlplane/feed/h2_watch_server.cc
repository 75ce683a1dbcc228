#include "controlplane/feed/h2_watch_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>

#include <nghttp2/nghttp2.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include "common/host_port.h"
#include "common/strings.h"
#include "spdlog/spdlog.h"

namespace krane::feed {
namespace {

constexpr std::string_view kWatchPath = "/krane.cluster.v1.ClusterService/Watch";
constexpr size_t kReadBufferBytes = 64 << 10;
// nghttp2's frames for one connection are gathered up to this many bytes into one write: one
// system call for the messages of all its streams, or for a batch of many frames.
constexpr size_t kSendBatchBytes = 64 << 10;
// Bytes read from one connection before the loop turns to the others.
constexpr size_t kReadBudgetBytes = 256 << 10;
constexpr uint32_t kMaxHeaderListBytes = 16 << 10;
// grpc-message is cut here: it must fit in a HEADERS frame nghttp2 agrees to send.
constexpr size_t kMaxStatusMessage = 1024;

// grpc-message is percent-encoded: bytes outside printable ASCII, and '%' itself.
std::string percentEncoded(std::string_view message) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(message.size());
  for (const char c : message) {
    const auto b = static_cast<unsigned char>(c);
    if (b < 0x20 || b > 0x7e || b == '%') {
      out += '%';
      out += kHex[b >> 4];
      out += kHex[b & 15];
    } else {
      out += c;
    }
  }
  return out;
}

nghttp2_nv header(std::string_view name, std::string_view value) {
  return {reinterpret_cast<uint8_t*>(const_cast<char*>(name.data())),
          reinterpret_cast<uint8_t*>(const_cast<char*>(value.data())), name.size(), value.size(),
          NGHTTP2_NV_FLAG_NONE};
}

std::string peerOf(const sockaddr_storage& addr) {
  char host[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET6) {
    const auto& a = reinterpret_cast<const sockaddr_in6&>(addr);
    inet_ntop(AF_INET6, &a.sin6_addr, host, sizeof(host));
    return strCat("ipv6:[", host, "]:", ntohs(a.sin6_port));
  }
  const auto& a = reinterpret_cast<const sockaddr_in&>(addr);
  inet_ntop(AF_INET, &a.sin_addr, host, sizeof(host));
  return strCat("ipv4:", host, ":", ntohs(a.sin_port));
}

}  // namespace

class H2Connection;

// One HTTP/2 stream: while its request arrives, what the headers said; then the call.
class H2Call final : public WatchCall {
 public:
  H2Call(H2Loop* loop, H2Connection* connection, int32_t stream_id)
      : loop_(loop), connection_(connection), stream_id_(stream_id) {}

  WatchScheduler& loop() override;
  void serve(WatchCallHandler* handler) override { handler_ = handler; }
  void write(const grpc::ByteBuffer* message, grpc::WriteOptions options) override;
  void finish(const grpc::Status& status) override;
  void cancel() override;

 private:
  friend class H2Loop;

  H2Loop* const loop_;
  H2Connection* connection_;  // null once the stream is gone
  const int32_t stream_id_;
  WatchCallHandler* handler_ = nullptr;

  // The request, until the call is opened.
  bool post_ = false;
  bool path_ok_ = false;
  std::string path_;
  bool grpc_content_ = false;
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  std::string authorization_;
  std::string request_;
  bool opened_ = false;  // handed to the opener (counted in calls())

  // The response.
  bool headers_sent_ = false;
  bool deferred_ = false;  // nghttp2 waits for resume_data
  bool writing_ = false;
  std::vector<grpc::Slice> out_;  // the message being written, after its 5-byte prefix
  char prefix_[5] = {};
  size_t out_slice_ = 0;
  size_t out_offset_ = 0;  // within the prefix, then within out_[out_slice_]
  bool prefix_done_ = false;
  bool finishing_ = false;  // finish() taken; trailers go once the data is out
  std::chrono::steady_clock::time_point finishing_since_;
  bool finish_taken_ = false;  // the finish op was processed
  std::string status_code_;
  std::string status_message_;
  bool stream_closed_ = false;
  bool cancel_reported_ = false;
};

class H2Connection {
 public:
  H2Loop* loop = nullptr;
  int fd = -1;
  std::string peer;
  SSL* ssl = nullptr;          // with TLS
  bool handshaking = false;    // the TLS handshake is not done
  bool tls_wants_out = false;  // OpenSSL waits for room in the socket
  nghttp2_session* session = nullptr;
  // Bytes nghttp2 made that the socket did not take yet; nghttp2 makes no more until they went.
  std::string pending;
  bool want_out = false;
  bool dirty = false;   // something to send
  bool closed = false;  // freed at the end of the loop's turn
  std::vector<H2Call*> calls;
  // Since when `calls` is empty.
  std::chrono::steady_clock::time_point idle_since = std::chrono::steady_clock::now();
  // When bytes last came from the client, and when a PING went to it with nothing since (the
  // epoch: none outstanding).
  std::chrono::steady_clock::time_point last_read = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point ping_sent{};
};

class H2Loop final : public WatchScheduler {
 public:
  H2Loop(H2WatchServer* server);
  ~H2Loop() override;

  void schedule(std::shared_ptr<Writable> target) override;
  void addConnection(int fd, std::string peer);
  void shutdown();
  void close();  // the thread ends; connections are closed
  void run();

  // From H2Call, any thread.
  void post(H2Call* call, const grpc::ByteBuffer* message);
  void postFinish(H2Call* call, grpc::Status status);
  void postCancel(H2Call* call);

 private:
  enum class EventKind { kWriteDone, kWriteFailed, kCancel, kDone };
  struct Event {
    H2Call* call;
    EventKind kind;
  };
  struct Op {
    H2Call* call;
    const grpc::ByteBuffer* message;  // null: finish (or the cancel)
    grpc::Status status;
    bool cancel = false;
  };
  void postOp(Op op);

  // nghttp2's callbacks.
  static int onBeginHeaders(nghttp2_session* session, const nghttp2_frame* frame, void* user);
  static int onHeader(nghttp2_session*, const nghttp2_frame* frame, const uint8_t* name,
                      size_t namelen, const uint8_t* value, size_t valuelen, uint8_t, void* user);
  static int onFrameRecv(nghttp2_session* session, const nghttp2_frame* frame, void* user);
  static int onDataChunk(nghttp2_session* session, uint8_t, int32_t stream_id, const uint8_t* data,
                         size_t len, void* user);
  static int onStreamClose(nghttp2_session* session, int32_t stream_id, uint32_t, void* user);
  static int onFrameSend(nghttp2_session* session, const nghttp2_frame* frame, void*);
  static ssize_t onRead(nghttp2_session* session, int32_t stream_id, uint8_t* buf, size_t length,
                        uint32_t* flags, nghttp2_data_source* source, void*);

  void wake();
  bool onLoopThread() const { return std::this_thread::get_id() == thread_id_.load(); }
  void takeInbox();
  // Runs ops, scheduled work and events, and sends, until nothing is left.
  void settle();
  void apply(Op& op);
  void deliver(const Event& event);
  // A request is complete, or its headers already settle it.
  void checkRequest(H2Call* call, bool end_of_stream);
  // The request (its message: `length` bytes after the 5-byte prefix) is complete.
  void open(H2Call* call, uint32_t length);
  // Answers a stream that never becomes a call: trailers only (or an HTTP status alone).
  void reject(H2Call* call, grpc::StatusCode code, std::string_view message,
              const char* http_status = "200");
  void respondHeaders(H2Call* call);
  void streamGone(H2Call* call);
  void release(H2Call* call);
  void markDirty(H2Connection* c);
  bool flush(H2Connection* c);
  bool sendFrames(H2Connection* c);
  void closeConnection(H2Connection* c);
  // Once a second: closes idle connections and those that did not answer a ping, pings the
  // quiet ones, refuses requests not complete in time and resets trailers that cannot go out.
  void sweepIdle();
  void setupConnection(int fd, std::string peer);
  static constexpr ssize_t kWouldBlock = -1;
  static constexpr ssize_t kFailed = -2;
  ssize_t readSome(H2Connection* c);
  ssize_t writeSome(H2Connection* c, const char* data, size_t length);
  bool handshake(H2Connection* c);

  H2WatchServer* const server_;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  nghttp2_session_callbacks* callbacks_ = nullptr;
  nghttp2_option* options_ = nullptr;
  std::atomic<std::thread::id> thread_id_;

  std::mutex mutex_;
  bool wake_pending_ = false;
  bool closing_ = false;   // close(): the thread ends
  bool shutdown_ = false;  // shutdown(): reset every call
  std::vector<std::pair<int, std::string>> new_connections_;
  std::vector<std::shared_ptr<Writable>> ready_;
  std::vector<Op> ops_;

  // The loop's thread only.
  bool shutdown_done_ = false;
  std::vector<std::unique_ptr<H2Connection>> connections_;
  std::vector<std::unique_ptr<H2Connection>> closed_;  // closed in this turn
  std::vector<H2Connection*> dirty_;
  std::vector<Event> events_;
  std::vector<uint8_t> buffer_;
  std::string out_;  // frames gathered for one write
  std::chrono::steady_clock::time_point last_sweep_ = std::chrono::steady_clock::now();
};

// ---------------------------------------------------------------------------------------------
// H2Call

WatchScheduler& H2Call::loop() { return *loop_; }

void H2Call::write(const grpc::ByteBuffer* message, grpc::WriteOptions) {
  loop_->post(this, message);
}

void H2Call::finish(const grpc::Status& status) { loop_->postFinish(this, status); }

void H2Call::cancel() { loop_->postCancel(this); }

// ---------------------------------------------------------------------------------------------
// H2Loop

H2Loop::H2Loop(H2WatchServer* server) : server_(server), buffer_(kReadBufferBytes) {
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = nullptr;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  nghttp2_session_callbacks_new(&callbacks_);
  nghttp2_session_callbacks_set_on_begin_headers_callback(callbacks_, onBeginHeaders);
  nghttp2_session_callbacks_set_on_header_callback(callbacks_, onHeader);
  nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks_, onFrameRecv);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks_, onDataChunk);
  nghttp2_session_callbacks_set_on_stream_close_callback(callbacks_, onStreamClose);
  nghttp2_session_callbacks_set_on_frame_send_callback(callbacks_, onFrameSend);
  nghttp2_option_new(&options_);
  // As lenient as gRPC's server about the request's HTTP semantics (an empty bearer token
  // makes a header value that ends in a space, which RFC 9113 does not allow): the method,
  // path and content type are checked here instead.
  nghttp2_option_set_no_http_messaging(options_, 1);
  // No HPACK dynamic table for the responses: a stream's headers go once, so remembering them
  // buys nothing and costs memory on every connection (1.6 KiB per idle agent, measured).
  nghttp2_option_set_max_deflate_dynamic_table_size(options_, 0);
}

H2Loop::~H2Loop() {
  for (auto& c : connections_) {
    if (c->session != nullptr) nghttp2_session_del(c->session);
    if (c->ssl != nullptr) SSL_free(c->ssl);
    if (c->fd >= 0) ::close(c->fd);
  }
  nghttp2_option_del(options_);
  nghttp2_session_callbacks_del(callbacks_);
  ::close(wake_fd_);
  ::close(epoll_fd_);
}

void H2Loop::wake() {
  const uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof(one));
}

void H2Loop::schedule(std::shared_ptr<Writable> target) {
  bool wake_now = false;
  {
    std::lock_guard lock(mutex_);
    if (closing_) return;
    ready_.push_back(std::move(target));
    if (!wake_pending_ && !onLoopThread()) wake_now = wake_pending_ = true;
  }
  if (wake_now) wake();
}

void H2Loop::postOp(Op op) {
  bool wake_now = false;
  {
    std::lock_guard lock(mutex_);
    if (closing_) return;
    ops_.push_back(std::move(op));
    if (!wake_pending_ && !onLoopThread()) wake_now = wake_pending_ = true;
  }
  if (wake_now) wake();
}

void H2Loop::post(H2Call* call, const grpc::ByteBuffer* message) {
  postOp(Op{call, message, grpc::Status::OK});
}

void H2Loop::postFinish(H2Call* call, grpc::Status status) {
  postOp(Op{call, nullptr, std::move(status)});
}

void H2Loop::postCancel(H2Call* call) { postOp(Op{call, nullptr, grpc::Status::OK, true}); }

void H2Loop::addConnection(int fd, std::string peer) {
  {
    std::lock_guard lock(mutex_);
    if (!closing_ && !shutdown_) {
      new_connections_.emplace_back(fd, std::move(peer));
      fd = -1;
    }
  }
  if (fd >= 0) {
    ::close(fd);
    return;
  }
  wake();
}

void H2Loop::shutdown() {
  {
    std::lock_guard lock(mutex_);
    shutdown_ = true;
  }
  wake();
}

void H2Loop::close() {
  {
    std::lock_guard lock(mutex_);
    closing_ = true;
  }
  wake();
}

void H2Loop::run() {
  thread_id_.store(std::this_thread::get_id());
  std::vector<epoll_event> events(256);
  for (;;) {
    const int n = epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()), 1000);
    for (int i = 0; i < n; ++i) {
      auto* c = static_cast<H2Connection*>(events[static_cast<size_t>(i)].data.ptr);
      if (c == nullptr) {
        uint64_t count = 0;
        (void)!::read(wake_fd_, &count, sizeof(count));
        continue;
      }
      if (c->closed) continue;  // closed earlier in this batch
      const uint32_t what = events[static_cast<size_t>(i)].events;
      bool alive = true;
      c->tls_wants_out = false;  // set again if OpenSSL still waits for room
      if (c->handshaking) alive = handshake(c);
      if (alive && !c->handshaking && (what & (EPOLLIN | EPOLLHUP | EPOLLERR | EPOLLOUT))) {
        for (size_t read = 0; read < kReadBudgetBytes;) {
          const ssize_t got = readSome(c);
          if (got > 0) {
            if (read == 0) c->last_read = std::chrono::steady_clock::now();
            read += static_cast<size_t>(got);
            if (nghttp2_session_mem_recv(c->session, buffer_.data(), static_cast<size_t>(got)) <
                0) {
              alive = false;
              break;
            }
            continue;
          }
          if (got == kWouldBlock) break;
          alive = false;  // closed or failed
          break;
        }
      }
      if (!alive) {
        closeConnection(c);
        continue;
      }
      markDirty(c);  // what the reads made nghttp2 answer, or room to send more
    }
    {
      std::lock_guard lock(mutex_);
      if (closing_) break;
    }
    settle();
    const auto now = std::chrono::steady_clock::now();
    if (now - last_sweep_ >= std::chrono::seconds(1)) {
      last_sweep_ = now;
      sweepIdle();
      settle();  // its pings, refusals and resets go out now, and the calls it ended are told
    }
    closed_.clear();  // no event of this batch refers to them any more
  }
  // Closing: the calls still alive are abandoned (they keep their memory, their writes and
  // finish are ignored, and nothing more is delivered to them); the connections close now.
  for (auto& c : connections_) {
    for (H2Call* call : c->calls) call->connection_ = nullptr;
    c->calls.clear();
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c->fd, nullptr);
    ::close(c->fd);
    c->fd = -1;
    if (c->ssl != nullptr) SSL_free(c->ssl);
    c->ssl = nullptr;
    nghttp2_session_del(c->session);
    c->session = nullptr;
    --server_->connections_;
  }
  connections_.clear();
  std::lock_guard lock(mutex_);
  for (auto& pending : new_connections_) ::close(pending.first);
  new_connections_.clear();
}

void H2Loop::takeInbox() {
  std::vector<std::pair<int, std::string>> fresh;
  bool shutdown_now = false;
  {
    std::lock_guard lock(mutex_);
    fresh.swap(new_connections_);
    shutdown_now = shutdown_ && !shutdown_done_;
  }
  for (auto& [fd, peer] : fresh) setupConnection(fd, std::move(peer));
  if (shutdown_now) {
    shutdown_done_ = true;
    for (auto& c : connections_) {
      nghttp2_submit_goaway(c->session, NGHTTP2_FLAG_NONE,
                            nghttp2_session_get_last_proc_stream_id(c->session), NGHTTP2_NO_ERROR,
                            nullptr, 0);
      for (H2Call* call : c->calls) {
        nghttp2_submit_rst_stream(c->session, NGHTTP2_FLAG_NONE, call->stream_id_, NGHTTP2_CANCEL);
      }
      markDirty(c.get());
    }
  }
}

// Bytes from the connection into buffer_: their count, 0 when the client closed, kWouldBlock,
// or kFailed.
ssize_t H2Loop::readSome(H2Connection* c) {
  if (c->ssl == nullptr) {
    for (;;) {
      const ssize_t got = ::recv(c->fd, buffer_.data(), buffer_.size(), 0);
      if (got >= 0) return got;
      if (errno == EINTR) continue;
      return errno == EAGAIN || errno == EWOULDBLOCK ? kWouldBlock : kFailed;
    }
  }
  ERR_clear_error();
  const int got = SSL_read(c->ssl, buffer_.data(), static_cast<int>(buffer_.size()));
  if (got > 0) return got;
  switch (SSL_get_error(c->ssl, got)) {
    case SSL_ERROR_WANT_READ:
      return kWouldBlock;
    case SSL_ERROR_WANT_WRITE:
      c->tls_wants_out = true;
      return kWouldBlock;
    case SSL_ERROR_ZERO_RETURN:
      return 0;
    default:
      return kFailed;
  }
}

// Advances the TLS handshake; false when it failed (the connection is to be closed).
bool H2Loop::handshake(H2Connection* c) {
  ERR_clear_error();
  const int rc = SSL_do_handshake(c->ssl);
  c->tls_wants_out = false;
  if (rc == 1) {
    c->handshaking = false;
    markDirty(c);  // the server's SETTINGS wait
    return true;
  }
  switch (SSL_get_error(c->ssl, rc)) {
    case SSL_ERROR_WANT_READ:
      return true;
    case SSL_ERROR_WANT_WRITE:
      c->tls_wants_out = true;
      markDirty(c);
      return true;
    default: {
      char reason[256] = {};
      ERR_error_string_n(ERR_peek_last_error(), reason, sizeof(reason));
      spdlog::info("feed: TLS handshake with {} on the watch listener failed: {}", c->peer,
                   reason[0] != '\0' ? reason : "connection closed");
      return false;
    }
  }
}

void H2Loop::setupConnection(int fd, std::string peer) {
  auto c = std::make_unique<H2Connection>();
  c->loop = this;
  c->fd = fd;
  c->peer = std::move(peer);
  if (server_->tls_ != nullptr) {
    c->ssl = SSL_new(server_->tls_);
    if (c->ssl == nullptr || SSL_set_fd(c->ssl, fd) != 1) {
      if (c->ssl != nullptr) SSL_free(c->ssl);
      ::close(fd);
      return;
    }
    SSL_set_accept_state(c->ssl);
    c->handshaking = true;
  }
  if (nghttp2_session_server_new2(&c->session, callbacks_, c.get(), options_) != 0) {
    ::close(fd);
    return;
  }
  const nghttp2_settings_entry settings[] = {
      {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, server_->options_.max_streams_per_connection},
      {NGHTTP2_SETTINGS_HEADER_TABLE_SIZE, 0},
      {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, kMaxHeaderListBytes}};
  nghttp2_submit_settings(c->session, NGHTTP2_FLAG_NONE, settings, 3);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = c.get();
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
  ++server_->connections_;
  markDirty(c.get());
  connections_.push_back(std::move(c));
}

void H2Loop::settle() {
  std::vector<Op> ops;
  std::vector<std::shared_ptr<Writable>> ready;
  for (;;) {
    takeInbox();
    {
      std::lock_guard lock(mutex_);
      wake_pending_ = false;
      ops.swap(ops_);
      ready.swap(ready_);
    }
    for (Op& op : ops) apply(op);
    ops.clear();
    for (auto& target : ready) target->startWrites();
    ready.clear();
    // Sending may finish writes (their events come next) and close streams.
    std::vector<H2Connection*> dirty;
    dirty.swap(dirty_);
    for (H2Connection* c : dirty) {
      c->dirty = false;
      if (!c->closed && !flush(c)) closeConnection(c);
    }
    std::vector<Event> events;
    events.swap(events_);
    for (const Event& event : events) deliver(event);
    bool more = false;
    {
      std::lock_guard lock(mutex_);
      more = !ops_.empty() || !ready_.empty() || !new_connections_.empty() ||
             (shutdown_ && !shutdown_done_);
    }
    if (!more && dirty_.empty() && events_.empty()) return;
  }
}

void H2Loop::apply(Op& op) {
  H2Call* call = op.call;
  if (op.cancel) {
    // RST_STREAM is not flow-controlled: it goes as soon as the socket takes it, and the
    // stream's close (streamGone) fails the write in flight and tells the handler.
    if (call->connection_ != nullptr && !call->stream_closed_) {
      nghttp2_submit_rst_stream(call->connection_->session, NGHTTP2_FLAG_NONE, call->stream_id_,
                                NGHTTP2_CANCEL);
      markDirty(call->connection_);
    }
    return;
  }
  if (op.message == nullptr) {
    // finish()
    if (call->finish_taken_) return;  // a second finish (after a cancel that crossed it)
    call->finish_taken_ = true;
    if (call->connection_ == nullptr) {
      // The stream is gone: the finish completes at once.
      events_.push_back({call, EventKind::kDone});
      return;
    }
    call->status_code_ = std::to_string(static_cast<int>(op.status.error_code()));
    call->status_message_ = percentEncoded(op.status.error_message().substr(0, kMaxStatusMessage));
    if (!call->headers_sent_) {
      call->headers_sent_ = true;
      const nghttp2_nv headers[] = {
          header(":status", "200"), header("content-type", "application/grpc"),
          header("grpc-status", call->status_code_), header("grpc-message", call->status_message_)};
      nghttp2_submit_response(call->connection_->session, call->stream_id_, headers,
                              call->status_message_.empty() ? 3 : 4, nullptr);
    } else {
      call->finishing_ = true;
      call->finishing_since_ = std::chrono::steady_clock::now();
      if (call->deferred_) {
        call->deferred_ = false;
        nghttp2_session_resume_data(call->connection_->session, call->stream_id_);
      }
    }
    markDirty(call->connection_);
    return;
  }
  // write()
  if (call->connection_ == nullptr || call->finish_taken_) {
    events_.push_back({call, EventKind::kWriteFailed});
    return;
  }
  call->out_.clear();
  if (!op.message->Dump(&call->out_).ok()) call->out_.clear();
  size_t size = 0;
  for (const auto& slice : call->out_) size += slice.size();
  call->prefix_[0] = 0;
  for (int b = 0; b < 4; ++b) {
    call->prefix_[1 + b] = static_cast<char>(static_cast<uint32_t>(size) >> (24 - 8 * b));
  }
  call->prefix_done_ = false;
  call->out_slice_ = 0;
  call->out_offset_ = 0;
  call->writing_ = true;
  if (!call->headers_sent_) {
    respondHeaders(call);
  } else if (call->deferred_) {
    call->deferred_ = false;
    nghttp2_session_resume_data(call->connection_->session, call->stream_id_);
  }
  markDirty(call->connection_);
}

void H2Loop::respondHeaders(H2Call* call) {
  call->headers_sent_ = true;
  const nghttp2_nv headers[] = {header(":status", "200"),
                                header("content-type", "application/grpc")};
  nghttp2_data_provider provider{};
  provider.source.ptr = call;
  provider.read_callback = onRead;
  nghttp2_submit_response(call->connection_->session, call->stream_id_, headers, 2, &provider);
}

void H2Loop::deliver(const Event& event) {
  H2Call* call = event.call;
  WatchCallHandler* handler = call->handler_;
  switch (event.kind) {
    case EventKind::kWriteDone:
    case EventKind::kWriteFailed:
      if (handler != nullptr) handler->OnWriteDone(event.kind == EventKind::kWriteDone);
      break;
    case EventKind::kCancel:
      if (handler != nullptr) handler->OnCancel();
      break;
    case EventKind::kDone:
      if (handler != nullptr) handler->OnDone();
      release(call);
      break;
  }
}

void H2Loop::release(H2Call* call) {
  if (call->opened_) --server_->calls_;
  delete call;
}

void H2Loop::markDirty(H2Connection* c) {
  if (c->dirty || c->closed) return;
  c->dirty = true;
  dirty_.push_back(c);
}

// Sends what nghttp2 has; watches for writability while the socket is full.
bool H2Loop::flush(H2Connection* c) {
  if (!c->handshaking && !sendFrames(c)) return false;
  const bool want_out = c->tls_wants_out || !c->pending.empty() ||
                        (!c->handshaking && nghttp2_session_want_write(c->session) != 0);
  if (want_out != c->want_out) {
    c->want_out = want_out;
    epoll_event ev{};
    ev.events = EPOLLIN | (want_out ? EPOLLOUT : 0u);
    ev.data.ptr = c;
    epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c->fd, &ev);
  }
  return c->handshaking || nghttp2_session_want_read(c->session) != 0 || want_out;
}

// Hands nghttp2's frames to the socket, gathered into writes of up to kSendBatchBytes, until
// nghttp2 has no more or the socket is full; false when the connection failed.
bool H2Loop::sendFrames(H2Connection* c) {
  if (!c->pending.empty()) {
    const ssize_t n = writeSome(c, c->pending.data(), c->pending.size());
    if (n == kFailed) return false;
    if (n == kWouldBlock) return true;
    c->pending.erase(0, static_cast<size_t>(n));
    if (!c->pending.empty()) return true;
    std::string().swap(c->pending);  // an idle connection keeps no buffer
  }
  for (;;) {
    out_.clear();
    while (out_.size() < kSendBatchBytes) {
      const uint8_t* data = nullptr;
      const ssize_t n = nghttp2_session_mem_send(c->session, &data);
      if (n < 0) return false;
      if (n == 0) break;
      out_.append(reinterpret_cast<const char*>(data), static_cast<size_t>(n));
    }
    if (out_.empty()) return true;
    size_t sent = 0;
    while (sent < out_.size()) {
      const ssize_t n = writeSome(c, out_.data() + sent, out_.size() - sent);
      if (n == kFailed) return false;
      if (n == kWouldBlock) break;
      sent += static_cast<size_t>(n);
    }
    if (sent < out_.size()) {
      c->pending.assign(out_, sent);
      return true;
    }
  }
}

// Writes to the connection: the bytes taken, kWouldBlock, or kFailed.
ssize_t H2Loop::writeSome(H2Connection* c, const char* data, size_t length) {
  if (c->ssl != nullptr) {
    ERR_clear_error();
    // Partial writes, and a retry from another address (pending), are allowed (setUpTls).
    const int n = SSL_write(c->ssl, data, static_cast<int>(std::min<size_t>(length, 1 << 20)));
    if (n > 0) return n;
    switch (SSL_get_error(c->ssl, n)) {
      case SSL_ERROR_WANT_WRITE:
      case SSL_ERROR_WANT_READ:  // a renegotiation waits for the client: EPOLLIN resumes it
        return kWouldBlock;
      default:
        return kFailed;
    }
  }
  for (;;) {
    const ssize_t n = ::send(c->fd, data, length, MSG_NOSIGNAL);
    if (n >= 0) return n;
    if (errno == EINTR) continue;
    return errno == EAGAIN || errno == EWOULDBLOCK ? kWouldBlock : kFailed;
  }
}

void H2Loop::closeConnection(H2Connection* c) {
  if (c->closed) return;
  c->closed = true;
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c->fd, nullptr);
  ::close(c->fd);
  c->fd = -1;
  if (c->ssl != nullptr) SSL_free(c->ssl);
  c->ssl = nullptr;
  // nghttp2 reports no stream closes when the session goes: every call is told here.
  std::vector<H2Call*> calls;
  calls.swap(c->calls);
  for (H2Call* call : calls) streamGone(call);
  nghttp2_session_del(c->session);
  c->session = nullptr;
  --server_->connections_;
  auto it = std::find_if(connections_.begin(), connections_.end(),
                         [c](const auto& p) { return p.get() == c; });
  closed_.push_back(std::move(*it));
  connections_.erase(it);
}

// The stream of `call` ended (reset, closed after the trailers, or its connection went).
void H2Loop::streamGone(H2Call* call) {
  H2Connection* c = call->connection_;
  call->connection_ = nullptr;
  call->stream_closed_ = true;
  if (c != nullptr && !c->closed) {
    auto& v = c->calls;
    v.erase(std::remove(v.begin(), v.end(), call), v.end());
  }
  if (c != nullptr && c->calls.empty()) c->idle_since = std::chrono::steady_clock::now();
  if (!call->opened_) {
    delete call;  // never a call: nobody else knows it
    return;
  }
  if (call->finish_taken_) {
    // Finished: done once the trailers went (or the client left meanwhile). A write cannot be
    // in flight (finish comes after the last write's completion).
    events_.push_back({call, EventKind::kDone});
    return;
  }
  if (call->writing_) {
    call->writing_ = false;
    call->out_.clear();
    events_.push_back({call, EventKind::kWriteFailed});
  }
  if (!call->cancel_reported_ && call->handler_ != nullptr) {
    call->cancel_reported_ = true;
    events_.push_back({call, EventKind::kCancel});
  }
  // A refused call (no handler) whose stream went before the refusal was sent: its finish is
  // queued and ends it.
}

void H2Loop::sweepIdle() {
  const auto now = std::chrono::steady_clock::now();
  const auto stall = server_->options_.stall_timeout;
  const auto keepalive = server_->options_.keepalive;
  std::vector<H2Connection*> idle;
  std::vector<H2Connection*> silent;
  for (auto& c : connections_) {
    if (c->calls.empty() && now - c->idle_since >= server_->options_.idle_timeout) {
      idle.push_back(c.get());
      continue;
    }
    if (keepalive.count() > 0 && !c->handshaking) {
      const bool outstanding = c->ping_sent > c->last_read;
      if (outstanding && now - c->ping_sent >= server_->options_.keepalive_timeout) {
        silent.push_back(c.get());
        continue;
      }
      if (!outstanding && now - c->last_read >= keepalive) {
        // Control frames are not flow-controlled: it goes out even to a client whose windows
        // are full, as soon as the socket takes it.
        nghttp2_submit_ping(c->session, NGHTTP2_FLAG_NONE, nullptr);
        c->ping_sent = now;
        markDirty(c.get());
      }
    }
    for (H2Call* call : c->calls) {
      if (!call->opened_ && !call->headers_sent_ && now - call->started_ >= stall) {
        reject(call, grpc::StatusCode::DEADLINE_EXCEEDED, "request: not complete in time");
        markDirty(c.get());
      } else if (call->finishing_ && now - call->finishing_since_ >= stall) {
        // The trailers wait for a window the client does not open: the call ends here.
        call->finishing_ = false;
        nghttp2_submit_rst_stream(c->session, NGHTTP2_FLAG_NONE, call->stream_id_, NGHTTP2_CANCEL);
        markDirty(c.get());
      }
    }
  }
  for (H2Connection* c : silent) {
    spdlog::info("feed: closing watch connection from {}: nothing came back to a ping within {} ms",
                 c->peer, server_->options_.keepalive_timeout.count());
    closeConnection(c);
  }
  for (H2Connection* c : idle) {
    spdlog::debug("feed: closing idle watch connection from {}", c->peer);
    nghttp2_submit_goaway(c->session, NGHTTP2_FLAG_NONE,
                          nghttp2_session_get_last_proc_stream_id(c->session), NGHTTP2_NO_ERROR,
                          nullptr, 0);
    if (!c->handshaking) (void)sendFrames(c);
    closeConnection(c);
  }
}

// --- requests

void H2Loop::checkRequest(H2Call* call, bool end_of_stream) {
  if (call->opened_ || call->headers_sent_) return;
  if (!call->post_) {
    reject(call, grpc::StatusCode::UNIMPLEMENTED, "only POST is served", "405");
    return;
  }
  if (!call->grpc_content_) {
    reject(call, grpc::StatusCode::UNKNOWN, "content-type: not application/grpc", "415");
    return;
  }
  if (!call->path_ok_) {
    reject(call, grpc::StatusCode::UNIMPLEMENTED,
           strCat("this listener serves ", kWatchPath, " only, not ", call->path_));
    return;
  }
  const std::string& r = call->request_;
  if (r.size() >= 5) {
    if (r[0] != 0) {
      reject(call, grpc::StatusCode::UNIMPLEMENTED, "compressed requests are not served");
      return;
    }
    uint32_t length = 0;
    for (int b = 1; b <= 4; ++b)
      length = (length << 8) | static_cast<uint8_t>(r[static_cast<size_t>(b)]);
    if (length > server_->options_.max_request_bytes) {
      reject(call, grpc::StatusCode::RESOURCE_EXHAUSTED,
             strCat("request: ", length, " bytes, more than the ",
                    server_->options_.max_request_bytes, " this listener reads"));
      return;
    }
    if (r.size() >= 5 + static_cast<size_t>(length)) {
      open(call, length);
      return;
    }
  }
  if (end_of_stream) {
    reject(call, grpc::StatusCode::INTERNAL, "request: the stream ended before the message");
  }
}

void H2Loop::open(H2Call* call, uint32_t length) {
  call->opened_ = true;
  ++server_->calls_;
  H2Connection* c = call->connection_;
  std::string authorization = std::move(call->authorization_);
  // What the request held is not needed any more: an idle call keeps no bytes of it.
  const std::string request = std::move(call->request_);
  std::string().swap(call->path_);
  server_->open_(call, std::string_view(request).substr(5, length), std::move(authorization),
                 c->peer);
}

void H2Loop::reject(H2Call* call, grpc::StatusCode code, std::string_view message,
                    const char* http_status) {
  call->headers_sent_ = true;
  call->finish_taken_ = true;
  const std::string code_text = std::to_string(static_cast<int>(code));
  const std::string message_text = percentEncoded(message.substr(0, kMaxStatusMessage));
  const nghttp2_nv headers[] = {
      header(":status", http_status), header("content-type", "application/grpc"),
      header("grpc-status", code_text), header("grpc-message", message_text)};
  nghttp2_submit_response(call->connection_->session, call->stream_id_, headers, 4, nullptr);
}

// --- nghttp2 callbacks (inside mem_recv and mem_send, on the loop's thread)

int H2Loop::onBeginHeaders(nghttp2_session* session, const nghttp2_frame* frame, void* user) {
  if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST) return 0;
  auto* c = static_cast<H2Connection*>(user);
  auto* call = new H2Call(c->loop, c, frame->hd.stream_id);
  c->calls.push_back(call);
  nghttp2_session_set_stream_user_data(session, frame->hd.stream_id, call);
  return 0;
}

int H2Loop::onHeader(nghttp2_session* session, const nghttp2_frame* frame, const uint8_t* name,
                     size_t namelen, const uint8_t* value, size_t valuelen, uint8_t, void*) {
  if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST) return 0;
  auto* call =
      static_cast<H2Call*>(nghttp2_session_get_stream_user_data(session, frame->hd.stream_id));
  if (call == nullptr) return 0;
  const std::string_view n(reinterpret_cast<const char*>(name), namelen);
  const std::string_view v(reinterpret_cast<const char*>(value), valuelen);
  if (n == ":method") {
    call->post_ = v == "POST";
  } else if (n == ":path") {
    call->path_ok_ = v == kWatchPath;
    if (!call->path_ok_) call->path_.assign(v.substr(0, 200));
  } else if (n == "content-type") {
    // application/grpc, or application/grpc+proto (and other suffixes gRPC allows).
    call->grpc_content_ = v == "application/grpc" || v.substr(0, 17) == "application/grpc+" ||
                          v.substr(0, 17) == "application/grpc;";
  } else if (n == "authorization") {
    // A longer one is no token of Krane's: refused as missing.
    if (v.size() <= 4096) call->authorization_.assign(v);
  }
  return 0;
}

int H2Loop::onFrameRecv(nghttp2_session* session, const nghttp2_frame* frame, void* user) {
  if (frame->hd.type != NGHTTP2_HEADERS && frame->hd.type != NGHTTP2_DATA) return 0;
  if (frame->hd.type == NGHTTP2_HEADERS && frame->headers.cat != NGHTTP2_HCAT_REQUEST &&
      (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) == 0) {
    return 0;
  }
  auto* call =
      static_cast<H2Call*>(nghttp2_session_get_stream_user_data(session, frame->hd.stream_id));
  if (call == nullptr) return 0;
  auto* c = static_cast<H2Connection*>(user);
  c->loop->checkRequest(call, (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0);
  return 0;
}

int H2Loop::onDataChunk(nghttp2_session* session, uint8_t, int32_t stream_id, const uint8_t* data,
                        size_t len, void* user) {
  auto* call = static_cast<H2Call*>(nghttp2_session_get_stream_user_data(session, stream_id));
  if (call == nullptr || call->opened_ || call->headers_sent_) return 0;  // after the request
  auto* c = static_cast<H2Connection*>(user);
  const size_t limit = 5 + c->loop->server_->options_.max_request_bytes;
  const size_t take = std::min(len, limit + 1 - std::min(limit + 1, call->request_.size()));
  call->request_.append(reinterpret_cast<const char*>(data), take);
  // The message may be complete before the stream's end (a client that keeps it open).
  c->loop->checkRequest(call, /*end_of_stream=*/false);
  return 0;
}

// The response ended (trailers, or a trailers-only answer) while the client keeps its side of
// the stream open: reset it, as gRPC's server does, so that the stream (and the call) ends.
int H2Loop::onFrameSend(nghttp2_session* session, const nghttp2_frame* frame, void*) {
  if ((frame->hd.type == NGHTTP2_HEADERS || frame->hd.type == NGHTTP2_DATA) &&
      (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0 &&
      nghttp2_session_get_stream_remote_close(session, frame->hd.stream_id) == 0) {
    nghttp2_submit_rst_stream(session, NGHTTP2_FLAG_NONE, frame->hd.stream_id, NGHTTP2_NO_ERROR);
  }
  return 0;
}

int H2Loop::onStreamClose(nghttp2_session* session, int32_t stream_id, uint32_t, void* user) {
  auto* call = static_cast<H2Call*>(nghttp2_session_get_stream_user_data(session, stream_id));
  if (call == nullptr) return 0;
  nghttp2_session_set_stream_user_data(session, stream_id, nullptr);
  static_cast<H2Connection*>(user)->loop->streamGone(call);
  return 0;
}

// The body of a call's response: each write is one message in one DATA frame or more (a frame
// holds at most one message, as gRPC frames them); after the finish, the trailers.
ssize_t H2Loop::onRead(nghttp2_session* session, int32_t stream_id, uint8_t* buf, size_t length,
                       uint32_t* flags, nghttp2_data_source* source, void* user) {
  auto* call = static_cast<H2Call*>(source->ptr);
  if (!call->writing_) {
    if (call->finishing_) {
      call->finishing_ = false;  // the trailers are on their way: nothing left to wait for
      *flags |= NGHTTP2_DATA_FLAG_EOF | NGHTTP2_DATA_FLAG_NO_END_STREAM;
      const nghttp2_nv trailers[] = {header("grpc-status", call->status_code_),
                                     header("grpc-message", call->status_message_)};
      if (nghttp2_submit_trailer(session, stream_id, trailers,
                                 call->status_message_.empty() ? 1 : 2) != 0) {
        return NGHTTP2_ERR_CALLBACK_FAILURE;
      }
      return 0;
    }
    call->deferred_ = true;
    return NGHTTP2_ERR_DEFERRED;
  }
  size_t n = 0;
  if (!call->prefix_done_) {
    const size_t take = std::min(length, sizeof(call->prefix_) - call->out_offset_);
    std::memcpy(buf, call->prefix_ + call->out_offset_, take);
    n += take;
    call->out_offset_ += take;
    if (call->out_offset_ < sizeof(call->prefix_)) return static_cast<ssize_t>(n);
    call->prefix_done_ = true;
    call->out_offset_ = 0;
  }
  while (n < length && call->out_slice_ < call->out_.size()) {
    const grpc::Slice& slice = call->out_[call->out_slice_];
    const size_t take = std::min(length - n, slice.size() - call->out_offset_);
    std::memcpy(buf + n, slice.begin() + call->out_offset_, take);
    n += take;
    call->out_offset_ += take;
    if (call->out_offset_ == slice.size()) {
      ++call->out_slice_;
      call->out_offset_ = 0;
    }
  }
  if (call->out_slice_ == call->out_.size()) {
    // The message is taken: the write is done. An idle call keeps no slice array.
    call->writing_ = false;
    std::vector<grpc::Slice>().swap(call->out_);
    static_cast<H2Connection*>(user)->loop->events_.push_back({call, EventKind::kWriteDone});
  }
  return static_cast<ssize_t>(n);
}

// ---------------------------------------------------------------------------------------------
// H2WatchServer

H2WatchServer::H2WatchServer(H2WatchOptions options, OpenH2WatchFn open)
    : options_(std::move(options)), open_(std::move(open)) {}

namespace {

std::string opensslError() {
  char reason[256] = {};
  ERR_error_string_n(ERR_get_error(), reason, sizeof(reason));
  return reason;
}

// Chooses h2, the only protocol served; a client that does not offer it gets no ALPN answer.
int selectH2(SSL*, const unsigned char** out, unsigned char* outlen, const unsigned char* in,
             unsigned int inlen, void*) {
  static const unsigned char kH2[] = {2, 'h', '2'};
  unsigned char* chosen = nullptr;
  if (SSL_select_next_proto(&chosen, outlen, kH2, sizeof(kH2), in, inlen) !=
      OPENSSL_NPN_NEGOTIATED) {
    return SSL_TLSEXT_ERR_NOACK;
  }
  *out = chosen;
  return SSL_TLSEXT_ERR_OK;
}

}  // namespace

absl::Status H2WatchServer::setUpTls() {
  const auto& t = options_.tls;
  tls_ = SSL_CTX_new(TLS_server_method());
  if (tls_ == nullptr) return absl::InternalError(strCat("TLS: ", opensslError()));
  SSL_CTX_set_min_proto_version(tls_, TLS1_2_VERSION);
  // Idle agents hold no record buffers; writes may be partial and retried from another address
  // (a connection's pending bytes).
  SSL_CTX_set_mode(tls_, SSL_MODE_RELEASE_BUFFERS | SSL_MODE_ENABLE_PARTIAL_WRITE |
                             SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  SSL_CTX_set_num_tickets(tls_, 0);  // no session tickets to keep or send
  // No renegotiation: a client could start one only to stall the loop's writes on its reads.
  SSL_CTX_set_options(tls_, SSL_OP_NO_RENEGOTIATION);
  if (SSL_CTX_use_certificate_chain_file(tls_, t.cert_file.c_str()) != 1) {
    return absl::InvalidArgumentError(
        strCat("tls.cert_file: cannot use ", t.cert_file, ": ", opensslError()));
  }
  if (SSL_CTX_use_PrivateKey_file(tls_, t.key_file.c_str(), SSL_FILETYPE_PEM) != 1 ||
      SSL_CTX_check_private_key(tls_) != 1) {
    return absl::InvalidArgumentError(
        strCat("tls.key_file: cannot use ", t.key_file, ": ", opensslError()));
  }
  if (!t.client_ca_file.empty()) {
    if (SSL_CTX_load_verify_locations(tls_, t.client_ca_file.c_str(), nullptr) != 1) {
      return absl::InvalidArgumentError(
          strCat("tls.client_ca_file: cannot use ", t.client_ca_file, ": ", opensslError()));
    }
    SSL_CTX_set_verify(tls_, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  }
  SSL_CTX_set_alpn_select_cb(tls_, selectH2, nullptr);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<H2WatchServer>> H2WatchServer::start(H2WatchOptions options,
                                                                    OpenH2WatchFn open) {
  auto [host, port] = splitHostPort(options.listen);
  if (!validHostPort(options.listen)) {
    return absl::InvalidArgumentError(
        strCat("feed.watch_listen: \"", options.listen, "\" is not host:port"));
  }
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  const bool any = isAnyAddress(host);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int rc =
          getaddrinfo(any || host == "*" ? nullptr : host.c_str(), port.c_str(), &hints, &found);
      rc != 0) {
    return absl::UnavailableError(
        strCat("cannot listen on ", options.listen, ": ", gai_strerror(rc)));
  }
  std::unique_ptr<H2WatchServer> server(new H2WatchServer(std::move(options), std::move(open)));
  if (!server->options_.tls.cert_file.empty()) {
    if (absl::Status st = server->setUpTls(); !st.ok()) {
      freeaddrinfo(found);
      return st;
    }
  }
  std::string last_error = "no address";
  for (addrinfo* a = found; a != nullptr && server->listener_ < 0; a = a->ai_next) {
    const int fd =
        ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    const int yes = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, 4096) != 0) {
      last_error = std::strerror(errno);
      ::close(fd);
      continue;
    }
    server->listener_ = fd;
  }
  freeaddrinfo(found);
  if (server->listener_ < 0) {
    return absl::UnavailableError(strCat("cannot listen on ", server->options_.listen, ": ",
                                         last_error, " (in use, or not a local address?)"));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  getsockname(server->listener_, reinterpret_cast<sockaddr*>(&bound), &len);
  server->port_ =
      ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6&>(bound).sin6_port
                                        : reinterpret_cast<sockaddr_in&>(bound).sin_port);
  server->wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  for (size_t i = 0; i < std::max<size_t>(1, server->options_.threads); ++i) {
    server->loops_.push_back(std::make_unique<H2Loop>(server.get()));
  }
  for (auto& loop : server->loops_) {
    server->threads_.emplace_back([loop = loop.get()] { loop->run(); });
  }
  server->acceptor_ = std::thread([s = server.get()] { s->acceptLoop(); });
  return server;
}

H2WatchServer::~H2WatchServer() {
  stop();
  loops_.clear();
  if (tls_ != nullptr) SSL_CTX_free(tls_);
}

void H2WatchServer::acceptLoop() {
  epoll_event events[2];
  const int epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = listener_;
  epoll_ctl(epoll_fd, EPOLL_CTL_ADD, listener_, &ev);
  ev.data.fd = wake_fd_;
  epoll_ctl(epoll_fd, EPOLL_CTL_ADD, wake_fd_, &ev);
  size_t next = 0;
  while (!shut_down_) {
    const int n = epoll_wait(epoll_fd, events, 2, -1);
    for (int i = 0; i < n && !shut_down_; ++i) {
      if (events[i].data.fd != listener_) continue;
      for (;;) {
        sockaddr_storage addr{};
        socklen_t len = sizeof(addr);
        const int fd = ::accept4(listener_, reinterpret_cast<sockaddr*>(&addr), &len,
                                 SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
          if (errno == EINTR || errno == ECONNABORTED) continue;
          if (errno != EAGAIN && errno != EWOULDBLOCK) {
            // Out of descriptors, most likely: say so, and let the backlog wait a moment.
            spdlog::warn("feed: watch listener cannot accept: {}", std::strerror(errno));
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
          }
          break;
        }
        const int yes = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof(yes));
        loops_[next++ % loops_.size()]->addConnection(fd, peerOf(addr));
      }
    }
  }
  ::close(epoll_fd);
}

void H2WatchServer::shutdown() {
  if (shut_down_.exchange(true)) return;
  const uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof(one));
  if (acceptor_.joinable()) acceptor_.join();
  for (auto& loop : loops_) loop->shutdown();
}

void H2WatchServer::stop(std::chrono::milliseconds grace) {
  if (stopped_) return;
  stopped_ = true;
  shutdown();
  const auto deadline = std::chrono::steady_clock::now() + grace;
  while (calls_ > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (calls_ > 0) {
    spdlog::warn(
        "feed: {} Watch calls of the watch listener still open {} ms after its shutdown; "
        "abandoned",
        calls_.load(), grace.count());
  }
  for (auto& loop : loops_) loop->close();
  for (auto& t : threads_) t.join();
  // The loops stay until the server goes: an abandoned call may still write to its loop.
  if (listener_ >= 0) ::close(listener_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
  listener_ = wake_fd_ = -1;
}

}  // namespace krane::feed
