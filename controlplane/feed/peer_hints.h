// Commit hints between the krane-ctrl replicas of one database.
//
// A replica's tailer learns of its own commits at once (Writer::onCommit) and of the other
// replicas' commits at its next poll. With peer hints, a replica that commits also tells the
// others, and their tailers read the change now instead of up to one poll interval later.
//
// A hint says nothing but "read now": the tailer's poll stays the only way changes are read, so
// a hint lost (a peer restarting, a network blip) costs at most one poll interval and a forged
// one at most one extra poll. Hints a replica receives are coalesced: at most one wake-up of its
// tailer per `min_gap`, and a hint received during the gap is delivered at its end, never lost.
//
// Each replica binds a ZeroMQ PUB socket on `listen` and records where the others reach it
// (`advertise`) in the table feed_peers, every `refresh`. It subscribes to the PUB of every
// other replica that did the same within `stale_after`, with a SUB socket per replica, and drops
// those that stopped (a stopping replica deletes its row; one that died ages out).
//
// The hint sockets use ZeroMQ's CURVE: each replica makes a key pair at start and records its
// public key with its address. Subscriptions are encrypted to the publisher's key, and a
// publisher admits only subscribers whose keys are in fresh rows of feed_peers when they connect
// (its ZAP handler): whoever cannot write that table cannot read a replica's hints. A key whose
// row goes away keeps the connection it has until that connection drops.
//
// Two threads: one receives hints and wakes the tailer, and only it touches the sockets; the
// other refreshes feed_peers and hands it the list of replicas. A database that hangs therefore
// delays finding new replicas, never the hints of the ones already connected.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <zmq.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "controlplane/db/pool.h"

namespace krane::feed {

struct PeerHintOptions {
  // host:port to bind: an IP address ([...] for IPv6) or * (every interface, IPv4 and IPv6);
  // port 0: any free port. Required.
  std::string listen;
  // host:port the other replicas connect to; empty: the host of `listen` and the bound port
  // (then `listen` must name one interface, not 0.0.0.0).
  std::string advertise;
  // How often this replica records itself in feed_peers and reads the others.
  std::chrono::milliseconds refresh{2000};
  // A replica not recorded for this long is taken for gone.
  std::chrono::milliseconds stale_after{10000};
  // At most one wake-up of the tailer per gap, however many hints arrive.
  std::chrono::milliseconds min_gap{2};
};

struct PeerHintStats {
  uint64_t sent = 0;       // hints published (one per commit)
  uint64_t received = 0;   // hints received from the other replicas
  uint64_t delivered = 0;  // wake-ups of the tailer they caused
  uint64_t refresh_errors = 0;
  uint64_t socket_errors = 0;
  // This replica's subscriptions whose handshake failed other than by a refusal: a wrong key in
  // feed_peers, or something else listening there. (ZeroMQ keeps retrying them.)
  uint64_t handshake_failures = 0;
  // Subscribers turned away by the ZAP handler: their key is in no fresh row of feed_peers. A
  // replica that just started is among them until this one's next refresh. (Subscribers
  // without CURVE or with the wrong server key fail before that and are not counted.)
  uint64_t refused = 0;
  // Replicas whose hint sockets this one dials (ZeroMQ connects in the background and retries).
  size_t peers = 0;
  // Of those, the ones with a live connection now (its ZeroMQ handshake done).
  size_t connected = 0;
};

class PeerHints {
 public:
  // `on_hint` runs on the hints' own thread and must not block (Tailer::notify).
  PeerHints(std::shared_ptr<db::Pool> pool, std::string replica_id, PeerHintOptions options,
            std::function<void()> on_hint);
  ~PeerHints();
  PeerHints(const PeerHints&) = delete;
  PeerHints& operator=(const PeerHints&) = delete;

  // Binds, records this replica, connects to the others and starts the thread. An error names
  // the address or the table.
  absl::Status start();
  // Idempotent: deletes this replica's row (the others disconnect at their next refresh) and
  // closes the sockets. publish() does nothing after it.
  void stop();

  // Tells the other replicas that this one committed. Any thread; never blocks (a hint a slow
  // peer cannot take is dropped).
  void publish();

  // host:port the other replicas connect to (known after start()).
  const std::string& advertised() const { return advertised_; }
  // This replica's CURVE public key, Z85 (known after start()).
  const std::string& publicKey() const { return public_key_; }
  const std::string& replicaId() const { return replica_id_; }
  PeerHintStats stats() const;

 private:
  // The hints' thread: receives hints, wakes the tailer, applies the refresher's lists.
  void run();
  // The refresher's thread: refresh() every `refresh`, its list handed to run().
  void refreshLoop();
  // The other replicas, from the fresh rows of feed_peers.
  struct Replicas {
    std::map<std::string, std::string> dial;  // endpoint -> the key of its freshest row
    std::set<std::string> keys;               // every row's key, admitted as subscribers
  };
  // Records this replica and returns where the others are. Touches no socket.
  absl::StatusOr<Replicas> refresh();
  // A replica this one subscribes to: its own SUB socket, and that socket's monitor (a PAIR
  // receiving its connection events), so that whether it is connected needs no matching of
  // addresses (ZeroMQ reports a connection by the address it resolved, not the one dialled).
  struct Peer {
    ~Peer() {
      if (sub) zmq_socket_monitor(sub.handle(), nullptr, 0);  // then the monitor, then sub close
    }
    std::string key;  // the publisher's
    zmq::socket_t sub;
    zmq::socket_t monitor;
    bool live = false;
    // The publisher refused it (it did not know this replica's key yet): ZeroMQ does not retry
    // that, so it is dialled again from `redial_at`. Other failures ZeroMQ retries by itself.
    bool refused = false;
    std::chrono::steady_clock::time_point redial_at;
    bool warned = false;  // about a failing handshake, once
  };
  // On the hints' thread (or in start(), before it runs): subscribes and unsubscribes, and
  // admits the replicas' keys.
  void connectTo(const Replicas& replicas);
  // Null when ZeroMQ refuses the endpoint or the key.
  std::unique_ptr<Peer> dial(const std::string& endpoint, const std::string& key);
  // On the hints' thread: answers one ZAP request (may this key subscribe?).
  void answerZap();
  // On the hints' thread: one event of `peer`'s monitor.
  void takeMonitorEvent(Peer& peer);
  void countPeers();

  std::shared_ptr<db::Pool> pool_;
  const std::string replica_id_;
  const PeerHintOptions options_;
  std::function<void()> on_hint_;
  std::string advertised_;
  std::string public_key_;  // Z85
  std::string secret_key_;  // Z85

  // Declared before the sockets: the context outlives them.
  zmq::context_t context_;
  std::mutex pub_mutex_;  // publish() comes from any thread; a socket is not thread-safe
  zmq::socket_t pub_;
  bool pub_open_ = false;
  zmq::socket_t zap_;               // the ZAP handler's REP socket; the hints' thread's only
  std::set<std::string> admitted_;  // the other replicas' public keys (Z85); the hints' thread's
  std::map<std::string, std::unique_ptr<Peer>> peers_by_endpoint_;  // the hints' thread's only
  std::set<std::string> refused_;  // endpoints ZeroMQ refused, warned about once
  uint64_t monitors_ = 0;          // names each peer's monitor endpoint
  uint64_t refreshes_ = 0;         // the refresher's only

  std::mutex wanted_mutex_;
  std::optional<Replicas> wanted_;  // the refresher's latest list, not yet applied

  std::atomic<bool> stopping_{false};
  std::mutex stop_mutex_;
  std::condition_variable stop_cv_;  // wakes the refresher at stop()
  std::thread thread_;
  std::thread refresher_;
  std::atomic<uint64_t> sent_{0};
  std::atomic<uint64_t> received_{0};
  std::atomic<uint64_t> delivered_{0};
  std::atomic<uint64_t> refresh_errors_{0};
  std::atomic<uint64_t> socket_errors_{0};
  std::atomic<uint64_t> refused_subscribers_{0};
  std::atomic<uint64_t> handshake_failures_{0};
  std::atomic<size_t> peers_{0};
  std::atomic<size_t> connected_peers_{0};
};

}  // namespace krane::feed
