// Pool::transact against a real MariaDB: commit, rollback, and retry of conflicts.
#include <atomic>
#include <latch>
#include <thread>

#include <catch2/catch.hpp>

#include "common/strings.h"
#include "controlplane/db/errors.h"
#include "controlplane/db/pool.h"
#include "tests/support/mariadb.h"
#include "tests/support/matchers.h"

namespace krane::db {
namespace {

using krane::testing::MariaDbTest;
using namespace std::chrono_literals;

class TransactionTest : public MariaDbTest {
 protected:
  TransactionTest() {
    auto pool = Pool::create(dsn_, {.max_connections = 8});
    REQUIRE_THAT(pool, IsOk());
    pool_ = *pool;
    auto conn = pool_->acquire();
    REQUIRE_THAT(
        (*conn)->execText("CREATE TABLE acct (id INT PRIMARY KEY, v INT NOT NULL) ENGINE=InnoDB"),
        IsOk());
    REQUIRE_THAT((*conn)->exec("INSERT INTO acct VALUES (1, 0), (2, 0)", {}), IsOk());
  }

  int64_t value(int id) {
    auto conn = pool_->acquire();
    return (*conn)->query("SELECT v FROM acct WHERE id = ?", {id})->rows.at(0).i64(0);
  }

  std::shared_ptr<Pool> pool_;
};

TEST_CASE_METHOD(TransactionTest, "commits when the body succeeds", "[transaction]") {
  auto status = pool_->transact("bump", [](Connection& c) {
    return c.exec("UPDATE acct SET v = v + 5 WHERE id = ?", {1}).status();
  });
  REQUIRE_THAT(status, IsOk());
  CHECK(value(1) == 5);
}

TEST_CASE_METHOD(TransactionTest, "rolls back everything when the body fails", "[transaction]") {
  int attempts = 0;
  auto status = pool_->transact("half", [&](Connection& c) -> absl::Status {
    ++attempts;
    if (auto st = c.exec("UPDATE acct SET v = 100 WHERE id = ?", {1}).status(); !st.ok()) return st;
    if (auto st = c.exec("INSERT INTO acct VALUES (?, ?)", {3, 3}).status(); !st.ok()) return st;
    return absl::InvalidArgumentError("validation failed after two writes");
  });
  CHECK(absl::IsInvalidArgument(status));
  CHECK(attempts == 1);  // not a conflict: not retried
  CHECK(value(1) == 0);
  auto conn = pool_->acquire();
  CHECK((*conn)->query("SELECT COUNT(*) FROM acct", {})->rows[0].i64(0) == 2);
}

// A body that throws (a workflow step's signals do, through its transaction) must leave nothing
// behind: neither its writes nor an open transaction in a pooled connection, whose locks would be
// held until the connection's next user happened to end it.
TEST_CASE_METHOD(TransactionTest, "a body that throws is rolled back and holds no lock",
                 "[transaction]") {
  struct Thrown {};
  CHECK_THROWS_AS(
      pool_->transact("throws",
                      [](Connection& c) -> absl::Status {
                        auto locked = c.query("SELECT v FROM acct WHERE id = 1 FOR UPDATE", {});
                        if (!locked.ok()) return locked.status();
                        if (auto st = c.exec("UPDATE acct SET v = 7 WHERE id = 2", {}).status();
                            !st.ok()) {
                          return st;
                        }
                        throw Thrown{};
                      }),
      Thrown);
  CHECK(value(2) == 0);
  // Every pooled connection, in turn, can lock the row at once.
  std::vector<PooledConnection> held;
  for (int i = 0; i < 8; ++i) {
    auto conn = pool_->acquire();
    REQUIRE_THAT(conn, IsOk());
    REQUIRE_THAT((*conn)->execText("SET SESSION innodb_lock_wait_timeout = 1"), IsOk());
    REQUIRE_THAT((*conn)->execText("START TRANSACTION"), IsOk());
    CHECK_THAT((*conn)->query("SELECT v FROM acct WHERE id = 1 FOR UPDATE", {}), IsOk());
    REQUIRE_THAT((*conn)->execText("ROLLBACK"), IsOk());
    held.push_back(*std::move(conn));
  }
}

TEST_CASE_METHOD(TransactionTest,
                 "a connection given back with its transaction open is rolled back",
                 "[transaction]") {
  {
    auto conn = pool_->acquire();
    REQUIRE_THAT(conn, IsOk());
    REQUIRE_THAT((*conn)->execText("START TRANSACTION"), IsOk());
    REQUIRE_THAT((*conn)->exec("UPDATE acct SET v = 9 WHERE id = 1", {}), IsOk());
    CHECK((*conn)->inTransaction());
  }  // given back as it is
  CHECK(value(1) == 0);
  auto conn = pool_->acquire();
  REQUIRE_THAT(conn, IsOk());
  CHECK_FALSE((*conn)->inTransaction());
  auto other = pool_->acquire();
  REQUIRE_THAT(other, IsOk());
  REQUIRE_THAT((*other)->execText("SET SESSION innodb_lock_wait_timeout = 1"), IsOk());
  CHECK_THAT((*other)->exec("UPDATE acct SET v = 1 WHERE id = 1", {}), IsOk());
}

TEST_CASE_METHOD(TransactionTest, "a duplicate key is returned not retried", "[transaction]") {
  int attempts = 0;
  auto status = pool_->transact("dup", [&](Connection& c) {
    ++attempts;
    return c.exec("INSERT INTO acct VALUES (?, ?)", {1, 1}).status();
  });
  INFO(status);
  CHECK(absl::IsAlreadyExists(status));
  CHECK(attempts == 1);
}

TEST_CASE_METHOD(TransactionTest, "a deadlock victim is retried and commits", "[transaction]") {
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
  REQUIRE_THAT(a, IsOk());
  REQUIRE_THAT(b, IsOk());
  CHECK(deadlocks.load() == 1);
  CHECK(attempts.load() == 3);  // one of them ran twice
  // Each transaction incremented each row exactly once.
  CHECK(value(1) == 2);
  CHECK(value(2) == 2);
}

TEST_CASE_METHOD(TransactionTest, "a lock wait timeout is retried", "[transaction]") {
  auto holder = Connection::open(dsn_);
  REQUIRE_THAT(holder, IsOk());
  REQUIRE_THAT((*holder)->execText("START TRANSACTION"), IsOk());
  REQUIRE_THAT((*holder)->query("SELECT v FROM acct WHERE id = ? FOR UPDATE", {1}), IsOk());
  absl::Status committed;
  std::thread release([&] {
    std::this_thread::sleep_for(1500ms);
    committed = (*holder)->execText("COMMIT");
  });
  std::vector<int> errnos;
  auto status = pool_->transact("wait", [&](Connection& c) -> absl::Status {
    if (auto st = c.execText("SET SESSION innodb_lock_wait_timeout = 1"); !st.ok()) return st;
    auto st = c.exec("UPDATE acct SET v = 7 WHERE id = ?", {1}).status();
    errnos.push_back(mysqlErrno(st));
    return st;
  });
  release.join();
  REQUIRE_THAT(committed, IsOk());
  REQUIRE_THAT(status, IsOk());
  REQUIRE(errnos.size() >= 2u);
  CHECK(errnos.front() == 1205);
  CHECK(errnos.back() == 0);
  CHECK(value(1) == 7);
}

TEST_CASE_METHOD(TransactionTest, "gives up after max attempts naming the transaction",
                 "[transaction]") {
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
  CHECK(attempts == 3);
  CHECK(absl::IsAborted(status));
  CHECK_THAT(std::string(toStd(status.message())),
             Catch::Contains("always-conflicting gave up after 3 attempts"));
}

TEST_CASE_METHOD(TransactionTest, "a connection lost before commit is retried on a fresh one",
                 "[transaction]") {
  auto killer = Connection::open(dsn_);
  REQUIRE_THAT(killer, IsOk());
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
  REQUIRE_THAT(status, IsOk());
  CHECK(attempts == 2);
  // The killed attempt was rolled back by the server: each row was incremented once.
  CHECK(value(1) == 1);
  CHECK(value(2) == 1);
}

}  // namespace
}  // namespace krane::db
