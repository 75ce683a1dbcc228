// Schema migrations against a real MariaDB: the real sql/ files and synthetic broken ones.
#include "controlplane/db/migrate.h"

#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/strings.h"
#include "tests/support/mariadb.h"

namespace krane::db {
namespace {

using krane::testing::MariaDbTest;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string messageOf(const absl::Status& status) { return std::string(toStd(status.message())); }

std::vector<Migration> builtin() {
  auto migrations = builtinMigrations();
  EXPECT_TRUE(migrations.ok()) << migrations.status();
  return migrations.ok() ? *migrations : std::vector<Migration>{};
}

std::vector<Migration> parse(const std::vector<std::pair<std::string, std::string>>& files) {
  auto migrations = parseMigrations(files);
  EXPECT_TRUE(migrations.ok()) << migrations.status();
  return migrations.ok() ? *migrations : std::vector<Migration>{};
}

class MigrateTest : public MariaDbTest {
 protected:
  void SetUp() override {
    MariaDbTest::SetUp();
    auto pool = Pool::create(dsn_, {.max_connections = 4});
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = *pool;
  }

  // Every column and index of the database, in a stable order: two schemas built by different
  // paths must print the same.
  std::string describeSchema(const Dsn& dsn) {
    auto pool = Pool::create(dsn);
    EXPECT_TRUE(pool.ok());
    auto conn = (*pool)->acquire();
    std::string out;
    auto columns = (*conn)->query(
        "SELECT TABLE_NAME, COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE, COALESCE(COLUMN_DEFAULT, "
        "'none'), EXTRA"
        " FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = ? AND TABLE_NAME <> "
        "'krane_schema_migrations'"
        " ORDER BY TABLE_NAME, ORDINAL_POSITION",
        {dsn.database});
    EXPECT_TRUE(columns.ok()) << columns.status();
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
    EXPECT_TRUE(indexes.ok()) << indexes.status();
    for (const Row& row : indexes->rows) {
      strAppend(&out, row.str(0), " ", row.str(1), " ", row.i64(2), " ", row.i64(3), " ",
                row.str(4), "\n");
    }
    return out;
  }

  std::shared_ptr<Pool> pool_;
};

TEST_F(MigrateTest, TheBuiltinSchemaAppliesFromEmpty) {
  const auto known = builtin();
  ASSERT_GE(known.size(), 2u);
  Migrator migrator(pool_, known);
  auto applied = migrator.migrate();
  ASSERT_TRUE(applied.ok()) << applied.status();
  EXPECT_EQ(applied->size(), known.size());
  EXPECT_EQ(*migrator.currentVersion(), static_cast<int>(known.size()));
  EXPECT_TRUE(migrator.checkUpToDate().ok());
  // The tables the rest of Krane relies on exist.
  auto conn = pool_->acquire();
  for (const char* table :
       {"workspaces", "projects", "apps", "environments", "regions", "deployments",
        "deployment_topology", "sentinels", "cilium_network_policies", "instances", "resources",
        "resource_changes", "agent_tokens"}) {
    auto rows = (*conn)->query(
        "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
        {dsn_.database, table});
    ASSERT_TRUE(rows.ok());
    EXPECT_EQ(rows->rows[0].i64(0), 1) << "missing table " << table;
  }
}

TEST_F(MigrateTest, RunningTwiceIsANoOp) {
  Migrator migrator(pool_, builtin());
  ASSERT_TRUE(migrator.migrate().ok());
  auto again = migrator.migrate();
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->empty());
}

TEST_F(MigrateTest, UpgradingFromEveryEarlierVersionGivesTheSameSchema) {
  const auto known = builtin();
  ASSERT_TRUE(Migrator(pool_, known).migrate().ok());
  const std::string reference = describeSchema(dsn_);
  ASSERT_FALSE(reference.empty());
  for (size_t start = 1; start < known.size(); ++start) {
    SCOPED_TRACE(strCat("starting at ", known[start - 1].name));
    const Dsn dsn = krane::testing::ScratchMariaDb::instance().freshDatabase();
    auto pool = Pool::create(dsn);
    ASSERT_TRUE(pool.ok());
    // An older binary knew only the first `start` migrations.
    std::vector<Migration> older(known.begin(), known.begin() + start);
    ASSERT_TRUE(Migrator(*pool, older).migrate().ok());
    EXPECT_EQ(*Migrator(*pool, older).currentVersion(), static_cast<int>(start));
    EXPECT_FALSE(Migrator(*pool, known).checkUpToDate().ok());
    auto upgraded = Migrator(*pool, known).migrate();
    ASSERT_TRUE(upgraded.ok()) << upgraded.status();
    EXPECT_EQ(upgraded->size(), known.size() - start);
    EXPECT_EQ(describeSchema(dsn), reference);
  }
}

TEST_F(MigrateTest, UpgradingKeepsDataAndSeedsRegionCounters) {
  // A database at 0003 with rows already versioned: 0004 must start each region's counter above
  // them, or the change feed would hand out versions agents have already seen.
  const auto known = builtin();
  ASSERT_GE(known.size(), 4u);
  ASSERT_TRUE(
      Migrator(pool_, std::vector<Migration>(known.begin(), known.begin() + 3)).migrate().ok());
  auto conn = pool_->acquire();
  ASSERT_TRUE(conn.ok());
  ASSERT_TRUE((*conn)->execText("SET SESSION foreign_key_checks = 0").ok());
  for (const char* region : {"eu-1", "us-1"}) {
    ASSERT_TRUE((*conn)
                    ->exec("INSERT INTO regions (id, display_name, created_at) VALUES (?, ?, ?)",
                           {region, region, 1})
                    .ok());
  }
  ASSERT_TRUE(
      (*conn)
          ->exec("INSERT INTO cilium_network_policies (id, workspace_id, project_id, "
                 "environment_id, region_id,"
                 " policy, version, created_at) VALUES (?, 'ws', 'p', 'env', 'eu-1', '{}', ?, 1)",
                 {"cnp_1", 41})
          .ok());
  ASSERT_TRUE((*conn)->execText("SET SESSION foreign_key_checks = 1").ok());

  ASSERT_TRUE(Migrator(pool_, known).migrate().ok());
  auto counters =
      (*conn)->query("SELECT region_id, version FROM region_versions ORDER BY region_id", {});
  ASSERT_TRUE(counters.ok()) << counters.status();
  ASSERT_EQ(counters->rows.size(), 2u);
  EXPECT_EQ(counters->rows[0].str(0), "eu-1");
  EXPECT_EQ(counters->rows[0].u64(1), 41u);
  EXPECT_EQ(counters->rows[1].str(0), "us-1");
  EXPECT_EQ(counters->rows[1].u64(1), 0u);
  auto kept = (*conn)->query("SELECT version FROM cilium_network_policies WHERE id = ?", {"cnp_1"});
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(kept->rows.at(0).u64(0), 41u);
}

TEST_F(MigrateTest, ConcurrentMigratorsApplyEachFileOnce) {
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
    ASSERT_TRUE(r.ok()) << r.status();
    total += r->size();
  }
  EXPECT_EQ(total, known.size());
}

TEST_F(MigrateTest, ASchemaNewerThanTheBinaryIsRefused) {
  const auto known = builtin();
  ASSERT_TRUE(Migrator(pool_, known).migrate().ok());
  std::vector<Migration> older(known.begin(), known.end() - 1);
  auto refused = Migrator(pool_, older).migrate();
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(refused.status()));
  EXPECT_THAT(messageOf(refused.status()), HasSubstr(strCat("at migration ", known.back().name)));
  EXPECT_THAT(messageOf(refused.status()), HasSubstr("newer than this binary knows"));
  EXPECT_THAT(messageOf(Migrator(pool_, older).checkUpToDate()), HasSubstr("upgrade krane-ctrl"));
}

TEST_F(MigrateTest, AnEditedAppliedMigrationIsRefused) {
  auto v1 = parse({{"0001_a.sql", "CREATE TABLE a (x INT);\n"}});
  ASSERT_TRUE(Migrator(pool_, v1).migrate().ok());
  auto edited = parse({{"0001_a.sql", "CREATE TABLE a (x BIGINT);\n"}});
  auto refused = Migrator(pool_, edited).migrate();
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(messageOf(refused.status()), HasSubstr("applied migration 0001_a does not match"));
  EXPECT_THAT(messageOf(refused.status()), HasSubstr("put changes in a new file"));
}

TEST_F(MigrateTest, AFailingFirstStatementLeavesNoTrace) {
  auto broken = parse({{"0001_a.sql", "CREATE TABLE a (x INT);\n"},
                       {"0002_b.sql", "\n\nCREATE TABLE b (x INT NOT NUL);\n"}});
  auto failed = Migrator(pool_, broken).migrate();
  ASSERT_FALSE(failed.ok());
  EXPECT_THAT(messageOf(failed.status()),
              HasSubstr("migration 0002_b.sql, statement 1 (line 3) failed"));
  EXPECT_THAT(messageOf(failed.status()), HasSubstr("nothing of it was applied"));
  EXPECT_THAT(messageOf(failed.status()), HasSubstr("syntax"));
  // 0001 stays applied; a corrected 0002 then applies normally.
  auto fixed = parse({{"0001_a.sql", "CREATE TABLE a (x INT);\n"},
                      {"0002_b.sql", "\n\nCREATE TABLE b (x INT NOT NULL);\n"}});
  auto applied = Migrator(pool_, fixed).migrate();
  ASSERT_TRUE(applied.ok()) << applied.status();
  EXPECT_THAT(*applied, ElementsAre("0002_b"));
}

TEST_F(MigrateTest, AHalfAppliedMigrationBlocksLaterRunsWithInstructions) {
  auto broken = parse({{"0001_a.sql", "CREATE TABLE a (x INT);\nCREATE TABLE a (y INT);\n"}});
  auto failed = Migrator(pool_, broken).migrate();
  ASSERT_FALSE(failed.ok());
  EXPECT_THAT(messageOf(failed.status()), HasSubstr("statement 2 (line 2)"));
  EXPECT_THAT(messageOf(failed.status()), HasSubstr("1 of its 2 statements were applied"));
  auto again = Migrator(pool_, broken).migrate();
  ASSERT_FALSE(again.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(again.status()));
  EXPECT_THAT(messageOf(again.status()), HasSubstr("migration 0001_a did not finish"));
  auto states = Migrator(pool_, broken).status();
  ASSERT_TRUE(states.ok());
  EXPECT_TRUE((*states)[0].interrupted);
}

TEST(ParseMigrations, RejectsMalformedSetsNamingTheFile) {
  auto error = [](const std::vector<std::pair<std::string, std::string>>& files) {
    auto parsed = parseMigrations(files);
    EXPECT_FALSE(parsed.ok());
    return parsed.ok() ? std::string() : messageOf(parsed.status());
  };
  EXPECT_THAT(error({{"1_init.sql", "SELECT 1;"}}),
              HasSubstr("migration file 1_init.sql: bad name"));
  EXPECT_THAT(error({{"0001-init.sql", "SELECT 1;"}}), HasSubstr("0001-init.sql: bad name"));
  EXPECT_THAT(error({{"0001_Init.sql", "SELECT 1;"}}), HasSubstr("bad name"));
  EXPECT_THAT(error({{"0000_zero.sql", "SELECT 1;"}}), HasSubstr("numbering starts at 0001"));
  EXPECT_THAT(error({{"0001_a.sql", "SELECT 1;"}, {"0001_b.sql", "SELECT 2;"}}),
              HasSubstr("have the same number 1"));
  EXPECT_THAT(error({{"0001_a.sql", "SELECT 1;"}, {"0003_c.sql", "SELECT 3;"}}),
              HasSubstr("migration 0002 is missing: found 0003_c.sql after 0001_a.sql"));
  EXPECT_THAT(error({{"0001_a.sql", "-- only a comment\n"}}),
              HasSubstr("0001_a.sql: contains no SQL statement"));
  EXPECT_THAT(error({{"0001_a.sql", "SELECT 1;\nINSERT INTO t VALUES ('x);\n"}}),
              HasSubstr("0001_a.sql: line 2: unterminated ' quote"));
}

}  // namespace
}  // namespace krane::db
