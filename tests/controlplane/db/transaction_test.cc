// Pool::transact against a real MariaDB: commit, rollback, and retry of conflicts.
#include <atomic>
#include <latch>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/strings.h"
#include "controlplane/db/errors.h"
#include "controlplane/db/pool.h"
#include "tests/support/mariadb.h"

namespace krane::db {
namespace {

using krane::testing::MariaDbTest;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

class TransactionTest : public MariaDbTest {
 protected:
  void SetUp() override {
    MariaDbTest::SetUp();
    auto pool = Pool::create(dsn_, {.max_connections = 8});
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = *pool;
    auto conn = pool_->acquire();
    ASSERT_TRUE(
        (*conn)
            ->execText("CREATE TABLE acct (id INT PRIMARY KEY, v INT NOT NULL) ENGINE=InnoDB")
            .ok());
    ASSERT_TRUE((*conn)->exec("INSERT INTO acct VALUES (1, 0), (2, 0)", {}).ok());
  }

  int64_t value(int id) {
    auto conn = pool_->acquire();
    return (*conn)->query("SELECT v FROM acct WHERE id = ?", {id})->rows.at(0).i64(0);
  }

  std::shared_ptr<Pool> pool_;
};

TEST_F(TransactionTest, CommitsWhenTheBodySucceeds) {
  auto status = pool_->transact("bump", [](Connection& c) {
    return c.exec("UPDATE acct SET v = v + 5 WHERE id = ?", {1}).status();
  });
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(value(1), 5);
}

TEST_F(TransactionTest, RollsBackEverythingWhenTheBodyFails) {
  int attempts = 0;
  auto status = pool_->transact("half", [&](Connection& c) -> absl::Status {
    ++attempts;
    if (auto st = c.exec("UPDATE acct SET v = 100 WHERE id = ?", {1}).status(); !st.ok()) return st;
    if (auto st = c.exec("INSERT INTO acct VALUES (?, ?)", {3, 3}).status(); !st.ok()) return st;
    return absl::InvalidArgumentError("validation failed after two writes");
  });
  EXPECT_TRUE(absl::IsInvalidArgument(status));
  EXPECT_EQ(attempts, 1);  // not a conflict: not retried
  EXPECT_EQ(value(1), 0);
  auto conn = pool_->acquire();
  EXPECT_EQ((*conn)->query("SELECT COUNT(*) FROM acct", {})->rows[0].i64(0), 2);
}

TEST_F(TransactionTest, ADuplicateKeyIsReturnedNotRetried) {
  int attempts = 0;
  auto status = pool_->transact("dup", [&](Connection& c) {
    ++attempts;
    return c.exec("INSERT INTO acct VALUES (?, ?)", {1, 1}).status();
  });
  EXPECT_TRUE(absl::IsAlreadyExists(status)) << status;
  EXPECT_EQ(attempts, 1);
}

TEST_F(TransactionTest, ADeadlockVictimIsRetriedAndCommits) {
  // Two transactions lock rows 1 and 2 in opposite orders; InnoDB kills one with 1213.
  std::latch both_locked_first_row(2);
  std::atomic<int> attempts{0};
  std::atomic<int> deadlocks{0};
  auto body = [&](int first, int second) {
    return [&, first, second, first_attempt = true](Connection& c) mutable -> absl::Status {
      ++attempts;
      if (auto st = c.exec("UPDATE acct SET v = v + 1 WHERE id = ?", {first}).status(); !st.ok()) {
        return st;
      }
      if (first_attempt) {
        first_attempt = false;
        both_locked_first_row.arrive_and_wait();
      }
      auto st = c.exec("UPDATE acct SET v = v + 1 WHERE id = ?", {second}).status();
      if (mysqlErrno(st) == 1213) ++deadlocks;
      return st;
    };
  };
  absl::Status a, b;
  std::thread ta([&] { a = pool_->transact("ab", body(1, 2)); });
  std::thread tb([&] { b = pool_->transact("ba", body(2, 1)); });
  ta.join();
  tb.join();
  ASSERT_TRUE(a.ok()) << a;
  ASSERT_TRUE(b.ok()) << b;
  EXPECT_EQ(deadlocks.load(), 1);
  EXPECT_EQ(attempts.load(), 3);  // one of them ran twice
  // Each transaction incremented each row exactly once.
  EXPECT_EQ(value(1), 2);
  EXPECT_EQ(value(2), 2);
}

TEST_F(TransactionTest, ALockWaitTimeoutIsRetried) {
  auto holder = Connection::open(dsn_);
  ASSERT_TRUE(holder.ok());
  ASSERT_TRUE((*holder)->execText("START TRANSACTION").ok());
  ASSERT_TRUE((*holder)->query("SELECT v FROM acct WHERE id = ? FOR UPDATE", {1}).ok());
  std::thread release([&] {
    std::this_thread::sleep_for(1500ms);
    ASSERT_TRUE((*holder)->execText("COMMIT").ok());
  });
  std::vector<int> errnos;
  auto status = pool_->transact("wait", [&](Connection& c) -> absl::Status {
    if (auto st = c.execText("SET SESSION innodb_lock_wait_timeout = 1"); !st.ok()) return st;
    auto st = c.exec("UPDATE acct SET v = 7 WHERE id = ?", {1}).status();
    errnos.push_back(mysqlErrno(st));
    return st;
  });
  release.join();
  ASSERT_TRUE(status.ok()) << status;
  ASSERT_GE(errnos.size(), 2u);
  EXPECT_EQ(errnos.front(), 1205);
  EXPECT_EQ(errnos.back(), 0);
  EXPECT_EQ(value(1), 7);
}

TEST_F(TransactionTest, GivesUpAfterMaxAttemptsNamingTheTransaction) {
  int attempts = 0;
  TxOptions options;
  options.max_attempts = 3;
  options.backoff = {1ms, 2.0, 5ms, 0.5};
  auto status = pool_->transact(
      "always-conflicting",
      [&](Connection&) {
        ++attempts;
        return statementError(1213, "40001", "Deadlock found", "UPDATE x");
      },
      options);
  EXPECT_EQ(attempts, 3);
  EXPECT_TRUE(absl::IsAborted(status));
  EXPECT_THAT(std::string(toStd(status.message())),
              HasSubstr("always-conflicting gave up after 3 attempts"));
}

TEST_F(TransactionTest, AConnectionLostBeforeCommitIsRetriedOnAFreshOne) {
  auto killer = Connection::open(dsn_);
  ASSERT_TRUE(killer.ok());
  int attempts = 0;
  auto status = pool_->transact("lost", [&](Connection& c) -> absl::Status {
    ++attempts;
    if (auto st = c.exec("UPDATE acct SET v = v + 1 WHERE id = ?", {1}).status(); !st.ok()) {
      return st;
    }
    if (attempts == 1) {
      if (auto st = (*killer)->exec("KILL ?", {c.threadId()}).status(); !st.ok()) return st;
    }
    return c.exec("UPDATE acct SET v = v + 1 WHERE id = ?", {2}).status();
  });
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(attempts, 2);
  // The killed attempt was rolled back by the server: each row was incremented once.
  EXPECT_EQ(value(1), 1);
  EXPECT_EQ(value(2), 1);
}

}  // namespace
}  // namespace krane::db
