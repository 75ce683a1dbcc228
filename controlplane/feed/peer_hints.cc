#include "controlplane/feed/peer_hints.h"

#include <algorithm>
#include <array>

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
    sub_ = zmq::socket_t(context_, zmq::socket_type::sub);
    sub_.set(zmq::sockopt::linger, 0);
    sub_.set(zmq::sockopt::rcvhwm, kQueuedHints);
    sub_.set(zmq::sockopt::maxmsgsize, kMaxHintBytes);
    sub_.set(zmq::sockopt::ipv6, 1);
    sub_.set(zmq::sockopt::subscribe, "");
  } catch (const zmq::error_t& e) {
    pub_.close();
    sub_.close();
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
  // The first refresh before the thread starts: a broken table fails the start-up, and peers
  // already running are connected before this replica serves anything.
  if (absl::Status status = refresh(); !status.ok()) {
    stop();
    return status;
  }
  spdlog::info("feed: peer hints on {} (advertised as {}), {} other replica(s)", bound, advertised_,
               connected_.size());
  thread_ = std::thread([this] { run(); });
  return absl::OkStatus();
}

void PeerHints::stop() {
  if (stopping_.exchange(true)) return;
  if (thread_.joinable()) thread_.join();
  {
    std::lock_guard lock(pub_mutex_);
    pub_open_ = false;
    pub_.close();
  }
  sub_.close();
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
                       refresh_errors_.load(), socket_errors_.load(), peers_.load()};
}

void PeerHints::run() {
  using Clock = std::chrono::steady_clock;
  std::array<zmq::pollitem_t, 1> items{{{sub_.handle(), 0, ZMQ_POLLIN, 0}}};
  auto next_refresh = Clock::now() + options_.refresh;
  auto last_delivery = Clock::time_point{};
  bool pending = false;
  bool refresh_failing = false;
  while (!stopping_) {
    const auto now = Clock::now();
    auto until = std::min(next_refresh, now + kMaxWait);
    if (pending) until = std::min(until, last_delivery + options_.min_gap);
    // Rounded up: rounded down, the last fraction of a millisecond of a gap would be a busy loop
    // of zero-timeout polls.
    const auto wait = std::max(std::chrono::milliseconds(0),
                               std::chrono::ceil<std::chrono::milliseconds>(until - now));
    try {
      zmq::poll(items.data(), items.size(), wait);
      if (items[0].revents & ZMQ_POLLIN) {
        zmq::message_t hint;
        while (sub_.recv(hint, zmq::recv_flags::dontwait)) {
          received_.fetch_add(1, std::memory_order_relaxed);
          pending = true;
        }
      }
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      // Not expected on a socket only this thread uses. Hints are an optimization: keep going
      // (and refreshing this replica's row) rather than fall silent.
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
    if (Clock::now() >= next_refresh) {
      absl::Status status = refresh();
      // From the end of this one: a slow database never makes refreshes run back to back.
      next_refresh = Clock::now() + options_.refresh;
      if (!status.ok()) {
        refresh_errors_.fetch_add(1, std::memory_order_relaxed);
        // The database is down or the table unreadable: the peers connected stay connected, and
        // polling covers the rest. Said once, not every refresh.
        if (!refresh_failing) {
          spdlog::warn("feed: peer hints cannot refresh the list of replicas: {}",
                       status.message());
        }
      } else if (refresh_failing) {
        spdlog::info("feed: peer hints refresh the list of replicas again");
      }
      refresh_failing = !status.ok();
    }
  }
}

absl::Status PeerHints::refresh() {
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
  connectTo(endpoints);
  return absl::OkStatus();
}

void PeerHints::connectTo(const std::set<std::string>& endpoints) {
  for (auto it = connected_.begin(); it != connected_.end();) {
    if (endpoints.count(*it) != 0) {
      ++it;
      continue;
    }
    try {
      sub_.disconnect(strCat("tcp://", *it));
    } catch (const zmq::error_t& e) {
      spdlog::debug("feed: peer hints: disconnecting {}: {}", *it, e.what());
    }
    spdlog::info("feed: peer hints: replica at {} is gone", *it);
    it = connected_.erase(it);
  }
  for (const std::string& endpoint : endpoints) {
    if (connected_.count(endpoint) != 0 || refused_.count(endpoint) != 0) continue;
    try {
      sub_.connect(strCat("tcp://", endpoint));
    } catch (const zmq::error_t& e) {
      spdlog::warn("feed: peer hints: cannot connect to a replica at \"{}\" (from feed_peers): {}",
                   endpoint, e.what());
      refused_.insert(endpoint);
      continue;
    }
    spdlog::info("feed: peer hints: connected to the replica at {}", endpoint);
    connected_.insert(endpoint);
  }
  peers_.store(connected_.size());
}

}  // namespace krane::feed
