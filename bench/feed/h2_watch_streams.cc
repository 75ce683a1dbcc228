#include "bench/feed/h2_watch_streams.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include <google/protobuf/arena.h>
#include <nghttp2/nghttp2.h>

#include "common/strings.h"

namespace krane::bench {

using cluster::v1::WatchEvent;

namespace {

constexpr const char* kWatchPath = "/krane.cluster.v1.ClusterService/Watch";
// Generous flow-control windows: the client reads everything at once, so they only keep the
// server from waiting on WINDOW_UPDATEs.
constexpr uint32_t kStreamWindow = 4 << 20;
constexpr int32_t kConnectionWindow = 64 << 20;
constexpr size_t kGrpcPrefix = 5;  // compressed flag, then the length (big-endian)

nghttp2_nv header(const std::string& name, const std::string& value) {
  return nghttp2_nv{reinterpret_cast<uint8_t*>(const_cast<char*>(name.data())),
                    reinterpret_cast<uint8_t*>(const_cast<char*>(value.data())), name.size(),
                    value.size(), NGHTTP2_NV_FLAG_NONE};
}

std::string errnoText(const char* what) { return strCat(what, ": ", std::strerror(errno)); }

}  // namespace

struct H2WatchStreams::Stream {
  explicit Stream(StreamTally& tally) : recorder(tally) {}
  StreamRecorder recorder;
  std::string request;  // the length-prefixed WatchRequest
  size_t request_sent = 0;
  std::string partial;      // bytes of a message not complete yet
  std::string grpc_status;  // from the trailers (or a trailers-only answer)
  std::string grpc_message;
  bool done = false;
};

struct H2WatchStreams::Connection {
  int fd = -1;
  nghttp2_session* session = nullptr;
  std::vector<std::unique_ptr<Stream>> streams;
  std::string out;  // bytes nghttp2 produced that the socket did not take yet
  bool want_out = false;
  bool broken = false;
  std::string error;                         // why a callback failed
  google::protobuf::Arena* arena = nullptr;  // the loop's
  StreamTally* tally = nullptr;

  ~Connection() {
    if (session != nullptr) nghttp2_session_del(session);
    if (fd >= 0) ::close(fd);
  }
};

struct H2WatchStreams::Loop {
  int epoll_fd = -1;
  int wake_fd = -1;
  std::thread thread;
  google::protobuf::Arena arena;  // the messages of its connections, reset after each

  ~Loop() {
    if (epoll_fd >= 0) ::close(epoll_fd);
    if (wake_fd >= 0) ::close(wake_fd);
  }
};

namespace {

using Stream = H2WatchStreams::Stream;
using Connection = H2WatchStreams::Connection;

// Parses one gRPC message of a stream (`data` after its prefix) and records it; false when it
// is not an uncompressed WatchEvent.
bool takeMessage(Connection& c, Stream& s, const uint8_t* prefix, const uint8_t* data, size_t size,
                 int64_t received) {
  if (prefix[0] != 0) {
    c.error = "krane-ctrl sent a compressed message, which the benchmark does not ask for";
    return false;
  }
  auto* event = google::protobuf::Arena::CreateMessage<WatchEvent>(c.arena);
  const bool parsed = event->ParseFromArray(data, static_cast<int>(size));
  if (parsed) s.recorder.message(*event, received);
  c.arena->Reset();
  if (!parsed) c.error = "krane-ctrl sent a message that is not a WatchEvent";
  return parsed;
}

int onDataChunk(nghttp2_session* session, uint8_t, int32_t stream_id, const uint8_t* data,
                size_t len, void* user_data) {
  auto& c = *static_cast<Connection*>(user_data);
  auto* s = static_cast<Stream*>(nghttp2_session_get_stream_user_data(session, stream_id));
  if (s == nullptr) return 0;
  const int64_t received = nowNs();
  // Whole messages are parsed where they lie; only a message cut by the chunk's end is copied.
  bool ok = true;
  auto parse = [&](const uint8_t* p, size_t n) -> size_t {
    size_t used = 0;
    while (ok && n - used >= kGrpcPrefix) {
      const uint32_t length = (uint32_t{p[used + 1]} << 24) | (uint32_t{p[used + 2]} << 16) |
                              (uint32_t{p[used + 3]} << 8) | uint32_t{p[used + 4]};
      if (n - used - kGrpcPrefix < length) break;
      ok = takeMessage(c, *s, p + used, p + used + kGrpcPrefix, length, received);
      used += kGrpcPrefix + length;
    }
    return used;
  };
  if (s->partial.empty()) {
    const size_t used = parse(data, len);
    s->partial.assign(reinterpret_cast<const char*>(data) + used, len - used);
  } else {
    s->partial.append(reinterpret_cast<const char*>(data), len);
    const size_t used =
        parse(reinterpret_cast<const uint8_t*>(s->partial.data()), s->partial.size());
    s->partial.erase(0, used);
  }
  return ok ? 0 : NGHTTP2_ERR_CALLBACK_FAILURE;
}

int onHeader(nghttp2_session* session, const nghttp2_frame* frame, const uint8_t* name,
             size_t namelen, const uint8_t* value, size_t valuelen, uint8_t, void*) {
  if (frame->hd.type != NGHTTP2_HEADERS) return 0;
  auto* s =
      static_cast<Stream*>(nghttp2_session_get_stream_user_data(session, frame->hd.stream_id));
  if (s == nullptr) return 0;
  const std::string_view key(reinterpret_cast<const char*>(name), namelen);
  const std::string_view text(reinterpret_cast<const char*>(value), valuelen);
  if (key == "grpc-status") s->grpc_status = std::string(text);
  if (key == "grpc-message") s->grpc_message = std::string(text);
  return 0;
}

int onStreamClose(nghttp2_session* session, int32_t stream_id, uint32_t error_code,
                  void* user_data) {
  auto& c = *static_cast<Connection*>(user_data);
  auto* s = static_cast<Stream*>(nghttp2_session_get_stream_user_data(session, stream_id));
  if (s == nullptr || s->done) return 0;
  s->done = true;
  std::string error;
  if (error_code != NGHTTP2_NO_ERROR) {
    error = strCat("Watch ended: stream reset by the server (HTTP/2 error ", error_code, ")");
  } else if (s->grpc_status != "0") {
    error = strCat("Watch ended: status ", s->grpc_status.empty() ? "missing" : s->grpc_status,
                   ": ", s->grpc_message);
  }
  c.tally->ended(error);
  return 0;
}

ssize_t readRequest(nghttp2_session*, int32_t, uint8_t* buf, size_t length, uint32_t* data_flags,
                    nghttp2_data_source* source, void*) {
  auto& s = *static_cast<Stream*>(source->ptr);
  const size_t n = std::min(length, s.request.size() - s.request_sent);
  std::memcpy(buf, s.request.data() + s.request_sent, n);
  s.request_sent += n;
  if (s.request_sent == s.request.size()) *data_flags |= NGHTTP2_DATA_FLAG_EOF;
  return static_cast<ssize_t>(n);
}

// Ends every stream of a connection that failed.
void breakConnection(Connection& c, const std::string& why) {
  if (c.broken) return;
  c.broken = true;
  for (auto& s : c.streams) {
    if (s->done) continue;
    s->done = true;
    c.tally->ended(strCat("Watch ended: ", why));
  }
}

// Writes what nghttp2 has to send, keeping what the socket does not take (all of it goes on a
// blocking socket, during set-up); false when the socket failed.
bool flush(Connection& c) {
  for (;;) {
    if (!c.out.empty()) {
      const ssize_t n = ::send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
        if (errno == EINTR) continue;
        return false;
      }
      c.out.erase(0, static_cast<size_t>(n));
      if (!c.out.empty()) return true;
    }
    const uint8_t* data = nullptr;
    const ssize_t n = nghttp2_session_mem_send(c.session, &data);
    if (n < 0) return false;
    if (n == 0) return true;
    c.out.assign(reinterpret_cast<const char*>(data), static_cast<size_t>(n));
  }
}

void watchOutput(int epoll_fd, Connection& c) {
  const bool want = !c.out.empty();
  if (want == c.want_out) return;
  c.want_out = want;
  epoll_event ev{};
  ev.events = EPOLLIN | (want ? static_cast<uint32_t>(EPOLLOUT) : 0u);
  ev.data.ptr = &c;
  epoll_ctl(epoll_fd, EPOLL_CTL_MOD, c.fd, &ev);
}

int connectTo(const std::string& target) {
  const size_t colon = target.rfind(':');
  if (colon == std::string::npos) throw std::runtime_error(strCat("bad target ", target));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::stoi(target.substr(colon + 1))));
  if (inet_pton(AF_INET, target.substr(0, colon).c_str(), &addr.sin_addr) != 1) {
    throw std::runtime_error(strCat("not an IPv4 address: ", target));
  }
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error(errnoText("socket"));
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const std::string error = errnoText(strCat("connect ", target).c_str());
    ::close(fd);
    throw std::runtime_error(error);
  }
  return fd;
}

}  // namespace

H2WatchStreams::H2WatchStreams(const std::string& target, const std::string& token,
                               const std::string& region, uint64_t version, size_t count,
                               size_t per_connection, bool accept_batches, size_t threads)
    : WatchStreams(count) {
  for (size_t i = 0; i < std::max<size_t>(threads, 1); ++i) {
    auto loop = std::make_unique<Loop>();
    loop->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    loop->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (loop->epoll_fd < 0 || loop->wake_fd < 0) throw std::runtime_error(errnoText("epoll"));
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = nullptr;  // the wake-up
    epoll_ctl(loop->epoll_fd, EPOLL_CTL_ADD, loop->wake_fd, &ev);
    loops_.push_back(std::move(loop));
  }

  nghttp2_session_callbacks* callbacks = nullptr;
  nghttp2_session_callbacks_new(&callbacks);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks, onDataChunk);
  nghttp2_session_callbacks_set_on_header_callback(callbacks, onHeader);
  nghttp2_session_callbacks_set_on_stream_close_callback(callbacks, onStreamClose);
  const std::string method = ":method", post = "POST", scheme = ":scheme", http = "http",
                    path = ":path", watch = kWatchPath, authority = ":authority",
                    content_type = "content-type", grpc = "application/grpc", te = "te",
                    trailers = "trailers", authorization = "authorization",
                    bearer = "Bearer " + token;
  const nghttp2_nv headers[] = {header(method, post),         header(scheme, http),
                                header(path, watch),          header(authority, target),
                                header(content_type, grpc),   header(te, trailers),
                                header(authorization, bearer)};
  const size_t group = std::max<size_t>(per_connection, 1);
  try {
    for (size_t first = 0; first < count; first += group) {
      auto c = std::make_unique<Connection>();
      Loop& loop = *loops_[connections_.size() % loops_.size()];
      c->fd = connectTo(target);
      c->arena = &loop.arena;
      c->tally = &tally_;
      nghttp2_session_client_new(&c->session, callbacks, c.get());
      const nghttp2_settings_entry settings[] = {
          {NGHTTP2_SETTINGS_ENABLE_PUSH, 0}, {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, kStreamWindow}};
      nghttp2_submit_settings(c->session, NGHTTP2_FLAG_NONE, settings, 2);
      nghttp2_session_set_local_window_size(c->session, NGHTTP2_FLAG_NONE, 0, kConnectionWindow);
      for (size_t i = first; i < std::min(count, first + group); ++i) {
        auto s = std::make_unique<Stream>(tally_);
        const std::string body =
            watchRequest(region, version, i, accept_batches).SerializeAsString();
        s->request.resize(kGrpcPrefix);
        s->request[0] = 0;
        for (int b = 0; b < 4; ++b) {
          s->request[static_cast<size_t>(1 + b)] = static_cast<char>(body.size() >> (24 - 8 * b));
        }
        s->request += body;
        nghttp2_data_provider provider{};
        provider.source.ptr = s.get();
        provider.read_callback = readRequest;
        if (nghttp2_submit_request(c->session, nullptr, headers, std::size(headers), &provider,
                                   s.get()) < 0) {
          throw std::runtime_error("nghttp2 refused a request");
        }
        c->streams.push_back(std::move(s));
      }
      // Blocking while nothing runs yet: the requests go out before the loops start.
      if (!flush(*c) || !c->out.empty()) {
        throw std::runtime_error(errnoText(strCat("sending to ", target).c_str()));
      }
      const int flags = fcntl(c->fd, F_GETFL);
      fcntl(c->fd, F_SETFL, flags | O_NONBLOCK);
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.ptr = c.get();
      epoll_ctl(loop.epoll_fd, EPOLL_CTL_ADD, c->fd, &ev);
      connections_.push_back(std::move(c));
    }
  } catch (...) {
    nghttp2_session_callbacks_del(callbacks);
    throw;
  }
  nghttp2_session_callbacks_del(callbacks);

  for (auto& loop : loops_) {
    Loop* l = loop.get();
    l->thread = std::thread([this, l] {
      std::vector<epoll_event> events(256);
      std::vector<uint8_t> buffer(256 << 10);
      while (!stopping_.load(std::memory_order_relaxed)) {
        const int n = epoll_wait(l->epoll_fd, events.data(), static_cast<int>(events.size()), 200);
        for (int i = 0; i < n; ++i) {
          auto* c = static_cast<Connection*>(events[static_cast<size_t>(i)].data.ptr);
          if (c == nullptr || c->broken) continue;  // the wake-up, or a dead connection
          bool ok = true;
          std::string why = "connection closed by the server";
          if (events[static_cast<size_t>(i)].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
            for (;;) {
              const ssize_t got = ::recv(c->fd, buffer.data(), buffer.size(), 0);
              if (got > 0) {
                if (nghttp2_session_mem_recv(c->session, buffer.data(), static_cast<size_t>(got)) <
                    0) {
                  ok = false;
                  why = c->error.empty() ? "HTTP/2 protocol error" : c->error;
                  break;
                }
                if (static_cast<size_t>(got) < buffer.size()) break;
                continue;
              }
              if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
              if (got < 0 && errno == EINTR) continue;
              ok = false;
              break;
            }
          }
          if (ok && !flush(*c)) {
            ok = false;
            why = errnoText("send");
          }
          if (!ok) {
            epoll_ctl(l->epoll_fd, EPOLL_CTL_DEL, c->fd, nullptr);
            breakConnection(*c, why);
            continue;
          }
          watchOutput(l->epoll_fd, *c);
        }
      }
    });
  }
}

H2WatchStreams::~H2WatchStreams() { close(); }

std::vector<std::vector<Sample>> H2WatchStreams::takeSamples() {
  std::vector<std::vector<Sample>> out;
  out.reserve(count_);
  for (auto& c : connections_) {
    for (auto& s : c->streams) out.push_back(s->recorder.takeSamples());
  }
  return out;
}

void H2WatchStreams::close() {
  if (closed_) return;
  closed_ = true;
  stopping_ = true;
  for (auto& loop : loops_) {
    const uint64_t one = 1;
    [[maybe_unused]] auto written = ::write(loop->wake_fd, &one, sizeof(one));
  }
  for (auto& loop : loops_) {
    if (loop->thread.joinable()) loop->thread.join();
  }
  // Closing a connection cancels its streams on the server, as a cancelled call does.
  for (auto& c : connections_) {
    for (auto& s : c->streams) {
      if (!s->done) {
        s->done = true;
        tally_.ended("");
      }
    }
  }
  connections_.clear();
  loops_.clear();
}

}  // namespace krane::bench
