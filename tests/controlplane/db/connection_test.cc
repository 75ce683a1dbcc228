// Typed binding and result decoding against a real MariaDB.
#include "controlplane/db/connection.h"

#include <chrono>
#include <limits>
#include <set>

#include <catch2/catch.hpp>

#include "common/strings.h"
#include "controlplane/db/errors.h"
#include "tests/support/mariadb.h"
#include "tests/support/matchers.h"

namespace krane::db {
namespace {

using krane::testing::MariaDbTest;

class ConnectionTest : public MariaDbTest {
 protected:
  ConnectionTest() {
    auto conn = Connection::open(dsn_);
    REQUIRE_THAT(conn, IsOk());
    conn_ = *std::move(conn);
    REQUIRE_THAT(
        conn_->execText("CREATE TABLE t (id BIGINT AUTO_INCREMENT PRIMARY KEY, i BIGINT NULL,"
                        " u BIGINT UNSIGNED NULL, d DOUBLE NULL, s VARCHAR(255) NULL,"
                        " b LONGBLOB NULL, dec_col DECIMAL(10,2) NULL, tiny TINYINT NULL)"),
        IsOk());
  }
  std::unique_ptr<Connection> conn_;
};

TEST_CASE_METHOD(ConnectionTest, "round trips every type", "[connection]") {
  const std::string binary("\0\x01\xff\xfe'\";--", 9);
  const std::string text = "O'Reilly \"quoted\" ; DROP TABLE t; -- ünïcødé";
  auto inserted =
      conn_->exec("INSERT INTO t (i, u, d, s, b, dec_col, tiny) VALUES (?, ?, ?, ?, ?, ?, ?)",
                  {std::numeric_limits<int64_t>::min(), std::numeric_limits<uint64_t>::max(), 2.5,
                   text, Blob{binary}, "12.34", -3});
  REQUIRE_THAT(inserted, IsOk());
  CHECK(*inserted == 1u);
  const uint64_t id = conn_->lastInsertId();
  CHECK(id > 0u);

  auto rows = conn_->query("SELECT i, u, d, s, b, dec_col, tiny FROM t WHERE id = ?", {id});
  REQUIRE_THAT(rows, IsOk());
  REQUIRE(rows->rows.size() == 1u);
  const Row& row = rows->rows[0];
  CHECK(row.i64("i") == std::numeric_limits<int64_t>::min());
  CHECK(row.u64("u") == std::numeric_limits<uint64_t>::max());
  CHECK(row.f64("d") == Approx(2.5));
  CHECK(row.str("s") == text);  // stored literally: values are bound, never spliced
  CHECK(row.str("b") == binary);
  CHECK(std::holds_alternative<Blob>(row.value(4).storage()));
  CHECK(row.str("dec_col") == "12.34");
  CHECK(row.i64("tiny") == -3);
}

TEST_CASE_METHOD(ConnectionTest, "nulls bind and read back", "[connection]") {
  std::optional<int64_t> none;
  REQUIRE_THAT(conn_->exec("INSERT INTO t (i, s) VALUES (?, ?)", {none, nullptr}), IsOk());
  auto rows = conn_->query("SELECT i, s FROM t", {});
  REQUIRE_THAT(rows, IsOk());
  CHECK(rows->rows[0].isNull("i"));
  CHECK(rows->rows[0].optStr("s") == std::nullopt);
  CHECK(rows->rows[0].optI64("i") == std::nullopt);
}

TEST_CASE_METHOD(ConnectionTest, "large values are not truncated", "[connection]") {
  std::string big(size_t{3} * 1024 * 1024, 'x');
  big[12345] = '\0';
  REQUIRE_THAT(conn_->exec("INSERT INTO t (b) VALUES (?)", {Blob{big}}), IsOk());
  REQUIRE_THAT(conn_->exec("INSERT INTO t (b) VALUES (?)", {Blob{"small"}}), IsOk());
  auto rows = conn_->query("SELECT b FROM t ORDER BY id", {});
  REQUIRE_THAT(rows, IsOk());
  CHECK(rows->rows[0].str(0) == big);
  CHECK(rows->rows[1].str(0) == "small");
}

TEST_CASE_METHOD(ConnectionTest, "reuses prepared statements", "[connection]") {
  for (int i = 0; i < 50; ++i) {
    REQUIRE_THAT(conn_->exec("INSERT INTO t (i) VALUES (?)", {i}), IsOk());
  }
  auto rows = conn_->query("SELECT COUNT(*) AS n, SUM(i) AS total FROM t", {});
  REQUIRE_THAT(rows, IsOk());
  CHECK(rows->rows[0].i64("n") == 50);
  CHECK(rows->rows[0].str("total") == "1225");  // SUM of BIGINT is DECIMAL, sent as text
  CHECK(rows->rows[0].i64("total") == 1225);    // and still reads as a whole number
  auto mixed = conn_->query("SELECT COALESCE(MAX(u), 0) AS m, SUM(d) AS f FROM t", {});
  REQUIRE_THAT(mixed, IsOk());
  CHECK(mixed->rows[0].u64("m") == 0u);
}

TEST_CASE_METHOD(ConnectionTest, "a connection keeps a bounded number of prepared statements",
                 "[connection]") {
  auto count = [&] {
    auto rows = conn_->query("SHOW GLOBAL STATUS LIKE 'Prepared_stmt_count'");
    REQUIRE_THAT(rows, IsOk());
    return rows->rows[0].i64(1);
  };
  const int64_t before = count();
  // Statements whose text varies, as IN lists of n placeholders do.
  const int kTexts = static_cast<int>(Connection::kMaxPreparedStatements) + 100;
  for (int i = 0; i < kTexts; ++i) {
    REQUIRE_THAT(conn_->query(strCat("SELECT ? + ", i, " AS v"), {1}), IsOk());
  }
  const int64_t kept = count() - before;
  INFO("prepared statements the server holds for the connection: " << kept);
  CHECK(kept <= static_cast<int64_t>(Connection::kMaxPreparedStatements) + 1);
  INFO("one that was dropped is prepared again");
  auto first = conn_->query("SELECT ? + 0 AS v", {41});
  REQUIRE_THAT(first, IsOk());
  CHECK(first->rows[0].i64("v") == 41);
  INFO("one used lately is kept, and still gives its own answer");
  auto last = conn_->query(strCat("SELECT ? + ", kTexts - 1, " AS v"), {1});
  REQUIRE_THAT(last, IsOk());
  CHECK(last->rows[0].i64("v") == kTexts);
}

// An IN list padded to a power of two: every length from 1 to 100 uses one of 8 statement texts,
// and the list finds the rows whatever its padding.
TEST_CASE_METHOD(ConnectionTest, "padded IN lists share a few statement texts", "[connection]") {
  CHECK(placeholders(1) == "?");
  CHECK(placeholders(3) == "?,?,?");
  CHECK(paddedListSize(1) == 1);
  CHECK(paddedListSize(5) == 8);
  CHECK(paddedListSize(8) == 8);
  CHECK(paddedListSize(1, 2) == 2);
  CHECK(paddedListSize(0) == 1);
  for (int i = 0; i < 100; ++i)
    REQUIRE_THAT(conn_->exec("INSERT INTO t (i) VALUES (?)", {i}), IsOk());
  std::set<std::string> texts;
  for (size_t n = 1; n <= 100; ++n) {
    Params values;
    for (size_t i = 0; i < n; ++i) values.emplace_back(static_cast<int64_t>(i));
    while (values.size() < paddedListSize(n)) values.emplace_back(int64_t{-1});
    const std::string sql =
        strCat("SELECT COUNT(*) FROM t WHERE i IN (", placeholders(values.size()), ")");
    texts.insert(sql);
    auto found = conn_->query(sql, values);
    REQUIRE_THAT(found, IsOk());
    CHECK(found->rows[0].i64(0) == static_cast<int64_t>(n));
  }
  CHECK(texts.size() == 8);
}

TEST_CASE_METHOD(ConnectionTest, "appendInList pads with the first value and locks no gap",
                 "[connection]") {
  for (int i = 1; i <= 100; ++i)
    REQUIRE_THAT(conn_->exec("INSERT INTO t (id, i) VALUES (?, ?)", {i * 10, i}), IsOk());
  std::set<std::string> texts;
  for (size_t n = 1; n <= 100; ++n) {
    Params values;
    for (size_t i = 0; i < n; ++i) values.emplace_back(static_cast<int64_t>(i + 1));
    Params params = {int64_t{0}};
    const std::string in = appendInList(params, values);
    CHECK(params.size() == 1 + paddedListSize(n));
    const std::string sql = strCat("SELECT COUNT(*) FROM t WHERE i > ? AND i IN (", in, ")");
    texts.insert(sql);
    auto found = conn_->query(sql, params);
    REQUIRE_THAT(found, IsOk());
    CHECK(found->rows[0].i64(0) == static_cast<int64_t>(n));
  }
  CHECK(texts.size() == 8);

  Params none;
  const std::string empty = appendInList(none, {});
  auto nothing = conn_->query(strCat("SELECT COUNT(*) FROM t WHERE id IN (", empty, ")"), none);
  REQUIRE_THAT(nothing, IsOk());
  CHECK(nothing->rows[0].i64(0) == 0);

  INFO("a locking read of a padded list holds its rows only: an insert below them goes through");
  REQUIRE_THAT(conn_->execText("START TRANSACTION"), IsOk());
  Params ids;
  const std::string in = appendInList(ids, {int64_t{10}, int64_t{20}, int64_t{30}});
  REQUIRE_THAT(conn_->query(strCat("SELECT id FROM t WHERE id IN (", in, ") FOR UPDATE"), ids),
               IsOk());
  auto other = Connection::open(dsn_);
  REQUIRE_THAT(other, IsOk());
  REQUIRE_THAT((*other)->execText("SET SESSION innodb_lock_wait_timeout = 1"), IsOk());
  // A value that matches nothing (-1) in place of the repeat would lock the gap below id 10.
  CHECK_THAT((*other)->exec("INSERT INTO t (id, i) VALUES (5, 0)", {}), IsOk());
  INFO("and the rows it holds stay held");
  CHECK_FALSE((*other)->exec("UPDATE t SET i = 0 WHERE id = 20", {}).ok());
  REQUIRE_THAT(conn_->execText("ROLLBACK"), IsOk());
}

TEST_CASE_METHOD(ConnectionTest, "query each streams and stops on error", "[connection]") {
  for (int i = 0; i < 10; ++i)
    REQUIRE_THAT(conn_->exec("INSERT INTO t (i) VALUES (?)", {i}), IsOk());
  int seen = 0;
  auto status = conn_->queryEach("SELECT i FROM t ORDER BY i", {}, [&](const Row& row) {
    if (row.i64(0) == 4) return absl::CancelledError("enough");
    ++seen;
    return absl::OkStatus();
  });
  CHECK(absl::IsCancelled(status));
  CHECK(seen == 4);
  // The connection is still usable afterwards.
  auto count = conn_->query("SELECT COUNT(*) FROM t", {});
  REQUIRE_THAT(count, IsOk());
  CHECK(count->rows[0].i64(0) == 10);
}

TEST_CASE_METHOD(ConnectionTest, "wrong parameter count is a clear error", "[connection]") {
  auto result = conn_->exec("INSERT INTO t (i, s) VALUES (?, ?)", {1});
  REQUIRE_FALSE(result.ok());
  CHECK(absl::IsInvalidArgument(result.status()));
  CHECK_THAT(std::string(result.status().message()),
             Catch::Contains("takes 2 parameters, 1 given"));
}

TEST_CASE_METHOD(ConnectionTest, "errors name the statement and carry the errno", "[connection]") {
  auto bad = conn_->exec("INSERT INTO no_such_table (x) VALUES (?)", {1});
  REQUIRE_FALSE(bad.ok());
  CHECK(mysqlErrno(bad.status()) == 1146);
  CHECK_THAT(std::string(bad.status().message()),
             Catch::Contains("INSERT INTO no_such_table (x) VALUES (?)"));
  CHECK_THAT(std::string(bad.status().message()), Catch::Contains("doesn't exist"));

  REQUIRE_THAT(conn_->execText("CREATE TABLE u (k VARCHAR(10) PRIMARY KEY)"), IsOk());
  REQUIRE_THAT(conn_->exec("INSERT INTO u VALUES (?)", {"a"}), IsOk());
  auto dup = conn_->exec("INSERT INTO u VALUES (?)", {"a"});
  INFO(dup.status());
  CHECK(absl::IsAlreadyExists(dup.status()));
  // Strict mode: a value too long fails instead of being silently truncated.
  auto too_long = conn_->exec("INSERT INTO u VALUES (?)", {"abcdefghijklmnop"});
  REQUIRE_FALSE(too_long.ok());
  CHECK(mysqlErrno(too_long.status()) == 1406);
}

TEST_CASE_METHOD(ConnectionTest,
                 "a locking read that failed after its columns were sent runs again at once",
                 "[connection]") {
  // A lock wait timeout or deadlock of a read that scans (not a lookup by primary key) arrives
  // after the result's columns: the statement then fails while its rows are read. Run again,
  // the same prepared statement must not wait for the rows of the failed run.
  REQUIRE_THAT(conn_->exec("INSERT INTO t (i) VALUES (?), (?)", {7, 8}), IsOk());
  Dsn impatient = dsn_;
  impatient.read_timeout = std::chrono::seconds(5);
  auto reader = Connection::open(impatient);
  REQUIRE_THAT(reader, IsOk());
  REQUIRE_THAT((*reader)->execText("SET SESSION innodb_lock_wait_timeout = 1"), IsOk());
  REQUIRE_THAT(conn_->execText("START TRANSACTION"), IsOk());
  REQUIRE_THAT(conn_->query("SELECT id FROM t WHERE i = ? FOR UPDATE", {7}), IsOk());

  const std::string locking = "SELECT id, i FROM t WHERE i >= ? FOR UPDATE";
  REQUIRE_THAT((*reader)->execText("START TRANSACTION"), IsOk());
  auto waited = (*reader)->query(locking, {7});
  REQUIRE_FALSE(waited.ok());
  CHECK(mysqlErrno(waited.status()) == 1205);
  CHECK_FALSE((*reader)->broken());
  INFO("the same without a prepared statement");
  auto text = (*reader)->execText("SELECT id, i FROM t WHERE i >= 7 FOR UPDATE");
  CHECK(mysqlErrno(text) == 1205);
  REQUIRE_THAT((*reader)->execText("ROLLBACK"), IsOk());
  REQUIRE_THAT(conn_->execText("COMMIT"), IsOk());

  const auto started = std::chrono::steady_clock::now();
  auto again = (*reader)->query(locking, {7});
  INFO("the second run took " << std::chrono::duration_cast<std::chrono::milliseconds>(
                                     std::chrono::steady_clock::now() - started)
                                     .count()
                              << " ms");
  REQUIRE_THAT(again, IsOk());
  CHECK(again->rows.size() == 2u);
  auto other = (*reader)->query("SELECT COUNT(*) FROM t", {});
  REQUIRE_THAT(other, IsOk());
  CHECK(other->rows[0].i64(0) == 2);
}

TEST_CASE_METHOD(ConnectionTest, "killed session is broken not silently reconnected",
                 "[connection]") {
  auto other = Connection::open(dsn_);
  REQUIRE_THAT(other, IsOk());
  REQUIRE_THAT((*other)->exec("KILL ?", {conn_->threadId()}), IsOk());
  auto after = conn_->query("SELECT 1", {});
  REQUIRE_FALSE(after.ok());
  INFO(after.status());
  CHECK(absl::IsUnavailable(after.status()));
  CHECK(conn_->broken());
}

TEST_CASE("wrong password and unknown database say what to fix", "[connection-open]") {
  auto& server = krane::testing::ScratchMariaDb::instance();
  Dsn dsn = server.adminDsn();
  dsn.password = "wrong";
  auto denied = Connection::open(dsn);
  REQUIRE_FALSE(denied.ok());
  CHECK(absl::IsPermissionDenied(denied.status()));
  CHECK_THAT(std::string(denied.status().message()),
             Catch::Contains("check the user and password"));

  dsn = server.adminDsn();
  dsn.database = "does_not_exist";
  auto missing = Connection::open(dsn);
  REQUIRE_FALSE(missing.ok());
  CHECK(absl::IsNotFound(missing.status()));
  CHECK_THAT(std::string(missing.status().message()), Catch::Contains("create the database first"));
}

}  // namespace
}  // namespace krane::db
