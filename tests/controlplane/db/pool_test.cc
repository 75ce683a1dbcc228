// The connection pool against a real MariaDB: exhaustion, waiting, server restarts and outages.
#include "controlplane/db/pool.h"

#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/strings.h"
#include "tests/support/mariadb.h"

namespace krane::db {
namespace {

using krane::testing::MariaDbTest;
using krane::testing::ScratchMariaDb;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

std::string messageOf(const absl::Status& status) { return std::string(toStd(status.message())); }

class PoolTest : public MariaDbTest {
 protected:
  std::shared_ptr<Pool> makePool(PoolOptions options) {
    auto pool = Pool::create(dsn_, options);
    EXPECT_TRUE(pool.ok()) << pool.status();
    return pool.ok() ? *pool : nullptr;
  }
};

TEST_F(PoolTest, ExhaustionWaitsThenTimesOutWithAClearError) {
  auto pool = makePool({.max_connections = 2, .acquire_timeout = 300ms});
  auto a = pool->acquire();
  auto b = pool->acquire();
  ASSERT_TRUE(a.ok() && b.ok());
  const auto started = std::chrono::steady_clock::now();
  auto c = pool->acquire();
  const auto waited = std::chrono::steady_clock::now() - started;
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(absl::IsResourceExhausted(c.status()));
  EXPECT_THAT(messageOf(c.status()), HasSubstr("all 2 connections"));
  EXPECT_THAT(messageOf(c.status()), HasSubstr("300 ms"));
  EXPECT_GE(waited, 250ms);  // it did wait rather than fail at once
  EXPECT_EQ(pool->stats().open, 2u);
}

TEST_F(PoolTest, AWaiterGetsTheConnectionThatIsReleased) {
  auto pool = makePool({.max_connections = 1, .acquire_timeout = 5000ms});
  auto held = pool->acquire();
  ASSERT_TRUE(held.ok());
  const uint64_t session = (*held)->threadId();
  std::thread releaser([&] {
    std::this_thread::sleep_for(100ms);
    held = PooledConnection();  // returns it
  });
  auto waited = pool->acquire();
  releaser.join();
  ASSERT_TRUE(waited.ok()) << waited.status();
  EXPECT_EQ((*waited)->threadId(), session);  // the same session, reused
  EXPECT_EQ(pool->stats().open, 1u);
}

TEST_F(PoolTest, ManyThreadsShareABoundedPool) {
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
  EXPECT_EQ(failures.load(), 0);
  EXPECT_LE(pool->stats().open, 4u);
}

TEST_F(PoolTest, BrokenConnectionsAreDiscardedNotReturned) {
  auto pool = makePool({.max_connections = 2});
  {
    auto conn = pool->acquire();
    ASSERT_TRUE(conn.ok());
    (*conn)->discard();
  }
  EXPECT_EQ(pool->stats().open, 0u);
  auto fresh = pool->acquire();
  ASSERT_TRUE(fresh.ok());
  EXPECT_TRUE((*fresh)->query("SELECT 1", {}).ok());
}

TEST_F(PoolTest, RecoversAfterTheServerRestarts) {
  auto pool = makePool({.max_connections = 4, .ping_after_idle = 0ms});
  {
    auto conn = pool->acquire();
    ASSERT_TRUE(conn.ok());
    ASSERT_TRUE((*conn)->execText("CREATE TABLE r (x INT)").ok());
  }
  ScratchMariaDb::instance().restart();
  // The idle connection died with the server: the health check replaces it.
  auto conn = pool->acquire();
  ASSERT_TRUE(conn.ok()) << conn.status();
  auto rows = (*conn)->query("SELECT COUNT(*) FROM r", {});
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(rows->rows[0].i64(0), 0);
}

TEST_F(PoolTest, TransactionsSurviveARestartWithoutAHealthCheck) {
  // With a long ping interval the dead session is only noticed when used; transact() retries.
  auto pool = makePool({.max_connections = 4, .ping_after_idle = 3600000ms});
  ASSERT_TRUE(
      pool->transact("create", [](Connection& c) { return c.execText("CREATE TABLE r (x INT)"); })
          .ok());
  ScratchMariaDb::instance().restart();
  int attempts = 0;
  auto status = pool->transact("insert", [&](Connection& c) {
    ++attempts;
    return c.exec("INSERT INTO r VALUES (?)", {1}).status();
  });
  ASSERT_TRUE(status.ok()) << status;
  // The dead session failed at START TRANSACTION; the body then ran once, on a new session.
  EXPECT_EQ(attempts, 1);
  auto conn = pool->acquire();
  ASSERT_TRUE(conn.ok());
  EXPECT_EQ((*conn)->query("SELECT COUNT(*) FROM r", {})->rows[0].i64(0), 1);
}

TEST_F(PoolTest, ServerDownIsAClearErrorAndRecoveryIsAutomatic) {
  auto pool = makePool({.max_connections = 2, .ping_after_idle = 0ms});
  ScratchMariaDb::instance().stop();
  auto create = Pool::create(dsn_);
  ASSERT_FALSE(create.ok());
  EXPECT_TRUE(absl::IsUnavailable(create.status()));
  EXPECT_THAT(messageOf(create.status()),
              HasSubstr(strCat("cannot connect to MySQL at 127.0.0.1:", dsn_.port)));
  EXPECT_THAT(messageOf(create.status()), HasSubstr("is the server running"));

  auto down = pool->acquire();
  ASSERT_FALSE(down.ok());
  EXPECT_TRUE(absl::IsUnavailable(down.status()));
  EXPECT_EQ(pool->stats().open, 0u);  // failed attempts do not leak slots

  ScratchMariaDb::instance().start();
  auto up = pool->acquire();
  ASSERT_TRUE(up.ok()) << up.status();
  EXPECT_TRUE((*up)->query("SELECT 1", {}).ok());
}

TEST(PoolCreate, RejectsAZeroSizedPool) {
  auto pool = Pool::create(ScratchMariaDb::instance().adminDsn(), {.max_connections = 0});
  ASSERT_FALSE(pool.ok());
  EXPECT_THAT(messageOf(pool.status()), HasSubstr("max_connections must be at least 1"));
}

}  // namespace
}  // namespace krane::db
