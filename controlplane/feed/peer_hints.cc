#include "controlplane/feed/peer_hints.h"

#include <algorithm>
#include <cstring>

#include "common/host_port.h"
#include "common/status.h"
#include "common/strings.h"
#include "spdlog/spdlog.h"

namespace krane::feed {
namespace {

// How long the thread waits in one poll at most: the bound on stop()'s latency.
constexpr std::chrono::milliseconds kMaxWait{100};
// Hints a slow peer has not taken yet; more are dropped (one is as good as many).
constexpr int kQueuedHints = 16;
// A hint is the sender's replica id (at most 128 bytes, and CURVE adds about 33); anything
// larger is not a hint, and its sender is dropped.
constexpr int64_t kMaxHintBytes = 256;
// A subscription the publisher refused (it did not know this replica's key yet; it learns it
// at its next refresh) is tried again after this long.
constexpr std::chrono::milliseconds kRedialAfter{250};
// Rows of replicas not seen for this long are deleted.
constexpr int64_t kForgetAfterMs = 3600 * 1000;

// Where ZeroMQ sends the authentication requests of a context's sockets (RFC 27, ZAP).
constexpr const char* kZapEndpoint = "inproc://zeromq.zap.01";

// Milliseconds since the epoch on the database's clock: every replica judges staleness by the
// same clock, whatever the skew between their hosts.
constexpr std::string_view kDbNowMs = "ROUND(UNIX_TIMESTAMP(NOW(3)) * 1000)";

}  // namespace

PeerHints::PeerHints(std::shared_ptr<db::Pool> pool, std::string replica_id,
                     PeerHintOptions options, std::function<void()> on_hint)
    : pool_(std::move(pool)),
      replica_id_(std::move(replica_id)),
      options_(std::move(options)),
      on_hint_(std::move(on_hint)) {}

PeerHints::~PeerHints() { stop(); }

absl::Status PeerHints::start() {
  if (!validHostPort(options_.listen)) {
    return absl::InvalidArgumentError(
        strCat("listen address \"", options_.listen, "\" is not host:port"));
  }
  const auto [host, port] = splitHostPort(options_.listen);
  if (options_.advertise.empty() && isAnyAddress(host)) {
    return absl::InvalidArgumentError(
        strCat("listen address \"", options_.listen,
               "\" binds every interface; say how the other replicas reach this one (advertise)"));
  }
  char public_key[41] = {};
  char secret_key[41] = {};
  if (zmq_curve_keypair(public_key, secret_key) != 0) {
    return absl::FailedPreconditionError(
        strCat("cannot make a CURVE key pair (this libzmq has no CURVE): ", zmq_strerror(errno)));
  }
  public_key_ = public_key;
  secret_key_ = secret_key;
  try {
    // The ZAP handler first: a subscriber's handshake asks it, and one finding none would be let
    // in unchecked.
    zap_ = zmq::socket_t(context_, zmq::socket_type::rep);
    zap_.set(zmq::sockopt::linger, 0);
    zap_.bind(kZapEndpoint);
    pub_ = zmq::socket_t(context_, zmq::socket_type::pub);
    pub_.set(zmq::sockopt::linger, 0);
    pub_.set(zmq::sockopt::sndhwm, kQueuedHints);
    pub_.set(zmq::sockopt::ipv6, 1);
    // What a PUB socket receives are its subscribers' subscriptions, kept in a table at about a
    // node per byte: a peer sending a huge one could exhaust memory. Ours is empty (""); the
    // largest message is CURVE's handshake (about 300 bytes).
    pub_.set(zmq::sockopt::maxmsgsize, int64_t{512});
    pub_.set(zmq::sockopt::curve_server, true);
    pub_.set(zmq::sockopt::curve_secretkey, secret_key_);
    pub_.set(zmq::sockopt::zap_domain, "krane-feed-hints");
    pub_.bind(strCat("tcp://", host, ":", portOf(options_.listen) == 0 ? std::string("*") : port));
  } catch (const zmq::error_t& e) {
    pub_.close();
    zap_.close();
    return absl::UnavailableError(strCat("cannot listen on ", options_.listen, ": ", e.what()));
  }
  const std::string bound = pub_.get(zmq::sockopt::last_endpoint);  // tcp://host:port
  if (options_.advertise.empty()) {
    advertised_ = strCat(host, ":", splitHostPort(bound).second);
  } else {
    advertised_ = options_.advertise;
  }
  {
    std::lock_guard lock(pub_mutex_);
    pub_open_ = true;
  }
  // The first refresh before the threads start: a broken table fails the start-up, and peers
  // already running are dialled before this replica serves anything.
  absl::StatusOr<Replicas> peers = refresh();
  if (!peers.ok()) {
    stop();
    return peers.status();
  }
  connectTo(*peers);
  spdlog::info("feed: peer hints on {} (advertised as {}), {} other replica(s)", bound, advertised_,
               peers_by_endpoint_.size());
  thread_ = std::thread([this] { run(); });
  refresher_ = std::thread([this] { refreshLoop(); });
  return absl::OkStatus();
}

void PeerHints::stop() {
  if (stopping_.exchange(true)) return;
  {
    // Taken after the flag is set: the refresher is either before its check (and sees it) or
    // waiting (and is woken).
    std::lock_guard lock(stop_mutex_);
  }
  stop_cv_.notify_all();
  // A refresh under way ends first: a database that hangs holds up stop() as long as it hangs.
  if (refresher_.joinable()) refresher_.join();
  if (thread_.joinable()) thread_.join();
  {
    std::lock_guard lock(pub_mutex_);
    pub_open_ = false;
    pub_.close();
  }
  peers_by_endpoint_.clear();  // closes their sockets
  zap_.close();
  context_.close();
  if (!advertised_.empty()) {
    auto conn = pool_->acquire();
    absl::Status status =
        conn.ok()
            ? (*conn)->exec("DELETE FROM feed_peers WHERE replica_id = ?", {replica_id_}).status()
            : conn.status();
    if (!status.ok()) {
      spdlog::warn(
          "feed: could not remove this replica from feed_peers ({}); the others drop it"
          " after {} ms",
          status.message(), options_.stale_after.count());
    }
  }
}

void PeerHints::publish() {
  std::lock_guard lock(pub_mutex_);
  if (!pub_open_) return;
  try {
    // PUB never blocks: a peer whose queue is full misses this hint, and polls.
    (void)pub_.send(zmq::buffer(replica_id_), zmq::send_flags::dontwait);
    sent_.fetch_add(1, std::memory_order_relaxed);
  } catch (const zmq::error_t& e) {
    spdlog::debug("feed: peer hint not sent: {}", e.what());
  }
}

PeerHintStats PeerHints::stats() const {
  PeerHintStats stats;
  stats.sent = sent_.load();
  stats.received = received_.load();
  stats.delivered = delivered_.load();
  stats.refresh_errors = refresh_errors_.load();
  stats.socket_errors = socket_errors_.load();
  stats.refused = refused_subscribers_.load();
  stats.handshake_failures = handshake_failures_.load();
  stats.peers = peers_.load();
  stats.connected = connected_peers_.load();
  return stats;
}

void PeerHints::run() {
  using Clock = std::chrono::steady_clock;
  // The ZAP handler, then two items per peer, its SUB socket then its monitor; rebuilt when the
  // peers change.
  std::vector<zmq::pollitem_t> items;
  std::vector<Peer*> polled;
  auto last_delivery = Clock::time_point{};
  bool pending = false;
  while (!stopping_) {
    std::optional<Replicas> wanted;
    {
      std::lock_guard lock(wanted_mutex_);
      wanted.swap(wanted_);
    }
    if (wanted) connectTo(*wanted);
    if (items.empty() || wanted || polled.size() != peers_by_endpoint_.size()) {
      items.clear();
      polled.clear();
      items.push_back({zap_.handle(), 0, ZMQ_POLLIN, 0});
      for (auto& [endpoint, peer] : peers_by_endpoint_) {
        items.push_back({peer->sub.handle(), 0, ZMQ_POLLIN, 0});
        items.push_back({peer->monitor.handle(), 0, ZMQ_POLLIN, 0});
        polled.push_back(peer.get());
      }
    }
    const auto now = Clock::now();
    // The refresher's next list is applied within kMaxWait.
    auto until = now + kMaxWait;
    if (pending) until = std::min(until, last_delivery + options_.min_gap);
    // Rounded up: rounded down, the last fraction of a millisecond of a gap would be a busy loop
    // of zero-timeout polls.
    const auto wait = std::max(std::chrono::milliseconds(0),
                               std::chrono::ceil<std::chrono::milliseconds>(until - now));
    try {
      zmq::poll(items.data(), items.size(), wait);
      if (items[0].revents & ZMQ_POLLIN) {
        answerZap();
        if (items[0].socket != zap_.handle()) items.clear();  // a new ZAP socket: rebuilt
      }
      for (size_t i = 0; i < polled.size(); ++i) {
        if (items[1 + 2 * i].revents & ZMQ_POLLIN) {
          zmq::message_t hint;
          while (polled[i]->sub.recv(hint, zmq::recv_flags::dontwait)) {
            received_.fetch_add(1, std::memory_order_relaxed);
            pending = true;
          }
        }
        if (items[2 + 2 * i].revents & ZMQ_POLLIN) takeMonitorEvent(*polled[i]);
      }
      // Peers that refused this replica are dialled again, on a socket of their own.
      for (auto& [endpoint, peer] : peers_by_endpoint_) {
        if (!peer->refused || std::chrono::steady_clock::now() < peer->redial_at) continue;
        if (auto again = dial(endpoint, peer->key)) {
          peer = std::move(again);
        } else {
          peer->redial_at = std::chrono::steady_clock::now() + options_.refresh;
        }
        items.clear();  // its pointers are stale: rebuilt at the top of the loop
        polled.clear();
      }
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      // Not expected on sockets only this thread uses. Hints are an optimization: keep going
      // (the refresher keeps this replica's row) rather than fall silent.
      socket_errors_.fetch_add(1, std::memory_order_relaxed);
      spdlog::warn("feed: peer hints: receiving failed: {}", e.what());
      std::this_thread::sleep_for(kMaxWait);
    }
    if (pending && Clock::now() - last_delivery >= options_.min_gap) {
      pending = false;
      last_delivery = Clock::now();
      delivered_.fetch_add(1, std::memory_order_relaxed);
      on_hint_();
    }
  }
}

void PeerHints::refreshLoop() {
  bool failing = false;
  std::unique_lock lock(stop_mutex_);
  // From the end of the last refresh: a slow database never makes them run back to back.
  while (!stop_cv_.wait_for(lock, options_.refresh, [this] { return stopping_.load(); })) {
    lock.unlock();
    absl::StatusOr<Replicas> peers = refresh();
    if (peers.ok()) {
      std::lock_guard wanted_lock(wanted_mutex_);
      wanted_ = std::move(*peers);
    } else {
      refresh_errors_.fetch_add(1, std::memory_order_relaxed);
      // The database is down or the table unreadable: the peers dialled stay dialled, and
      // polling covers the rest. Said once, not every refresh.
      if (!failing) {
        spdlog::warn("feed: peer hints cannot refresh the list of replicas: {}",
                     peers.status().message());
      }
    }
    if (peers.ok() && failing) spdlog::info("feed: peer hints refresh the list of replicas again");
    failing = !peers.ok();
    lock.lock();
  }
}

absl::StatusOr<PeerHints::Replicas> PeerHints::refresh() {
  KRANE_ASSIGN_OR_RETURN(auto conn, pool_->acquire());
  KRANE_RETURN_IF_ERROR(
      conn->exec(strCat("INSERT INTO feed_peers (replica_id, endpoint, public_key, seen_at)"
                        " VALUES (?, ?, ?, ",
                        kDbNowMs,
                        ") ON DUPLICATE KEY UPDATE endpoint = VALUES(endpoint),"
                        " public_key = VALUES(public_key), seen_at = VALUES(seen_at)"),
                 {replica_id_, advertised_, public_key_})
          .status());
  // Oldest first: where two rows share an address (a replica restarted on it while its old row
  // is still fresh), the newer key is the one dialled.
  KRANE_ASSIGN_OR_RETURN(
      auto rows, conn->query(strCat("SELECT replica_id, endpoint, public_key FROM feed_peers"
                                    " WHERE seen_at >= ",
                                    kDbNowMs,
                                    " - ? AND replica_id <> ? AND public_key IS NOT NULL"
                                    " ORDER BY seen_at, replica_id"),
                             {static_cast<int64_t>(options_.stale_after.count()), replica_id_}));
  // Rows of replicas that died rather than stopped: one statement a minute or so removes those
  // older than an hour.
  if (refreshes_++ % 30 == 0) {
    KRANE_RETURN_IF_ERROR(
        conn->exec(strCat("DELETE FROM feed_peers WHERE seen_at < ", kDbNowMs, " - ?"),
                   {kForgetAfterMs})
            .status());
  }
  // Rows without a key are replicas of an earlier version, which speak no CURVE: neither side
  // can hint the other, and both poll.
  Replicas replicas;
  for (const db::Row& r : rows.rows) {
    replicas.keys.insert(r.str("public_key"));
    // Two replicas advertising one address (a configuration mistake) would get each other's
    // hints through this one's own socket: never connect to ourselves.
    if (r.str("endpoint") != advertised_) replicas.dial[r.str("endpoint")] = r.str("public_key");
  }
  return replicas;
}

void PeerHints::connectTo(const Replicas& replicas) {
  admitted_ = replicas.keys;
  for (auto it = peers_by_endpoint_.begin(); it != peers_by_endpoint_.end();) {
    const auto wanted = replicas.dial.find(it->first);
    // Gone, or restarted on the same address with a new key.
    if (wanted != replicas.dial.end() && wanted->second == it->second->key) {
      ++it;
      continue;
    }
    spdlog::info("feed: peer hints: replica at {} is gone", it->first);
    it = peers_by_endpoint_.erase(it);  // closes its sockets
  }
  for (const auto& [endpoint, key] : replicas.dial) {
    const std::string id = strCat(endpoint, " ", key);
    if (peers_by_endpoint_.count(endpoint) != 0 || refused_.count(id) != 0) continue;
    if (auto peer = dial(endpoint, key)) {
      spdlog::info("feed: peer hints: dialling the replica at {}", endpoint);
      peers_by_endpoint_.emplace(endpoint, std::move(peer));
    } else {
      refused_.insert(id);
    }
  }
  countPeers();
}

std::unique_ptr<PeerHints::Peer> PeerHints::dial(const std::string& endpoint,
                                                 const std::string& key) {
  auto peer = std::make_unique<Peer>();
  peer->key = key;
  try {
    peer->sub = zmq::socket_t(context_, zmq::socket_type::sub);
    peer->sub.set(zmq::sockopt::linger, 0);
    peer->sub.set(zmq::sockopt::rcvhwm, kQueuedHints);
    peer->sub.set(zmq::sockopt::maxmsgsize, kMaxHintBytes);
    peer->sub.set(zmq::sockopt::ipv6, 1);
    // ZeroMQ retries a dropped connection or a failed handshake (a wrong key in feed_peers)
    // itself: from every 100 ms, backing off to every 2 s.
    peer->sub.set(zmq::sockopt::reconnect_ivl_max, 2000);
    peer->sub.set(zmq::sockopt::subscribe, "");
    peer->sub.set(zmq::sockopt::curve_serverkey, key);
    peer->sub.set(zmq::sockopt::curve_publickey, public_key_);
    peer->sub.set(zmq::sockopt::curve_secretkey, secret_key_);
    // Up once the ZeroMQ handshake is done (a port where something else listens accepts the
    // TCP connection but never completes it); down when the connection drops or the handshake
    // fails. The context is this object's own, so the name is unique in it.
    const std::string monitor = strCat("inproc://peer-hints-monitor-", ++monitors_);
    if (zmq_socket_monitor(peer->sub.handle(), monitor.c_str(),
                           ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_DISCONNECTED |
                               ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                               ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                               ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) != 0) {
      throw zmq::error_t();
    }
    peer->monitor = zmq::socket_t(context_, zmq::socket_type::pair);
    peer->monitor.set(zmq::sockopt::linger, 0);
    peer->monitor.connect(monitor);
    peer->sub.connect(strCat("tcp://", endpoint));
  } catch (const zmq::error_t& e) {
    spdlog::warn("feed: peer hints: cannot connect to a replica at \"{}\" (from feed_peers): {}",
                 endpoint, e.what());
    return nullptr;
  }
  return peer;
}

void PeerHints::takeMonitorEvent(Peer& peer) {
  // Two frames: the event (a 16-bit number, then a 32-bit value) and the peer's address.
  zmq::message_t event;
  zmq::message_t address;
  if (!peer.monitor.recv(event, zmq::recv_flags::dontwait)) return;
  if (event.more()) (void)peer.monitor.recv(address, zmq::recv_flags::dontwait);
  uint16_t id = 0;
  if (event.size() < sizeof(id)) return;
  std::memcpy(&id, event.data(), sizeof(id));
  peer.live = id == ZMQ_EVENT_HANDSHAKE_SUCCEEDED;
  if (peer.live) peer.refused = false;
  // Refused by the publisher's ZAP handler (or a protocol error): ZeroMQ stops there. The
  // disconnect that follows must not clear it.
  if (id == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH || id == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) {
    peer.refused = true;
    peer.redial_at = std::chrono::steady_clock::now() + kRedialAfter;
  }
  // A refusal right after this replica starts is expected (the others learn its key at their
  // next refresh); a handshake that fails otherwise is worth one line.
  if (id == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) {
    handshake_failures_.fetch_add(1, std::memory_order_relaxed);
  }
  if (id == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL && !peer.warned) {
    peer.warned = true;
    spdlog::warn(
        "feed: peer hints: the handshake with the replica at {} failed (a wrong key in"
        " feed_peers, or not a replica there); ZeroMQ keeps trying",
        address.to_string());
  }
  countPeers();
}

void PeerHints::answerZap() {
  // RFC 27: version, request id, domain, address, routing id, mechanism, then the credentials
  // (for CURVE, the client's 32-byte public key).
  std::vector<zmq::message_t> request;
  do {
    request.emplace_back();
    if (!zap_.recv(request.back(), zmq::recv_flags::dontwait)) return;
  } while (request.back().more());
  const bool well_formed = request.size() >= 7 && request[0].to_string() == "1.0" &&
                           request[5].to_string() == "CURVE" && request[6].size() == 32;
  bool admitted = false;
  if (well_formed) {
    char z85[41] = {};
    zmq_z85_encode(z85, static_cast<const uint8_t*>(request[6].data()), 32);
    admitted = admitted_.count(z85) != 0;
  }
  if (!admitted) {
    refused_subscribers_.fetch_add(1, std::memory_order_relaxed);
    spdlog::debug("feed: peer hints: a subscriber from {} is not a replica in feed_peers",
                  request.size() > 3 ? request[3].to_string() : std::string("?"));
  }
  const std::string request_id = request.size() > 1 ? request[1].to_string() : std::string();
  try {
    zap_.send(zmq::buffer(std::string_view("1.0")), zmq::send_flags::sndmore);
    zap_.send(zmq::buffer(request_id), zmq::send_flags::sndmore);
    zap_.send(zmq::buffer(std::string_view(admitted ? "200" : "400")), zmq::send_flags::sndmore);
    zap_.send(zmq::buffer(std::string_view(admitted ? "OK" : "not a replica")),
              zmq::send_flags::sndmore);
    zap_.send(zmq::buffer(std::string_view("")), zmq::send_flags::sndmore);  // user id
    zap_.send(zmq::buffer(std::string_view("")), zmq::send_flags::none);     // metadata
  } catch (const zmq::error_t& e) {
    // A reply cut short would leave the REP socket unable to take the next request: start a
    // new one (the subscriber whose answer was lost times out and retries).
    socket_errors_.fetch_add(1, std::memory_order_relaxed);
    spdlog::warn("feed: peer hints: answering a subscriber failed: {}", e.what());
    zap_.close();
    zap_ = zmq::socket_t(context_, zmq::socket_type::rep);
    zap_.set(zmq::sockopt::linger, 0);
    zap_.bind(kZapEndpoint);
  }
}

void PeerHints::countPeers() {
  size_t live = 0;
  for (const auto& [endpoint, peer] : peers_by_endpoint_) live += peer->live ? 1 : 0;
  peers_.store(peers_by_endpoint_.size());
  connected_peers_.store(live);
}

}  // namespace krane::feed
