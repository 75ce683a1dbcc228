// Typed binding and result decoding against a real MariaDB.
#include "controlplane/db/connection.h"

#include <limits>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/strings.h"
#include "controlplane/db/errors.h"
#include "tests/support/mariadb.h"

namespace krane::db {
namespace {

using krane::testing::MariaDbTest;
using ::testing::HasSubstr;

class ConnectionTest : public MariaDbTest {
 protected:
  void SetUp() override {
    MariaDbTest::SetUp();
    auto conn = Connection::open(dsn_);
    ASSERT_TRUE(conn.ok()) << conn.status();
    conn_ = *std::move(conn);
    ASSERT_TRUE(
        conn_
            ->execText("CREATE TABLE t (id BIGINT AUTO_INCREMENT PRIMARY KEY, i BIGINT NULL,"
                       " u BIGINT UNSIGNED NULL, d DOUBLE NULL, s VARCHAR(255) NULL,"
                       " b LONGBLOB NULL, dec_col DECIMAL(10,2) NULL, tiny TINYINT NULL)")
            .ok());
  }
  std::unique_ptr<Connection> conn_;
};

TEST_F(ConnectionTest, RoundTripsEveryType) {
  const std::string binary("\0\x01\xff\xfe'\";--", 9);
  const std::string text = "O'Reilly \"quoted\" ; DROP TABLE t; -- ünïcødé";
  auto inserted =
      conn_->exec("INSERT INTO t (i, u, d, s, b, dec_col, tiny) VALUES (?, ?, ?, ?, ?, ?, ?)",
                  {std::numeric_limits<int64_t>::min(), std::numeric_limits<uint64_t>::max(), 2.5,
                   text, Blob{binary}, "12.34", -3});
  ASSERT_TRUE(inserted.ok()) << inserted.status();
  EXPECT_EQ(*inserted, 1u);
  const uint64_t id = conn_->lastInsertId();
  EXPECT_GT(id, 0u);

  auto rows = conn_->query("SELECT i, u, d, s, b, dec_col, tiny FROM t WHERE id = ?", {id});
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->rows.size(), 1u);
  const Row& row = rows->rows[0];
  EXPECT_EQ(row.i64("i"), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(row.u64("u"), std::numeric_limits<uint64_t>::max());
  EXPECT_DOUBLE_EQ(row.f64("d"), 2.5);
  EXPECT_EQ(row.str("s"), text);  // stored literally: values are bound, never spliced
  EXPECT_EQ(row.str("b"), binary);
  EXPECT_TRUE(std::holds_alternative<Blob>(row.value(4).storage()));
  EXPECT_EQ(row.str("dec_col"), "12.34");
  EXPECT_EQ(row.i64("tiny"), -3);
}

TEST_F(ConnectionTest, NullsBindAndReadBack) {
  std::optional<int64_t> none;
  ASSERT_TRUE(conn_->exec("INSERT INTO t (i, s) VALUES (?, ?)", {none, nullptr}).ok());
  auto rows = conn_->query("SELECT i, s FROM t", {});
  ASSERT_TRUE(rows.ok());
  EXPECT_TRUE(rows->rows[0].isNull("i"));
  EXPECT_EQ(rows->rows[0].optStr("s"), std::nullopt);
  EXPECT_EQ(rows->rows[0].optI64("i"), std::nullopt);
}

TEST_F(ConnectionTest, LargeValuesAreNotTruncated) {
  std::string big(size_t{3} * 1024 * 1024, 'x');
  big[12345] = '\0';
  ASSERT_TRUE(conn_->exec("INSERT INTO t (b) VALUES (?)", {Blob{big}}).ok());
  ASSERT_TRUE(conn_->exec("INSERT INTO t (b) VALUES (?)", {Blob{"small"}}).ok());
  auto rows = conn_->query("SELECT b FROM t ORDER BY id", {});
  ASSERT_TRUE(rows.ok());
  EXPECT_EQ(rows->rows[0].str(0), big);
  EXPECT_EQ(rows->rows[1].str(0), "small");
}

TEST_F(ConnectionTest, ReusesPreparedStatements) {
  for (int i = 0; i < 50; ++i) {
    ASSERT_TRUE(conn_->exec("INSERT INTO t (i) VALUES (?)", {i}).ok());
  }
  auto rows = conn_->query("SELECT COUNT(*) AS n, SUM(i) AS total FROM t", {});
  ASSERT_TRUE(rows.ok());
  EXPECT_EQ(rows->rows[0].i64("n"), 50);
  EXPECT_EQ(rows->rows[0].str("total"), "1225");  // SUM of BIGINT is DECIMAL, sent as text
  EXPECT_EQ(rows->rows[0].i64("total"), 1225);    // and still reads as a whole number
  auto mixed = conn_->query("SELECT COALESCE(MAX(u), 0) AS m, SUM(d) AS f FROM t", {});
  ASSERT_TRUE(mixed.ok());
  EXPECT_EQ(mixed->rows[0].u64("m"), 0u);
}

TEST_F(ConnectionTest, QueryEachStreamsAndStopsOnError) {
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(conn_->exec("INSERT INTO t (i) VALUES (?)", {i}).ok());
  int seen = 0;
  auto status = conn_->queryEach("SELECT i FROM t ORDER BY i", {}, [&](const Row& row) {
    if (row.i64(0) == 4) return absl::CancelledError("enough");
    ++seen;
    return absl::OkStatus();
  });
  EXPECT_TRUE(absl::IsCancelled(status));
  EXPECT_EQ(seen, 4);
  // The connection is still usable afterwards.
  auto count = conn_->query("SELECT COUNT(*) FROM t", {});
  ASSERT_TRUE(count.ok()) << count.status();
  EXPECT_EQ(count->rows[0].i64(0), 10);
}

TEST_F(ConnectionTest, WrongParameterCountIsAClearError) {
  auto result = conn_->exec("INSERT INTO t (i, s) VALUES (?, ?)", {1});
  ASSERT_FALSE(result.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(result.status()));
  EXPECT_THAT(toStd(result.status().message()), HasSubstr("takes 2 parameters, 1 given"));
}

TEST_F(ConnectionTest, ErrorsNameTheStatementAndCarryTheErrno) {
  auto bad = conn_->exec("INSERT INTO no_such_table (x) VALUES (?)", {1});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(mysqlErrno(bad.status()), 1146);
  EXPECT_THAT(toStd(bad.status().message()), HasSubstr("INSERT INTO no_such_table (x) VALUES (?)"));
  EXPECT_THAT(toStd(bad.status().message()), HasSubstr("doesn't exist"));

  ASSERT_TRUE(conn_->execText("CREATE TABLE u (k VARCHAR(10) PRIMARY KEY)").ok());
  ASSERT_TRUE(conn_->exec("INSERT INTO u VALUES (?)", {"a"}).ok());
  auto dup = conn_->exec("INSERT INTO u VALUES (?)", {"a"});
  EXPECT_TRUE(absl::IsAlreadyExists(dup.status())) << dup.status();
  // Strict mode: a value too long fails instead of being silently truncated.
  auto too_long = conn_->exec("INSERT INTO u VALUES (?)", {"abcdefghijklmnop"});
  ASSERT_FALSE(too_long.ok());
  EXPECT_EQ(mysqlErrno(too_long.status()), 1406);
}

TEST_F(ConnectionTest, KilledSessionIsBrokenNotSilentlyReconnected) {
  auto other = Connection::open(dsn_);
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE((*other)->exec("KILL ?", {conn_->threadId()}).ok());
  auto after = conn_->query("SELECT 1", {});
  ASSERT_FALSE(after.ok());
  EXPECT_TRUE(absl::IsUnavailable(after.status())) << after.status();
  EXPECT_TRUE(conn_->broken());
}

TEST(ConnectionOpen, WrongPasswordAndUnknownDatabaseSayWhatToFix) {
  auto& server = krane::testing::ScratchMariaDb::instance();
  Dsn dsn = server.adminDsn();
  dsn.password = "wrong";
  auto denied = Connection::open(dsn);
  ASSERT_FALSE(denied.ok());
  EXPECT_TRUE(absl::IsPermissionDenied(denied.status()));
  EXPECT_THAT(toStd(denied.status().message()), HasSubstr("check the user and password"));

  dsn = server.adminDsn();
  dsn.database = "does_not_exist";
  auto missing = Connection::open(dsn);
  ASSERT_FALSE(missing.ok());
  EXPECT_TRUE(absl::IsNotFound(missing.status()));
  EXPECT_THAT(toStd(missing.status().message()), HasSubstr("create the database first"));
}

}  // namespace
}  // namespace krane::db
