// The single writer against a real MariaDB: versions per region are contiguous and in commit
// order, failed transactions leave no trace, and bad input is refused naming the field.
#include "controlplane/feed/writer.h"

#include <thread>

#include <catch2/catch.hpp>

#include "common/status.h"
#include "common/strings.h"
#include "controlplane/db/migrate.h"
#include "controlplane/feed/tables.h"
#include "tests/support/mariadb.h"
#include "tests/support/matchers.h"

namespace krane::feed {
namespace {

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

class WriterTest : public krane::testing::MigratedDbTest {
 protected:
  WriterTest() : MigratedDbTest(24) {
    for (const char* region : {"eu-1", "us-1"}) {
      REQUIRE_THAT((*pool_->acquire())
                       ->exec("INSERT INTO regions (id, display_name, created_at) VALUES (?, ?, 1)",
                              {region, region}),
                   IsOk());
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

  std::shared_ptr<Writer> writer_;
};

TEST_CASE_METHOD(WriterTest, "versions count up per region", "[writer]") {
  auto a = writer_->put(generic("a", "eu-1", "1"));
  auto b = writer_->put(generic("b", "eu-1", "1"));
  auto c = writer_->put(generic("c", "us-1", "1"));
  INFO(a.status() << b.status() << c.status());
  REQUIRE((a.ok() && b.ok() && c.ok()));
  CHECK(a->version == 1u);
  CHECK(a->created);
  CHECK(b->version == 2u);
  CHECK(c->version == 1u);  // another region has its own counter
  auto update = writer_->put(generic("a", "eu-1", "2"));
  REQUIRE_THAT(update, IsOk());
  CHECK(update->version == 3u);
  CHECK_FALSE(update->created);
  auto removed = writer_->remove({"example.krane.dev/bucket", "a", "eu-1"});
  REQUIRE_THAT(removed, IsOk());
  CHECK(removed->version == 4u);
  CHECK(changeVersions("eu-1") == std::vector<uint64_t>{1, 2, 3, 4});
}

TEST_CASE_METHOD(WriterTest, "one transaction may change several regions", "[writer]") {
  auto results = writer_->transact("multi", [](WriteTx& tx) -> absl::Status {
    for (int i = 0; i < 3; ++i) {
      if (auto st = tx.put(generic(strCat("x", i), "eu-1", "v")); !st.ok()) return st;
      if (auto st = tx.put(generic(strCat("y", i), "us-1", "v")); !st.ok()) return st;
    }
    return absl::OkStatus();
  });
  REQUIRE_THAT(results, IsOk());
  REQUIRE(results->size() == 6u);
  CHECK(changeVersions("eu-1") == std::vector<uint64_t>{1, 2, 3});
  CHECK(changeVersions("us-1") == std::vector<uint64_t>{1, 2, 3});
}

TEST_CASE_METHOD(WriterTest, "a failed transaction leaves no row no change no version",
                 "[writer]") {
  REQUIRE_THAT(writer_->put(generic("a", "eu-1", "1")), IsOk());
  auto failed = writer_->transact("fails", [](WriteTx& tx) -> absl::Status {
    if (auto st = tx.put(generic("b", "eu-1", "2")); !st.ok()) return st;
    return absl::FailedPreconditionError("caller changed its mind");
  });
  CHECK(absl::IsFailedPrecondition(failed.status()));
  auto next = writer_->put(generic("c", "eu-1", "3"));
  REQUIRE_THAT(next, IsOk());
  CHECK(next->version == 2u);  // no hole where the failed transaction was
  auto conn = pool_->acquire();
  CHECK((*conn)->query("SELECT COUNT(*) FROM resources WHERE id = 'b'", {})->rows[0].i64(0) == 0);
  CHECK(changeVersions("eu-1") == std::vector<uint64_t>{1, 2});
}

TEST_CASE_METHOD(WriterTest, "concurrent writers get contiguous versions", "[writer]") {
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
  CHECK(failures.load() == 0);
  const auto versions = changeVersions("eu-1");
  REQUIRE(versions.size() == 200u);
  for (size_t i = 0; i < versions.size(); ++i) REQUIRE(versions[i] == (i + 1));
}

TEST_CASE_METHOD(WriterTest, "expected version is optimistic concurrency", "[writer]") {
  auto first = writer_->put(generic("a", "eu-1", "1"));
  REQUIRE_THAT(first, IsOk());
  auto stale = writer_->put(generic("a", "eu-1", "2"), first->version + 5);
  CHECK(absl::IsAborted(stale.status()));
  CHECK_THAT(messageOf(stale.status()), Catch::Contains("is at version 1, not the expected 6"));
  CHECK_THAT(writer_->put(generic("a", "eu-1", "2"), first->version), IsOk());
  CHECK(absl::IsAborted(writer_->remove({"example.krane.dev/bucket", "a", "eu-1"}, 1).status()));
}

// update: the stored resource, changed in place; one that is gone or that the change leaves
// alone writes nothing, and neither is an error.
TEST_CASE_METHOD(WriterTest, "update changes the stored resource or writes nothing", "[writer]") {
  REQUIRE_THAT(writer_->put(generic("a", "eu-1", "1")), IsOk());
  REQUIRE_THAT(writer_->put(generic("gone", "eu-1", "1")), IsOk());
  REQUIRE_THAT(writer_->remove({"example.krane.dev/bucket", "gone", "eu-1"}), IsOk());
  const size_t before = changeVersions("eu-1").size();
  std::vector<std::string> seen;
  auto set = [&](const std::string& to) {
    return [&seen, to](Resource& r) {
      seen.push_back(r.generic().spec());
      if (r.generic().spec() == to) return false;
      r.mutable_generic()->set_spec(to);
      return true;
    };
  };
  auto written = writer_->transact("update", [&](WriteTx& tx) -> absl::Status {
    const std::string type = "example.krane.dev/bucket";
    KRANE_ASSIGN_OR_RETURN(bool changed, tx.update({type, "a", "eu-1"}, set("2")));
    CHECK(changed);
    KRANE_ASSIGN_OR_RETURN(bool gone, tx.update({type, "gone", "eu-1"}, set("2")));
    CHECK_FALSE(gone);
    KRANE_ASSIGN_OR_RETURN(bool missing, tx.update({type, "never", "eu-1"}, set("2")));
    CHECK_FALSE(missing);
    return absl::OkStatus();
  });
  REQUIRE_THAT(written, IsOk());
  CHECK(changeVersions("eu-1").size() == before + 1);
  INFO("a change that leaves the resource as it is writes no version");
  auto again = writer_->transact("update", [&](WriteTx& tx) -> absl::Status {
    KRANE_ASSIGN_OR_RETURN(bool changed,
                           tx.update({"example.krane.dev/bucket", "a", "eu-1"}, set("2")));
    CHECK_FALSE(changed);
    return absl::OkStatus();
  });
  REQUIRE_THAT(again, IsOk());
  CHECK(seen == std::vector<std::string>{"1", "2"});
  CHECK(changeVersions("eu-1").size() == before + 1);
  auto bad = writer_->transact("update", [&](WriteTx& tx) {
    return tx.update({"example.krane.dev/bucket", "", "eu-1"}, [](Resource&) { return true; })
        .status();
  });
  CHECK(absl::IsInvalidArgument(bad.status()));
}

TEST_CASE_METHOD(WriterTest, "bad input is refused naming the field", "[writer]") {
  CHECK_THAT(messageOf(writer_->put(generic("", "eu-1", "x")).status()),
             Catch::Contains("resource.id: required"));
  CHECK_THAT(messageOf(writer_->put(generic("a b", "eu-1", "x")).status()),
             Catch::Contains("resource.id: \"a b\" may only contain"));
  CHECK_THAT(messageOf(writer_->put(generic("a", "eu-1", "x", "bad type!")).status()),
             Catch::Contains("resource.type"));
  auto unknown_region = writer_->put(generic("a", "mars-1", "x"));
  CHECK(absl::IsNotFound(unknown_region.status()));
  CHECK_THAT(messageOf(unknown_region.status()),
             Catch::Contains("region \"mars-1\" is not registered"));
  Resource no_kind = generic("a", "eu-1", "x");
  no_kind.clear_generic();
  CHECK_THAT(messageOf(writer_->put(no_kind).status()),
             Catch::Contains("resource.generic: required"));
  auto big = writer_->put(generic("a", "eu-1", std::string(2 << 20, 'x')));
  CHECK_THAT(messageOf(big.status()), Catch::Contains("resource.generic.spec: at most"));
  auto missing = writer_->remove({"example.krane.dev/bucket", "nope", "eu-1"});
  CHECK(absl::IsNotFound(missing.status()));
  // Nothing of the refused writes reached the change table.
  CHECK(changeVersions("eu-1").empty());
}

TEST_CASE_METHOD(WriterTest, "a live resource cannot silently move region", "[writer]") {
  REQUIRE_THAT(writer_->put(generic("a", "eu-1", "1")), IsOk());
  auto moved = writer_->put(generic("a", "us-1", "1"));
  CHECK(absl::IsFailedPrecondition(moved.status()));
  CHECK_THAT(messageOf(moved.status()), Catch::Contains("exists in region \"eu-1\""));
  REQUIRE_THAT(writer_->remove({"example.krane.dev/bucket", "a", "eu-1"}), IsOk());
  CHECK_THAT(writer_->put(generic("a", "us-1", "1")), IsOk());  // after a delete it may
}

TEST_CASE_METHOD(WriterTest, "commit listeners hear the regions", "[writer]") {
  std::vector<std::string> heard;
  writer_->onCommit([&](const std::vector<std::string>& regions) { heard = regions; });
  REQUIRE_THAT(writer_->put(generic("a", "us-1", "1")), IsOk());
  CHECK(heard == std::vector<std::string>{"us-1"});
}

}  // namespace
}  // namespace krane::feed
