// The on-disk (and in-memory) format of the cursor store, `<state_dir>/cursor.store`, layout 1.
//
// The file is mapped MAP_SHARED by the agent and by every plugin host, so these structs ARE the
// shared state: no serialisation step, no allocator, no pointers (offsets only). Everything that
// changes after creation is a 64-bit lock-free std::atomic; a field group has exactly one writing
// process (see cursor_store.h for who writes what and why no lock is needed).
//
// Anything that changes the meaning of a byte in this file, including the resource hash below,
// needs a new kLayoutVersion: an old file is then refused with a reset instruction.
//
//   offset 0            FileHeader            (kHeaderBytes, one page)
//   slots_offset        PluginSlotRecord[32]  (256 bytes each)
//   parked_offset       ParkedRecord[parked_capacity]  (432 bytes each)
//   table_offset        TableEntry[table_entries]      (32 bytes each, page aligned)
//
// The file is created sparse (ftruncate); zero bytes are the valid "empty" state of every record,
// so creating a store touches only its header page.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <type_traits>

namespace krane::ipc::layout {

inline constexpr char kMagic[8] = {'K', 'R', 'A', 'N', 'E', 'C', 'S', '1'};
inline constexpr uint32_t kLayoutVersion = 1;
inline constexpr uint64_t kPageBytes = 4096;
inline constexpr uint64_t kHeaderBytes = kPageBytes;
inline constexpr uint32_t kPluginSlots = 32;
inline constexpr uint64_t kTableEntriesPerResource = 2;  // load factor at most 50 %

// A word of shared state. A process killed in the middle of a store leaves either the old or the
// new value: an aligned 8-byte store is never torn, and the page cache outlives the process.
using Word = std::atomic<uint64_t>;
using SignedWord = std::atomic<int64_t>;
static_assert(Word::is_always_lock_free, "cursor store words must be lock-free");
static_assert(SignedWord::is_always_lock_free, "cursor store words must be lock-free");
static_assert(sizeof(Word) == 8 && alignof(Word) == 8);
static_assert(sizeof(SignedWord) == 8 && alignof(SignedWord) == 8);

// Fixed-size UTF-8 text, NUL padded (a value of exactly `Bytes` bytes has no terminator). Stored
// word by word so that a concurrent reader performs only atomic loads; consistency across words
// comes from the seqlock state word of the record that holds it.
template <size_t Bytes>
struct Text {
  static_assert(Bytes % 8 == 0);
  static constexpr size_t kBytes = Bytes;
  Word words[Bytes / 8];
};

// Sequence-locked record states (plugin slots, parked events): 0 = free; odd = being written
// (a crash leaves it odd, and the agent frees it on its next open); even and non-zero = valid.
// Each write takes a fresh number from FileHeader::sequence, so a state never repeats (no ABA).
inline constexpr uint64_t kFree = 0;
inline constexpr uint64_t writingState(uint64_t seq) { return 2 * seq + 1; }
inline constexpr uint64_t validState(uint64_t seq) { return 2 * seq + 2; }
inline constexpr bool isValidState(uint64_t state) { return state != kFree && state % 2 == 0; }

struct FileHeader {
  // Immutable: written before the file is published under its final name.
  char magic[8];
  uint32_t layout_version;
  uint32_t header_bytes;
  uint64_t file_bytes;
  uint32_t slot_count;
  uint32_t slot_bytes;
  uint32_t parked_capacity;
  uint32_t parked_entry_bytes;
  uint64_t table_entries;
  uint32_t table_entry_bytes;
  uint32_t reserved0;
  uint64_t max_resources;
  uint64_t slots_offset;
  uint64_t parked_offset;
  uint64_t table_offset;
  int64_t created_unix_ms;
  char region[64];
  // Written by the agent only.
  Word generation;       // +1 each time an agent opens the store
  SignedWord agent_pid;  // pid of the agent that opened it last
  Word watermark;        // every event below it was acknowledged; only ever raised
  SignedWord watermark_unix_ms;
  Word full_sync_version;  // snapshot version of the last completed full sync
  SignedWord full_sync_unix_ms;
  Word tracked;     // live table entries (recounted on every agent open)
  Word tombstones;  // tombstoned table entries (recounted on every agent open)
  Word sequence;    // source of seqlock numbers for slots and parked events
  Word superseded;  // 1 once the agent replaced this file (grown or compacted)
  // The feed epoch of the last completed full sync (0: not known; files made before the field
  // existed hold 0 here, the header's unused bytes being zero).
  Word feed_epoch;
};
static_assert(sizeof(FileHeader) <= kHeaderBytes);
static_assert(std::is_standard_layout_v<FileHeader>);

struct PluginSlotRecord {
  // Written by the agent: assigns the slot to a plugin and counts its restarts.
  Word state;  // seqlock over `name`
  Word restarts;
  SignedWord assigned_unix_ms;
  Word reserved_agent[5];
  Text<64> name;
  // Written by the plugin host that owns the slot (by the agent only while assigning a free slot,
  // before any host is told about it).
  SignedWord pid;
  Word acked_version;
  Word heartbeat_mono_ns;  // CLOCK_MONOTONIC: comparable across processes of one boot
  SignedWord heartbeat_unix_ms;
  Word applied;
  Word failed;
  Word parked;
  Word redelivered;
  Word reserved_host[8];
};
static_assert(sizeof(PluginSlotRecord) == 256);
static_assert(std::is_standard_layout_v<PluginSlotRecord>);

// A parked event (retries exhausted). Written by the agent only.
struct ParkedRecord {
  Word state;   // seqlock over the whole record
  Word key_hi;  // resourceKey(type, id): identity even when the texts below are truncated
  Word key_lo;
  Word version;
  Word attempts;
  SignedWord parked_unix_ms;
  Text<64> type;
  Text<64> id;
  Text<256> last_error;
};
static_assert(sizeof(ParkedRecord) == 432);
static_assert(std::is_standard_layout_v<ParkedRecord>);

// The last applied version of one resource. Written by the agent only.
//
// `tag` is the publication word and the entry's checksum at once: 0 = empty, 2 = tombstone, and
// an odd value = live, equal to entryTag(key_hi, key_lo). An insert writes key and version first
// and publishes the tag last (release); a raise of the version is one store. So a reader (or the
// agent after a crash) never finds a live tag over a key it does not belong to.
struct TableEntry {
  Word tag;
  Word key_hi;
  Word key_lo;
  Word version;
};
static_assert(sizeof(TableEntry) == 32);

inline constexpr uint64_t kEmptyTag = 0;
inline constexpr uint64_t kTombstoneTag = 2;
inline constexpr bool isLiveTag(uint64_t tag) { return tag % 2 == 1; }

// Where everything lives for a given capacity.
struct Geometry {
  uint64_t max_resources = 0;
  uint32_t parked_capacity = 0;
  uint64_t slots_offset = 0;
  uint64_t parked_offset = 0;
  uint64_t table_offset = 0;
  uint64_t table_entries = 0;
  uint64_t file_bytes = 0;
};

inline constexpr uint64_t alignUp(uint64_t value, uint64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

inline constexpr Geometry geometry(uint64_t max_resources, uint32_t parked_capacity) {
  Geometry g;
  g.max_resources = max_resources;
  g.parked_capacity = parked_capacity;
  g.slots_offset = kHeaderBytes;
  g.parked_offset = g.slots_offset + kPluginSlots * sizeof(PluginSlotRecord);
  g.table_offset =
      alignUp(g.parked_offset + uint64_t{parked_capacity} * sizeof(ParkedRecord), kPageBytes);
  g.table_entries = max_resources * kTableEntriesPerResource;
  g.file_bytes = g.table_offset + g.table_entries * sizeof(TableEntry);
  return g;
}

// ---- The resource key: a 128-bit hash of (type, id) --------------------------------------------
//
// Two 64-bit lanes over the same input with different seeds and multipliers, each finished with
// a full avalanche, then cross-mixed. Lengths are part of the input, so ("ab", "c") and
// ("a", "bc") differ. Two resources are treated as the same only if all 128 bits match.

struct ResourceKey {
  uint64_t hi = 0;
  uint64_t lo = 0;
  bool operator==(const ResourceKey&) const = default;
};

namespace hash_internal {

inline constexpr uint64_t kMulA = 0x9E3779B97F4A7C15ULL;
inline constexpr uint64_t kMulB = 0xD6E8FEB86659FD93ULL;
inline constexpr uint64_t kSeedA = 0x243F6A8885A308D3ULL;
inline constexpr uint64_t kSeedB = 0x13198A2E03707344ULL;

inline uint64_t fold(uint64_t a, uint64_t b) {
  const unsigned __int128 product = static_cast<unsigned __int128>(a) * b;
  return static_cast<uint64_t>(product) ^ static_cast<uint64_t>(product >> 64);
}

inline uint64_t finish(uint64_t x) {
  x ^= x >> 33;
  x *= 0xFF51AFD7ED558CCDULL;
  x ^= x >> 33;
  x *= 0xC4CEB9FE1A85EC53ULL;
  x ^= x >> 33;
  return x;
}

struct Lanes {
  uint64_t a = kSeedA;
  uint64_t b = kSeedB;
  void word(uint64_t w) {
    a = fold(a ^ w, kMulA);
    b = fold(b + w, kMulB) ^ (b >> 29);
  }
  void bytes(std::string_view s) {
    size_t i = 0;
    for (; i + 8 <= s.size(); i += 8) {
      uint64_t w;
      std::memcpy(&w, s.data() + i, 8);
      word(w);
    }
    uint64_t tail = 0;
    if (i < s.size()) std::memcpy(&tail, s.data() + i, s.size() - i);
    word(tail ^ (uint64_t{s.size()} << 56) ^ s.size());
  }
};

}  // namespace hash_internal

inline ResourceKey resourceKey(std::string_view type, std::string_view id) {
  hash_internal::Lanes lanes;
  lanes.bytes(type);
  lanes.bytes(id);
  const uint64_t a = hash_internal::finish(lanes.a);
  const uint64_t b = hash_internal::finish(lanes.b ^ hash_internal::kSeedA);
  return ResourceKey{a ^ (b >> 31), b ^ (a << 17)};
}

// The live tag of an entry holding `key`: odd, hence never 0 (empty) or 2 (tombstone).
inline uint64_t entryTag(uint64_t key_hi, uint64_t key_lo) {
  return hash_internal::finish(key_hi ^ hash_internal::fold(key_lo, hash_internal::kMulB)) | 1;
}

// The first bucket probed for `key` (multiply-shift, so any table size works).
inline uint64_t homeBucket(const ResourceKey& key, uint64_t table_entries) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(key.lo) * table_entries) >> 64);
}

}  // namespace krane::ipc::layout
