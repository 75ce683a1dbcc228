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
// A hint is the sender's replica id; anything larger is not a hint, and its sender is dropped.
constexpr int64_t kMaxHintBytes = 256;
// Rows of replicas not seen for this long are deleted.
constexpr int64_t kForgetAfterMs = 3600 * 1000;

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
  try {
    pub_ = zmq::socket_t(context_, zmq::socket_type::pub);
    pub_.set(zmq::sockopt::linger, 0);
    pub_.set(zmq::sockopt::sndhwm, kQueuedHints);
    pub_.set(zmq::sockopt::ipv6, 1);
    // What a PUB socket receives are its subscribers' subscriptions, kept in a table at about a
    // node per byte: a peer sending a huge one could exhaust memory. Ours is empty ("").
    pub_.set(zmq::sockopt::maxmsgsize, int64_t{64});
    pub_.bind(strCat("tcp://", host, ":", portOf(options_.listen) == 0 ? std::string("*") : port));
  } catch (const zmq::error_t& e) {
    pub_.close();
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
  absl::StatusOr<std::set<std::string>> peers = refresh();
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
  return PeerHintStats{sent_.load(),           received_.load(),      delivered_.load(),
                       refresh_errors_.load(), socket_errors_.load(), peers_.load(),
                       connected_peers_.load()};
}

void PeerHints::run() {
  using Clock = std::chrono::steady_clock;
  // Two items per peer, its SUB socket then its monitor; rebuilt when the peers change.
  std::vector<zmq::pollitem_t> items;
  std::vector<Peer*> polled;
  auto last_delivery = Clock::time_point{};
  bool pending = false;
  while (!stopping_) {
    std::optional<std::set<std::string>> wanted;
    {
      std::lock_guard lock(wanted_mutex_);
      wanted.swap(wanted_);
    }
    if (wanted) connectTo(*wanted);
    if (wanted || polled.size() != peers_by_endpoint_.size()) {
      items.clear();
      polled.clear();
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
      if (items.empty()) {
        std::this_thread::sleep_for(wait);
      } else {
        zmq::poll(items.data(), items.size(), wait);
      }
      for (size_t i = 0; i < polled.size(); ++i) {
        if (items[2 * i].revents & ZMQ_POLLIN) {
          zmq::message_t hint;
          while (polled[i]->sub.recv(hint, zmq::recv_flags::dontwait)) {
            received_.fetch_add(1, std::memory_order_relaxed);
            pending = true;
          }
        }
        if (items[2 * i + 1].revents & ZMQ_POLLIN) takeMonitorEvent(*polled[i]);
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
    absl::StatusOr<std::set<std::string>> peers = refresh();
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

absl::StatusOr<std::set<std::string>> PeerHints::refresh() {
  KRANE_ASSIGN_OR_RETURN(auto conn, pool_->acquire());
  KRANE_RETURN_IF_ERROR(
      conn->exec(strCat("INSERT INTO feed_peers (replica_id, endpoint, seen_at) VALUES (?, ?, ",
                        kDbNowMs,
                        ") ON DUPLICATE KEY UPDATE endpoint = VALUES(endpoint),"
                        " seen_at = VALUES(seen_at)"),
                 {replica_id_, advertised_})
          .status());
  KRANE_ASSIGN_OR_RETURN(
      auto rows, conn->query(strCat("SELECT replica_id, endpoint FROM feed_peers WHERE seen_at >= ",
                                    kDbNowMs, " - ? AND replica_id <> ?"),
                             {static_cast<int64_t>(options_.stale_after.count()), replica_id_}));
  // Rows of replicas that died rather than stopped: one statement a minute or so removes those
  // older than an hour.
  if (refreshes_++ % 30 == 0) {
    KRANE_RETURN_IF_ERROR(
        conn->exec(strCat("DELETE FROM feed_peers WHERE seen_at < ", kDbNowMs, " - ?"),
                   {kForgetAfterMs})
            .status());
  }
  std::set<std::string> endpoints;
  for (const db::Row& r : rows.rows) {
    // Two replicas advertising one address (a configuration mistake) would get each other's
    // hints through this one's own socket: never connect to ourselves.
    if (r.str("endpoint") != advertised_) endpoints.insert(r.str("endpoint"));
  }
  return endpoints;
}

void PeerHints::connectTo(const std::set<std::string>& endpoints) {
  for (auto it = peers_by_endpoint_.begin(); it != peers_by_endpoint_.end();) {
    if (endpoints.count(it->first) != 0) {
      ++it;
      continue;
    }
    spdlog::info("feed: peer hints: replica at {} is gone", it->first);
    it = peers_by_endpoint_.erase(it);  // closes its sockets
  }
  for (const std::string& endpoint : endpoints) {
    if (peers_by_endpoint_.count(endpoint) != 0 || refused_.count(endpoint) != 0) continue;
    if (auto peer = dial(endpoint)) {
      spdlog::info("feed: peer hints: dialling the replica at {}", endpoint);
      peers_by_endpoint_.emplace(endpoint, std::move(peer));
    } else {
      refused_.insert(endpoint);
    }
  }
  countPeers();
}

std::unique_ptr<PeerHints::Peer> PeerHints::dial(const std::string& endpoint) {
  auto peer = std::make_unique<Peer>();
  try {
    peer->sub = zmq::socket_t(context_, zmq::socket_type::sub);
    peer->sub.set(zmq::sockopt::linger, 0);
    peer->sub.set(zmq::sockopt::rcvhwm, kQueuedHints);
    peer->sub.set(zmq::sockopt::maxmsgsize, kMaxHintBytes);
    peer->sub.set(zmq::sockopt::ipv6, 1);
    peer->sub.set(zmq::sockopt::subscribe, "");
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
  countPeers();
}

void PeerHints::countPeers() {
  size_t live = 0;
  for (const auto& [endpoint, peer] : peers_by_endpoint_) live += peer->live ? 1 : 0;
  peers_.store(peers_by_endpoint_.size());
  connected_peers_.store(live);
}

}  // namespace krane::feed
