#include "ipc/cursor_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "common/strings.h"
#include "ipc/cursor_layout.h"
#include "tests/ipc/temp_dir.h"
#include "tests/support/matchers.h"
#include "tests/support/process.h"

namespace krane::ipc {
namespace {

using ::krane::ipc::testing::RawFile;
using ::krane::ipc::testing::TempDir;

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
  CHECK_THAT(store, IsOk());
  return store.ok() ? std::move(*store) : nullptr;
}

std::string resetInstruction(const std::string& path) {
  return strCat("remove ", path, "; the agent then does one full sync");
}

void overwrite(const std::string& path, off_t offset, const void* bytes, size_t n) {
  const int fd = ::open(path.c_str(), O_WRONLY);
  REQUIRE(fd >= 0);
  REQUIRE(::pwrite(fd, bytes, n, offset) == static_cast<ssize_t>(n));
  ::close(fd);
}

TEST_CASE("creates file with header", "[cursor-store]") {
  TempDir dir;
  auto store = openOrDie(dir.path(), agentOptions());
  REQUIRE(store != nullptr);
  CHECK(store->recovery().created);
  CHECK(store->path() == dir.file("cursor.store"));
  CHECK(store->region() == "eu-test-1");
  CHECK(store->generation() == 1u);
  CHECK(store->watermark() == 0u);
  const StoreLayout& l = store->layout();
  CHECK(l.layout_version == layout::kLayoutVersion);
  CHECK(l.max_resources == 1000u);
  CHECK(l.table_entries == 2000u);
  CHECK(l.table_entry_bytes == 32u);
  CHECK(l.file_bytes == std::filesystem::file_size(store->path()));
  CHECK((l.table_offset % layout::kPageBytes) == 0u);
  char magic[8];
  const int fd = ::open(store->path().c_str(), O_RDONLY);
  REQUIRE(::pread(fd, magic, 8, 0) == 8);
  ::close(fd);
  CHECK(std::string(magic, 8) == "KRANECS1");
  // Nothing but the final file and the lock file: the temporary name is gone.
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    names.push_back(e.path().filename().string());
  }
  CHECK_THAT(names,
             Catch::UnorderedEquals(std::vector<std::string>{"cursor.store", "cursor.store.lock"}));
}

TEST_CASE("reopen keeps everything", "[cursor-store]") {
  TempDir dir;
  {
    auto store = openOrDie(dir.path(), agentOptions());
    REQUIRE(store->advanceWatermark(41));
    REQUIRE(store->advanceWatermark(42));
    store->recordFullSync(30, 1'700'000'000'000);
    REQUIRE_THAT(store->recordApplied("deployment", "web", 40), IsOk());
    REQUIRE_THAT(store->recordApplied("sentinel", "s-1", 7), IsOk());
    REQUIRE_THAT(store->recordApplied("cilium", "gone", 9), IsOk());
    REQUIRE(store->forget("cilium", "gone"));
    REQUIRE_THAT(store->park({"deployment", "api", 39, 5, "image pull failed", 1'700'000'000'123}),
                 IsOk());
    auto slot = store->registerPlugin("deployment");
    REQUIRE_THAT(slot, IsOk());
    store->setPluginPid(*slot, 4242);
    store->heartbeat(*slot);
    store->ackPlugin(*slot, 40);
    store->countApplied(*slot, 3);
    store->countFailed(*slot, 2);
    store->countParked(*slot);
    store->countRedelivered(*slot, 4);
    store->recordRestart(*slot);
    REQUIRE_THAT(store->flush(), IsOk());
  }
  auto store = openOrDie(dir.path(), agentOptions());
  CHECK_FALSE(store->recovery().created);
  CHECK(store->generation() == 2u);
  CHECK(store->watermark() == 42u);
  CHECK(store->fullSyncVersion() == 30u);
  CHECK(store->fullSyncUnixMs() == 1'700'000'000'000);
  CHECK(store->lastApplied("deployment", "web") == 40u);
  CHECK(store->lastApplied("sentinel", "s-1") == 7u);
  CHECK(store->lastApplied("cilium", "gone") == std::nullopt);
  CHECK(store->trackedResources() == 2u);
  const auto parked = store->listParked();
  REQUIRE(parked.size() == 1u);
  CHECK(parked[0].type == "deployment");
  CHECK(parked[0].id == "api");
  CHECK(parked[0].version == 39u);
  CHECK(parked[0].attempts == 5u);
  CHECK(parked[0].last_error == "image pull failed");
  CHECK(parked[0].parked_unix_ms == 1'700'000'000'123);
  auto slot = store->findPlugin("deployment");
  REQUIRE_THAT(slot, IsOk());
  const auto info = store->plugin(*slot);
  REQUIRE(info.has_value());
  CHECK(info->name == "deployment");
  CHECK(info->pid == 4242);
  CHECK(info->acked_version == 40u);
  CHECK(info->heartbeat_mono_ns > 0u);
  CHECK(info->heartbeat_unix_ms > 0);
  CHECK(info->applied == 3u);
  CHECK(info->failed == 2u);
  CHECK(info->parked == 1u);
  CHECK(info->redelivered == 4u);
  CHECK(info->restarts == 1u);
  // Registering again returns the same slot and keeps its counters.
  CHECK(store->registerPlugin("deployment").value() == *slot);
  CHECK(store->plugin(*slot)->applied == 3u);
}

TEST_CASE("refuses wrong magic", "[cursor-store]") {
  TempDir dir;
  const std::string path = dir.file("cursor.store");
  openOrDie(dir.path(), agentOptions());
  overwrite(path, 0, "BADMAGIC", 8);
  for (OpenMode mode : {OpenMode::kAgent, OpenMode::kHost, OpenMode::kReadOnly}) {
    auto store = CursorStore::open(dir.path(), modeOptions(mode));
    REQUIRE_FALSE(store.ok());
    CHECK(store.status().code() == absl::StatusCode::kFailedPrecondition);
    const std::string message(store.status().message());
    CHECK_THAT(message, Catch::Contains("\"BADMAGIC\""));
    CHECK_THAT(message, Catch::Contains("expected \"KRANECS1\""));
    CHECK_THAT(message, Catch::Contains(resetInstruction(path)));
  }
}

TEST_CASE("refuses unknown layout version", "[cursor-store]") {
  TempDir dir;
  const std::string path = dir.file("cursor.store");
  openOrDie(dir.path(), agentOptions());
  const uint32_t future = 7;
  overwrite(path, offsetof(layout::FileHeader, layout_version), &future, sizeof(future));
  auto store = CursorStore::open(dir.path(), agentOptions());
  REQUIRE_FALSE(store.ok());
  const std::string message(store.status().message());
  CHECK_THAT(message, Catch::Contains("has layout version 7"));
  CHECK_THAT(message, Catch::Contains("this build reads layout version 1"));
  CHECK_THAT(message, Catch::Contains("newer krane"));
  CHECK_THAT(message, Catch::Contains(resetInstruction(path)));
}

TEST_CASE("refuses truncated file", "[cursor-store]") {
  TempDir dir;
  const std::string path = dir.file("cursor.store");
  const uint64_t full = openOrDie(dir.path(), agentOptions())->layout().file_bytes;
  std::filesystem::resize_file(path, full / 2);
  auto store = CursorStore::open(dir.path(), agentOptions());
  REQUIRE_FALSE(store.ok());
  std::string message(store.status().message());
  CHECK_THAT(message, Catch::Contains(strCat("is ", full / 2, " bytes")));
  CHECK_THAT(message, Catch::Contains(strCat("needs ", full, " bytes")));
  CHECK_THAT(message, Catch::Contains("truncated"));
  CHECK_THAT(message, Catch::Contains(resetInstruction(path)));

  std::filesystem::resize_file(path, 100);
  store = CursorStore::open(dir.path(), modeOptions(OpenMode::kReadOnly));
  REQUIRE_FALSE(store.ok());
  message = std::string(store.status().message());
  CHECK_THAT(message, Catch::Contains("is 100 bytes, too short to hold its header (4096 bytes)"));
  CHECK_THAT(message, Catch::Contains(resetInstruction(path)));

  // Following the instruction works: the agent creates a fresh store.
  std::filesystem::remove(path);
  auto fresh = openOrDie(dir.path(), agentOptions());
  CHECK(fresh->recovery().created);
}

TEST_CASE("refuses another region", "[cursor-store]") {
  TempDir dir;
  openOrDie(dir.path(), agentOptions());
  CursorStoreOptions other = agentOptions();
  other.region = "us-test-2";
  auto store = CursorStore::open(dir.path(), other);
  REQUIRE_FALSE(store.ok());
  CHECK_THAT(
      std::string(store.status().message()),
      Catch::Contains("belongs to region 'eu-test-1' but this agent serves region 'us-test-2'"));
}

TEST_CASE("only the agent creates and only one agent at a time", "[cursor-store]") {
  TempDir dir;
  auto host = CursorStore::open(dir.path(), modeOptions(OpenMode::kHost));
  REQUIRE_FALSE(host.ok());
  CHECK(host.status().code() == absl::StatusCode::kNotFound);
  CHECK_THAT(std::string(host.status().message()), Catch::Contains("the agent creates it"));

  auto agent = openOrDie(dir.path(), agentOptions());
  auto second = CursorStore::open(dir.path(), agentOptions());
  REQUIRE_FALSE(second.ok());
  CHECK_THAT(
      std::string(second.status().message()),
      Catch::Contains(strCat("already open in agent mode by another process (pid ", ::getpid())));
  // Readers and hosts are welcome meanwhile.
  CHECK_THAT(CursorStore::open(dir.path(), modeOptions(OpenMode::kHost)), IsOk());
  CHECK_THAT(CursorStore::open(dir.path(), modeOptions(OpenMode::kReadOnly)), IsOk());
  agent.reset();
  CHECK_THAT(CursorStore::open(dir.path(), agentOptions()), IsOk());
}

TEST_CASE("record applied only raises", "[cursor-store]") {
  TempDir dir;
  auto store = openOrDie(dir.path(), agentOptions());
  CHECK(store->lastApplied("deployment", "web") == std::nullopt);
  CHECK(store->shouldApply("deployment", "web", 0));
  REQUIRE_THAT(store->recordApplied("deployment", "web", 10), IsOk());
  CHECK(store->lastApplied("deployment", "web") == 10u);
  // An older version arriving late is ignored.
  REQUIRE_THAT(store->recordApplied("deployment", "web", 7), IsOk());
  CHECK(store->lastApplied("deployment", "web") == 10u);
  CHECK_FALSE(store->shouldApply("deployment", "web", 7));
  CHECK_FALSE(store->shouldApply("deployment", "web", 10));
  CHECK(store->shouldApply("deployment", "web", 11));
  REQUIRE_THAT(store->recordApplied("deployment", "web", 12), IsOk());
  CHECK(store->lastApplied("deployment", "web") == 12u);
  // Type and id are both part of the key; lengths too.
  CHECK(store->lastApplied("sentinel", "web") == std::nullopt);
  REQUIRE_THAT(store->recordApplied("ab", "c", 1), IsOk());
  CHECK(store->lastApplied("a", "bc") == std::nullopt);
  CHECK(store->trackedResources() == 2u);
}

TEST_CASE("forget then record again", "[cursor-store]") {
  TempDir dir;
  auto store = openOrDie(dir.path(), agentOptions());
  REQUIRE_THAT(store->recordApplied("deployment", "web", 10), IsOk());
  CHECK(store->forget("deployment", "web"));
  CHECK_FALSE(store->forget("deployment", "web"));
  CHECK(store->lastApplied("deployment", "web") == std::nullopt);
  CHECK(store->shouldApply("deployment", "web", 3));
  CHECK(store->trackedResources() == 0u);
  // A re-created resource starts afresh.
  REQUIRE_THAT(store->recordApplied("deployment", "web", 3), IsOk());
  CHECK(store->lastApplied("deployment", "web") == 3u);
  CHECK(store->trackedResources() == 1u);
}

TEST_CASE("churn keeps lookups correct and tombstones bounded", "[cursor-store]") {
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
      REQUIRE(store->forget("t", id));
      expected[k].reset();
    } else if (expected[k].has_value() || live < 500) {
      REQUIRE_THAT(store->recordApplied("t", id, version), IsOk());
      expected[k] = version;
    }
  }
  size_t live = 0;
  for (size_t k = 0; k < expected.size(); ++k) {
    INFO(k);
    REQUIRE(store->lastApplied("t", strCat("r", k)) == expected[k]);
    live += expected[k].has_value();
  }
  const TableStats stats = store->tableStats();
  CHECK(stats.live == live);
  CHECK(store->trackedResources() == live);
  CHECK(stats.damaged == 0u);
  CHECK(stats.half_written == 0u);
  std::printf("churn: live=%zu tombstones=%lu mean_probe=%.2f longest_probe=%lu\n", live,
              static_cast<unsigned long>(stats.tombstones), stats.mean_probe,
              static_cast<unsigned long>(stats.longest_probe));
  // Deleted entries never crowd out the empty buckets that end every probe.
  CHECK((stats.live + stats.tombstones) <= (1024u * 3 / 4));
}

TEST_CASE("hundred thousand resources fit in a hundred bytes each", "[cursor-store]") {
  TempDir dir;
  constexpr uint64_t kResources = 100'000;
  auto store = openOrDie(dir.path(), agentOptions(kResources, 4096));
  std::vector<std::string> ids;
  ids.reserve(kResources);
  for (uint64_t i = 0; i < kResources; ++i) ids.push_back(strCat("app-", i, "-web"));

  auto start = std::chrono::steady_clock::now();
  for (uint64_t i = 0; i < kResources; ++i) {
    REQUIRE_THAT(store->recordApplied("deployment", ids[i], i + 1), IsOk());
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
  CHECK(found == kResources);
  CHECK(store->trackedResources() == kResources);
  CHECK(store->lastApplied("deployment", ids[777]) == (kResources * kRounds + 778));

  // From the layout: the whole file (header, 32 slots, 4096 parked events, table) per resource.
  const StoreLayout& l = store->layout();
  const double file_per_resource = static_cast<double>(l.file_bytes) / kResources;
  const double table_per_resource =
      static_cast<double>(l.table_entries * l.table_entry_bytes) / kResources;
  CHECK(store->bytesPerTrackedResource() == Approx(file_per_resource));
  CHECK(file_per_resource <= 100.0);
  CHECK(table_per_resource <= 64.0);
  const TableStats stats = store->tableStats();
  std::printf(
      "cursor_store: resources=%lu file_bytes=%lu bytes_per_tracked_resource=%.1f "
      "(table %.1f) new_keys_per_s=%.0f cursor_updates_per_s=%.0f lookups_per_s=%.0f "
      "mean_probe=%.2f longest_probe=%lu\n",
      static_cast<unsigned long>(kResources), static_cast<unsigned long>(l.file_bytes),
      file_per_resource, table_per_resource, kResources / insert_s, kResources * kRounds / update_s,
      kResources / lookup_s, stats.mean_probe, static_cast<unsigned long>(stats.longest_probe));
  // Lenient: tests may run unoptimised on a busy machine; bench/agent measures the real figure.
  CHECK((kResources * kRounds / update_s) > 100'000.0);
}

TEST_CASE("full table says how to raise capacity and grows on reopen", "[cursor-store]") {
  TempDir dir;
  {
    auto store = openOrDie(dir.path(), agentOptions(10));
    for (int i = 0; i < 10; ++i) REQUIRE_THAT(store->recordApplied("t", strCat("r", i), 5), IsOk());
    const absl::Status full = store->recordApplied("t", "one-too-many", 5);
    CHECK(full.code() == absl::StatusCode::kResourceExhausted);
    CHECK_THAT(std::string(full.message()),
               Catch::Contains("is full: it tracks 10 resources, its max_resources. Raise "
                               "max_resources in the agent configuration and restart the agent"));
    // Known resources still update; a deletion makes room.
    CHECK_THAT(store->recordApplied("t", "r3", 6), IsOk());
    CHECK(store->forget("t", "r4"));
    CHECK_THAT(store->recordApplied("t", "one-too-many", 5), IsOk());
    REQUIRE(store->advanceWatermark(77));
    REQUIRE_THAT(store->registerPlugin("deployment"), IsOk());
    REQUIRE_THAT(store->park({"t", "r9", 5, 1, "boom", 0}), IsOk());
  }
  auto reader = openOrDie(dir.path(), modeOptions(OpenMode::kReadOnly));
  CHECK_FALSE(reader->superseded());
  auto store = openOrDie(dir.path(), agentOptions(40));
  CHECK(store->recovery().rebuilt);
  CHECK(store->recovery().previous_max_resources == 10u);
  CHECK(store->layout().max_resources == 40u);
  CHECK(reader->superseded());
  CHECK(store->watermark() == 77u);
  CHECK(store->lastApplied("t", "r3") == 6u);
  CHECK(store->lastApplied("t", "r4") == std::nullopt);
  CHECK(store->lastApplied("t", "one-too-many") == 5u);
  CHECK(store->trackedResources() == 10u);
  CHECK_THAT(store->findPlugin("deployment"), IsOk());
  CHECK(store->listParked().size() == 1u);
  for (int i = 10; i < 40; ++i) REQUIRE_THAT(store->recordApplied("t", strCat("r", i), 5), IsOk());
  CHECK_FALSE(store->recordApplied("t", "r40", 5).ok());
  // A smaller setting does not shrink the store.
  store.reset();
  CHECK(openOrDie(dir.path(), agentOptions(10))->layout().max_resources == 40u);
}

TEST_CASE("parked events", "[cursor-store]") {
  TempDir dir;
  auto store = openOrDie(dir.path(), agentOptions(100, 3));
  CHECK(store->listParked().empty());
  REQUIRE_THAT(store->park({"deployment", "web", 10, 3, "timeout", 3000}), IsOk());
  REQUIRE_THAT(store->park({"sentinel", "s1", 11, 5, "invalid spec", 1000}), IsOk());
  REQUIRE_THAT(store->park({"cilium", "p", 12, 1, "", 2000}), IsOk());
  auto parked = store->listParked();
  REQUIRE(parked.size() == 3u);
  CHECK(parked[0].id == "s1");  // oldest first
  CHECK(parked[1].id == "p");
  CHECK(parked[2].id == "web");
  CHECK(parked[0].last_error == "invalid spec");

  const absl::Status full = store->park({"deployment", "api", 13, 1, "x", 0});
  CHECK(full.code() == absl::StatusCode::kResourceExhausted);
  CHECK_THAT(std::string(full.message()), Catch::Contains("parked list is full (3 events)"));

  // Parking the same resource again replaces its event (in place when the list is full).
  REQUIRE_THAT(store->park({"deployment", "web", 14, 4, "timeout again", 4000}), IsOk());
  parked = store->listParked();
  REQUIRE(parked.size() == 3u);
  CHECK(parked[2].version == 14u);
  CHECK(parked[2].attempts == 4u);

  CHECK(store->unpark("sentinel", "s1"));
  CHECK_FALSE(store->unpark("sentinel", "s1"));
  REQUIRE_THAT(store->park({"deployment", "web", 15, 5, "and again", 5000}), IsOk());
  parked = store->listParked();
  REQUIRE(parked.size() == 2u);
  CHECK(parked[1].version == 15u);
  CHECK(store->unpark("deployment", "web"));
  CHECK(store->unpark("cilium", "p"));
  CHECK(store->listParked().empty());

  // Long texts are cut to their fixed sizes (at a UTF-8 boundary); identity uses the full id.
  const std::string long_id = std::string(63, 'a') + "\xC3\xA9" + "-1";
  const std::string long_id2 = std::string(63, 'a') + "\xC3\xA9" + "-2";
  REQUIRE_THAT(store->park({"deployment", long_id, 1, 1, std::string(300, 'e'), 0}), IsOk());
  REQUIRE_THAT(store->park({"deployment", long_id2, 2, 1, "", 0}), IsOk());
  parked = store->listParked();
  REQUIRE(parked.size() == 2u);
  if (parked[0].version != 1) std::swap(parked[0], parked[1]);
  CHECK(parked[0].id == std::string(63, 'a'));
  CHECK(parked[1].id == std::string(63, 'a'));
  CHECK(parked[0].last_error == std::string(256, 'e'));
  CHECK(parked[0].parked_unix_ms > 0);
  CHECK(store->unpark("deployment", long_id2));
  REQUIRE(store->listParked().size() == 1u);
  CHECK(store->listParked()[0].version == 1u);
}

TEST_CASE("plugin slots", "[cursor-store]") {
  TempDir dir;
  auto store = openOrDie(dir.path(), agentOptions());
  std::vector<int> slots;
  for (uint32_t i = 0; i < layout::kPluginSlots; ++i) {
    auto slot = store->registerPlugin(strCat("plugin-", i));
    REQUIRE_THAT(slot, IsOk());
    slots.push_back(*slot);
  }
  auto extra = store->registerPlugin("one-more");
  CHECK(extra.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(store->registerPlugin(std::string(65, 'x')).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(store->findPlugin("plugin-3").value() == slots[3]);
  CHECK(store->findPlugin("missing").status().code() == absl::StatusCode::kNotFound);

  store->countApplied(slots[5], 9);
  store->releasePlugin(slots[5]);
  CHECK_FALSE(store->plugin(slots[5]).has_value());
  CHECK_FALSE(store->findPlugin("plugin-5").ok());
  auto reused = store->registerPlugin("cilium");
  REQUIRE_THAT(reused, IsOk());
  CHECK(*reused == slots[5]);
  CHECK(store->plugin(*reused)->applied == 0u);  // a new plugin starts at zero
  CHECK(store->snapshot().plugins.size() == layout::kPluginSlots);
}

TEST_CASE("host writes its slot only", "[cursor-store]") {
  TempDir dir;
  auto agent = openOrDie(dir.path(), agentOptions());
  const int slot = agent->registerPlugin("sentinel").value();
  auto host = openOrDie(dir.path(), modeOptions(OpenMode::kHost));
  const int found = host->findPlugin("sentinel").value();
  CHECK(found == slot);
  host->setPluginPid(found, 99);
  host->heartbeat(found);
  host->ackPlugin(found, 1234);
  CHECK(agent->plugin(slot)->pid == 99);
  CHECK(agent->plugin(slot)->acked_version == 1234u);
  REQUIRE_THAT(agent->recordApplied("sentinel", "s", 5), IsOk());
  CHECK(host->lastApplied("sentinel", "s") == 5u);
  CHECK_FALSE(host->shouldApply("sentinel", "s", 4));
}

TEST_CASE("writing outside your mode aborts", "[cursor-store-death]") {
  TempDir dir;
  auto agent = openOrDie(dir.path(), agentOptions());
  const int slot = agent->registerPlugin("p").value();
  auto host = openOrDie(dir.path(), modeOptions(OpenMode::kHost));
  auto reader = openOrDie(dir.path(), modeOptions(OpenMode::kReadOnly));
  {
    const auto death = krane::testing::runInChild([&] { (void)host->recordApplied("t", "i", 1); });
    CHECK(death.died);
    CHECK_THAT(death.err, ContainsRegex("needs|agent-owned"));
  }
  {
    const auto death = krane::testing::runInChild([&] { host->advanceWatermark(5); });
    CHECK(death.died);
    CHECK_THAT(death.err, ContainsRegex("agent-owned"));
  }
  {
    const auto death = krane::testing::runInChild([&] { reader->heartbeat(slot); });
    CHECK(death.died);
    CHECK_THAT(death.err, ContainsRegex("opened read-only"));
  }
  {
    const auto death = krane::testing::runInChild([&] { agent->heartbeat(99); });
    CHECK(death.died);
    CHECK_THAT(death.err, ContainsRegex("plugin slot 99 out of range"));
  }
}

TEST_CASE("watermark only rises", "[cursor-store]") {
  TempDir dir;
  auto store = openOrDie(dir.path(), agentOptions());
  CHECK(store->advanceWatermark(10));
  CHECK(store->advanceWatermark(10));
  CHECK_FALSE(store->advanceWatermark(9));
  CHECK(store->watermark() == 10u);
  CHECK(store->snapshot().watermark_unix_ms > 0);
}

TEST_CASE("a full sync replaces versions and the watermark", "[cursor-store]") {
  TempDir dir;
  auto store = openOrDie(dir.path(), agentOptions(100));
  REQUIRE_THAT(store->recordApplied("t", "kept", 40), IsOk());
  REQUIRE_THAT(store->recordApplied("t", "gone", 41), IsOk());
  REQUIRE_THAT(store->recordApplied("u", "kept", 42), IsOk());
  REQUIRE(store->advanceWatermark(42));
  // A sync after a database restore: lower versions, and one resource no longer exists.
  REQUIRE_THAT(store->replaceApplied("t", "kept", 7), IsOk());
  CHECK(store->retainOnly({layout::resourceKey("t", "kept"), layout::resourceKey("u", "kept"),
                           layout::resourceKey("t", "never-tracked")}) == 1u);
  store->setWatermark(9);
  CHECK(store->lastApplied("t", "kept") == 7u);
  CHECK(store->lastApplied("u", "kept") == 42u);
  CHECK(store->lastApplied("t", "gone") == std::nullopt);
  CHECK(store->trackedResources() == 2u);
  CHECK(store->watermark() == 9u);
  CHECK(store->shouldApply("t", "kept", 8));
  CHECK(store->shouldApply("t", "gone", 1));
  const TableStats stats = store->tableStats();
  CHECK(stats.live == 2u);
  CHECK((stats.damaged + stats.half_written) == 0u);
  // Everything survives a reopen.
  store.reset();
  store = openOrDie(dir.path(), agentOptions(100));
  CHECK(store->lastApplied("t", "kept") == 7u);
  CHECK(store->lastApplied("t", "gone") == std::nullopt);
  CHECK(store->watermark() == 9u);
}

// Leftovers a kill can leave (and damage a kill cannot) are repaired when the agent opens.
TEST_CASE("agent open repairs leftovers", "[cursor-store]") {
  TempDir dir;
  const std::string path = dir.file("cursor.store");
  StoreLayout l;
  {
    auto store = openOrDie(dir.path(), agentOptions(100, 8));
    REQUIRE_THAT(store->recordApplied("t", "keep", 5), IsOk());
    REQUIRE_THAT(store->park({"t", "p", 1, 1, "e", 0}), IsOk());
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
  CHECK(reader->tableStats().damaged == 1u);
  CHECK(reader->tableStats().half_written == 1u);

  auto store = openOrDie(dir.path(), agentOptions(100, 8));
  const RecoveryReport& r = store->recovery();
  CHECK(r.half_written_entries_cleared == 1u);
  CHECK(r.damaged_entries_dropped == 1u);
  CHECK(r.parked_half_written_cleared == 1u);
  CHECK(r.slots_half_written_cleared == 1u);
  CHECK(r.stale_temp_files_removed == 1u);
  const TableStats stats = store->tableStats();
  CHECK(stats.damaged == 0u);
  CHECK(stats.half_written == 0u);
  CHECK(stats.live == 1u);
  CHECK(store->lastApplied("t", "keep") == 5u);
  CHECK(store->listParked().size() == 1u);
  CHECK_FALSE(std::filesystem::exists(dir.file("cursor.store.tmp.99999")));
}

TEST_CASE("resource key is stable", "[cursor-store]") {
  // The hash is part of the file format: a change here needs a new layout version.
  const layout::ResourceKey k = layout::resourceKey("deployment", "web");
  CHECK(k == layout::resourceKey("deployment", "web"));
  CHECK(k != layout::resourceKey("deployment", "web2"));
  CHECK(layout::resourceKey("ab", "c") != layout::resourceKey("a", "bc"));
  CHECK(layout::resourceKey("", "") != layout::resourceKey("", std::string_view("\0", 1)));
  // Pinned: a different value here means every existing store would be misread.
  CHECK(k.hi == 0x889f43b67111e73eULL);
  CHECK(k.lo == 0x92cf32bcfc8d6b80ULL);
}

}  // namespace
}  // namespace krane::ipc
