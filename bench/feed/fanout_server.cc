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
//   --mode nghttp2   no gRPC at all: gRPC's wire protocol (length-prefixed messages on HTTP/2)
//                    served with nghttp2 from one epoll loop per core, each owning the
//                    connections it was handed. What a Watch server of Krane's own could spend.
//
// `--rate 0` sends no change: the streams stay idle after their bookmark (for memory).
//
// Prints "listening on PORT" once it serves; runs until killed.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/alarm.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/support/byte_buffer.h>
#include <nghttp2/nghttp2.h>

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

// Calls `tick(version)` `rate` times a second, on a fixed schedule, from its own thread; with
// rate 0, never.
void runTicker(double rate, const std::function<void(grpc::Slice)>& tick) {
  if (rate <= 0) {
    for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
  }
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
    // Nothing more once the client went away or the stream is finishing: a write started after
    // Finish() aborts the process.
    if (done_ || cancelled_ || finished_) return;
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
    if (!ok || cancelled_) {
      pending_.clear();
      finishLocked();
      return;
    }
    if (!pending_.empty()) startLocked();
  }
  void OnCancel() override {
    std::lock_guard lock(mutex_);
    cancelled_ = true;
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
  bool cancelled_ = false;
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

// ---------------------------------------------------------------------------------------------
// nghttp2: gRPC's wire protocol without gRPC.

// A message as gRPC frames it: not compressed, its length (4 bytes, big-endian), the bytes.
std::string grpcFrame(const grpc::Slice& message) {
  std::string out(5 + message.size(), '\0');
  const auto n = static_cast<uint32_t>(message.size());
  for (int b = 0; b < 4; ++b)
    out[static_cast<size_t>(1 + b)] = static_cast<char>(n >> (24 - 8 * b));
  std::memcpy(out.data() + 5, message.begin(), message.size());
  return out;
}

using Framed = std::shared_ptr<const std::string>;

struct H2Stream {
  int32_t id = 0;
  // Framed messages not yet taken by nghttp2, shared by every stream (as gRPC's slices are);
  // [head, size) are due, and the first of them from `offset`. Empty (no storage) when idle.
  std::vector<Framed> pending;
  size_t head = 0;
  size_t offset = 0;
  bool deferred = false;  // nghttp2 waits for resume_data
};

struct H2Connection {
  int fd = -1;
  bool want_out = false;
  bool closed = false;  // closed in this turn of the loop; freed at its end
  nghttp2_session* session = nullptr;
  std::vector<std::unique_ptr<H2Stream>> streams;
};

ssize_t h2Send(nghttp2_session*, const uint8_t* data, size_t length, int, void* user) {
  auto* c = static_cast<H2Connection*>(user);
  const ssize_t n = ::send(c->fd, data, length, MSG_NOSIGNAL);
  if (n < 0)
    return errno == EAGAIN || errno == EWOULDBLOCK ? NGHTTP2_ERR_WOULDBLOCK
                                                   : NGHTTP2_ERR_CALLBACK_FAILURE;
  return n;
}

// At most one message per DATA frame, as gRPC frames each message it is given.
ssize_t h2Read(nghttp2_session*, int32_t, uint8_t* buf, size_t length, uint32_t*,
               nghttp2_data_source* source, void*) {
  auto* s = static_cast<H2Stream*>(source->ptr);
  if (s->head == s->pending.size()) {
    s->deferred = true;
    return NGHTTP2_ERR_DEFERRED;
  }
  const std::string& message = *s->pending[s->head];
  const size_t n = std::min(message.size() - s->offset, length);
  std::memcpy(buf, message.data() + s->offset, n);
  s->offset += n;
  if (s->offset == message.size()) {
    s->offset = 0;
    if (++s->head == s->pending.size()) {
      std::vector<Framed>().swap(s->pending);  // idle streams hold no storage
      s->head = 0;
    }
  }
  return static_cast<ssize_t>(n);
}

// A request's headers are in: answer with the response headers and a body that never ends,
// starting with a bookmark.
int h2FrameRecv(nghttp2_session* session, const nghttp2_frame* frame, void* user) {
  if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST) return 0;
  auto* c = static_cast<H2Connection*>(user);
  auto s = std::make_unique<H2Stream>();
  s->id = frame->hd.stream_id;
  static const Framed kBookmark = std::make_shared<const std::string>(grpcFrame(bookmark()));
  s->pending.push_back(kBookmark);
  const char status[] = ":status";
  const char ok[] = "200";
  const char type[] = "content-type";
  const char grpc_type[] = "application/grpc";
  nghttp2_nv headers[] = {
      {(uint8_t*)status, (uint8_t*)ok, sizeof(status) - 1, sizeof(ok) - 1, NGHTTP2_NV_FLAG_NONE},
      {(uint8_t*)type, (uint8_t*)grpc_type, sizeof(type) - 1, sizeof(grpc_type) - 1,
       NGHTTP2_NV_FLAG_NONE}};
  nghttp2_data_provider provider{};
  provider.source.ptr = s.get();
  provider.read_callback = h2Read;
  if (nghttp2_submit_response(session, s->id, headers, 2, &provider) != 0) return 0;
  c->streams.push_back(std::move(s));
  return 0;
}

int h2StreamClose(nghttp2_session*, int32_t id, uint32_t, void* user) {
  auto* c = static_cast<H2Connection*>(user);
  auto& v = c->streams;
  v.erase(std::remove_if(v.begin(), v.end(), [id](const auto& s) { return s->id == id; }), v.end());
  return 0;
}

class H2Loop {
 public:
  H2Loop() {
    epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
    wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = nullptr;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
    nghttp2_session_callbacks_new(&callbacks_);
    nghttp2_session_callbacks_set_send_callback(callbacks_, h2Send);
    nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks_, h2FrameRecv);
    nghttp2_session_callbacks_set_on_stream_close_callback(callbacks_, h2StreamClose);
    // As lenient as gRPC's server: no check of the request's HTTP semantics (the floor's client
    // sends an empty bearer token, a value RFC 9113 does not allow to end in a space).
    nghttp2_option_new(&options_);
    nghttp2_option_set_no_http_messaging(options_, 1);
    // No HPACK dynamic tables: a stream's headers come once, so remembering them buys nothing
    // and costs memory on every connection (1.6 KiB per idle agent, measured).
    nghttp2_option_set_max_deflate_dynamic_table_size(options_, 0);
  }

  // From the acceptor or the ticker.
  void addConnection(int fd) {
    {
      std::lock_guard lock(mutex_);
      new_fds_.push_back(fd);
    }
    wake();
  }
  void post(Framed framed) {
    {
      std::lock_guard lock(mutex_);
      inbox_.push_back(std::move(framed));
    }
    wake();
  }

  void run() {
    std::vector<epoll_event> events(256);
    std::vector<uint8_t> buffer(64 << 10);
    for (;;) {
      const int n = epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()), -1);
      for (int i = 0; i < n; ++i) {
        auto* c = static_cast<H2Connection*>(events[static_cast<size_t>(i)].data.ptr);
        if (c == nullptr) {
          takeInbox();
          continue;
        }
        if (c->closed) continue;  // closed earlier in this batch
        const uint32_t what = events[static_cast<size_t>(i)].events;
        bool alive = true;
        if (what & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
          for (;;) {
            const ssize_t got = ::recv(c->fd, buffer.data(), buffer.size(), 0);
            if (got > 0) {
              if (nghttp2_session_mem_recv(c->session, buffer.data(), static_cast<size_t>(got)) <
                  0) {
                alive = false;
                break;
              }
              continue;
            }
            if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
            alive = false;  // closed or failed
            break;
          }
        }
        if (alive) alive = flush(*c);
        if (!alive) close(c);
      }
      closed_.clear();  // no event of this batch refers to them any more
    }
  }

 private:
  void wake() {
    const uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof(one));
  }

  void takeInbox() {
    uint64_t count = 0;
    (void)!::read(wake_fd_, &count, sizeof(count));
    std::vector<int> fds;
    std::vector<Framed> messages;
    {
      std::lock_guard lock(mutex_);
      fds.swap(new_fds_);
      messages.swap(inbox_);
    }
    for (int fd : fds) {
      auto c = std::make_unique<H2Connection>();
      c->fd = fd;
      nghttp2_session_server_new2(&c->session, callbacks_, c.get(), options_);
      const nghttp2_settings_entry settings[] = {{NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, 1000},
                                                 {NGHTTP2_SETTINGS_HEADER_TABLE_SIZE, 0}};
      nghttp2_submit_settings(c->session, NGHTTP2_FLAG_NONE, settings, 2);
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.ptr = c.get();
      epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
      H2Connection* raw = c.get();
      connections_.push_back(std::move(c));
      if (!flush(*raw)) close(raw);
    }
    if (messages.empty()) return;
    for (auto& c : connections_) {
      for (auto& s : c->streams) {
        s->pending.insert(s->pending.end(), messages.begin(), messages.end());
        if (s->deferred) {
          s->deferred = false;
          nghttp2_session_resume_data(c->session, s->id);
        }
      }
    }
    std::vector<H2Connection*> failed;
    for (auto& c : connections_) {
      if (!flush(*c)) failed.push_back(c.get());
    }
    for (H2Connection* c : failed) close(c);
  }

  // Sends what nghttp2 has; watches for writability while the socket is full.
  bool flush(H2Connection& c) {
    if (nghttp2_session_send(c.session) != 0) return false;
    const bool want_out = nghttp2_session_want_write(c.session) != 0;
    if (want_out != c.want_out) {
      c.want_out = want_out;
      epoll_event ev{};
      ev.events = EPOLLIN | (want_out ? EPOLLOUT : 0u);
      ev.data.ptr = &c;
      epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c.fd, &ev);
    }
    return nghttp2_session_want_read(c.session) != 0 || want_out;
  }

  // Closes `c` now and frees it at the end of the loop's turn: a later event of the same batch
  // may still name it.
  void close(H2Connection* c) {
    if (c->closed) return;
    c->closed = true;
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c->fd, nullptr);
    ::close(c->fd);
    nghttp2_session_del(c->session);
    c->session = nullptr;
    auto it = std::find_if(connections_.begin(), connections_.end(),
                           [c](const auto& p) { return p.get() == c; });
    closed_.push_back(std::move(*it));
    connections_.erase(it);
  }

  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  nghttp2_session_callbacks* callbacks_ = nullptr;
  nghttp2_option* options_ = nullptr;
  std::mutex mutex_;
  std::vector<int> new_fds_;
  std::vector<Framed> inbox_;
  std::vector<std::unique_ptr<H2Connection>> connections_;  // the loop thread's only
  std::vector<std::unique_ptr<H2Connection>> closed_;       // closed in this turn
};

int serveNghttp2(const std::string& address, double rate, size_t threads) {
  const size_t colon = address.rfind(':');
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::stoi(address.substr(colon + 1))));
  if (inet_pton(AF_INET, address.substr(0, colon).c_str(), &addr.sin_addr) != 1) return 1;
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int yes = 1;
  setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  if (::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(listener, 4096) != 0) {
    return 1;
  }
  socklen_t len = sizeof(addr);
  getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  std::vector<std::unique_ptr<H2Loop>> loops;
  std::vector<std::thread> workers;
  for (size_t t = 0; t < threads; ++t) loops.push_back(std::make_unique<H2Loop>());
  for (auto& loop : loops) workers.emplace_back([&loop] { loop->run(); });
  std::thread acceptor([&] {
    for (size_t k = 0;; ++k) {
      const int fd = ::accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) continue;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof(yes));
      loops[k % loops.size()]->addConnection(fd);
    }
  });
  std::printf("listening on %d\n", ntohs(addr.sin_port));
  std::fflush(stdout);
  runTicker(rate, [&](const grpc::Slice& message) {
    Framed framed = std::make_shared<const std::string>(grpcFrame(message));
    for (auto& loop : loops) loop->post(framed);
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
  if (mode == "nghttp2") return serveNghttp2(address, rate, threads);
  std::fprintf(stderr, "fanout_server: --mode is callback, async or nghttp2, not %s\n",
               mode.c_str());
  return 2;
}

}  // namespace
}  // namespace krane::bench

int main(int argc, char** argv) { return krane::bench::run(argc, argv); }
