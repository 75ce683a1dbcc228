// The single writer against a real MariaDB: versions per region are contiguous and in commit
// order, failed transactions leave no trace, and bad input is refused naming the field.
#include "controlplane/feed/writer.h"

#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/strings.h"
#include "controlplane/db/migrate.h"
#include "controlplane/feed/tables.h"
#include "tests/support/mariadb.h"

namespace krane::feed {
namespace {

using ::testing::HasSubstr;

std::string messageOf(const absl::Status& s) { return std::string(toStd(s.message())); }

Resource generic(const std::string& id, const std::string& region, const std::string& spec,
                 const std::string& type = "example.krane.dev/bucket") {
  Resource r;
  r.set_type(type);
  r.set_id(id);
  r.set_region(region);
  r.mutable_generic()->set_spec(spec);
  r.mutable_generic()->set_content_type("text/plain");
  return r;
}

class WriterTest : public krane::testing::MariaDbTest {
 protected:
  void SetUp() override {
    MariaDbTest::SetUp();
    auto pool = db::Pool::create(dsn_, {.max_connections = 24});
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = *pool;
    ASSERT_TRUE(db::Migrator(pool_, *db::builtinMigrations()).migrate().ok());
    for (const char* region : {"eu-1", "us-1"}) {
      ASSERT_TRUE((*pool_->acquire())
                      ->exec("INSERT INTO regions (id, display_name, created_at) VALUES (?, ?, 1)",
                             {region, region})
                      .ok());
    }
    writer_ = std::make_shared<Writer>(pool_, std::make_shared<ResourceTables>());
  }

  std::vector<uint64_t> changeVersions(const std::string& region) {
    std::vector<uint64_t> out;
    auto rows =
        (*pool_->acquire())
            ->query("SELECT version FROM resource_changes WHERE region_id = ? ORDER BY version",
                    {region});
    for (const auto& row : rows->rows) out.push_back(row.u64(0));
    return out;
  }

  std::shared_ptr<db::Pool> pool_;
  std::shared_ptr<Writer> writer_;
};

TEST_F(WriterTest, VersionsCountUpPerRegion) {
  auto a = writer_->put(generic("a", "eu-1", "1"));
  auto b = writer_->put(generic("b", "eu-1", "1"));
  auto c = writer_->put(generic("c", "us-1", "1"));
  ASSERT_TRUE(a.ok() && b.ok() && c.ok()) << a.status() << b.status() << c.status();
  EXPECT_EQ(a->version, 1u);
  EXPECT_TRUE(a->created);
  EXPECT_EQ(b->version, 2u);
  EXPECT_EQ(c->version, 1u);  // another region has its own counter
  auto update = writer_->put(generic("a", "eu-1", "2"));
  ASSERT_TRUE(update.ok());
  EXPECT_EQ(update->version, 3u);
  EXPECT_FALSE(update->created);
  auto removed = writer_->remove({"example.krane.dev/bucket", "a", "eu-1"});
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(removed->version, 4u);
  EXPECT_THAT(changeVersions("eu-1"), ::testing::ElementsAre(1, 2, 3, 4));
}

TEST_F(WriterTest, OneTransactionMayChangeSeveralRegions) {
  auto results = writer_->transact("multi", [](WriteTx& tx) -> absl::Status {
    for (int i = 0; i < 3; ++i) {
      if (auto st = tx.put(generic(strCat("x", i), "eu-1", "v")); !st.ok()) return st;
      if (auto st = tx.put(generic(strCat("y", i), "us-1", "v")); !st.ok()) return st;
    }
    return absl::OkStatus();
  });
  ASSERT_TRUE(results.ok()) << results.status();
  ASSERT_EQ(results->size(), 6u);
  EXPECT_THAT(changeVersions("eu-1"), ::testing::ElementsAre(1, 2, 3));
  EXPECT_THAT(changeVersions("us-1"), ::testing::ElementsAre(1, 2, 3));
}

TEST_F(WriterTest, AFailedTransactionLeavesNoRowNoChangeNoVersion) {
  ASSERT_TRUE(writer_->put(generic("a", "eu-1", "1")).ok());
  auto failed = writer_->transact("fails", [](WriteTx& tx) -> absl::Status {
    if (auto st = tx.put(generic("b", "eu-1", "2")); !st.ok()) return st;
    return absl::FailedPreconditionError("caller changed its mind");
  });
  EXPECT_TRUE(absl::IsFailedPrecondition(failed.status()));
  auto next = writer_->put(generic("c", "eu-1", "3"));
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->version, 2u);  // no hole where the failed transaction was
  auto conn = pool_->acquire();
  EXPECT_EQ((*conn)->query("SELECT COUNT(*) FROM resources WHERE id = 'b'", {})->rows[0].i64(0), 0);
  EXPECT_THAT(changeVersions("eu-1"), ::testing::ElementsAre(1, 2));
}

TEST_F(WriterTest, ConcurrentWritersGetContiguousVersions) {
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 25; ++i) {
        if (!writer_->put(generic(strCat("r", t, "-", i % 5), "eu-1", strCat(i))).ok()) ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  const auto versions = changeVersions("eu-1");
  ASSERT_EQ(versions.size(), 200u);
  for (size_t i = 0; i < versions.size(); ++i) ASSERT_EQ(versions[i], i + 1);
}

TEST_F(WriterTest, ExpectedVersionIsOptimisticConcurrency) {
  auto first = writer_->put(generic("a", "eu-1", "1"));
  ASSERT_TRUE(first.ok());
  auto stale = writer_->put(generic("a", "eu-1", "2"), first->version + 5);
  EXPECT_TRUE(absl::IsAborted(stale.status()));
  EXPECT_THAT(messageOf(stale.status()), HasSubstr("is at version 1, not the expected 6"));
  EXPECT_TRUE(writer_->put(generic("a", "eu-1", "2"), first->version).ok());
  EXPECT_TRUE(
      absl::IsAborted(writer_->remove({"example.krane.dev/bucket", "a", "eu-1"}, 1).status()));
}

TEST_F(WriterTest, BadInputIsRefusedNamingTheField) {
  EXPECT_THAT(messageOf(writer_->put(generic("", "eu-1", "x")).status()),
              HasSubstr("resource.id: required"));
  EXPECT_THAT(messageOf(writer_->put(generic("a b", "eu-1", "x")).status()),
              HasSubstr("resource.id: \"a b\" may only contain"));
  EXPECT_THAT(messageOf(writer_->put(generic("a", "eu-1", "x", "bad type!")).status()),
              HasSubstr("resource.type"));
  auto unknown_region = writer_->put(generic("a", "mars-1", "x"));
  EXPECT_TRUE(absl::IsNotFound(unknown_region.status()));
  EXPECT_THAT(messageOf(unknown_region.status()), HasSubstr("region \"mars-1\" is not registered"));
  Resource no_kind = generic("a", "eu-1", "x");
  no_kind.clear_generic();
  EXPECT_THAT(messageOf(writer_->put(no_kind).status()), HasSubstr("resource.generic: required"));
  auto big = writer_->put(generic("a", "eu-1", std::string(2 << 20, 'x')));
  EXPECT_THAT(messageOf(big.status()), HasSubstr("resource.generic.spec: at most"));
  auto missing = writer_->remove({"example.krane.dev/bucket", "nope", "eu-1"});
  EXPECT_TRUE(absl::IsNotFound(missing.status()));
  // Nothing of the refused writes reached the change table.
  EXPECT_TRUE(changeVersions("eu-1").empty());
}

TEST_F(WriterTest, ALiveResourceCannotSilentlyMoveRegion) {
  ASSERT_TRUE(writer_->put(generic("a", "eu-1", "1")).ok());
  auto moved = writer_->put(generic("a", "us-1", "1"));
  EXPECT_TRUE(absl::IsFailedPrecondition(moved.status()));
  EXPECT_THAT(messageOf(moved.status()), HasSubstr("exists in region \"eu-1\""));
  ASSERT_TRUE(writer_->remove({"example.krane.dev/bucket", "a", "eu-1"}).ok());
  EXPECT_TRUE(writer_->put(generic("a", "us-1", "1")).ok());  // after a delete it may
}

TEST_F(WriterTest, CommitListenersHearTheRegions) {
  std::vector<std::string> heard;
  writer_->onCommit([&](const std::vector<std::string>& regions) { heard = regions; });
  ASSERT_TRUE(writer_->put(generic("a", "us-1", "1")).ok());
  EXPECT_THAT(heard, ::testing::ElementsAre("us-1"));
}

}  // namespace
}  // namespace krane::feed
