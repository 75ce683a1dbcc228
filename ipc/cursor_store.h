// The agent's durable, crash-safe shared state: `<state_dir>/cursor.store`.
//
// One file, mapped MAP_SHARED (Boost.Interprocess file_mapping + mapped_region) by the agent and
// by every plugin host, with the fixed layout of cursor_layout.h. It holds the agent's durable
// watermark and last full sync, one slot per plugin host (heartbeat, acked version, counters), the
// last applied version of every resource, and the parked events.
//
// WHY THERE IS NO LOCK
// A process-shared mutex is not robust: a process killed while holding it leaves it locked for
// good. So nothing in the file is ever locked. Instead:
//   * Single writer per field group.
//       agent (one process; enforced with flock on cursor.store.lock, which the kernel releases
//       when the process dies): header counters and watermark, the resource table, the parked
//       events, and in each plugin slot its assignment (state, name, restarts).
//       plugin host: the host fields of its own slot only (pid, acked version, heartbeat,
//       counters). The agent touches them only while assigning a free slot.
//       Threads of one writing process are serialised by an ordinary std::mutex in process memory
//       (it dies with the process, so it cannot be left locked for anybody else).
//   * Every shared field is a lock-free 64-bit std::atomic; a kill never tears one.
//   * Multi-word records are published by one word written last:
//       resource table entry: key and version are written, then the tag (checksum of the key) is
//         stored with release. A version raise is a single store. A delete stores the tombstone
//         tag. A kill between two stores leaves an entry that is empty or a tombstone, never a
//         live tag over a foreign key or version; the agent zeroes such leftovers when it opens.
//       plugin slot name and parked events: seqlock state word (odd while writing, a fresh even
//         number once valid). A kill leaves it odd; the agent frees it on its next open. An update
//         of a parked event writes a new record before freeing the old one, so a kill leaves the
//         old, or both (readers keep the newer), never neither. (Only when the list is full is
//         a parked event updated in place, where a kill loses that one record.)
//   * Readers in any process may read at any time, without writing: they load the publication
//     word with acquire, read the record, and re-check the word (retrying if it moved).
//   * Entries never move (no rehash in place, no backward shift): a lookup in flight cannot miss
//     a key that is there. A deleted entry becomes a tombstone, and turns back into an empty
//     bucket as soon as no live key's probe path crosses it, so lookups answer the same either
//     way. Growing or compacting the table (agent start only) writes a new file, renames it into
//     place and marks the old one superseded; hosts check superseded() with their heartbeat and
//     reopen. (An agent killed between the rename and that mark leaves hosts on the old file:
//     their heartbeats stop reaching the agent, which restarts them onto the new one.)
//   * The agent's open repairs what a kill can leave: odd seqlock states are freed, tag-less
//     leftovers zeroed, counters recounted, duplicate parked records resolved. A live tag that
//     does not match its key (impossible with this write order: disk damage) becomes a tombstone.
//
// DURABILITY
// Stores land in the page cache, which outlives a killed process: after a crash of the agent or a
// host, everything it stored is there. Only a machine crash needs flush() (msync of the mapping;
// its cost grows with the dirty pages), which the agent calls every 5 seconds while it runs and
// when it stops. Pages reach the disk in any order, so after a machine crash
// the table may be older than the watermark; that is harmless: events below the watermark are not
// redelivered, and a newer event (or a full sync) always wins over an older stored version.
//
// RESET
// A file that cannot be read (unknown magic or layout, wrong size, another region) is refused;
// the message says: remove <path>; the agent then does one full sync.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <boost/interprocess/mapped_region.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ipc/cursor_layout.h"

namespace krane::ipc {

enum class OpenMode {
  // Creates the file if missing, grows it if the options ask for more capacity, recovers from a
  // crash, and may write every agent-owned field. One agent process at a time (flock).
  kAgent,
  // Opens an existing file; writes the host fields of its own plugin slot only.
  kHost,
  // Opens an existing file mapped read-only (inspection).
  kReadOnly,
};

struct CursorStoreOptions {
  OpenMode mode = OpenMode::kAgent;
  // Recorded at creation. When set, a file of another region is refused.
  std::string region;
  // How many resources the table can track; the table has 2 entries of 32 bytes per resource
  // (load at most 50 %), so the default is a 1,000,000-entry, 32 MB table. An agent
  // that opens a smaller file with a larger value enlarges it, keeping its contents.
  uint64_t max_resources = 500'000;
  uint32_t parked_capacity = 4096;
  // Allocate the file's blocks when creating it (posix_fallocate). Without it the file is sparse,
  // and a full disk shows up as SIGBUS at the first write to a new page instead of as an error
  // from open().
  bool preallocate = true;
};

// Where everything lives in the file (from its header).
struct StoreLayout {
  uint32_t layout_version = 0;
  uint64_t file_bytes = 0;
  uint64_t header_bytes = 0;
  uint32_t slot_count = 0;
  uint64_t slot_bytes = 0;
  uint64_t slots_offset = 0;
  uint32_t parked_capacity = 0;
  uint64_t parked_entry_bytes = 0;
  uint64_t parked_offset = 0;
  uint64_t max_resources = 0;
  uint64_t table_entries = 0;
  uint64_t table_entry_bytes = 0;
  uint64_t table_offset = 0;
};

struct PluginSlotInfo {
  int slot = -1;
  std::string name;
  int64_t pid = 0;
  uint64_t acked_version = 0;
  uint64_t heartbeat_mono_ns = 0;
  int64_t heartbeat_unix_ms = 0;
  int64_t assigned_unix_ms = 0;
  uint64_t restarts = 0;
  uint64_t applied = 0;
  uint64_t failed = 0;
  uint64_t parked = 0;
  uint64_t redelivered = 0;
};

struct ParkedEvent {
  std::string type;  // stored truncated to 64 bytes; identity uses the full (type, id)
  std::string id;    // stored truncated to 64 bytes
  uint64_t version = 0;
  uint32_t attempts = 0;
  std::string last_error;      // stored truncated to 256 bytes
  int64_t parked_unix_ms = 0;  // 0 when parking: now
};

// A scan of the resource table.
struct TableStats {
  uint64_t live = 0;
  uint64_t tombstones = 0;
  uint64_t half_written = 0;  // empty tag over leftover words (an interrupted insert or delete)
  uint64_t damaged = 0;       // live tag that does not match its key: must stay 0
  uint64_t longest_probe = 0;
  double mean_probe = 0;  // buckets visited to find a live entry
};

// What the agent repaired when it opened the store.
struct RecoveryReport {
  bool created = false;
  bool rebuilt = false;  // copied into a new file (grown, or compacted)
  uint64_t previous_max_resources = 0;
  uint64_t half_written_entries_cleared = 0;
  uint64_t damaged_entries_dropped = 0;
  uint64_t tombstones_reclaimed = 0;
  uint64_t parked_half_written_cleared = 0;
  uint64_t parked_duplicates_dropped = 0;
  uint64_t slots_half_written_cleared = 0;
  uint64_t stale_temp_files_removed = 0;
};

// Everything in the store, copied out, for inspection.
struct CursorSnapshot {
  std::string path;
  StoreLayout layout;
  std::string region;
  int64_t created_unix_ms = 0;
  uint64_t generation = 0;
  int64_t agent_pid = 0;
  uint64_t watermark = 0;
  int64_t watermark_unix_ms = 0;
  uint64_t full_sync_version = 0;
  int64_t full_sync_unix_ms = 0;
  uint64_t tracked_resources = 0;       // the agent's counter
  uint64_t tombstones = 0;              // the agent's counter
  TableStats table;                     // a scan
  std::vector<PluginSlotInfo> plugins;  // assigned slots only
  std::vector<ParkedEvent> parked;
  bool superseded = false;
  int64_t taken_unix_ms = 0;
  uint64_t taken_mono_ns = 0;
};

// Thread-safe: any thread may call any method allowed by the open mode. Writes of one process
// are serialised internally; reads never block. Methods that write agent-owned fields need
// OpenMode::kAgent; methods that write host fields need kAgent or kHost (a host writes only the
// slot the agent gave it). Calling a write method in a mode that does not allow it is a
// programming error and aborts.
class CursorStore {
 public:
  static constexpr std::string_view kFileName = "cursor.store";
  static constexpr std::string_view kLockFileName = "cursor.store.lock";

  // Opens (kAgent: creates, grows and recovers) `<state_dir>/cursor.store`.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<CursorStore>> open(
      const std::string& state_dir, const CursorStoreOptions& options = {});

  ~CursorStore();
  CursorStore(const CursorStore&) = delete;
  CursorStore& operator=(const CursorStore&) = delete;

  const std::string& path() const { return path_; }
  OpenMode mode() const { return mode_; }
  const StoreLayout& layout() const { return layout_; }
  const RecoveryReport& recovery() const { return recovery_; }
  std::string region() const;
  // Agent incarnation: +1 on every agent open.
  uint64_t generation() const;
  // The agent replaced this file (to enlarge it): hosts should reopen.
  bool superseded() const;

  // ---- Agent: watermark and full sync -------------------------------------------------------
  uint64_t watermark() const;
  // Raises the watermark; returns false (and changes nothing) if `version` is below it.
  bool advanceWatermark(uint64_t version);
  // Sets the watermark, lower or higher: a completed full sync replaces what was known (after a
  // database restore the region's versions can go backwards).
  void setWatermark(uint64_t version);
  void recordFullSync(uint64_t version, int64_t unix_ms);
  // The feed epoch the watermark belongs to (from the last full sync's SyncEnd); 0: not known.
  void setFeedEpoch(uint64_t epoch);
  uint64_t feedEpoch() const;
  uint64_t fullSyncVersion() const;
  int64_t fullSyncUnixMs() const;
  // msync of the whole mapping (MS_SYNC): a durability point against machine crashes.
  [[nodiscard]] absl::Status flush();

  // ---- Resource versions (agent writes; anyone reads) ----------------------------------------
  std::optional<uint64_t> lastApplied(std::string_view type, std::string_view id) const;
  // False if a version at or above `version` was already applied.
  bool shouldApply(std::string_view type, std::string_view id, uint64_t version) const;
  // Records `version` as applied unless a higher one already is (only ever raises). No syscall,
  // no allocation: a 128-bit hash, a short linear probe, stores into the mapping, under this
  // process's writer mutex. RESOURCE_EXHAUSTED when a new resource does not fit (the message
  // says which setting to raise).
  // bench/agent measures `cursor_updates_per_s` with this call.
  [[nodiscard]] absl::Status recordApplied(std::string_view type, std::string_view id,
                                           uint64_t version);
  // Records `version` as applied even if a higher one was (a full sync's snapshot is the truth).
  [[nodiscard]] absl::Status replaceApplied(std::string_view type, std::string_view id,
                                            uint64_t version);
  // Forgets every tracked resource whose key is not in `keep` (after a full sync: what the
  // snapshot did not contain no longer exists). Returns how many were forgotten.
  uint64_t retainOnly(std::vector<layout::ResourceKey> keep);
  // Forgets the resource (it was deleted). Returns whether it was tracked.
  bool forget(std::string_view type, std::string_view id);
  uint64_t trackedResources() const;
  // File bytes per tracked resource (the whole file, header and parked list included); 0 when
  // nothing is tracked. This is bench/agent's `bytes_per_tracked_resource`: measure it with
  // max_resources set to the number of resources tracked (a store sized for more costs more).
  double bytesPerTrackedResource() const;
  TableStats tableStats() const;

  // ---- Parked events (agent writes; anyone reads) --------------------------------------------
  // Parks an event, replacing a parked event of the same resource.
  [[nodiscard]] absl::Status park(const ParkedEvent& event);
  // Returns whether an event of this resource was parked.
  bool unpark(std::string_view type, std::string_view id);
  std::vector<ParkedEvent> listParked() const;

  // ---- Plugin slots ---------------------------------------------------------------------------
  // Agent: the slot of plugin `name`, assigning a free one the first time (its host fields zeroed).
  [[nodiscard]] absl::StatusOr<int> registerPlugin(std::string_view name);
  // Agent: frees the slot (the plugin was removed).
  void releasePlugin(int slot);
  // Agent: the plugin's host was restarted.
  void recordRestart(int slot);
  // Anyone: the slot assigned to `name` (NOT_FOUND if none).
  [[nodiscard]] absl::StatusOr<int> findPlugin(std::string_view name) const;
  std::optional<PluginSlotInfo> plugin(int slot) const;
  // Host of `slot` (or the agent for an in-process plugin).
  void setPluginPid(int slot, int64_t pid);
  void heartbeat(int slot);
  void ackPlugin(int slot, uint64_t version);
  void countApplied(int slot, uint64_t n = 1);
  void countFailed(int slot, uint64_t n = 1);
  void countParked(int slot, uint64_t n = 1);
  void countRedelivered(int slot, uint64_t n = 1);

  // A copy of everything (scans the whole table: a few milliseconds per million entries).
  CursorSnapshot snapshot() const;

 private:
  CursorStore(std::string path, OpenMode mode, int lock_fd);

  void attach(boost::interprocess::mapped_region& region);
  void recover();
  absl::Status rebuild(uint64_t max_resources, uint32_t parked_capacity, bool preallocate);
  void requireAgent(const char* what) const;
  void requireWritable(const char* what) const;
  layout::PluginSlotRecord& slotRecord(int slot) const;
  uint64_t nextSequence();
  std::optional<uint64_t> findVersion(const layout::ResourceKey& key) const;
  int findPluginSlot(std::string_view name) const;
  void clearEntry(layout::TableEntry& entry);
  absl::Status storeApplied(std::string_view type, std::string_view id, uint64_t version,
                            bool replace);
  uint64_t cleanCluster(uint64_t bucket);

  std::string path_;
  OpenMode mode_;
  int lock_fd_ = -1;
  boost::interprocess::mapped_region region_;
  layout::FileHeader* header_ = nullptr;
  layout::PluginSlotRecord* slots_ = nullptr;
  layout::ParkedRecord* parked_ = nullptr;
  layout::TableEntry* table_ = nullptr;
  StoreLayout layout_;
  RecoveryReport recovery_;
  std::mutex write_mutex_;  // serialises this process's writers; never shared with others
};

const char* openModeName(OpenMode mode);

}  // namespace krane::ipc
