// Commit hints between replicas, against a real MariaDB and real ZeroMQ sockets on loopback:
// a hint reaches every other replica and never its sender, replicas that stop or die are
// dropped, bad rows and bad addresses are refused clearly, and a burst of hints is coalesced
// without losing the last one.
#include "controlplane/feed/peer_hints.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <vector>

#include <catch2/catch.hpp>

#include "common/clock.h"
#include "common/strings.h"
#include "controlplane/db/migrate.h"
#include "tests/support/mariadb.h"
#include "tests/support/matchers.h"
#include "tests/support/wait.h"

namespace krane::feed {
namespace {

using krane::testing::eventually;
using namespace std::chrono_literals;

// One replica's hints, with a count of its tailer's wake-ups and how many hints it had received
// at the last one.
struct Replica {
  // Stopped first: its wake-ups read `hints`.
  ~Replica() {
    if (hints) hints->stop();
  }
  std::atomic<int> wakeups{0};
  std::atomic<uint64_t> received_at_wakeup{0};
  std::unique_ptr<PeerHints> hints;
};

// Hints from `from` until each of `to` woke more often than it had: a connection just made may
// miss the first hints (ZeroMQ's subscriptions travel after the connect), so hint again, as
// commits would keep doing.
bool hintUntilWoken(Replica& from, std::vector<Replica*> to,
                    std::chrono::milliseconds timeout = 10s) {
  std::vector<int> before;
  for (Replica* r : to) before.push_back(r->wakeups);
  return eventually(
      [&] {
        from.hints->publish();
        for (size_t i = 0; i < to.size(); ++i) {
          if (to[i]->wakeups <= before[i]) return false;
        }
        return true;
      },
      timeout);
}

// A CURVE public key, Z85, as a replica records it.
std::string someKey() {
  char public_key[41] = {};
  char secret_key[41] = {};
  REQUIRE(zmq_curve_keypair(public_key, secret_key) == 0);
  return public_key;
}

PeerHintOptions staleAfter(std::chrono::milliseconds d) {
  PeerHintOptions o;
  o.stale_after = d;
  return o;
}

PeerHintOptions minGap(std::chrono::milliseconds d) {
  PeerHintOptions o;
  o.min_gap = d;
  return o;
}

class PeerHintsTest : public krane::testing::MigratedDbTest {
 protected:
  PeerHintsTest() : MigratedDbTest(8) {}

  std::unique_ptr<Replica> start(const std::string& id, PeerHintOptions options = {}) {
    auto r = std::make_unique<Replica>();
    if (options.listen.empty()) options.listen = "127.0.0.1:0";
    if (options.refresh == PeerHintOptions{}.refresh) options.refresh = 50ms;
    r->hints = std::make_unique<PeerHints>(pool_, id, options, [r = r.get()] {
      r->received_at_wakeup = r->hints->stats().received;
      ++r->wakeups;
    });
    REQUIRE_THAT(r->hints->start(), IsOk());
    return r;
  }

  int64_t rowsOf(const std::string& sql, const db::Params& params = {}) {
    auto rows = (*pool_->acquire())->query(sql, params);
    REQUIRE_THAT(rows, IsOk());
    return rows->rows[0].i64(0);
  }
};

TEST_CASE_METHOD(PeerHintsTest, "a commit hint reaches every other replica, not its sender",
                 "[feed][hints]") {
  auto a = start("replica-a");
  auto b = start("replica-b");
  auto c = start("replica-c");
  // Each finds the two others at its next refresh at the latest.
  REQUIRE(eventually([&] {
    return a->hints->stats().peers == 2 && b->hints->stats().peers == 2 &&
           c->hints->stats().peers == 2;
  }));
  CHECK(rowsOf("SELECT COUNT(*) FROM feed_peers") == 3);
  REQUIRE(hintUntilWoken(*a, {b.get(), c.get()}));
  std::this_thread::sleep_for(100ms);
  CHECK(a->wakeups == 0);
  CHECK(a->hints->stats().received == 0);
  CHECK(b->hints->stats().received > 0);
  CHECK(a->hints->stats().sent > 0);

  SECTION("a replica that stops is dropped by the others") {
    b->hints->stop();
    CHECK(rowsOf("SELECT COUNT(*) FROM feed_peers WHERE replica_id = 'replica-b'") == 0);
    REQUIRE(
        eventually([&] { return a->hints->stats().peers == 1 && c->hints->stats().peers == 1; }));
    // Publishing after the stop does nothing, and the others still hear each other.
    const uint64_t sent = b->hints->stats().sent;
    b->hints->publish();
    CHECK(b->hints->stats().sent == sent);
    REQUIRE(hintUntilWoken(*a, {c.get()}));
  }
}

TEST_CASE_METHOD(PeerHintsTest, "replicas on IPv6 addresses hint each other", "[feed][hints]") {
  PeerHintOptions v6;
  v6.listen = "[::1]:0";
  v6.refresh = 50ms;
  auto probe = std::make_unique<PeerHints>(pool_, "probe", v6, [] {});
  if (!probe->start().ok()) {
    WARN("no IPv6 loopback on this machine: not tested");
    return;
  }
  probe->stop();
  auto a = start("replica-a", v6);
  auto b = start("replica-b", v6);
  CHECK(a->hints->advertised().rfind("[::1]:", 0) == 0);
  REQUIRE(eventually([&] { return b->hints->stats().peers == 1; }));
  REQUIRE(hintUntilWoken(*a, {b.get()}));
}

TEST_CASE_METHOD(PeerHintsTest, "a replica that died is dropped once its row is stale",
                 "[feed][hints]") {
  auto a = start("replica-a", staleAfter(300ms));
  // A row as a replica leaves it when it is killed: nobody deletes it, nobody refreshes it.
  REQUIRE_THAT((*pool_->acquire())
                   ->exec("INSERT INTO feed_peers (replica_id, endpoint, public_key, seen_at)"
                          " VALUES ('dead', '127.0.0.1:1', ?, ?)",
                          {someKey(), unixMillis()}),
               IsOk());
  REQUIRE(eventually([&] { return a->hints->stats().peers == 1; }));
  REQUIRE(eventually([&] { return a->hints->stats().peers == 0; }, 5s));
}

TEST_CASE_METHOD(PeerHintsTest, "through a database outage hints still flow, and refreshes resume",
                 "[feed][hints]") {
  auto a = start("replica-a");
  auto b = start("replica-b");
  REQUIRE(eventually([&] { return b->hints->stats().peers == 1; }));
  REQUIRE(hintUntilWoken(*a, {b.get()}));

  auto& server = krane::testing::ScratchMariaDb::instance();
  server.stop();
  // Refreshes fail and are counted; the replicas already connected stay connected.
  REQUIRE(eventually([&] { return b->hints->stats().refresh_errors > 0; }, 10s));
  CHECK(b->hints->stats().peers == 1);
  REQUIRE(hintUntilWoken(*a, {b.get()}));
  // A replica starting now cannot record itself: its start fails, and it holds no socket.
  PeerHintOptions loopback;
  loopback.listen = "127.0.0.1:0";
  auto c = std::make_unique<PeerHints>(pool_, "replica-c", loopback, [] {});
  CHECK_FALSE(c->start().ok());
  c->publish();
  CHECK(c->stats().sent == 0);

  server.start();
  // Refreshes work again: a replica started after the outage is found.
  auto d = start("replica-d");
  REQUIRE(eventually([&] { return b->hints->stats().peers == 2; }, 10s));
  REQUIRE(hintUntilWoken(*d, {a.get(), b.get()}));
}

TEST_CASE_METHOD(PeerHintsTest, "a refresh that hangs on the database delays no hint",
                 "[feed][hints]") {
  auto a = start("replica-a");
  auto b = start("replica-b");
  REQUIRE(eventually([&] { return b->hints->stats().peers == 1; }));
  REQUIRE(hintUntilWoken(*a, {b.get()}));

  // Another session locks B's row: B's next refresh waits on it (for up to the server's lock
  // wait timeout, 50 s by default), as it would on a database that hangs.
  auto holder = pool_->acquire();
  REQUIRE_THAT(holder, IsOk());
  REQUIRE_THAT((*holder)->execText("START TRANSACTION"), IsOk());
  REQUIRE_THAT((*holder)->query("SELECT * FROM feed_peers WHERE replica_id = 'replica-b'"
                                " FOR UPDATE"),
               IsOk());
  REQUIRE(eventually([&] {
    // The server refreshes INNODB_TRX only when it was not read in the last 100 ms.
    std::this_thread::sleep_for(150ms);
    return rowsOf(
               "SELECT COUNT(*) FROM information_schema.innodb_trx"
               " WHERE trx_state = 'LOCK WAIT' AND trx_query LIKE 'INSERT INTO feed_peers%'") > 0;
  }));
  // B's hints go on meanwhile: A's commits still wake B's tailer at once.
  CHECK(hintUntilWoken(*a, {b.get()}, 3s));
  CHECK(hintUntilWoken(*a, {b.get()}, 3s));
  REQUIRE_THAT((*holder)->execText("ROLLBACK"), IsOk());
  // Once the lock is gone, B refreshes again and finds a new replica.
  auto c = start("replica-c");
  REQUIRE(eventually([&] { return b->hints->stats().peers == 2; }));
  CHECK(b->hints->stats().refresh_errors == 0);
}

TEST_CASE_METHOD(PeerHintsTest, "live connections are counted apart from the replicas dialled",
                 "[feed][hints]") {
  auto b = start("replica-b");
  // A refreshes only at its start: what it learns later comes from its connection alone.
  PeerHintOptions slow;
  slow.refresh = 60s;
  auto a = start("replica-a", slow);
  CHECK(a->hints->stats().peers == 1);
  REQUIRE(eventually([&] { return a->hints->stats().connected == 1; }));
  REQUIRE(hintUntilWoken(*b, {a.get()}));
  // B stops: its connection goes at once, though A still dials its address until a refresh.
  b->hints->stop();
  REQUIRE(eventually([&] { return a->hints->stats().connected == 0; }));
  CHECK(a->hints->stats().peers == 1);
}

TEST_CASE_METHOD(PeerHintsTest, "a replica back on its address is connected again, counted once",
                 "[feed][hints]") {
  auto b = start("replica-b");
  PeerHintOptions slower;
  slower.refresh = 300ms;
  auto a = start("replica-a", slower);
  REQUIRE(eventually([&] { return a->hints->stats().connected == 1; }));
  const std::string address = b->hints->advertised();
  b->hints->stop();
  REQUIRE(eventually([&] { return a->hints->stats().connected == 0; }));
  // Back on the same address with a new key: A connects again once its refresh reads the key.
  PeerHintOptions same;
  same.listen = address;
  auto again = start("replica-b", same);
  REQUIRE(eventually([&] { return a->hints->stats().connected == 1; }));
  REQUIRE(hintUntilWoken(*again, {a.get()}));
  CHECK(a->hints->stats().peers == 1);
  again->hints->stop();
  REQUIRE(eventually([&] { return a->hints->stats().connected == 0; }));
}

TEST_CASE_METHOD(PeerHintsTest, "an address where no replica answers is dialled, never connected",
                 "[feed][hints]") {
  // Something else listens there (a wrong `advertise`): TCP connects, ZeroMQ's handshake never
  // completes.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  REQUIRE(::listen(fd, 4) == 0);
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  REQUIRE_THAT((*pool_->acquire())
                   ->exec("INSERT INTO feed_peers (replica_id, endpoint, public_key, seen_at)"
                          " VALUES ('impostor', ?, ?, ?)",
                          {strCat("127.0.0.1:", ntohs(addr.sin_port)), someKey(),
                           unixMillis() + 3600 * 1000}),
               IsOk());
  auto a = start("replica-a");
  auto b = start("replica-b");
  REQUIRE(eventually([&] { return a->hints->stats().connected == 1; }));
  std::this_thread::sleep_for(500ms);
  CHECK(a->hints->stats().peers == 2);
  CHECK(a->hints->stats().connected == 1);
  ::close(fd);
}

TEST_CASE_METHOD(PeerHintsTest, "only replicas recorded in feed_peers may subscribe to hints",
                 "[feed][hints]") {
  auto a = start("replica-a");
  CHECK(a->hints->publicKey().size() == 40);
  CHECK(rowsOf("SELECT COUNT(*) FROM feed_peers WHERE replica_id = 'replica-a' AND public_key = ?",
               {a->hints->publicKey()}) == 1);
  zmq::context_t context;
  auto subscriber = [&] {
    zmq::socket_t s(context, zmq::socket_type::sub);
    s.set(zmq::sockopt::linger, 0);
    s.set(zmq::sockopt::subscribe, "");
    return s;
  };
  char public_key[41] = {};
  char secret_key[41] = {};
  REQUIRE(zmq_curve_keypair(public_key, secret_key) == 0);
  // A subscriber with that key pair, connected to A.
  auto withKey = [&] {
    zmq::socket_t s = subscriber();
    s.set(zmq::sockopt::curve_serverkey, a->hints->publicKey());
    s.set(zmq::sockopt::curve_publickey, std::string(public_key));
    s.set(zmq::sockopt::curve_secretkey, std::string(secret_key));
    s.connect("tcp://" + a->hints->advertised());
    return s;
  };
  // One without CURVE, and one with a key no replica recorded.
  zmq::socket_t plain = subscriber();
  plain.connect("tcp://" + a->hints->advertised());
  zmq::socket_t stranger = withKey();
  auto got = [](zmq::socket_t& s) {
    zmq::message_t m;
    return s.recv(m, zmq::recv_flags::dontwait).has_value();
  };
  for (int i = 0; i < 20; ++i) {
    a->hints->publish();
    std::this_thread::sleep_for(50ms);
    CHECK_FALSE(got(plain));
    CHECK_FALSE(got(stranger));
  }
  CHECK(a->hints->stats().refused > 0);

  // Once its key is in feed_peers, A admits it from its next refresh on.
  REQUIRE_THAT((*pool_->acquire())
                   ->exec("INSERT INTO feed_peers (replica_id, endpoint, public_key, seen_at)"
                          " VALUES ('newcomer', '127.0.0.1:1', ?, ?)",
                          {std::string(public_key), unixMillis() + 3600 * 1000}),
               IsOk());
  REQUIRE(eventually([&] { return a->hints->stats().peers == 1; }));
  zmq::socket_t newcomer = withKey();
  CHECK(eventually(
      [&] {
        a->hints->publish();
        return got(newcomer);
      },
      10s));
  CHECK_FALSE(got(plain));

  // Its row gone, the key is not admitted any more: A's list replaces the one before.
  REQUIRE_THAT((*pool_->acquire())->exec("DELETE FROM feed_peers WHERE replica_id = 'newcomer'"),
               IsOk());
  REQUIRE(eventually([&] { return a->hints->stats().peers == 0; }));
  const uint64_t refused = a->hints->stats().refused;
  zmq::socket_t again = withKey();
  REQUIRE(eventually([&] { return a->hints->stats().refused > refused; }));
  for (int i = 0; i < 10; ++i) {
    a->hints->publish();
    std::this_thread::sleep_for(20ms);
    CHECK_FALSE(got(again));
  }
}

TEST_CASE_METHOD(PeerHintsTest, "a replica that starts after another hears it once admitted",
                 "[feed][hints]") {
  // A learns of B only at its next refresh, half a second away: B's first subscription to A is
  // refused, and B dials again until A admits it.
  PeerHintOptions slow;
  slow.refresh = 500ms;
  auto a = start("replica-a", slow);
  auto b = start("replica-b");
  REQUIRE(eventually([&] { return a->hints->stats().refused > 0; }));
  REQUIRE(hintUntilWoken(*a, {b.get()}));
  CHECK(b->hints->stats().connected == 1);
}

TEST_CASE_METHOD(PeerHintsTest, "rows without a key, or two on one address, mislead no replica",
                 "[feed][hints]") {
  auto b = start("replica-b");
  // A replica of an earlier version (no key) and B's own previous run on the same address,
  // still fresh: the first is not dialled, and the address is dialled with B's newer key.
  REQUIRE_THAT((*pool_->acquire())
                   ->exec("INSERT INTO feed_peers (replica_id, endpoint, public_key, seen_at)"
                          " VALUES ('older-version', '127.0.0.1:1', NULL, ?),"
                          " ('replica-b-before', ?, ?, ?)",
                          {unixMillis() + 3600 * 1000, b->hints->advertised(), someKey(),
                           unixMillis() - 1000}),
               IsOk());
  auto a = start("replica-a");
  CHECK(a->hints->stats().peers == 1);
  // Well before the old row ages out (9 s): dialled with the old key, A would connect only then.
  REQUIRE(eventually([&] { return a->hints->stats().connected == 1; }, 3s));
  REQUIRE(hintUntilWoken(*b, {a.get()}, 3s));
  REQUIRE(hintUntilWoken(*a, {b.get()}, 3s));
}

TEST_CASE_METHOD(PeerHintsTest, "a row with a wrong key is dialled, fails, and is counted",
                 "[feed][hints]") {
  auto b = start("replica-b");
  // A row fresher than B's own, on B's address, with a key that is not B's.
  REQUIRE_THAT((*pool_->acquire())
                   ->exec("INSERT INTO feed_peers (replica_id, endpoint, public_key, seen_at)"
                          " VALUES ('liar', ?, ?, ?)",
                          {b->hints->advertised(), someKey(), unixMillis() + 3600 * 1000}),
               IsOk());
  auto a = start("replica-a");
  CHECK(a->hints->stats().peers == 1);
  REQUIRE(eventually([&] { return a->hints->stats().handshake_failures > 0; }));
  CHECK(a->hints->stats().connected == 0);
  CHECK(a->hints->stats().refused == 0);
  // The other way round nothing is wrong: B hears A.
  REQUIRE(hintUntilWoken(*a, {b.get()}));
}

TEST_CASE_METHOD(PeerHintsTest, "a row with an address ZeroMQ refuses does not stop the others",
                 "[feed][hints]") {
  REQUIRE_THAT((*pool_->acquire())
                   ->exec("INSERT INTO feed_peers (replica_id, endpoint, public_key, seen_at)"
                          " VALUES ('broken', 'no port here', ?, ?)",
                          {someKey(), unixMillis() + 3600 * 1000}),
               IsOk());
  auto a = start("replica-a");
  auto b = start("replica-b");
  REQUIRE(eventually([&] { return a->hints->stats().peers == 1; }));
  REQUIRE(hintUntilWoken(*b, {a.get()}));
  CHECK(a->hints->stats().refresh_errors == 0);
}

TEST_CASE_METHOD(PeerHintsTest, "a burst of hints wakes the tailer once or twice, after the last",
                 "[feed][hints]") {
  auto a = start("replica-a");
  auto b = start("replica-b", minGap(500ms));
  REQUIRE(eventually([&] { return b->hints->stats().peers == 1; }));
  REQUIRE(hintUntilWoken(*a, {b.get()}));
  std::this_thread::sleep_for(700ms);  // the gap after that first wake-up is over
  const int before = b->wakeups;
  const uint64_t received_before = b->hints->stats().received;
  for (int i = 0; i < 10; ++i) {
    a->hints->publish();
    std::this_thread::sleep_for(5ms);
  }
  // Every hint is followed by a wake-up (the last one included, so the last commit is read),
  // but the burst makes one wake-up, or two when it straddles the end of a gap.
  REQUIRE(eventually(
      [&] {
        const uint64_t received = b->hints->stats().received;
        return received == received_before + 10 && b->received_at_wakeup == received;
      },
      5s));
  std::this_thread::sleep_for(700ms);
  CHECK(b->wakeups - before >= 1);
  CHECK(b->wakeups - before <= 2);
}

TEST_CASE_METHOD(PeerHintsTest, "bad listen addresses are refused naming the address",
                 "[feed][hints]") {
  auto hints = [&](const std::string& listen, const std::string& advertise = "") {
    PeerHintOptions options;
    options.listen = listen;
    options.advertise = advertise;
    return std::make_unique<PeerHints>(pool_, "x", options, [] {});
  };
  SECTION("not host:port") {
    auto status = hints("localhost")->start();
    CHECK_THAT(status, IsError(absl::StatusCode::kInvalidArgument));
    CHECK_THAT(std::string(status.message()), Catch::Contains("\"localhost\""));
  }
  SECTION("every interface and no advertised address") {
    auto status = hints("0.0.0.0:0")->start();
    CHECK_THAT(status, IsError(absl::StatusCode::kInvalidArgument));
    CHECK_THAT(std::string(status.message()), Catch::Contains("advertise"));
  }
  SECTION("a port in use") {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    REQUIRE(::listen(fd, 1) == 0);
    socklen_t len = sizeof(addr);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    const std::string taken = strCat("127.0.0.1:", ntohs(addr.sin_port));
    auto status = hints(taken)->start();
    ::close(fd);
    CHECK_THAT(status, IsError(absl::StatusCode::kUnavailable));
    CHECK_THAT(std::string(status.message()), Catch::Contains(strCat("cannot listen on ", taken)));
    CHECK(rowsOf("SELECT COUNT(*) FROM feed_peers") == 0);
  }
  SECTION("the advertised address is what the others read") {
    auto h = hints("127.0.0.1:0", "10.1.2.3:7444");
    REQUIRE_THAT(h->start(), IsOk());
    CHECK(h->advertised() == "10.1.2.3:7444");
    CHECK(rowsOf("SELECT COUNT(*) FROM feed_peers WHERE endpoint = '10.1.2.3:7444'") == 1);
  }
}

}  // namespace
}  // namespace krane::feed
