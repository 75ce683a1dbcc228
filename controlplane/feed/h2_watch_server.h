// The feed's own listener for agents' Watch calls: gRPC's wire protocol (length-prefixed
// messages on HTTP/2, status in trailers) served with nghttp2 from one epoll loop per thread,
// for nothing but `krane.cluster.v1.ClusterService/Watch`. Agents reach it with their ordinary
// gRPC client: heartbeat answers tell them its port (or control_plane.watch_address names it).
//
// Why a second listener: an idle Watch on gRPC's server costs about 39 KiB, most of it gRPC's
// own per-connection state (a call arena of 11.5 KiB, an 8 KiB read buffer, the table of every
// registered method), which a replica serving thousands of agents pays for each of them. Here a
// connection holds its HTTP/2 session and a small record per call; reads go through one buffer
// per loop, and a message is copied from the bytes shared by every stream (encoded_event.h)
// straight into its DATA frame (bench/README.md, "Measured: the watch listener").
//
// What it serves, as gRPC's server would: each request message is read whole (up to
// max_request_bytes, not compressed) and handed to the opener with the request's
// `authorization` header; each write is one message; finish() sends grpc-status and
// grpc-message as trailers (a call refused before any write gets a trailers-only response). Other
// paths get UNIMPLEMENTED, other content types HTTP 415. A client that resets its stream or
// drops the connection is reported to the handler (a write in flight fails, then OnCancel).
// Flow control is HTTP/2's: a write completes when the client's window took its last byte, so
// an agent that stops reading stops completing writes, and its stream's queue grows until the
// stream is told to resync (watch_stream.h).
//
// TLS is krane-ctrl's (tls.*, with client certificates when tls.client_ca_file is set): OpenSSL
// on the loop's nonblocking sockets, releasing a connection's record buffers while it is idle
// (SSL_MODE_RELEASE_BUFFERS). Not served: compressed messages, grpc-timeout (Watch calls of agents
// have no deadline).
//
// Bounds against clients that misbehave: max_streams_per_connection calls per connection, a
// request of at most max_request_bytes that must arrive within stall_timeout, an authorization
// header of at most 4 KiB; a stream whose response ended is reset if the client keeps its own
// side open (as gRPC's server does), so it cannot pin the call.
//
// Threads: one acceptor, `threads` loops. A call's events come on its connection's loop; its
// writes and finish may start on any thread. Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "controlplane/feed/watch_call.h"

struct ssl_ctx_st;  // OpenSSL's SSL_CTX

namespace krane::feed {

struct H2WatchOptions {
  std::string listen = "127.0.0.1:0";  // host:port; port 0: any free one
  size_t threads = 1;                  // loops
  // Calls open at once on one connection (SETTINGS_MAX_CONCURRENT_STREAMS). An agent opens one.
  uint32_t max_streams_per_connection = 100;
  // The largest request message read (WatchRequest is a few hundred bytes).
  size_t max_request_bytes = 64 << 10;
  // A connection with no stream open for this long is closed (a client that connects and never
  // asks, or one that stopped watching).
  std::chrono::milliseconds idle_timeout{60000};
  // A request not complete this long after its headers is refused (DEADLINE_EXCEEDED), and a
  // finished call whose trailers could not go out in this time (a client that stopped reading,
  // its window full) is reset: neither holds its stream for longer.
  std::chrono::milliseconds stall_timeout{10000};
  // A connection from which nothing came for `keepalive` gets a PING (0: never); one from which
  // nothing came within `keepalive_timeout` after it is closed, and its calls are told
  // (OnCancel). A client that vanished (its host gone, a partition) sends nothing, not even the
  // TCP close, and its calls would otherwise be held for as long as the process runs. A live
  // client's HTTP/2 stack answers even while its application reads nothing.
  std::chrono::milliseconds keepalive{60000};
  std::chrono::milliseconds keepalive_timeout{20000};
  // TLS (PEM files, as krane-ctrl's tls.*): with cert_file and key_file the listener speaks TLS
  // (1.2 or later, ALPN h2); with client_ca_file too, clients must show a certificate it signed.
  struct Tls {
    std::string cert_file;
    std::string key_file;
    std::string client_ca_file;
  } tls;
};

// Takes a call whose request arrived: serve() it, or refuse() it. `request` is the request
// message's bytes (valid during the call of the function), `authorization` the value of its
// `authorization` header (empty without), `peer` the client's address as gRPC writes it
// ("ipv4:10.0.0.7:51234"). Runs on the connection's loop: it must not block.
using OpenH2WatchFn = std::function<void(WatchCall* call, std::string_view request,
                                         std::string authorization, std::string peer)>;

class H2Loop;

class H2WatchServer {
 public:
  // Binds options.listen and starts accepting; UNAVAILABLE when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<H2WatchServer>> start(H2WatchOptions options,
                                                              OpenH2WatchFn open);
  ~H2WatchServer();  // stop()
  H2WatchServer(const H2WatchServer&) = delete;
  H2WatchServer& operator=(const H2WatchServer&) = delete;

  // The port it listens on.
  int port() const { return port_; }

  // Stops accepting, tells every client to go (GOAWAY) and resets the open calls, whose handlers
  // are told (OnCancel) and finish. Returns at once.
  void shutdown();
  // shutdown(), then waits up to `grace` for the calls to end, closes every connection and joins
  // the threads. Calls still alive then are abandoned: nothing more is delivered to them, and
  // what they start is ignored (until the server is destroyed).
  void stop(std::chrono::milliseconds grace = std::chrono::seconds(5));

  // Calls handed to the opener and not over yet.
  size_t calls() const { return calls_.load(); }
  size_t connections() const { return connections_.load(); }

 private:
  friend class H2Loop;
  H2WatchServer(H2WatchOptions options, OpenH2WatchFn open);
  absl::Status setUpTls();
  void acceptLoop();

  const H2WatchOptions options_;
  const OpenH2WatchFn open_;
  int listener_ = -1;
  int port_ = 0;
  int wake_fd_ = -1;             // wakes the acceptor to stop
  ::ssl_ctx_st* tls_ = nullptr;  // OpenSSL's SSL_CTX when options_.tls is set
  std::atomic<size_t> calls_{0};
  std::atomic<size_t> connections_{0};
  std::atomic<bool> shut_down_{false};
  bool stopped_ = false;
  std::vector<std::unique_ptr<H2Loop>> loops_;
  std::vector<std::thread> threads_;
  std::thread acceptor_;
};

}  // namespace krane::feed
