#include "ipc/cursor_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/strings.h"
#include "ipc/cursor_layout.h"
#include "tests/ipc/temp_dir.h"

namespace krane::ipc {
namespace {

using ::krane::ipc::testing::RawFile;
using ::krane::ipc::testing::TempDir;
using ::testing::HasSubstr;

CursorStoreOptions agentOptions(uint64_t max_resources = 1000, uint32_t parked = 16) {
  CursorStoreOptions options;
  options.region = "eu-test-1";
  options.max_resources = max_resources;
  options.parked_capacity = parked;
  return options;
}

CursorStoreOptions modeOptions(OpenMode mode) {
  CursorStoreOptions options;
  options.mode = mode;
  return options;
}

std::unique_ptr<CursorStore> openOrDie(const std::string& dir, const CursorStoreOptions& options) {
  auto store = CursorStore::open(dir, options);
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? std::move(*store) : nullptr;
}

std::string resetInstruction(const std::string& path) {
  return strCat("remove ", path, "; the agent then does one full sync");
}

void overwrite(const std::string& path, off_t offset, const void* bytes, size_t n) {
  const int fd = ::open(path.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::pwrite(fd, bytes, n, offset), static_cast<ssize_t>(n));
  ::close(fd);
}

TEST(CursorStoreTest, CreatesFileWithHeader) {
  TempDir dir;
  auto store = openOrDie(dir.path(), agentOptions());
  ASSERT_NE(store, nullptr);
  EXPECT_TRUE(store->recovery().created);
  EXPECT_EQ(store->path(), dir.file("cursor.store"));
  EXPECT_EQ(store->region(), "eu-test-1");
  EXPECT_EQ(store->generation(), 1u);
  EXPECT_EQ(store->watermark(), 0u);
  const StoreLayout& l = store->layout();
  EXPECT_EQ(l.layout_version, layout::kLayoutVersion);
  EXPECT_EQ(l.max_resources, 1000u);
  EXPECT_EQ(l.table_entries, 2000u);
  EXPECT_EQ(l.table_entry_bytes, 32u);
  EXPECT_EQ(l.file_bytes, std::filesystem::file_size(store->path()));
  EXPECT_EQ(l.table_offset % layout::kPageBytes, 0u);
  char magic[8];
  const int fd = ::open(store->path().c_str(), O_RDONLY);
  ASSERT_EQ(::pread(fd, magic, 8, 0), 8);
  ::close(fd);
  EXPECT_EQ(std::string(magic, 8), "KRANECS1");
  // Nothing but the final file and the lock file: the temporary name is gone.
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    names.push_back(e.path().filename().string());
  }
  EXPECT_THAT(names, ::testing::UnorderedElementsAre("cursor.store", "cursor.store.lock"));
}

TEST(CursorStoreTest, ReopenKeepsEverything) {
  TempDir dir;
  {
    auto store = openOrDie(dir.path(), agentOptions());
    ASSERT_TRUE(store->advanceWatermark(41));
    ASSERT_TRUE(store->advanceWatermark(42));
    store->recordFullSync(30, 1'700'000'000'000);
    ASSERT_TRUE(store->recordApplied("deployment", "web", 40).ok());
    ASSERT_TRUE(store->recordApplied("sentinel", "s-1", 7).ok());
    ASSERT_TRUE(store->recordApplied("cilium", "gone", 9).ok());
    ASSERT_TRUE(store->forget("cilium", "gone"));
    ASSERT_TRUE(
        store->park({"deployment", "api", 39, 5, "image pull failed", 1'700'000'000'123}).ok());
    auto slot = store->registerPlugin("deployment");
    ASSERT_TRUE(slot.ok());
    store->setPluginPid(*slot, 4242);
    store->heartbeat(*slot);
    store->ackPlugin(*slot, 40);
    store->countApplied(*slot, 3);
    store->countFailed(*slot, 2);
    store->countParked(*slot);
    store->countRedelivered(*slot, 4);
    store->recordRestart(*slot);
    ASSERT_TRUE(store->flush().ok());
  }
  auto store = openOrDie(dir.path(), agentOptions());
  EXPECT_FALSE(store->recovery().created);
  EXPECT_EQ(store->generation(), 2u);
  EXPECT_EQ(store->watermark(), 42u);
  EXPECT_EQ(store->fullSyncVersion(), 30u);
  EXPECT_EQ(store->fullSyncUnixMs(), 1'700'000'000'000);
  EXPECT_EQ(store->lastApplied("deployment", "web"), 40u);
  EXPECT_EQ(store->lastApplied("sentinel", "s-1"), 7u);
  EXPECT_EQ(store->lastApplied("cilium", "gone"), std::nullopt);
  EXPECT_EQ(store->trackedResources(), 2u);
  const auto parked = store->listParked();
  ASSERT_EQ(parked.size(), 1u);
  EXPECT_EQ(parked[0].type, "deployment");
  EXPECT_EQ(parked[0].id, "api");
  EXPECT_EQ(parked[0].version, 39u);
  EXPECT_EQ(parked[0].attempts, 5u);
  EXPECT_EQ(parked[0].last_error, "image pull failed");
  EXPECT_EQ(parked[0].parked_unix_ms, 1'700'000'000'123);
  auto slot = store->findPlugin("deployment");
  ASSERT_TRUE(slot.ok());
  const auto info = store->plugin(*slot);
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->name, "deployment");
  EXPECT_EQ(info->pid, 4242);
  EXPECT_EQ(info->acked_version, 40u);
  EXPECT_GT(info->heartbeat_mono_ns, 0u);
  EXPECT_GT(info->heartbeat_unix_ms, 0);
  EXPECT_EQ(info->applied, 3u);
  EXPECT_EQ(info->failed, 2u);
  EXPECT_EQ(info->parked, 1u);
  EXPECT_EQ(info->redelivered, 4u);
  EXPECT_EQ(info->restarts, 1u);
  // Registering again returns the same slot and keeps its counters.
  EXPECT_EQ(store->registerPlugin("deployment").value(), *slot);
  EXPECT_EQ(store->plugin(*slot)->applied, 3u);
}

TEST(CursorStoreTest, RefusesWrongMagic) {
  TempDir dir;
  const std::string path = dir.file("cursor.store");
  openOrDie(dir.path(), agentOptions());
  overwrite(path, 0, "BADMAGIC", 8);
  for (OpenMode mode : {OpenMode::kAgent, OpenMode::kHost, OpenMode::kReadOnly}) {
    auto store = CursorStore::open(dir.path(), modeOptions(mode));
    ASSERT_FALSE(store.ok());
    EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
    const std::string message(store.status().message());
    EXPECT_THAT(message, HasSubstr("\"BADMAGIC\""));
    EXPECT_THAT(message, HasSubstr("expected \"KRANECS1\""));
    EXPECT_THAT(message, HasSubstr(resetInstruction(path)));
  }
}

TEST(CursorStoreTest, RefusesUnknownLayoutVersion) {
  TempDir dir;
  const std::string path = dir.file("cursor.store");
  openOrDie(dir.path(), agentOptions());
  const uint32_t future = 7;
  overwrite(path, offsetof(layout::FileHeader, layout_version), &future, sizeof(future));
  auto store = CursorStore::open(dir.path(), agentOptions());
  ASSERT_FALSE(store.ok());
  const std::string message(store.status().message());
  EXPECT_THAT(message, HasSubstr("has layout version 7"));
  EXPECT_THAT(message, HasSubstr("this build reads layout version 1"));
  EXPECT_THAT(message, HasSubstr("newer krane"));
  EXPECT_THAT(message, HasSubstr(resetInstruction(path)));
}

TEST(CursorStoreTest, RefusesTruncatedFile) {
  TempDir dir;
  const std::string path = dir.file("cursor.store");
  const uint64_t full = openOrDie(dir.path(), agentOptions())->layout().file_bytes;
  std::filesystem::resize_file(path, full / 2);
  auto store = CursorStore::open(dir.path(), agentOptions());
  ASSERT_FALSE(store.ok());
  std::string message(store.status().message());
  EXPECT_THAT(message, HasSubstr(strCat("is ", full / 2, " bytes")));
  EXPECT_THAT(message, HasSubstr(strCat("needs ", full, " bytes")));
  EXPECT_THAT(message, HasSubstr("truncated"));
  EXPECT_THAT(message, HasSubstr(resetInstruction(path)));

  std::filesystem::resize_file(path, 100);
  store = CursorStore::open(dir.path(), modeOptions(OpenMode::kReadOnly));
  ASSERT_FALSE(store.ok());
  message = std::string(store.status().message());
  EXPECT_THAT(message, HasSubstr("is 100 bytes, too short to hold its header (4096 bytes)"));
  EXPECT_THAT(message, HasSubstr(resetInstruction(path)));

  // Following the instruction works: the agent creates a fresh store.
  std::filesystem::remove(path);
  auto fresh = openOrDie(dir.path(), agentOptions());
  EXPECT_TRUE(fresh->recovery().created);
}

TEST(CursorStoreTest, RefusesAnotherRegion) {
  TempDir dir;
  openOrDie(dir.path(), agentOptions());
  CursorStoreOptions other = agentOptions();
  other.region = "us-test-2";
  auto store = CursorStore::open(dir.path(), other);
  ASSERT_FALSE(store.ok());
  EXPECT_THAT(std::string(store.status().message()),
              HasSubstr("belongs to region 'eu-test-1' but this agent serves region 'us-test-2'"));
}

TEST(CursorStoreTest, OnlyTheAgentCreatesAndOnlyOneAgentAtATime) {
  TempDir dir;
  auto host = CursorStore::open(dir.path(), modeOptions(OpenMode::kHost));
  ASSERT_FALSE(host.ok());
  EXPECT_EQ(host.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(host.status().message()), HasSubstr("the agent creates it"));

  auto agent = openOrDie(dir.path(), agentOptions());
  auto second = CursorStore::open(dir.path(), agentOptions());
  ASSERT_FALSE(second.ok());
  EXPECT_THAT(std::string(second.status().message()),
              HasSubstr(strCat("already open in agent mode by another process (pid ", ::getpid())));
  // Readers and hosts are welcome meanwhile.
  EXPECT_TRUE(CursorStore::open(dir.path(), modeOptions(OpenMode::kHost)).ok());
  EXPECT_TRUE(CursorStore::open(dir.path(), modeOptions(OpenMode::kReadOnly)).ok());
  agent.reset();
  EXPECT_TRUE(CursorStore::open(dir.path(), agentOptions()).ok());
}

TEST(CursorStoreTest, RecordAppliedOnlyRaises) {
  TempDir dir;
  auto store = openOrDie(dir.path(), agentOptions());
  EXPECT_EQ(store->lastApplied("deployment", "web"), std::nullopt);
  EXPECT_TRUE(store->shouldApply("deployment", "web", 0));
  ASSERT_TRUE(store->recordApplied("deployment", "web", 10).ok());
  EXPECT_EQ(store->lastApplied("deployment", "web"), 10u);
  // An older version arriving late is ignored.
  ASSERT_TRUE(store->recordApplied("deployment", "web", 7).ok());
  EXPECT_EQ(store->lastApplied("deployment", "web"), 10u);
  EXPECT_FALSE(store->shouldApply("deployment", "web", 7));
  EXPECT_FALSE(store->shouldApply("deployment", "web", 10));
  EXPECT_TRUE(store->shouldApply("deployment", "web", 11));
  ASSERT_TRUE(store->recordApplied("deployment", "web", 12).ok());
  EXPECT_EQ(store->lastApplied("deployment", "web"), 12u);
  // Type and id are both part of the key; lengths too.
  EXPECT_EQ(store->lastApplied("sentinel", "web"), std::nullopt);
  ASSERT_TRUE(store->recordApplied("ab", "c", 1).ok());
  EXPECT_EQ(store->lastApplied("a", "bc"), std::nullopt);
  EXPECT_EQ(store->trackedResources(), 2u);
}

TEST(CursorStoreTest, ForgetThenRecordAgain) {
  TempDir dir;
  auto store = openOrDie(dir.path(), agentOptions());
  ASSERT_TRUE(store->recordApplied("deployment", "web", 10).ok());
  EXPECT_TRUE(store->forget("deployment", "web"));
  EXPECT_FALSE(store->forget("deployment", "web"));
  EXPECT_EQ(store->lastApplied("deployment", "web"), std::nullopt);
  EXPECT_TRUE(store->shouldApply("deployment", "web", 3));
  EXPECT_EQ(store->trackedResources(), 0u);
  // A re-created resource starts afresh.
  ASSERT_TRUE(store->recordApplied("deployment", "web", 3).ok());
  EXPECT_EQ(store->lastApplied("deployment", "web"), 3u);
  EXPECT_EQ(store->trackedResources(), 1u);
}

TEST(CursorStoreTest, ChurnKeepsLookupsCorrectAndTombstonesBounded) {
  TempDir dir;
  auto store = openOrDie(dir.path(), agentOptions(512));
  std::vector<std::optional<uint64_t>> expected(2000);
  uint64_t rng = 12345;
  for (uint64_t version = 1; version <= 200'000; ++version) {
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    const size_t k = (rng >> 33) % expected.size();
    const std::string id = strCat("r", k);
    const size_t live = static_cast<size_t>(store->trackedResources());
    if (expected[k].has_value() && ((rng >> 20) & 1) == 0) {
      ASSERT_TRUE(store->forget("t", id));
      expected[k].reset();
    } else if (expected[k].has_value() || live < 500) {
      ASSERT_TRUE(store->recordApplied("t", id, version).ok());
      expected[k] = version;
    }
  }
  size_t live = 0;
  for (size_t k = 0; k < expected.size(); ++k) {
    ASSERT_EQ(store->lastApplied("t", strCat("r", k)), expected[k]) << k;
    live += expected[k].has_value();
  }
  const TableStats stats = store->tableStats();
  EXPECT_EQ(stats.live, live);
  EXPECT_EQ(store->trackedResources(), live);
  EXPECT_EQ(stats.damaged, 0u);
  EXPECT_EQ(stats.half_written, 0u);
  std::printf("churn: live=%zu tombstones=%lu mean_probe=%.2f longest_probe=%lu\n", live,
              static_cast<unsigned long>(stats.tombstones), stats.mean_probe,
              static_cast<unsigned long>(stats.longest_probe));
  // Deleted entries never crowd out the empty buckets that end every probe.
  EXPECT_LE(stats.live + stats.tombstones, 1024u * 3 / 4);
}

TEST(CursorStoreTest, HundredThousandResourcesFitInAHundredBytesEach) {
  TempDir dir;
  constexpr uint64_t kResources = 100'000;
  auto store = openOrDie(dir.path(), agentOptions(kResources, 4096));
  std::vector<std::string> ids;
  ids.reserve(kResources);
  for (uint64_t i = 0; i < kResources; ++i) ids.push_back(strCat("app-", i, "-web"));

  auto start = std::chrono::steady_clock::now();
  for (uint64_t i = 0; i < kResources; ++i) {
    ASSERT_TRUE(store->recordApplied("deployment", ids[i], i + 1).ok());
  }
  const double insert_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  constexpr int kRounds = 5;
  start = std::chrono::steady_clock::now();
  for (int round = 0; round < kRounds; ++round) {
    for (uint64_t i = 0; i < kResources; ++i) {
      if (!store->recordApplied("deployment", ids[i], kResources * (round + 1) + i + 1).ok()) {
        FAIL();
      }
    }
  }
  const double update_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  start = std::chrono::steady_clock::now();
  uint64_t found = 0;
  for (uint64_t i = 0; i < kResources; ++i) {
    found += store->lastApplied("deployment", ids[i]).has_value();
  }
  const double lookup_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(found, kResources);
  EXPECT_EQ(store->trackedResources(), kResources);
  EXPECT_EQ(store->lastApplied("deployment", ids[777]), kResources * kRounds + 778);

  // From the layout: the whole file (header, 32 slots, 4096 parked events, table) per resource.
  const StoreLayout& l = store->layout();
  const double file_per_resource = static_cast<double>(l.file_bytes) / kResources;
  const double table_per_resource =
      static_cast<double>(l.table_entries * l.table_entry_bytes) / kResources;
  EXPECT_DOUBLE_EQ(store->bytesPerTrackedResource(), file_per_resource);
  EXPECT_LE(file_per_resource, 100.0);
  EXPECT_LE(table_per_resource, 64.0);
  const TableStats stats = store->tableStats();
  std::printf(
      "cursor_store: resources=%lu file_bytes=%lu bytes_per_tracked_resource=%.1f "
      "(table %.1f) new_keys_per_s=%.0f cursor_updates_per_s=%.0f lookups_per_s=%.0f "
      "mean_probe=%.2f longest_probe=%lu\n",
      static_cast<unsigned long>(kResources), static_cast<unsigned long>(l.file_bytes),
      file_per_resource, table_per_resource, kResources / insert_s, kResources * kRounds / update_s,
      kResources / lookup_s, stats.mean_probe, static_cast<unsigned long>(stats.longest_probe));
  // Lenient: tests may run unoptimised on a busy machine; bench/agent measures the real figure.
  EXPECT_GT(kResources * kRounds / update_s, 100'000.0);
}

TEST(CursorStoreTest, FullTableSaysHowToRaiseCapacityAndGrowsOnReopen) {
  TempDir dir;
  {
    auto store = openOrDie(dir.path(), agentOptions(10));
    for (int i = 0; i < 10; ++i) ASSERT_TRUE(store->recordApplied("t", strCat("r", i), 5).ok());
    const absl::Status full = store->recordApplied("t", "one-too-many", 5);
    EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
    EXPECT_THAT(std::string(full.message()),
                HasSubstr("is full: it tracks 10 resources, its max_resources. Raise "
                          "max_resources in the agent configuration and restart the agent"));
    // Known resources still update; a deletion makes room.
    EXPECT_TRUE(store->recordApplied("t", "r3", 6).ok());
    EXPECT_TRUE(store->forget("t", "r4"));
    EXPECT_TRUE(store->recordApplied("t", "one-too-many", 5).ok());
    ASSERT_TRUE(store->advanceWatermark(77));
    ASSERT_TRUE(store->registerPlugin("deployment").ok());
    ASSERT_TRUE(store->park({"t", "r9", 5, 1, "boom", 0}).ok());
  }
  auto reader = openOrDie(dir.path(), modeOptions(OpenMode::kReadOnly));
  EXPECT_FALSE(reader->superseded());
  auto store = openOrDie(dir.path(), agentOptions(40));
  EXPECT_TRUE(store->recovery().rebuilt);
  EXPECT_EQ(store->recovery().previous_max_resources, 10u);
  EXPECT_EQ(store->layout().max_resources, 40u);
  EXPECT_TRUE(reader->superseded());
  EXPECT_EQ(store->watermark(), 77u);
  EXPECT_EQ(store->lastApplied("t", "r3"), 6u);
  EXPECT_EQ(store->lastApplied("t", "r4"), std::nullopt);
  EXPECT_EQ(store->lastApplied("t", "one-too-many"), 5u);
  EXPECT_EQ(store->trackedResources(), 10u);
  EXPECT_TRUE(store->findPlugin("deployment").ok());
  EXPECT_EQ(store->listParked().size(), 1u);
  for (int i = 10; i < 40; ++i) ASSERT_TRUE(store->recordApplied("t", strCat("r", i), 5).ok());
  EXPECT_FALSE(store->recordApplied("t", "r40", 5).ok());
  // A smaller setting does not shrink the store.
  store.reset();
  EXPECT_EQ(openOrDie(dir.path(), agentOptions(10))->layout().max_resources, 40u);
}

TEST(CursorStoreTest, ParkedEvents) {
  TempDir dir;
  auto store = openOrDie(dir.path(), agentOptions(100, 3));
  EXPECT_TRUE(store->listParked().empty());
  ASSERT_TRUE(store->park({"deployment", "web", 10, 3, "timeout", 3000}).ok());
  ASSERT_TRUE(store->park({"sentinel", "s1", 11, 5, "invalid spec", 1000}).ok());
  ASSERT_TRUE(store->park({"cilium", "p", 12, 1, "", 2000}).ok());
  auto parked = store->listParked();
  ASSERT_EQ(parked.size(), 3u);
  EXPECT_EQ(parked[0].id, "s1");  // oldest first
  EXPECT_EQ(parked[1].id, "p");
  EXPECT_EQ(parked[2].id, "web");
  EXPECT_EQ(parked[0].last_error, "invalid spec");

  const absl::Status full = store->park({"deployment", "api", 13, 1, "x", 0});
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(full.message()), HasSubstr("parked list is full (3 events)"));

  // Parking the same resource again replaces its event (in place when the list is full).
  ASSERT_TRUE(store->park({"deployment", "web", 14, 4, "timeout again", 4000}).ok());
  parked = store->listParked();
  ASSERT_EQ(parked.size(), 3u);
  EXPECT_EQ(parked[2].version, 14u);
  EXPECT_EQ(parked[2].attempts, 4u);

  EXPECT_TRUE(store->unpark("sentinel", "s1"));
  EXPECT_FALSE(store->unpark("sentinel", "s1"));
  ASSERT_TRUE(store->park({"deployment", "web", 15, 5, "and again", 5000}).ok());
  parked = store->listParked();
  ASSERT_EQ(parked.size(), 2u);
  EXPECT_EQ(parked[1].version, 15u);
  EXPECT_TRUE(store->unpark("deployment", "web"));
  EXPECT_TRUE(store->unpark("cilium", "p"));
  EXPECT_TRUE(store->listParked().empty());

  // Long texts are cut to their fixed sizes (at a UTF-8 boundary); identity uses the full id.
  const std::string long_id = std::string(63, 'a') + "\xC3\xA9" + "-1";
  const std::string long_id2 = std::string(63, 'a') + "\xC3\xA9" + "-2";
  ASSERT_TRUE(store->park({"deployment", long_id, 1, 1, std::string(300, 'e'), 0}).ok());
  ASSERT_TRUE(store->park({"deployment", long_id2, 2, 1, "", 0}).ok());
  parked = store->listParked();
  ASSERT_EQ(parked.size(), 2u);
  if (parked[0].version != 1) std::swap(parked[0], parked[1]);
  EXPECT_EQ(parked[0].id, std::string(63, 'a'));
  EXPECT_EQ(parked[1].id, std::string(63, 'a'));
  EXPECT_EQ(parked[0].last_error, std::string(256, 'e'));
  EXPECT_GT(parked[0].parked_unix_ms, 0);
  EXPECT_TRUE(store->unpark("deployment", long_id2));
  ASSERT_EQ(store->listParked().size(), 1u);
  EXPECT_EQ(store->listParked()[0].version, 1u);
}

TEST(CursorStoreTest, PluginSlots) {
  TempDir dir;
  auto store = openOrDie(dir.path(), agentOptions());
  std::vector<int> slots;
  for (uint32_t i = 0; i < layout::kPluginSlots; ++i) {
    auto slot = store->registerPlugin(strCat("plugin-", i));
    ASSERT_TRUE(slot.ok()) << slot.status();
    slots.push_back(*slot);
  }
  auto extra = store->registerPlugin("one-more");
  EXPECT_EQ(extra.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(store->registerPlugin(std::string(65, 'x')).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->findPlugin("plugin-3").value(), slots[3]);
  EXPECT_EQ(store->findPlugin("missing").status().code(), absl::StatusCode::kNotFound);

  store->countApplied(slots[5], 9);
  store->releasePlugin(slots[5]);
  EXPECT_FALSE(store->plugin(slots[5]).has_value());
  EXPECT_FALSE(store->findPlugin("plugin-5").ok());
  auto reused = store->registerPlugin("cilium");
  ASSERT_TRUE(reused.ok());
  EXPECT_EQ(*reused, slots[5]);
  EXPECT_EQ(store->plugin(*reused)->applied, 0u);  // a new plugin starts at zero
  EXPECT_EQ(store->snapshot().plugins.size(), layout::kPluginSlots);
}

TEST(CursorStoreTest, HostWritesItsSlotOnly) {
  TempDir dir;
  auto agent = openOrDie(dir.path(), agentOptions());
  const int slot = agent->registerPlugin("sentinel").value();
  auto host = openOrDie(dir.path(), modeOptions(OpenMode::kHost));
  const int found = host->findPlugin("sentinel").value();
  EXPECT_EQ(found, slot);
  host->setPluginPid(found, 99);
  host->heartbeat(found);
  host->ackPlugin(found, 1234);
  EXPECT_EQ(agent->plugin(slot)->pid, 99);
  EXPECT_EQ(agent->plugin(slot)->acked_version, 1234u);
  ASSERT_TRUE(agent->recordApplied("sentinel", "s", 5).ok());
  EXPECT_EQ(host->lastApplied("sentinel", "s"), 5u);
  EXPECT_FALSE(host->shouldApply("sentinel", "s", 4));
}

TEST(CursorStoreDeathTest, WritingOutsideYourModeAborts) {
  TempDir dir;
  auto agent = openOrDie(dir.path(), agentOptions());
  const int slot = agent->registerPlugin("p").value();
  auto host = openOrDie(dir.path(), modeOptions(OpenMode::kHost));
  auto reader = openOrDie(dir.path(), modeOptions(OpenMode::kReadOnly));
  EXPECT_DEATH((void)host->recordApplied("t", "i", 1), "needs|agent-owned");
  EXPECT_DEATH(host->advanceWatermark(5), "agent-owned");
  EXPECT_DEATH(reader->heartbeat(slot), "opened read-only");
  EXPECT_DEATH(agent->heartbeat(99), "plugin slot 99 out of range");
}

TEST(CursorStoreTest, WatermarkOnlyRises) {
  TempDir dir;
  auto store = openOrDie(dir.path(), agentOptions());
  EXPECT_TRUE(store->advanceWatermark(10));
  EXPECT_TRUE(store->advanceWatermark(10));
  EXPECT_FALSE(store->advanceWatermark(9));
  EXPECT_EQ(store->watermark(), 10u);
  EXPECT_GT(store->snapshot().watermark_unix_ms, 0);
}

TEST(CursorStoreTest, AFullSyncReplacesVersionsAndTheWatermark) {
  TempDir dir;
  auto store = openOrDie(dir.path(), agentOptions(100));
  ASSERT_TRUE(store->recordApplied("t", "kept", 40).ok());
  ASSERT_TRUE(store->recordApplied("t", "gone", 41).ok());
  ASSERT_TRUE(store->recordApplied("u", "kept", 42).ok());
  ASSERT_TRUE(store->advanceWatermark(42));
  // A sync after a database restore: lower versions, and one resource no longer exists.
  ASSERT_TRUE(store->replaceApplied("t", "kept", 7).ok());
  EXPECT_EQ(store->retainOnly({layout::resourceKey("t", "kept"), layout::resourceKey("u", "kept"),
                               layout::resourceKey("t", "never-tracked")}),
            1u);
  store->setWatermark(9);
  EXPECT_EQ(store->lastApplied("t", "kept"), 7u);
  EXPECT_EQ(store->lastApplied("u", "kept"), 42u);
  EXPECT_EQ(store->lastApplied("t", "gone"), std::nullopt);
  EXPECT_EQ(store->trackedResources(), 2u);
  EXPECT_EQ(store->watermark(), 9u);
  EXPECT_TRUE(store->shouldApply("t", "kept", 8));
  EXPECT_TRUE(store->shouldApply("t", "gone", 1));
  const TableStats stats = store->tableStats();
  EXPECT_EQ(stats.live, 2u);
  EXPECT_EQ(stats.damaged + stats.half_written, 0u);
  // Everything survives a reopen.
  store.reset();
  store = openOrDie(dir.path(), agentOptions(100));
  EXPECT_EQ(store->lastApplied("t", "kept"), 7u);
  EXPECT_EQ(store->lastApplied("t", "gone"), std::nullopt);
  EXPECT_EQ(store->watermark(), 9u);
}

// Leftovers a kill can leave (and damage a kill cannot) are repaired when the agent opens.
TEST(CursorStoreTest, AgentOpenRepairsLeftovers) {
  TempDir dir;
  const std::string path = dir.file("cursor.store");
  StoreLayout l;
  {
    auto store = openOrDie(dir.path(), agentOptions(100, 8));
    ASSERT_TRUE(store->recordApplied("t", "keep", 5).ok());
    ASSERT_TRUE(store->park({"t", "p", 1, 1, "e", 0}).ok());
    l = store->layout();
  }
  {
    RawFile raw(path);
    auto* table = raw.at<layout::TableEntry>(l.table_offset);
    // An insert killed before its tag was published: words without a tag.
    uint64_t free_bucket = 0;
    while (table[free_bucket].tag.load() != 0) ++free_bucket;
    table[free_bucket].key_hi.store(123);
    table[free_bucket].version.store(9);
    // A live tag over words it does not match (what a wrong write order would leave).
    uint64_t other = free_bucket + 1;
    while (table[other].tag.load() != 0) ++other;
    table[other].key_hi.store(1);
    table[other].key_lo.store(2);
    table[other].tag.store(layout::entryTag(1, 3));
    // A parked event and a slot killed mid-write.
    auto* parked = raw.at<layout::ParkedRecord>(l.parked_offset);
    parked[5].state.store(layout::writingState(1000));
    auto* slots = raw.at<layout::PluginSlotRecord>(l.slots_offset);
    slots[7].state.store(layout::writingState(1001));
    // A stale temporary file of an agent killed while creating the store.
    std::FILE* f = std::fopen(dir.file("cursor.store.tmp.99999").c_str(), "w");
    std::fclose(f);
  }
  auto reader = openOrDie(dir.path(), modeOptions(OpenMode::kReadOnly));
  EXPECT_EQ(reader->tableStats().damaged, 1u);
  EXPECT_EQ(reader->tableStats().half_written, 1u);

  auto store = openOrDie(dir.path(), agentOptions(100, 8));
  const RecoveryReport& r = store->recovery();
  EXPECT_EQ(r.half_written_entries_cleared, 1u);
  EXPECT_EQ(r.damaged_entries_dropped, 1u);
  EXPECT_EQ(r.parked_half_written_cleared, 1u);
  EXPECT_EQ(r.slots_half_written_cleared, 1u);
  EXPECT_EQ(r.stale_temp_files_removed, 1u);
  const TableStats stats = store->tableStats();
  EXPECT_EQ(stats.damaged, 0u);
  EXPECT_EQ(stats.half_written, 0u);
  EXPECT_EQ(stats.live, 1u);
  EXPECT_EQ(store->lastApplied("t", "keep"), 5u);
  EXPECT_EQ(store->listParked().size(), 1u);
  EXPECT_FALSE(std::filesystem::exists(dir.file("cursor.store.tmp.99999")));
}

TEST(CursorStoreTest, ResourceKeyIsStable) {
  // The hash is part of the file format: a change here needs a new layout version.
  const layout::ResourceKey k = layout::resourceKey("deployment", "web");
  EXPECT_EQ(k, layout::resourceKey("deployment", "web"));
  EXPECT_NE(k, layout::resourceKey("deployment", "web2"));
  EXPECT_NE(layout::resourceKey("ab", "c"), layout::resourceKey("a", "bc"));
  EXPECT_NE(layout::resourceKey("", ""), layout::resourceKey("", std::string_view("\0", 1)));
  // Pinned: a different value here means every existing store would be misread.
  EXPECT_EQ(k.hi, 0x889f43b67111e73eULL);
  EXPECT_EQ(k.lo, 0x92cf32bcfc8d6b80ULL);
}

}  // namespace
}  // namespace krane::ipc
