// SIGKILL the cursor store's writer at random moments, over and over, while another process reads.
//
// After every kill the store must open, its watermark must not have moved back (nor behind what
// the writer reported), and every resource and parked event must be in a state the model allows:
// what the operations up to the watermark produce, possibly with the one operation after it
// (crash_model.h). Meanwhile a reader thread of this process (a different process from the
// writer) checks every entry it sees: the version belongs to the key it was found under, is not
// from the future, and never goes back.
#include <signal.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "common/strings.h"
#include "ipc/cursor_store.h"
#include "tests/ipc/crash_model.h"
#include "tests/ipc/temp_dir.h"
#include "tests/support/matchers.h"
#include "tests/support/process.h"

namespace krane::ipc::testing {
namespace {

using krane::testing::ChildProcess;
using krane::testing::runfile;

CursorStoreOptions writerOptions(uint64_t max_resources) {
  CursorStoreOptions options;
  options.region = "crash";
  options.max_resources = max_resources;
  options.parked_capacity = 2 * kCrashKeys;
  return options;
}

// What the writer printed: its first operation and the last progress line.
struct WriterLog {
  std::optional<uint64_t> start;
  uint64_t last_done = 0;
  std::string text;
};

WriterLog readLog(const std::string& path) {
  WriterLog log;
  std::ifstream in(path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  log.text = buffer.str();
  std::istringstream lines(log.text);
  std::string word;
  while (lines >> word) {
    uint64_t value = 0;
    if (word == "start" && lines >> value) log.start = value;
    if (word == "done" && lines >> value) log.last_done = value;
  }
  return log;
}

// Reads the store from this process while the writer runs, and records anything impossible.
class ConcurrentReader {
 public:
  explicit ConcurrentReader(std::string state_dir) : state_dir_(std::move(state_dir)) {
    thread_ = std::thread([this] { run(); });
  }
  ~ConcurrentReader() { stop(); }

  void stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  std::vector<std::string> problems() {
    std::lock_guard lock(mutex_);
    return problems_;
  }
  uint64_t lookups() const { return lookups_.load(); }
  uint64_t scans() const { return scans_.load(); }
  uint64_t reopens() const { return reopens_.load(); }
  uint64_t heartbeatsSeen() const { return heartbeats_seen_.load(); }

 private:
  void problem(std::string text) {
    std::lock_guard lock(mutex_);
    if (problems_.size() < 20) problems_.push_back(std::move(text));
  }

  std::unique_ptr<CursorStore> open() {
    CursorStoreOptions options;
    options.mode = OpenMode::kHost;
    auto store = CursorStore::open(state_dir_, options);
    if (store.ok()) return std::move(*store);
    problem(strCat("reader cannot open the store: ", store.status().message()));
    return nullptr;
  }

  void run() {
    std::unique_ptr<CursorStore> store = open();
    if (store == nullptr) return;
    std::vector<uint64_t> last_seen(kCrashKeys, 0);
    uint64_t last_heartbeat = 0;
    std::mt19937_64 rng(42);
    while (!stop_.load(std::memory_order_relaxed)) {
      if (store->superseded()) {  // the agent enlarged the store: follow it
        store = open();
        if (store == nullptr) return;
        reopens_.fetch_add(1);
      }
      for (int i = 0; i < 4096; ++i) {
        const uint64_t k = rng() % kCrashKeys;
        const auto version = store->lastApplied(kCrashType, crashId(k));
        const uint64_t watermark = store->watermark();
        if (!version) continue;
        if (keyOfVersion(*version) != k) {
          problem(strCat("lookup of key ", k, " returned version ", *version, " of key ",
                         keyOfVersion(*version)));
        }
        if (seqOfVersion(*version) > watermark + 1) {
          problem(strCat("key ", k, " has version of seq ", seqOfVersion(*version),
                         " ahead of watermark ", watermark));
        }
        if (*version < last_seen[k]) {
          problem(strCat("key ", k, " went back from ", last_seen[k], " to ", *version));
        }
        last_seen[k] = *version;
      }
      lookups_.fetch_add(4096);
      const TableStats stats = store->tableStats();
      if (stats.damaged != 0) problem(strCat("scan saw ", stats.damaged, " torn entries"));
      for (const ParkedEvent& e : store->listParked()) {
        if (e.id != crashId(keyOfVersion(e.version)) || e.last_error != parkError(e.version) ||
            e.attempts != parkAttempts(seqOfVersion(e.version))) {
          problem(
              strCat("torn parked event ", e.id, " version ", e.version, " '", e.last_error, "'"));
        }
      }
      if (auto slot = store->findPlugin(kCrashPlugin); slot.ok()) {
        const uint64_t heartbeat = store->plugin(*slot)->heartbeat_mono_ns;
        if (heartbeat < last_heartbeat) problem("plugin heartbeat went back");
        if (heartbeat > last_heartbeat) heartbeats_seen_.fetch_add(1);
        last_heartbeat = heartbeat;
      }
      scans_.fetch_add(1);
    }
  }

  std::string state_dir_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::mutex mutex_;
  std::vector<std::string> problems_;
  std::atomic<uint64_t> lookups_{0};
  std::atomic<uint64_t> scans_{0};
  std::atomic<uint64_t> reopens_{0};
  std::atomic<uint64_t> heartbeats_seen_{0};
};

TEST_CASE("survives sigkill at random moments", "[cursor-store-crash][slow]") {
  TempDir dir;
  const std::string child = runfile("tests/ipc/store_child");
  REQUIRE_THAT(CursorStore::open(dir.path(), writerOptions(8192)), IsOk());

  const uint64_t test_seed = std::random_device{}();
  std::printf("crash test seed %lu (state dir %s)\n", static_cast<unsigned long>(test_seed),
              dir.path().c_str());
  std::mt19937_64 rng(test_seed);
  ConcurrentReader reader(dir.path());
  CrashModel model;
  uint64_t last_watermark = 0;
  uint64_t total_ops = 0;
  RecoveryReport repairs;
  constexpr int kKills = 30;
  for (int run = 0; run < kKills; ++run) {
    const uint64_t seed = rng();
    // Every fifth run asks for a larger store: the writer's open rebuilds it, and some kills land
    // in the middle of that.
    const uint64_t max_resources = 8192 + 1024 * (run / 5);
    // Every third kill lands within 25 ms: while the writer starts, opens, recovers or grows the
    // store. The others land anywhere in its first 200 ms.
    const auto delay =
        std::chrono::microseconds(run % 3 == 0 ? rng() % 25000 : 25000 + rng() % 175000);
    const std::string log_path = dir.file(strCat("writer-", run, ".log"));
    {
      ChildProcess writer({child, "writer", "--state-dir", dir.path(), "--seed",
                           std::to_string(seed), "--max-resources", std::to_string(max_resources)},
                          log_path);
      std::this_thread::sleep_for(delay);
      writer.signal(SIGKILL);
      const int result = writer.wait();
      INFO("the writer ended on its own:\n" << readLog(log_path).text);
      REQUIRE(result == -SIGKILL);
    }
    const WriterLog log = readLog(log_path);

    // Reopen as the restarted agent would (no growth asked: the smallest capacity).
    auto opened = CursorStore::open(dir.path(), writerOptions(1));
    INFO("run " << run << ": " << opened.status());
    REQUIRE_THAT(opened, IsOk());
    CursorStore& store = **opened;
    const uint64_t watermark = store.watermark();
    INFO("run " << run << ": the watermark went back");
    REQUIRE(watermark >= last_watermark);
    INFO("run " << run << ": the writer reported more");
    REQUIRE(watermark >= log.last_done);
    if (log.start) {
      INFO("run " << run);
      REQUIRE(*log.start == (last_watermark + 1));
      model.completed(seed, *log.start, watermark);
      model.maybe(seed, watermark + 1);
    } else {
      INFO("run " << run << ": no operation was started");
      REQUIRE(watermark == last_watermark);
    }
    const std::vector<std::string> problems = model.check(store);
    for (const std::string& p : problems) FAIL_CHECK("run " << run << ": " << p);
    REQUIRE(problems.empty());
    if (auto slot = store.findPlugin(kCrashPlugin); slot.ok()) {
      const uint64_t acked = store.plugin(*slot)->acked_version;
      CHECK(acked <= watermark);
      CHECK((watermark - acked) <= 2u);  // acked right after the watermark moves
    }
    const RecoveryReport& r = store.recovery();
    repairs.half_written_entries_cleared += r.half_written_entries_cleared;
    repairs.tombstones_reclaimed += r.tombstones_reclaimed;
    repairs.parked_half_written_cleared += r.parked_half_written_cleared;
    repairs.parked_duplicates_dropped += r.parked_duplicates_dropped;
    repairs.slots_half_written_cleared += r.slots_half_written_cleared;
    repairs.stale_temp_files_removed += r.stale_temp_files_removed;
    INFO("run " << run);
    CHECK(r.damaged_entries_dropped == 0u);
    const uint64_t ops = log.start ? watermark + 1 - *log.start : 0;
    total_ops += ops;
    std::printf(
        "run %2d: killed after %6.1f ms, %7lu ops, watermark %8lu, tracked %4lu, "
        "parked %4zu, max_resources %lu\n",
        run, static_cast<double>(delay.count()) / 1000.0, static_cast<unsigned long>(ops),
        static_cast<unsigned long>(watermark), static_cast<unsigned long>(store.trackedResources()),
        store.listParked().size(), static_cast<unsigned long>(store.layout().max_resources));
    last_watermark = watermark;
  }
  reader.stop();
  for (const std::string& p : reader.problems()) FAIL_CHECK("reader: " << p);
  CHECK(total_ops > 0u);
  CHECK(reader.lookups() > 0u);
  CHECK(reader.heartbeatsSeen() > 0u);
  std::printf(
      "crash test: %d kills, %lu ops; reader: %lu lookups, %lu scans, %lu reopens, %lu "
      "heartbeats seen; repairs on reopen: %lu half-written entries, %lu tombstones "
      "reclaimed, %lu half-written parked, %lu duplicate parked, %lu half-written slots, %lu "
      "temp files\n",
      kKills, static_cast<unsigned long>(total_ops), static_cast<unsigned long>(reader.lookups()),
      static_cast<unsigned long>(reader.scans()), static_cast<unsigned long>(reader.reopens()),
      static_cast<unsigned long>(reader.heartbeatsSeen()),
      static_cast<unsigned long>(repairs.half_written_entries_cleared),
      static_cast<unsigned long>(repairs.tombstones_reclaimed),
      static_cast<unsigned long>(repairs.parked_half_written_cleared),
      static_cast<unsigned long>(repairs.parked_duplicates_dropped),
      static_cast<unsigned long>(repairs.slots_half_written_cleared),
      static_cast<unsigned long>(repairs.stale_temp_files_removed));
}

// The checks above must be able to fail: damage a store the way a wrong write order would
// (a key published over another key's version, an update lost, a version from the future, the
// watermark moved before the write) and expect the model to say so.
class CrashModelSelfTest {
 protected:
  static constexpr uint64_t kSeed = 7;
  static constexpr uint64_t kOps = 3000;

  CrashModelSelfTest() {
    auto opened = CursorStore::open(dir_.path(), writerOptions(8192));
    REQUIRE_THAT(opened, IsOk());
    store_ = std::move(*opened);
    for (uint64_t seq = 1; seq <= kOps; ++seq) {
      REQUIRE_THAT(runCrashOp(*store_, kSeed, seq), IsOk());
    }
    model_.completed(kSeed, 1, kOps);
  }

  // The table entry of a key the workload holds, found in the raw file.
  layout::TableEntry* entryOf(RawFile& raw, uint64_t key) {
    const layout::ResourceKey rk = layout::resourceKey(kCrashType, crashId(key));
    auto* table = raw.at<layout::TableEntry>(store_->layout().table_offset);
    for (uint64_t i = 0; i < store_->layout().table_entries; ++i) {
      if (layout::isLiveTag(table[i].tag.load()) && table[i].key_hi.load() == rk.hi &&
          table[i].key_lo.load() == rk.lo) {
        return &table[i];
      }
    }
    return nullptr;
  }

  uint64_t someLiveKey() {
    for (uint64_t k = 0; k < kCrashKeys; ++k) {
      if (store_->lastApplied(kCrashType, crashId(k))) return k;
    }
    return kCrashKeys;
  }

  TempDir dir_;
  std::unique_ptr<CursorStore> store_;
  CrashModel model_;
};

TEST_CASE_METHOD(CrashModelSelfTest, "accepts the truth", "[crash-model-self][slow]") {
  CHECK(model_.check(*store_).empty());
}

TEST_CASE_METHOD(CrashModelSelfTest, "catches a foreign version", "[crash-model-self][slow]") {
  RawFile raw(store_->path());
  const uint64_t k = someLiveKey();
  layout::TableEntry* e = entryOf(raw, k);
  REQUIRE(e != nullptr);
  e->version.store(crashVersion(seqOfVersion(e->version.load()), (k + 1) % kCrashKeys));
  const auto problems = model_.check(*store_);
  REQUIRE_FALSE(problems.empty());
  INFO(problems[0]);
  CHECK(problems[0].find("which belongs to key") != std::string::npos);
}

TEST_CASE_METHOD(CrashModelSelfTest, "catches a lost update and a future version",
                 "[crash-model-self][slow]") {
  RawFile raw(store_->path());
  const uint64_t k = someLiveKey();
  layout::TableEntry* e = entryOf(raw, k);
  REQUIRE(e != nullptr);
  e->version.store(crashVersion(seqOfVersion(e->version.load()) - 1, k));
  CHECK_FALSE(model_.check(*store_).empty());
  // check() took the damaged store as the new truth; put the model back and try the future.
  CrashModel fresh;
  fresh.completed(kSeed, 1, kOps);
  e->version.store(crashVersion(kOps + 5, k));
  CHECK_FALSE(fresh.check(*store_).empty());
}

TEST_CASE_METHOD(CrashModelSelfTest, "catches a watermark ahead of the write",
                 "[crash-model-self][slow]") {
  // The model believes the next record completed (as a watermark stored before the entry would
  // claim) but the store never saw it.
  uint64_t seq = kOps + 1;
  while (crashOp(kSeed, seq).kind != CrashOpKind::kRecord) ++seq;
  for (uint64_t s = kOps + 1; s < seq; ++s) REQUIRE_THAT(runCrashOp(*store_, kSeed, s), IsOk());
  model_.completed(kSeed, kOps + 1, seq);
  CHECK_FALSE(model_.check(*store_).empty());
}

TEST_CASE_METHOD(CrashModelSelfTest, "catches a torn parked event", "[crash-model-self][slow]") {
  RawFile raw(store_->path());
  auto* parked = raw.at<layout::ParkedRecord>(store_->layout().parked_offset);
  uint32_t i = 0;
  while (!layout::isValidState(parked[i].state.load())) ++i;
  parked[i].version.store(parked[i].version.load() + (uint64_t{1} << kKeyBits));
  const auto problems = model_.check(*store_);
  REQUIRE_FALSE(problems.empty());
  INFO(problems[0]);
  CHECK(problems[0].find("torn parked event") != std::string::npos);
}

}  // namespace
}  // namespace krane::ipc::testing
