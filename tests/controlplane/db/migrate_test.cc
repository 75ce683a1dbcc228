// Schema migrations against a real MariaDB: the real sql/ files and synthetic broken ones.
#include "controlplane/db/migrate.h"

#include <thread>

#include <catch2/catch.hpp>

#include "common/strings.h"
#include "tests/support/mariadb.h"
#include "tests/support/matchers.h"

namespace krane::db {
namespace {

using krane::testing::MariaDbTest;

std::string messageOf(const absl::Status& status) { return std::string(toStd(status.message())); }

std::vector<Migration> builtin() {
  auto migrations = builtinMigrations();
  CHECK_THAT(migrations, IsOk());
  return migrations.ok() ? *migrations : std::vector<Migration>{};
}

std::vector<Migration> parse(const std::vector<std::pair<std::string, std::string>>& files) {
  auto migrations = parseMigrations(files);
  CHECK_THAT(migrations, IsOk());
  return migrations.ok() ? *migrations : std::vector<Migration>{};
}

class MigrateTest : public MariaDbTest {
 protected:
  MigrateTest() {
    auto pool = Pool::create(dsn_, {.max_connections = 4});
    REQUIRE_THAT(pool, IsOk());
    pool_ = *pool;
  }

  // Every column and index of the database, in a stable order: two schemas built by different
  // paths must print the same.
  std::string describeSchema(const Dsn& dsn) {
    auto pool = Pool::create(dsn);
    CHECK_THAT(pool, IsOk());
    auto conn = (*pool)->acquire();
    std::string out;
    auto columns = (*conn)->query(
        "SELECT TABLE_NAME, COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE, COALESCE(COLUMN_DEFAULT, "
        "'none'), EXTRA"
        " FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = ? AND TABLE_NAME <> "
        "'krane_schema_migrations'"
        " ORDER BY TABLE_NAME, ORDINAL_POSITION",
        {dsn.database});
    CHECK_THAT(columns, IsOk());
    for (const Row& row : columns->rows) {
      for (size_t i = 0; i < row.size(); ++i) {
        strAppend(&out, row.str(i), i + 1 < row.size() ? " " : "\n");
      }
    }
    auto indexes = (*conn)->query(
        "SELECT TABLE_NAME, INDEX_NAME, NON_UNIQUE, SEQ_IN_INDEX, COLUMN_NAME FROM "
        "information_schema.STATISTICS"
        " WHERE TABLE_SCHEMA = ? AND TABLE_NAME <> 'krane_schema_migrations'"
        " ORDER BY TABLE_NAME, INDEX_NAME, SEQ_IN_INDEX",
        {dsn.database});
    CHECK_THAT(indexes, IsOk());
    for (const Row& row : indexes->rows) {
      strAppend(&out, row.str(0), " ", row.str(1), " ", row.i64(2), " ", row.i64(3), " ",
                row.str(4), "\n");
    }
    return out;
  }

  std::shared_ptr<Pool> pool_;
};

TEST_CASE_METHOD(MigrateTest, "the builtin schema applies from empty", "[migrate]") {
  const auto known = builtin();
  REQUIRE(known.size() >= 2u);
  Migrator migrator(pool_, known);
  auto applied = migrator.migrate();
  REQUIRE_THAT(applied, IsOk());
  CHECK(applied->size() == known.size());
  CHECK(*migrator.currentVersion() == static_cast<int>(known.size()));
  CHECK_THAT(migrator.checkUpToDate(), IsOk());
  // The tables the rest of Krane relies on exist.
  auto conn = pool_->acquire();
  for (const char* table :
       {"workspaces", "projects", "apps", "environments", "regions", "deployments",
        "deployment_topology", "sentinels", "cilium_network_policies", "instances", "resources",
        "resource_changes", "agent_tokens"}) {
    auto rows = (*conn)->query(
        "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
        {dsn_.database, table});
    REQUIRE_THAT(rows, IsOk());
    INFO("missing table " << table);
    CHECK(rows->rows[0].i64(0) == 1);
  }
}

TEST_CASE_METHOD(MigrateTest, "running twice is a no op", "[migrate]") {
  Migrator migrator(pool_, builtin());
  REQUIRE_THAT(migrator.migrate(), IsOk());
  auto again = migrator.migrate();
  REQUIRE_THAT(again, IsOk());
  CHECK(again->empty());
}

TEST_CASE_METHOD(MigrateTest, "upgrading from every earlier version gives the same schema",
                 "[migrate]") {
  const auto known = builtin();
  REQUIRE_THAT(Migrator(pool_, known).migrate(), IsOk());
  const std::string reference = describeSchema(dsn_);
  REQUIRE_FALSE(reference.empty());
  for (size_t start = 1; start < known.size(); ++start) {
    INFO(strCat("starting at ", known[start - 1].name));
    const Dsn dsn = krane::testing::ScratchMariaDb::instance().freshDatabase();
    auto pool = Pool::create(dsn);
    REQUIRE_THAT(pool, IsOk());
    // An older binary knew only the first `start` migrations.
    std::vector<Migration> older(known.begin(), known.begin() + start);
    REQUIRE_THAT(Migrator(*pool, older).migrate(), IsOk());
    CHECK(*Migrator(*pool, older).currentVersion() == static_cast<int>(start));
    CHECK_FALSE(Migrator(*pool, known).checkUpToDate().ok());
    auto upgraded = Migrator(*pool, known).migrate();
    REQUIRE_THAT(upgraded, IsOk());
    CHECK(upgraded->size() == (known.size() - start));
    CHECK(describeSchema(dsn) == reference);
  }
}

TEST_CASE_METHOD(MigrateTest, "upgrading keeps data and seeds region counters", "[migrate]") {
  // A database at 0003 with rows already versioned: 0004 must start each region's counter above
  // them, or the change feed would hand out versions agents have already seen.
  const auto known = builtin();
  REQUIRE(known.size() >= 4u);
  REQUIRE_THAT(Migrator(pool_, std::vector<Migration>(known.begin(), known.begin() + 3)).migrate(),
               IsOk());
  auto conn = pool_->acquire();
  REQUIRE_THAT(conn, IsOk());
  REQUIRE_THAT((*conn)->execText("SET SESSION foreign_key_checks = 0"), IsOk());
  for (const char* region : {"eu-1", "us-1"}) {
    REQUIRE_THAT(
        (*conn)->exec("INSERT INTO regions (id, display_name, created_at) VALUES (?, ?, ?)",
                      {region, region, 1}),
        IsOk());
  }
  REQUIRE_THAT((*conn)->exec(
                   "INSERT INTO cilium_network_policies (id, workspace_id, project_id, "
                   "environment_id, region_id,"
                   " policy, version, created_at) VALUES (?, 'ws', 'p', 'env', 'eu-1', '{}', ?, 1)",
                   {"cnp_1", 41}),
               IsOk());
  REQUIRE_THAT((*conn)->execText("SET SESSION foreign_key_checks = 1"), IsOk());

  REQUIRE_THAT(Migrator(pool_, known).migrate(), IsOk());
  auto counters =
      (*conn)->query("SELECT region_id, version FROM region_versions ORDER BY region_id", {});
  REQUIRE_THAT(counters, IsOk());
  REQUIRE(counters->rows.size() == 2u);
  CHECK(counters->rows[0].str(0) == "eu-1");
  CHECK(counters->rows[0].u64(1) == 41u);
  CHECK(counters->rows[1].str(0) == "us-1");
  CHECK(counters->rows[1].u64(1) == 0u);
  auto kept = (*conn)->query("SELECT version FROM cilium_network_policies WHERE id = ?", {"cnp_1"});
  REQUIRE_THAT(kept, IsOk());
  CHECK(kept->rows.at(0).u64(0) == 41u);
}

TEST_CASE_METHOD(MigrateTest, "concurrent migrators apply each file once", "[migrate]") {
  const auto known = builtin();
  std::vector<std::thread> threads;
  std::vector<absl::StatusOr<std::vector<std::string>>> results(4, std::vector<std::string>{});
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      auto pool = Pool::create(dsn_);
      if (!pool.ok()) {
        results[i] = pool.status();
        return;
      }
      results[i] = Migrator(*pool, known).migrate();
    });
  }
  for (auto& t : threads) t.join();
  size_t total = 0;
  for (auto& r : results) {
    REQUIRE_THAT(r, IsOk());
    total += r->size();
  }
  CHECK(total == known.size());
}

TEST_CASE_METHOD(MigrateTest, "a schema newer than the binary is refused", "[migrate]") {
  const auto known = builtin();
  REQUIRE_THAT(Migrator(pool_, known).migrate(), IsOk());
  std::vector<Migration> older(known.begin(), known.end() - 1);
  auto refused = Migrator(pool_, older).migrate();
  REQUIRE_FALSE(refused.ok());
  CHECK(absl::IsFailedPrecondition(refused.status()));
  CHECK_THAT(messageOf(refused.status()),
             Catch::Contains(strCat("at migration ", known.back().name)));
  CHECK_THAT(messageOf(refused.status()), Catch::Contains("newer than this binary knows"));
  CHECK_THAT(messageOf(Migrator(pool_, older).checkUpToDate()),
             Catch::Contains("upgrade krane-ctrl"));
}

TEST_CASE_METHOD(MigrateTest, "an edited applied migration is refused", "[migrate]") {
  auto v1 = parse({{"0001_a.sql", "CREATE TABLE a (x INT);\n"}});
  REQUIRE_THAT(Migrator(pool_, v1).migrate(), IsOk());
  auto edited = parse({{"0001_a.sql", "CREATE TABLE a (x BIGINT);\n"}});
  auto refused = Migrator(pool_, edited).migrate();
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(messageOf(refused.status()),
             Catch::Contains("applied migration 0001_a does not match"));
  CHECK_THAT(messageOf(refused.status()), Catch::Contains("put changes in a new file"));
}

TEST_CASE_METHOD(MigrateTest, "a failing first statement leaves no trace", "[migrate]") {
  auto broken = parse({{"0001_a.sql", "CREATE TABLE a (x INT);\n"},
                       {"0002_b.sql", "\n\nCREATE TABLE b (x INT NOT NUL);\n"}});
  auto failed = Migrator(pool_, broken).migrate();
  REQUIRE_FALSE(failed.ok());
  CHECK_THAT(messageOf(failed.status()),
             Catch::Contains("migration 0002_b.sql, statement 1 (line 3) failed"));
  CHECK_THAT(messageOf(failed.status()), Catch::Contains("nothing of it was applied"));
  CHECK_THAT(messageOf(failed.status()), Catch::Contains("syntax"));
  // 0001 stays applied; a corrected 0002 then applies normally.
  auto fixed = parse({{"0001_a.sql", "CREATE TABLE a (x INT);\n"},
                      {"0002_b.sql", "\n\nCREATE TABLE b (x INT NOT NULL);\n"}});
  auto applied = Migrator(pool_, fixed).migrate();
  REQUIRE_THAT(applied, IsOk());
  CHECK(*applied == std::vector<std::string>{"0002_b"});
}

TEST_CASE_METHOD(MigrateTest, "a half applied migration blocks later runs with instructions",
                 "[migrate]") {
  auto broken = parse({{"0001_a.sql", "CREATE TABLE a (x INT);\nCREATE TABLE a (y INT);\n"}});
  auto failed = Migrator(pool_, broken).migrate();
  REQUIRE_FALSE(failed.ok());
  CHECK_THAT(messageOf(failed.status()), Catch::Contains("statement 2 (line 2)"));
  CHECK_THAT(messageOf(failed.status()), Catch::Contains("1 of its 2 statements were applied"));
  auto again = Migrator(pool_, broken).migrate();
  REQUIRE_FALSE(again.ok());
  CHECK(absl::IsFailedPrecondition(again.status()));
  CHECK_THAT(messageOf(again.status()), Catch::Contains("migration 0001_a did not finish"));
  auto states = Migrator(pool_, broken).status();
  REQUIRE_THAT(states, IsOk());
  CHECK((*states)[0].interrupted);
}

TEST_CASE("rejects malformed sets naming the file", "[parse-migrations]") {
  auto error = [](const std::vector<std::pair<std::string, std::string>>& files) {
    auto parsed = parseMigrations(files);
    CHECK_FALSE(parsed.ok());
    return parsed.ok() ? std::string() : messageOf(parsed.status());
  };
  CHECK_THAT(error({{"1_init.sql", "SELECT 1;"}}),
             Catch::Contains("migration file 1_init.sql: bad name"));
  CHECK_THAT(error({{"0001-init.sql", "SELECT 1;"}}), Catch::Contains("0001-init.sql: bad name"));
  CHECK_THAT(error({{"0001_Init.sql", "SELECT 1;"}}), Catch::Contains("bad name"));
  CHECK_THAT(error({{"0000_zero.sql", "SELECT 1;"}}), Catch::Contains("numbering starts at 0001"));
  CHECK_THAT(error({{"0001_a.sql", "SELECT 1;"}, {"0001_b.sql", "SELECT 2;"}}),
             Catch::Contains("have the same number 1"));
  CHECK_THAT(error({{"0001_a.sql", "SELECT 1;"}, {"0003_c.sql", "SELECT 3;"}}),
             Catch::Contains("migration 0002 is missing: found 0003_c.sql after 0001_a.sql"));
  CHECK_THAT(error({{"0001_a.sql", "-- only a comment\n"}}),
             Catch::Contains("0001_a.sql: contains no SQL statement"));
  CHECK_THAT(error({{"0001_a.sql", "SELECT 1;\nINSERT INTO t VALUES ('x);\n"}}),
             Catch::Contains("0001_a.sql: line 2: unterminated ' quote"));
}

}  // namespace
}  // namespace krane::db
