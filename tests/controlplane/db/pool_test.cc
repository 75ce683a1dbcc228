// The connection pool against a real MariaDB: exhaustion, waiting, server restarts and outages.
#include "controlplane/db/pool.h"

#include <thread>

#include <catch2/catch.hpp>

#include "common/strings.h"
#include "tests/support/mariadb.h"
#include "tests/support/matchers.h"

namespace krane::db {
namespace {

using krane::testing::MariaDbTest;
using krane::testing::ScratchMariaDb;
using namespace std::chrono_literals;

std::string messageOf(const absl::Status& status) { return std::string(toStd(status.message())); }

class PoolTest : public MariaDbTest {
 protected:
  std::shared_ptr<Pool> makePool(PoolOptions options) {
    auto pool = Pool::create(dsn_, options);
    CHECK_THAT(pool, IsOk());
    return pool.ok() ? *pool : nullptr;
  }
};

TEST_CASE_METHOD(PoolTest, "exhaustion waits then times out with a clear error", "[pool]") {
  auto pool = makePool({.max_connections = 2, .acquire_timeout = 300ms});
  auto a = pool->acquire();
  auto b = pool->acquire();
  REQUIRE((a.ok() && b.ok()));
  const auto started = std::chrono::steady_clock::now();
  auto c = pool->acquire();
  const auto waited = std::chrono::steady_clock::now() - started;
  REQUIRE_FALSE(c.ok());
  CHECK(absl::IsResourceExhausted(c.status()));
  CHECK_THAT(messageOf(c.status()), Catch::Contains("all 2 connections"));
  CHECK_THAT(messageOf(c.status()), Catch::Contains("300 ms"));
  CHECK(waited >= 250ms);  // it did wait rather than fail at once
  CHECK(pool->stats().open == 2u);
}

TEST_CASE_METHOD(PoolTest, "a waiter gets the connection that is released", "[pool]") {
  auto pool = makePool({.max_connections = 1, .acquire_timeout = 5000ms});
  auto held = pool->acquire();
  REQUIRE_THAT(held, IsOk());
  const uint64_t session = (*held)->threadId();
  std::thread releaser([&] {
    std::this_thread::sleep_for(100ms);
    held = PooledConnection();  // returns it
  });
  auto waited = pool->acquire();
  releaser.join();
  REQUIRE_THAT(waited, IsOk());
  CHECK((*waited)->threadId() == session);  // the same session, reused
  CHECK(pool->stats().open == 1u);
}

TEST_CASE_METHOD(PoolTest, "many threads share a bounded pool", "[pool]") {
  auto pool = makePool({.max_connections = 4, .acquire_timeout = 10000ms});
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 16; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 20; ++i) {
        auto conn = pool->acquire();
        if (!conn.ok() || !(*conn)->query("SELECT SLEEP(0.001)", {}).ok()) ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(failures.load() == 0);
  CHECK(pool->stats().open <= 4u);
}

TEST_CASE_METHOD(PoolTest, "broken connections are discarded not returned", "[pool]") {
  auto pool = makePool({.max_connections = 2});
  {
    auto conn = pool->acquire();
    REQUIRE_THAT(conn, IsOk());
    (*conn)->discard();
  }
  CHECK(pool->stats().open == 0u);
  auto fresh = pool->acquire();
  REQUIRE_THAT(fresh, IsOk());
  CHECK_THAT((*fresh)->query("SELECT 1", {}), IsOk());
}

TEST_CASE_METHOD(PoolTest, "recovers after the server restarts", "[pool]") {
  auto pool = makePool({.max_connections = 4, .ping_after_idle = 0ms});
  {
    auto conn = pool->acquire();
    REQUIRE_THAT(conn, IsOk());
    REQUIRE_THAT((*conn)->execText("CREATE TABLE r (x INT)"), IsOk());
  }
  ScratchMariaDb::instance().restart();
  // The idle connection died with the server: the health check replaces it.
  auto conn = pool->acquire();
  REQUIRE_THAT(conn, IsOk());
  auto rows = (*conn)->query("SELECT COUNT(*) FROM r", {});
  REQUIRE_THAT(rows, IsOk());
  CHECK(rows->rows[0].i64(0) == 0);
}

TEST_CASE_METHOD(PoolTest, "transactions survive a restart without a health check", "[pool]") {
  // With a long ping interval the dead session is only noticed when used; transact() retries.
  auto pool = makePool({.max_connections = 4, .ping_after_idle = 3600000ms});
  REQUIRE_THAT(
      pool->transact("create", [](Connection& c) { return c.execText("CREATE TABLE r (x INT)"); }),
      IsOk());
  ScratchMariaDb::instance().restart();
  int attempts = 0;
  auto status = pool->transact("insert", [&](Connection& c) {
    ++attempts;
    return c.exec("INSERT INTO r VALUES (?)", {1}).status();
  });
  REQUIRE_THAT(status, IsOk());
  // The dead session failed at START TRANSACTION; the body then ran once, on a new session.
  CHECK(attempts == 1);
  auto conn = pool->acquire();
  REQUIRE_THAT(conn, IsOk());
  CHECK((*conn)->query("SELECT COUNT(*) FROM r", {})->rows[0].i64(0) == 1);
}

TEST_CASE_METHOD(PoolTest, "server down is a clear error and recovery is automatic", "[pool]") {
  auto pool = makePool({.max_connections = 2, .ping_after_idle = 0ms});
  ScratchMariaDb::instance().stop();
  auto create = Pool::create(dsn_);
  REQUIRE_FALSE(create.ok());
  CHECK(absl::IsUnavailable(create.status()));
  CHECK_THAT(messageOf(create.status()),
             Catch::Contains(strCat("cannot connect to MySQL at 127.0.0.1:", dsn_.port)));
  CHECK_THAT(messageOf(create.status()), Catch::Contains("is the server running"));

  auto down = pool->acquire();
  REQUIRE_FALSE(down.ok());
  CHECK(absl::IsUnavailable(down.status()));
  CHECK(pool->stats().open == 0u);  // failed attempts do not leak slots

  ScratchMariaDb::instance().start();
  auto up = pool->acquire();
  REQUIRE_THAT(up, IsOk());
  CHECK_THAT((*up)->query("SELECT 1", {}), IsOk());
}

TEST_CASE("rejects a zero sized pool", "[pool-create]") {
  auto pool = Pool::create(ScratchMariaDb::instance().adminDsn(), {.max_connections = 0});
  REQUIRE_FALSE(pool.ok());
  CHECK_THAT(messageOf(pool.status()), Catch::Contains("max_connections must be at least 1"));
}

}  // namespace
}  // namespace krane::db
