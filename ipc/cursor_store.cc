#include "ipc/cursor_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <new>
#include <tuple>
#include <unordered_map>

#include <boost/interprocess/exceptions.hpp>
#include <boost/interprocess/file_mapping.hpp>

#include "common/status.h"
#include "common/strings.h"

namespace krane::ipc {

namespace bip = boost::interprocess;
using layout::FileHeader;
using layout::ParkedRecord;
using layout::PluginSlotRecord;
using layout::ResourceKey;
using layout::TableEntry;

namespace {

constexpr auto kRelaxed = std::memory_order_relaxed;
constexpr auto kAcquire = std::memory_order_acquire;
constexpr auto kRelease = std::memory_order_release;

constexpr uint64_t kMaxResourcesLimit = uint64_t{1} << 36;
constexpr uint32_t kParkedCapacityLimit = 1 << 20;

int64_t nowUnixMs() {
  timespec ts;
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t{ts.tv_sec} * 1000 + ts.tv_nsec / 1'000'000;
}

uint64_t nowMonoNs() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000ULL + uint64_t(ts.tv_nsec);
}

std::string errnoText(int err) { return std::strerror(err); }

std::string resetHint(const std::string& path) {
  return strCat("Reset it: remove ", path, "; the agent then does one full sync.");
}

// Cuts `s` to at most `max` bytes without splitting a UTF-8 sequence.
std::string_view truncateUtf8(std::string_view s, size_t max) {
  if (s.size() <= max) return s;
  size_t end = max;
  while (end > 0 && (static_cast<unsigned char>(s[end]) & 0xC0) == 0x80) --end;
  return s.substr(0, end);
}

template <size_t N>
void storeText(layout::Text<N>& text, std::string_view value) {
  char bytes[N] = {};
  const std::string_view cut = truncateUtf8(value, N);
  std::memcpy(bytes, cut.data(), cut.size());
  for (size_t i = 0; i < N / 8; ++i) {
    uint64_t word;
    std::memcpy(&word, bytes + 8 * i, 8);
    text.words[i].store(word, kRelaxed);
  }
}

template <size_t N>
std::string loadText(const layout::Text<N>& text) {
  char bytes[N];
  for (size_t i = 0; i < N / 8; ++i) {
    const uint64_t word = text.words[i].load(kRelaxed);
    std::memcpy(bytes + 8 * i, &word, 8);
  }
  return std::string(bytes, ::strnlen(bytes, N));
}

std::string fixedText(const char* bytes, size_t n) {
  return std::string(bytes, ::strnlen(bytes, n));
}

// The magic as found, printable: "KRANECS1", or escaped bytes.
std::string describeMagic(const char* magic) {
  std::string out = "\"";
  for (int i = 0; i < 8; ++i) {
    const auto c = static_cast<unsigned char>(magic[i]);
    if (c >= 0x20 && c < 0x7F && c != '"' && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      out += fmt::format("\\x{:02x}", c);
    }
  }
  return out + "\"";
}

void fsyncDirectoryOf(const std::string& path) {
  const std::string dir = std::filesystem::path(path).parent_path().string();
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

absl::Status mapFile(const std::string& path, bool writable, bip::mapped_region* out) {
  try {
    const bip::mode_t mode = writable ? bip::read_write : bip::read_only;
    bip::file_mapping file(path.c_str(), mode);
    bip::mapped_region region(file, mode);
    out->swap(region);
    return absl::OkStatus();
  } catch (const bip::interprocess_exception& e) {
    return absl::UnavailableError(strCat("cannot map cursor store ", path, ": ", e.what()));
  }
}

// A store file being built under a temporary name; removed unless published.
class NewStoreFile {
 public:
  explicit NewStoreFile(std::string tmp_path) : tmp_path_(std::move(tmp_path)) {}
  ~NewStoreFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!published_) ::unlink(tmp_path_.c_str());
  }

  // Creates it sparse at the geometry's size and writes the immutable header.
  absl::Status create(const layout::Geometry& g, std::string_view region, int64_t created_ms,
                      bool preallocate) {
    ::unlink(tmp_path_.c_str());
    fd_ = ::open(tmp_path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd_ < 0) {
      return absl::UnavailableError(
          strCat("cannot create cursor store ", tmp_path_, ": ", errnoText(errno)));
    }
    if (::ftruncate(fd_, static_cast<off_t>(g.file_bytes)) != 0) {
      return absl::UnavailableError(strCat("cannot size cursor store ", tmp_path_, " to ",
                                           g.file_bytes, " bytes: ", errnoText(errno)));
    }
    if (preallocate) {
      if (const int err = ::posix_fallocate(fd_, 0, static_cast<off_t>(g.file_bytes)); err != 0) {
        return absl::ResourceExhaustedError(strCat("cannot allocate ", g.file_bytes,
                                                   " bytes for cursor store ", tmp_path_, ": ",
                                                   errnoText(err)));
      }
    }
    KRANE_RETURN_IF_ERROR(mapFile(tmp_path_, /*writable=*/true, &region_));
    auto* h = new (region_.get_address()) FileHeader{};
    std::memcpy(h->magic, layout::kMagic, sizeof(h->magic));
    h->layout_version = layout::kLayoutVersion;
    h->header_bytes = layout::kHeaderBytes;
    h->file_bytes = g.file_bytes;
    h->slot_count = layout::kPluginSlots;
    h->slot_bytes = sizeof(PluginSlotRecord);
    h->parked_capacity = g.parked_capacity;
    h->parked_entry_bytes = sizeof(ParkedRecord);
    h->table_entries = g.table_entries;
    h->table_entry_bytes = sizeof(TableEntry);
    h->max_resources = g.max_resources;
    h->slots_offset = g.slots_offset;
    h->parked_offset = g.parked_offset;
    h->table_offset = g.table_offset;
    h->created_unix_ms = created_ms;
    std::memcpy(h->region, region.data(), std::min(region.size(), sizeof(h->region)));
    return absl::OkStatus();
  }

  bip::mapped_region& region() { return region_; }

  // Makes it durable, then gives it its final name (replacing whatever is there: only the agent,
  // holding the lock, ever publishes).
  absl::Status publish(const std::string& final_path) {
    if (!region_.flush(0, 0, /*async=*/false) || ::fsync(fd_) != 0) {
      return absl::UnavailableError(
          strCat("cannot write cursor store ", tmp_path_, ": ", errnoText(errno)));
    }
    if (::rename(tmp_path_.c_str(), final_path.c_str()) != 0) {
      return absl::UnavailableError(
          strCat("cannot rename ", tmp_path_, " to ", final_path, ": ", errnoText(errno)));
    }
    published_ = true;
    fsyncDirectoryOf(final_path);
    return absl::OkStatus();
  }

 private:
  std::string tmp_path_;
  int fd_ = -1;
  bool published_ = false;
  bip::mapped_region region_;
};

// Checks that the mapped file is a cursor store this build can read, of the size its header says.
absl::Status validateHeader(const std::string& path, uint64_t size,
                            const CursorStoreOptions& options, const FileHeader& h) {
  const std::string reset = resetHint(path);
  if (std::memcmp(h.magic, layout::kMagic, sizeof(h.magic)) != 0) {
    return absl::FailedPreconditionError(
        strCat("cursor store ", path, " is not a Krane cursor store: its magic is ",
               describeMagic(h.magic), ", expected ", describeMagic(layout::kMagic), ". ", reset));
  }
  if (h.layout_version != layout::kLayoutVersion) {
    return absl::FailedPreconditionError(
        strCat("cursor store ", path, " has layout version ", h.layout_version,
               ", this build reads layout version ", layout::kLayoutVersion,
               h.layout_version > layout::kLayoutVersion ? " (the file is from a newer krane)" : "",
               ". ", reset));
  }
  if (h.header_bytes != layout::kHeaderBytes || h.slot_count != layout::kPluginSlots ||
      h.slot_bytes != sizeof(PluginSlotRecord) || h.parked_entry_bytes != sizeof(ParkedRecord) ||
      h.table_entry_bytes != sizeof(TableEntry)) {
    return absl::FailedPreconditionError(strCat(
        "cursor store ", path, " has layout version ", h.layout_version,
        " but unexpected record sizes (header ", h.header_bytes, ", ", h.slot_count, " slots of ",
        h.slot_bytes, ", parked ", h.parked_entry_bytes, ", table entry ", h.table_entry_bytes,
        "; expected header ", layout::kHeaderBytes, ", ", layout::kPluginSlots, " slots of ",
        sizeof(PluginSlotRecord), ", parked ", sizeof(ParkedRecord), ", table entry ",
        sizeof(TableEntry), "): the file is damaged. ", reset));
  }
  if (h.max_resources == 0 || h.max_resources > kMaxResourcesLimit || h.parked_capacity == 0 ||
      h.parked_capacity > kParkedCapacityLimit) {
    return absl::FailedPreconditionError(strCat(
        "cursor store ", path, " has an impossible capacity (max_resources ", h.max_resources,
        ", parked_capacity ", h.parked_capacity, "): the file is damaged. ", reset));
  }
  const layout::Geometry g = layout::geometry(h.max_resources, h.parked_capacity);
  if (h.file_bytes != g.file_bytes || h.table_entries != g.table_entries ||
      h.slots_offset != g.slots_offset || h.parked_offset != g.parked_offset ||
      h.table_offset != g.table_offset) {
    return absl::FailedPreconditionError(strCat(
        "cursor store ", path, " has a header that does not match its own capacity (file ",
        h.file_bytes, " bytes, expected ", g.file_bytes, " for max_resources ", h.max_resources,
        " and parked_capacity ", h.parked_capacity, "): the file is damaged. ", reset));
  }
  if (size != h.file_bytes) {
    return absl::FailedPreconditionError(
        strCat("cursor store ", path, " is ", size, " bytes but its header (layout version ",
               h.layout_version, ", max_resources ", h.max_resources, ", parked_capacity ",
               h.parked_capacity, ") needs ", h.file_bytes, " bytes: the file is ",
               size < h.file_bytes ? "truncated" : "damaged", ". ", reset));
  }
  const std::string region = fixedText(h.region, sizeof(h.region));
  if (!options.region.empty() && !region.empty() && region != options.region) {
    return absl::FailedPreconditionError(strCat("cursor store ", path, " belongs to region '",
                                                region, "' but this agent serves region '",
                                                options.region, "'. ", reset));
  }
  return absl::OkStatus();
}

absl::Status validateOptions(const CursorStoreOptions& options) {
  if (options.max_resources == 0 || options.max_resources > kMaxResourcesLimit) {
    return absl::InvalidArgumentError(strCat("cursor store max_resources must be between 1 and ",
                                             kMaxResourcesLimit, ", got ", options.max_resources));
  }
  if (options.parked_capacity == 0 || options.parked_capacity > kParkedCapacityLimit) {
    return absl::InvalidArgumentError(strCat("cursor store parked_capacity must be between 1 and ",
                                             kParkedCapacityLimit, ", got ",
                                             options.parked_capacity));
  }
  if (options.region.size() > sizeof(FileHeader::region)) {
    return absl::InvalidArgumentError(strCat("region name '", options.region, "' is longer than ",
                                             sizeof(FileHeader::region), " bytes"));
  }
  return absl::OkStatus();
}

// A consistent copy of one table entry (seqlock read on the tag).
struct EntryView {
  uint64_t tag = 0;
  uint64_t hi = 0;
  uint64_t lo = 0;
  uint64_t version = 0;
};

EntryView readEntry(const TableEntry& e) {
  for (;;) {
    EntryView v;
    v.tag = e.tag.load(kAcquire);
    v.hi = e.key_hi.load(kRelaxed);
    v.lo = e.key_lo.load(kRelaxed);
    v.version = e.version.load(kRelaxed);
    std::atomic_thread_fence(kAcquire);
    if (e.tag.load(kRelaxed) == v.tag) return v;
  }
}

// A consistent copy of one parked record; nullopt when free or being written.
std::optional<std::pair<uint64_t, ParkedEvent>> readParked(const ParkedRecord& r,
                                                           ResourceKey* key) {
  for (;;) {
    const uint64_t state = r.state.load(kAcquire);
    if (!layout::isValidState(state)) return std::nullopt;
    ParkedEvent event;
    ResourceKey k{r.key_hi.load(kRelaxed), r.key_lo.load(kRelaxed)};
    event.version = r.version.load(kRelaxed);
    event.attempts = static_cast<uint32_t>(r.attempts.load(kRelaxed));
    event.parked_unix_ms = r.parked_unix_ms.load(kRelaxed);
    event.type = loadText(r.type);
    event.id = loadText(r.id);
    event.last_error = loadText(r.last_error);
    std::atomic_thread_fence(kAcquire);
    if (r.state.load(kRelaxed) == state) {
      if (key != nullptr) *key = k;
      return std::make_pair(state, std::move(event));
    }
  }
}

struct KeyHash {
  size_t operator()(const ResourceKey& k) const { return k.hi ^ (k.lo * 0x9E3779B97F4A7C15ULL); }
};

[[noreturn]] void die(const std::string& message) {
  std::fprintf(stderr, "cursor store: %s\n", message.c_str());
  std::abort();
}

}  // namespace

const char* openModeName(OpenMode mode) {
  switch (mode) {
    case OpenMode::kAgent:
      return "agent";
    case OpenMode::kHost:
      return "host";
    case OpenMode::kReadOnly:
      return "read-only";
  }
  return "?";
}

CursorStore::CursorStore(std::string path, OpenMode mode, int lock_fd)
    : path_(std::move(path)), mode_(mode), lock_fd_(lock_fd) {}

CursorStore::~CursorStore() {
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the agent's flock
}

absl::StatusOr<std::unique_ptr<CursorStore>> CursorStore::open(const std::string& state_dir,
                                                               const CursorStoreOptions& options) {
  KRANE_RETURN_IF_ERROR(validateOptions(options));
  const std::string path = strCat(state_dir, "/", kFileName);
  const bool agent = options.mode == OpenMode::kAgent;

  int lock_fd = -1;
  if (agent) {
    std::error_code ec;
    std::filesystem::create_directories(state_dir, ec);
    if (ec) {
      return absl::UnavailableError(
          strCat("cannot create state directory ", state_dir, ": ", ec.message()));
    }
    const std::string lock_path = strCat(state_dir, "/", kLockFileName);
    // O_CLOEXEC: plugin hosts started by the agent must not inherit (and so keep) the lock.
    lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (lock_fd < 0) {
      return absl::UnavailableError(strCat("cannot open ", lock_path, ": ", errnoText(errno)));
    }
    if (::flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
      char pid[32] = {};
      const ssize_t n = ::pread(lock_fd, pid, sizeof(pid) - 1, 0);
      ::close(lock_fd);
      return absl::FailedPreconditionError(
          strCat("cursor store ", path, " is already open in agent mode by another process",
                 n > 0 ? strCat(" (pid ", std::string(pid, ::strnlen(pid, sizeof(pid))), ")") : "",
                 "; lock file ", lock_path));
    }
    // The pid is only a hint for the message above; the lock is what counts.
    // Stores made before the state directory was private were created 0644.
    (void)::fchmod(lock_fd, S_IRUSR | S_IWUSR);
    const std::string pid = std::to_string(::getpid());
    const bool noted =
        ::ftruncate(lock_fd, 0) == 0 && ::pwrite(lock_fd, pid.data(), pid.size(), 0) > 0;
    (void)noted;
  }
  std::unique_ptr<CursorStore> store(new CursorStore(path, options.mode, lock_fd));

  if (agent) {
    // Leftovers of an agent killed while creating or enlarging the store.
    const std::string prefix = strCat(kFileName, ".tmp.");
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(state_dir, ec)) {
      if (entry.path().filename().string().rfind(prefix, 0) == 0) {
        std::filesystem::remove(entry.path(), ec);
        ++store->recovery_.stale_temp_files_removed;
      }
    }
  }

  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (errno != ENOENT) {
      return absl::UnavailableError(strCat("cannot stat ", path, ": ", errnoText(errno)));
    }
    if (!agent) {
      return absl::NotFoundError(
          strCat("no cursor store at ", path, ": the agent creates it when it starts"));
    }
    NewStoreFile file(strCat(path, ".tmp.", ::getpid()));
    KRANE_RETURN_IF_ERROR(
        file.create(layout::geometry(options.max_resources, options.parked_capacity),
                    options.region, nowUnixMs(), options.preallocate));
    KRANE_RETURN_IF_ERROR(file.publish(path));
    store->recovery_.created = true;
    if (::stat(path.c_str(), &st) != 0) {
      return absl::UnavailableError(strCat("cannot stat ", path, ": ", errnoText(errno)));
    }
  } else if (agent && (st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    // Only the agent's user (and the plugin hosts it starts) may read the cursors.
    if (::chmod(path.c_str(), S_IRUSR | S_IWUSR) != 0) {
      return absl::UnavailableError(strCat("cannot make ", path, " private: ", errnoText(errno)));
    }
  }
  if (static_cast<uint64_t>(st.st_size) < layout::kHeaderBytes) {
    return absl::FailedPreconditionError(
        strCat("cursor store ", path, " is ", st.st_size, " bytes, too short to hold its header (",
               layout::kHeaderBytes, " bytes): the file is truncated. ", resetHint(path)));
  }

  bip::mapped_region region;
  KRANE_RETURN_IF_ERROR(mapFile(path, options.mode != OpenMode::kReadOnly, &region));
  KRANE_RETURN_IF_ERROR(validateHeader(path, region.get_size(), options,
                                       *static_cast<const FileHeader*>(region.get_address())));
  store->attach(region);

  if (agent) {
    store->recover();
    const bool grow = options.max_resources > store->layout_.max_resources ||
                      options.parked_capacity > store->layout_.parked_capacity;
    // Tombstones that still guard a live key's probe path stay; should they ever pile up,
    // lookups slow down, so the live entries are copied into a fresh file.
    const bool compact =
        store->header_->tombstones.load(kRelaxed) * 4 > store->layout_.table_entries;
    if (grow || compact) {
      KRANE_RETURN_IF_ERROR(store->rebuild(
          std::max(options.max_resources, store->layout_.max_resources),
          std::max(options.parked_capacity, store->layout_.parked_capacity), options.preallocate));
    }
    store->header_->agent_pid.store(::getpid(), kRelaxed);
    store->header_->generation.fetch_add(1, kRelease);
  }
  return store;
}

void CursorStore::attach(bip::mapped_region& region) {
  region_.swap(region);
  auto* base = static_cast<char*>(region_.get_address());
  header_ = reinterpret_cast<FileHeader*>(base);
  slots_ = reinterpret_cast<PluginSlotRecord*>(base + header_->slots_offset);
  parked_ = reinterpret_cast<ParkedRecord*>(base + header_->parked_offset);
  table_ = reinterpret_cast<TableEntry*>(base + header_->table_offset);
  layout_.layout_version = header_->layout_version;
  layout_.file_bytes = header_->file_bytes;
  layout_.header_bytes = header_->header_bytes;
  layout_.slot_count = header_->slot_count;
  layout_.slot_bytes = header_->slot_bytes;
  layout_.slots_offset = header_->slots_offset;
  layout_.parked_capacity = header_->parked_capacity;
  layout_.parked_entry_bytes = header_->parked_entry_bytes;
  layout_.parked_offset = header_->parked_offset;
  layout_.max_resources = header_->max_resources;
  layout_.table_entries = header_->table_entries;
  layout_.table_entry_bytes = header_->table_entry_bytes;
  layout_.table_offset = header_->table_offset;
}

void CursorStore::clearEntry(TableEntry& e) {
  e.tag.store(layout::kEmptyTag, kRelease);
  std::atomic_thread_fence(kRelease);
  e.key_hi.store(0, kRelaxed);
  e.key_lo.store(0, kRelaxed);
  e.version.store(0, kRelaxed);
}

// Runs at every agent open, before the agent writes anything else. Other processes may be reading;
// every repair below is a single publication-word store they already know how to read.
void CursorStore::recover() {
  std::lock_guard lock(write_mutex_);
  const uint64_t n = layout_.table_entries;
  uint64_t live = 0;
  uint64_t tombstones = 0;
  for (uint64_t i = 0; i < n; ++i) {
    TableEntry& e = table_[i];
    const uint64_t tag = e.tag.load(kRelaxed);
    if (tag == layout::kEmptyTag) {
      if ((e.key_hi.load(kRelaxed) | e.key_lo.load(kRelaxed) | e.version.load(kRelaxed)) != 0) {
        clearEntry(e);
        ++recovery_.half_written_entries_cleared;
      }
    } else if (tag == layout::kTombstoneTag) {
      ++tombstones;
    } else if (layout::isLiveTag(tag) &&
               tag == layout::entryTag(e.key_hi.load(kRelaxed), e.key_lo.load(kRelaxed))) {
      ++live;
    } else {
      // Not something this code ever writes (disk damage): drop the entry but keep the chain.
      e.tag.store(layout::kTombstoneTag, kRelease);
      ++recovery_.damaged_entries_dropped;
      ++tombstones;
    }
  }
  header_->tracked.store(live, kRelaxed);
  header_->tombstones.store(tombstones, kRelaxed);
  for (uint64_t i = 0; i < n; ++i) {
    // Once per cluster, at its first bucket.
    if (table_[i].tag.load(kRelaxed) != layout::kEmptyTag &&
        table_[i == 0 ? n - 1 : i - 1].tag.load(kRelaxed) == layout::kEmptyTag) {
      recovery_.tombstones_reclaimed += cleanCluster(i);
    }
  }

  std::unordered_map<ResourceKey, uint32_t, KeyHash> newest;
  for (uint32_t i = 0; i < layout_.parked_capacity; ++i) {
    ParkedRecord& r = parked_[i];
    const uint64_t state = r.state.load(kRelaxed);
    if (state == layout::kFree) continue;
    if (!layout::isValidState(state)) {
      r.state.store(layout::kFree, kRelease);
      ++recovery_.parked_half_written_cleared;
      continue;
    }
    const ResourceKey key{r.key_hi.load(kRelaxed), r.key_lo.load(kRelaxed)};
    auto [it, inserted] = newest.emplace(key, i);
    if (!inserted) {
      // An update interrupted between writing the new record and freeing the old one.
      ParkedRecord& other = parked_[it->second];
      ParkedRecord& older = other.state.load(kRelaxed) < state ? other : r;
      if (&older == &other) it->second = i;
      older.state.store(layout::kFree, kRelease);
      ++recovery_.parked_duplicates_dropped;
    }
  }

  for (uint32_t i = 0; i < layout::kPluginSlots; ++i) {
    const uint64_t state = slots_[i].state.load(kRelaxed);
    if (state != layout::kFree && !layout::isValidState(state)) {
      slots_[i].state.store(layout::kFree, kRelease);
      ++recovery_.slots_half_written_cleared;
    }
  }
}

// A tombstone only has to stay while some live key's probe path (from its home bucket to where it
// is stored) crosses it. Within one cluster (a maximal run of non-empty buckets; every live key
// lies in the cluster of its home), a backward pass knows the earliest home of the live keys behind
// each position: a tombstone before all of them guards nobody and becomes empty. Concurrent
// lookups cannot tell: no key they may be looking for is reached through that bucket.
uint64_t CursorStore::cleanCluster(uint64_t bucket) {
  const uint64_t n = layout_.table_entries;
  const auto tag_at = [this](uint64_t i) { return table_[i].tag.load(kRelaxed); };
  if (tag_at(bucket) == layout::kEmptyTag) return 0;
  uint64_t start = bucket;
  uint64_t length = 1;
  while (length < n) {
    const uint64_t before = start == 0 ? n - 1 : start - 1;
    if (tag_at(before) == layout::kEmptyTag) break;
    start = before;
    ++length;
  }
  for (uint64_t i = bucket + 1 == n ? 0 : bucket + 1; length < n && tag_at(i) != layout::kEmptyTag;
       i = i + 1 == n ? 0 : i + 1) {
    ++length;
  }
  if (length >= n) return 0;  // no empty bucket at all: the load limit makes this impossible

  uint64_t earliest_home = length;  // offset from `start` of the earliest home seen behind
  uint64_t reclaimed = 0;
  for (uint64_t d = length; d-- > 0;) {
    TableEntry& e = table_[start + d >= n ? start + d - n : start + d];
    const uint64_t tag = e.tag.load(kRelaxed);
    if (tag == layout::kTombstoneTag) {
      if (earliest_home > d) {
        clearEntry(e);
        header_->tombstones.fetch_sub(1, kRelaxed);
        ++reclaimed;
      }
    } else if (layout::isLiveTag(tag)) {
      const uint64_t home =
          layout::homeBucket(ResourceKey{e.key_hi.load(kRelaxed), e.key_lo.load(kRelaxed)}, n);
      earliest_home = std::min(earliest_home, home >= start ? home - start : home + n - start);
    }
  }
  return reclaimed;
}

absl::Status CursorStore::rebuild(uint64_t max_resources, uint32_t parked_capacity,
                                  bool preallocate) {
  std::lock_guard lock(write_mutex_);
  const layout::Geometry g = layout::geometry(max_resources, parked_capacity);
  NewStoreFile file(strCat(path_, ".tmp.", ::getpid()));
  KRANE_RETURN_IF_ERROR(file.create(g, fixedText(header_->region, sizeof(header_->region)),
                                    header_->created_unix_ms, preallocate));
  auto* base = static_cast<char*>(file.region().get_address());
  auto* h = reinterpret_cast<FileHeader*>(base);
  auto* slots = reinterpret_cast<PluginSlotRecord*>(base + g.slots_offset);
  auto* parked = reinterpret_cast<ParkedRecord*>(base + g.parked_offset);
  auto* table = reinterpret_cast<TableEntry*>(base + g.table_offset);

  const auto copy = [](const auto& from, auto& to) { to.store(from.load(kRelaxed), kRelaxed); };
  // Slot and parked records are arrays of 8-byte lock-free atomics (signed or not), copied word
  // by word; nothing else writes the new file yet.
  const auto copy_words = [](const void* from, void* to, size_t bytes) {
    const auto* f = static_cast<const layout::Word*>(from);
    auto* t = static_cast<layout::Word*>(to);
    for (size_t i = 0; i < bytes / 8; ++i) t[i].store(f[i].load(kRelaxed), kRelaxed);
  };
  copy(header_->generation, h->generation);
  copy(header_->agent_pid, h->agent_pid);
  copy(header_->watermark, h->watermark);
  copy(header_->watermark_unix_ms, h->watermark_unix_ms);
  copy(header_->full_sync_version, h->full_sync_version);
  copy(header_->full_sync_unix_ms, h->full_sync_unix_ms);
  copy(header_->feed_epoch, h->feed_epoch);
  copy(header_->sequence, h->sequence);
  for (uint32_t i = 0; i < layout::kPluginSlots; ++i) {
    if (layout::isValidState(slots_[i].state.load(kRelaxed))) {
      copy_words(&slots_[i], &slots[i], sizeof(PluginSlotRecord));
    }
  }
  uint32_t next_parked = 0;
  for (uint32_t i = 0; i < layout_.parked_capacity; ++i) {
    if (layout::isValidState(parked_[i].state.load(kRelaxed))) {
      copy_words(&parked_[i], &parked[next_parked++], sizeof(ParkedRecord));
    }
  }
  uint64_t live = 0;
  for (uint64_t i = 0; i < layout_.table_entries; ++i) {
    const TableEntry& from = table_[i];
    const uint64_t tag = from.tag.load(kRelaxed);
    if (!layout::isLiveTag(tag)) continue;
    const ResourceKey key{from.key_hi.load(kRelaxed), from.key_lo.load(kRelaxed)};
    uint64_t j = layout::homeBucket(key, g.table_entries);
    while (table[j].tag.load(kRelaxed) != layout::kEmptyTag) {
      j = j + 1 == g.table_entries ? 0 : j + 1;
    }
    table[j].key_hi.store(key.hi, kRelaxed);
    table[j].key_lo.store(key.lo, kRelaxed);
    table[j].version.store(from.version.load(kRelaxed), kRelaxed);
    table[j].tag.store(tag, kRelease);
    ++live;
  }
  h->tracked.store(live, kRelaxed);
  KRANE_RETURN_IF_ERROR(file.publish(path_));

  recovery_.rebuilt = true;
  recovery_.previous_max_resources = layout_.max_resources;
  // Processes still mapping the old file see this and reopen.
  header_->superseded.store(1, kRelease);
  attach(file.region());
  return absl::OkStatus();
}

// ---- Guards ---------------------------------------------------------------------------------

void CursorStore::requireAgent(const char* what) const {
  if (mode_ != OpenMode::kAgent) {
    die(strCat(what, " writes agent-owned state but ", path_, " was opened in ",
               openModeName(mode_), " mode"));
  }
}

void CursorStore::requireWritable(const char* what) const {
  if (mode_ == OpenMode::kReadOnly) {
    die(strCat(what, " writes to ", path_, " but it was opened read-only"));
  }
}

PluginSlotRecord& CursorStore::slotRecord(int slot) const {
  if (slot < 0 || slot >= static_cast<int>(layout::kPluginSlots)) {
    die(strCat("plugin slot ", slot, " out of range [0, ", layout::kPluginSlots, ")"));
  }
  return slots_[slot];
}

uint64_t CursorStore::nextSequence() { return header_->sequence.fetch_add(1, kRelaxed) + 1; }

// ---- Header ---------------------------------------------------------------------------------

std::string CursorStore::region() const {
  return fixedText(header_->region, sizeof(header_->region));
}

uint64_t CursorStore::generation() const { return header_->generation.load(kAcquire); }

bool CursorStore::superseded() const { return header_->superseded.load(kAcquire) != 0; }

uint64_t CursorStore::watermark() const { return header_->watermark.load(kAcquire); }

bool CursorStore::advanceWatermark(uint64_t version) {
  requireAgent("advanceWatermark");
  std::lock_guard lock(write_mutex_);
  if (version < header_->watermark.load(kRelaxed)) return false;
  header_->watermark_unix_ms.store(nowUnixMs(), kRelaxed);
  header_->watermark.store(version, kRelease);
  return true;
}

void CursorStore::setWatermark(uint64_t version) {
  requireAgent("setWatermark");
  std::lock_guard lock(write_mutex_);
  header_->watermark_unix_ms.store(nowUnixMs(), kRelaxed);
  header_->watermark.store(version, kRelease);
}

void CursorStore::recordFullSync(uint64_t version, int64_t unix_ms) {
  requireAgent("recordFullSync");
  std::lock_guard lock(write_mutex_);
  header_->full_sync_unix_ms.store(unix_ms, kRelaxed);
  header_->full_sync_version.store(version, kRelease);
}

uint64_t CursorStore::fullSyncVersion() const { return header_->full_sync_version.load(kAcquire); }

void CursorStore::setFeedEpoch(uint64_t epoch) {
  requireAgent("setFeedEpoch");
  header_->feed_epoch.store(epoch, kRelease);
}

uint64_t CursorStore::feedEpoch() const { return header_->feed_epoch.load(kAcquire); }

int64_t CursorStore::fullSyncUnixMs() const { return header_->full_sync_unix_ms.load(kAcquire); }

absl::Status CursorStore::flush() {
  if (mode_ == OpenMode::kReadOnly) return absl::OkStatus();
  if (!region_.flush(0, 0, /*async=*/false)) {
    return absl::UnavailableError(
        strCat("msync of cursor store ", path_, " failed: ", errnoText(errno)));
  }
  return absl::OkStatus();
}

// ---- Resource table -------------------------------------------------------------------------

std::optional<uint64_t> CursorStore::findVersion(const ResourceKey& key) const {
  const uint64_t tag = layout::entryTag(key.hi, key.lo);
  const uint64_t n = layout_.table_entries;
  uint64_t i = layout::homeBucket(key, n);
  for (uint64_t probes = 0; probes < n;) {
    const TableEntry& e = table_[i];
    const uint64_t t = e.tag.load(kAcquire);
    if (t == layout::kEmptyTag) return std::nullopt;
    if (t == tag) {
      const uint64_t hi = e.key_hi.load(kRelaxed);
      const uint64_t lo = e.key_lo.load(kRelaxed);
      const uint64_t version = e.version.load(kRelaxed);
      std::atomic_thread_fence(kAcquire);
      if (e.tag.load(kRelaxed) != t) continue;  // rewritten meanwhile: look again
      if (hi == key.hi && lo == key.lo) return version;
    }
    i = i + 1 == n ? 0 : i + 1;
    ++probes;
  }
  return std::nullopt;
}

std::optional<uint64_t> CursorStore::lastApplied(std::string_view type, std::string_view id) const {
  return findVersion(layout::resourceKey(type, id));
}

bool CursorStore::shouldApply(std::string_view type, std::string_view id, uint64_t version) const {
  const std::optional<uint64_t> applied = lastApplied(type, id);
  return !applied.has_value() || version > *applied;
}

absl::Status CursorStore::recordApplied(std::string_view type, std::string_view id,
                                        uint64_t version) {
  requireAgent("recordApplied");
  return storeApplied(type, id, version, /*replace=*/false);
}

absl::Status CursorStore::replaceApplied(std::string_view type, std::string_view id,
                                         uint64_t version) {
  requireAgent("replaceApplied");
  return storeApplied(type, id, version, /*replace=*/true);
}

absl::Status CursorStore::storeApplied(std::string_view type, std::string_view id, uint64_t version,
                                       bool replace) {
  const ResourceKey key = layout::resourceKey(type, id);
  const uint64_t tag = layout::entryTag(key.hi, key.lo);
  const uint64_t n = layout_.table_entries;
  std::lock_guard lock(write_mutex_);
  uint64_t i = layout::homeBucket(key, n);
  uint64_t reuse = n;  // first tombstone on the way: where a new key goes
  uint64_t probes = 0;
  for (; probes < n; ++probes) {
    TableEntry& e = table_[i];
    const uint64_t t = e.tag.load(kRelaxed);  // this thread is the only writer
    if (t == layout::kEmptyTag) break;
    if (t == layout::kTombstoneTag) {
      if (reuse == n) reuse = i;
    } else if (t == tag && e.key_hi.load(kRelaxed) == key.hi && e.key_lo.load(kRelaxed) == key.lo) {
      if (replace || version > e.version.load(kRelaxed)) e.version.store(version, kRelease);
      return absl::OkStatus();
    }
    i = i + 1 == n ? 0 : i + 1;
  }
  const uint64_t tracked = header_->tracked.load(kRelaxed);
  if (tracked >= layout_.max_resources) {
    return absl::ResourceExhaustedError(
        strCat("cursor store ", path_, " is full: it tracks ", tracked,
               " resources, its max_resources. Raise max_resources in the agent configuration and "
               "restart the agent: it enlarges the store on start and keeps its contents."));
  }
  const uint64_t tombstones = header_->tombstones.load(kRelaxed);
  if (reuse == n && (probes == n || (tracked + tombstones + 1) * 4 > n * 3)) {
    return absl::ResourceExhaustedError(
        strCat("cursor store ", path_, " has no room for a new resource: ", tracked,
               " tracked and ", tombstones, " deleted entries fill its ", n,
               "-entry table. Restart the agent to compact it, or raise max_resources in the agent "
               "configuration."));
  }
  const uint64_t target = reuse != n ? reuse : i;
  TableEntry& e = table_[target];
  // Orders the earlier tombstone/empty store of this bucket before the new key: a reader that
  // sees the new key words also sees the old tag change and retries.
  std::atomic_thread_fence(kRelease);
  e.key_hi.store(key.hi, kRelaxed);
  e.key_lo.store(key.lo, kRelaxed);
  e.version.store(version, kRelaxed);
  e.tag.store(tag, kRelease);  // publication: the entry exists from here on
  header_->tracked.store(tracked + 1, kRelaxed);
  if (reuse != n) header_->tombstones.store(tombstones - 1, kRelaxed);
  return absl::OkStatus();
}

bool CursorStore::forget(std::string_view type, std::string_view id) {
  requireAgent("forget");
  const ResourceKey key = layout::resourceKey(type, id);
  const uint64_t tag = layout::entryTag(key.hi, key.lo);
  const uint64_t n = layout_.table_entries;
  std::lock_guard lock(write_mutex_);
  uint64_t i = layout::homeBucket(key, n);
  for (uint64_t probes = 0; probes < n; ++probes) {
    TableEntry& e = table_[i];
    const uint64_t t = e.tag.load(kRelaxed);
    if (t == layout::kEmptyTag) return false;
    if (t == tag && e.key_hi.load(kRelaxed) == key.hi && e.key_lo.load(kRelaxed) == key.lo) {
      e.tag.store(layout::kTombstoneTag, kRelease);
      header_->tracked.fetch_sub(1, kRelaxed);
      header_->tombstones.fetch_add(1, kRelaxed);
      cleanCluster(i);
      return true;
    }
    i = i + 1 == n ? 0 : i + 1;
  }
  return false;
}

uint64_t CursorStore::retainOnly(std::vector<ResourceKey> keep) {
  requireAgent("retainOnly");
  const auto less = [](const ResourceKey& a, const ResourceKey& b) {
    return a.hi != b.hi ? a.hi < b.hi : a.lo < b.lo;
  };
  std::sort(keep.begin(), keep.end(), less);
  const uint64_t n = layout_.table_entries;
  uint64_t forgotten = 0;
  std::lock_guard lock(write_mutex_);
  for (uint64_t i = 0; i < n; ++i) {
    TableEntry& e = table_[i];
    const uint64_t t = e.tag.load(kRelaxed);
    if (!layout::isLiveTag(t)) continue;
    const ResourceKey key{e.key_hi.load(kRelaxed), e.key_lo.load(kRelaxed)};
    if (std::binary_search(keep.begin(), keep.end(), key, less)) continue;
    e.tag.store(layout::kTombstoneTag, kRelease);
    header_->tracked.fetch_sub(1, kRelaxed);
    header_->tombstones.fetch_add(1, kRelaxed);
    ++forgotten;
  }
  // Tombstones followed by an empty bucket are not needed by any probe: clear them in one pass.
  if (forgotten > 0) {
    for (uint64_t i = 0; i < n; ++i) {
      if (table_[i].tag.load(kRelaxed) == layout::kTombstoneTag) cleanCluster(i);
    }
  }
  return forgotten;
}

uint64_t CursorStore::trackedResources() const { return header_->tracked.load(kRelaxed); }

double CursorStore::bytesPerTrackedResource() const {
  const uint64_t tracked = trackedResources();
  return tracked == 0 ? 0.0
                      : static_cast<double>(layout_.file_bytes) / static_cast<double>(tracked);
}

TableStats CursorStore::tableStats() const {
  TableStats stats;
  const uint64_t n = layout_.table_entries;
  uint64_t probe_sum = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const EntryView v = readEntry(table_[i]);
    if (v.tag == layout::kEmptyTag) {
      if ((v.hi | v.lo | v.version) != 0) ++stats.half_written;
    } else if (v.tag == layout::kTombstoneTag) {
      ++stats.tombstones;
    } else if (layout::isLiveTag(v.tag) && v.tag == layout::entryTag(v.hi, v.lo)) {
      ++stats.live;
      const uint64_t home = layout::homeBucket(ResourceKey{v.hi, v.lo}, n);
      const uint64_t probe = (i >= home ? i - home : i + n - home) + 1;
      probe_sum += probe;
      stats.longest_probe = std::max(stats.longest_probe, probe);
    } else {
      ++stats.damaged;
    }
  }
  stats.mean_probe =
      stats.live == 0 ? 0.0 : static_cast<double>(probe_sum) / static_cast<double>(stats.live);
  return stats;
}

// ---- Parked events --------------------------------------------------------------------------

absl::Status CursorStore::park(const ParkedEvent& event) {
  requireAgent("park");
  const ResourceKey key = layout::resourceKey(event.type, event.id);
  std::lock_guard lock(write_mutex_);
  std::vector<uint32_t> existing;
  uint32_t target = layout_.parked_capacity;
  for (uint32_t i = 0; i < layout_.parked_capacity; ++i) {
    const ParkedRecord& r = parked_[i];
    const uint64_t state = r.state.load(kRelaxed);
    if (state == layout::kFree) {
      if (target == layout_.parked_capacity) target = i;
    } else if (r.key_hi.load(kRelaxed) == key.hi && r.key_lo.load(kRelaxed) == key.lo) {
      existing.push_back(i);
    }
  }
  if (target == layout_.parked_capacity) {
    if (existing.empty()) {
      return absl::ResourceExhaustedError(
          strCat("cursor store ", path_, ": the parked list is full (", layout_.parked_capacity,
                 " events). Unpark events, or raise parked_capacity in the agent configuration and "
                 "restart the agent."));
    }
    // No free record for a copy: update in place (a crash now may lose this one record).
    target = existing.back();
    existing.pop_back();
  }
  ParkedRecord& r = parked_[target];
  const uint64_t seq = nextSequence();
  r.state.store(layout::writingState(seq), kRelaxed);
  std::atomic_thread_fence(kRelease);
  r.key_hi.store(key.hi, kRelaxed);
  r.key_lo.store(key.lo, kRelaxed);
  r.version.store(event.version, kRelaxed);
  r.attempts.store(event.attempts, kRelaxed);
  r.parked_unix_ms.store(event.parked_unix_ms != 0 ? event.parked_unix_ms : nowUnixMs(), kRelaxed);
  storeText(r.type, event.type);
  storeText(r.id, event.id);
  storeText(r.last_error, event.last_error);
  r.state.store(layout::validState(seq), kRelease);
  // Only now free the previous record of this resource: a crash in between leaves both, and the
  // newer one wins.
  for (uint32_t i : existing) parked_[i].state.store(layout::kFree, kRelease);
  return absl::OkStatus();
}

bool CursorStore::unpark(std::string_view type, std::string_view id) {
  requireAgent("unpark");
  const ResourceKey key = layout::resourceKey(type, id);
  std::lock_guard lock(write_mutex_);
  bool found = false;
  for (uint32_t i = 0; i < layout_.parked_capacity; ++i) {
    ParkedRecord& r = parked_[i];
    if (r.state.load(kRelaxed) != layout::kFree && r.key_hi.load(kRelaxed) == key.hi &&
        r.key_lo.load(kRelaxed) == key.lo) {
      r.state.store(layout::kFree, kRelease);
      found = true;
    }
  }
  return found;
}

std::vector<ParkedEvent> CursorStore::listParked() const {
  struct Found {
    uint64_t state;
    ParkedEvent event;
  };
  std::unordered_map<ResourceKey, Found, KeyHash> newest;
  for (uint32_t i = 0; i < layout_.parked_capacity; ++i) {
    ResourceKey key;
    auto found = readParked(parked_[i], &key);
    if (!found) continue;
    // Both records of an update in flight can be valid at once: the newer one wins.
    auto it = newest.find(key);
    if (it == newest.end()) {
      newest.emplace(key, Found{found->first, std::move(found->second)});
    } else if (it->second.state < found->first) {
      it->second = Found{found->first, std::move(found->second)};
    }
  }
  std::vector<ParkedEvent> out;
  out.reserve(newest.size());
  for (auto& [key, found] : newest) out.push_back(std::move(found.event));
  std::sort(out.begin(), out.end(), [](const ParkedEvent& a, const ParkedEvent& b) {
    return std::tie(a.parked_unix_ms, a.type, a.id) < std::tie(b.parked_unix_ms, b.type, b.id);
  });
  return out;
}

// ---- Plugin slots ---------------------------------------------------------------------------

int CursorStore::findPluginSlot(std::string_view name) const {
  for (uint32_t i = 0; i < layout::kPluginSlots; ++i) {
    const PluginSlotRecord& s = slots_[i];
    for (;;) {
      const uint64_t state = s.state.load(kAcquire);
      if (!layout::isValidState(state)) break;
      const std::string slot_name = loadText(s.name);
      std::atomic_thread_fence(kAcquire);
      if (s.state.load(kRelaxed) != state) continue;
      if (slot_name == name) return static_cast<int>(i);
      break;
    }
  }
  return -1;
}

absl::StatusOr<int> CursorStore::registerPlugin(std::string_view name) {
  requireAgent("registerPlugin");
  if (name.empty() || name.size() > sizeof(PluginSlotRecord::name)) {
    return absl::InvalidArgumentError(
        strCat("plugin name '", name, "' must be 1 to ", sizeof(PluginSlotRecord::name), " bytes"));
  }
  std::lock_guard lock(write_mutex_);
  if (const int existing = findPluginSlot(name); existing >= 0) return existing;
  for (uint32_t i = 0; i < layout::kPluginSlots; ++i) {
    PluginSlotRecord& s = slots_[i];
    if (s.state.load(kRelaxed) != layout::kFree) continue;
    const uint64_t seq = nextSequence();
    s.state.store(layout::writingState(seq), kRelaxed);
    std::atomic_thread_fence(kRelease);
    storeText(s.name, name);
    s.restarts.store(0, kRelaxed);
    s.assigned_unix_ms.store(nowUnixMs(), kRelaxed);
    s.pid.store(0, kRelaxed);
    s.acked_version.store(0, kRelaxed);
    s.heartbeat_mono_ns.store(0, kRelaxed);
    s.heartbeat_unix_ms.store(0, kRelaxed);
    s.applied.store(0, kRelaxed);
    s.failed.store(0, kRelaxed);
    s.parked.store(0, kRelaxed);
    s.redelivered.store(0, kRelaxed);
    s.state.store(layout::validState(seq), kRelease);
    return static_cast<int>(i);
  }
  return absl::ResourceExhaustedError(strCat("cursor store ", path_, ": all ", layout::kPluginSlots,
                                             " plugin slots are in use; release one first"));
}

void CursorStore::releasePlugin(int slot) {
  requireAgent("releasePlugin");
  PluginSlotRecord& s = slotRecord(slot);
  std::lock_guard lock(write_mutex_);
  s.state.store(layout::kFree, kRelease);
}

void CursorStore::recordRestart(int slot) {
  requireAgent("recordRestart");
  slotRecord(slot).restarts.fetch_add(1, kRelease);
}

absl::StatusOr<int> CursorStore::findPlugin(std::string_view name) const {
  const int slot = findPluginSlot(name);
  if (slot < 0) {
    return absl::NotFoundError(strCat("no plugin slot named '", name, "' in ", path_));
  }
  return slot;
}

std::optional<PluginSlotInfo> CursorStore::plugin(int slot) const {
  const PluginSlotRecord& s = slotRecord(slot);
  for (;;) {
    const uint64_t state = s.state.load(kAcquire);
    if (!layout::isValidState(state)) return std::nullopt;
    PluginSlotInfo info;
    info.slot = slot;
    info.name = loadText(s.name);
    info.restarts = s.restarts.load(kRelaxed);
    info.assigned_unix_ms = s.assigned_unix_ms.load(kRelaxed);
    info.pid = s.pid.load(kRelaxed);
    info.acked_version = s.acked_version.load(kRelaxed);
    info.heartbeat_mono_ns = s.heartbeat_mono_ns.load(kRelaxed);
    info.heartbeat_unix_ms = s.heartbeat_unix_ms.load(kRelaxed);
    info.applied = s.applied.load(kRelaxed);
    info.failed = s.failed.load(kRelaxed);
    info.parked = s.parked.load(kRelaxed);
    info.redelivered = s.redelivered.load(kRelaxed);
    std::atomic_thread_fence(kAcquire);
    if (s.state.load(kRelaxed) == state) return info;
  }
}

void CursorStore::setPluginPid(int slot, int64_t pid) {
  requireWritable("setPluginPid");
  slotRecord(slot).pid.store(pid, kRelease);
}

void CursorStore::heartbeat(int slot) {
  requireWritable("heartbeat");
  PluginSlotRecord& s = slotRecord(slot);
  s.heartbeat_unix_ms.store(nowUnixMs(), kRelaxed);
  s.heartbeat_mono_ns.store(nowMonoNs(), kRelease);
}

void CursorStore::ackPlugin(int slot, uint64_t version) {
  requireWritable("ackPlugin");
  slotRecord(slot).acked_version.store(version, kRelease);
}

void CursorStore::countApplied(int slot, uint64_t n) {
  requireWritable("countApplied");
  slotRecord(slot).applied.fetch_add(n, kRelaxed);
}

void CursorStore::countFailed(int slot, uint64_t n) {
  requireWritable("countFailed");
  slotRecord(slot).failed.fetch_add(n, kRelaxed);
}

void CursorStore::countParked(int slot, uint64_t n) {
  requireWritable("countParked");
  slotRecord(slot).parked.fetch_add(n, kRelaxed);
}

void CursorStore::countRedelivered(int slot, uint64_t n) {
  requireWritable("countRedelivered");
  slotRecord(slot).redelivered.fetch_add(n, kRelaxed);
}

// ---- Snapshot -------------------------------------------------------------------------------

CursorSnapshot CursorStore::snapshot() const {
  CursorSnapshot snap;
  snap.path = path_;
  snap.layout = layout_;
  snap.region = region();
  snap.created_unix_ms = header_->created_unix_ms;
  snap.generation = header_->generation.load(kAcquire);
  snap.agent_pid = header_->agent_pid.load(kRelaxed);
  snap.watermark = header_->watermark.load(kAcquire);
  snap.watermark_unix_ms = header_->watermark_unix_ms.load(kRelaxed);
  snap.full_sync_version = header_->full_sync_version.load(kAcquire);
  snap.full_sync_unix_ms = header_->full_sync_unix_ms.load(kRelaxed);
  snap.tracked_resources = header_->tracked.load(kRelaxed);
  snap.tombstones = header_->tombstones.load(kRelaxed);
  snap.table = tableStats();
  for (uint32_t i = 0; i < layout::kPluginSlots; ++i) {
    if (auto info = plugin(static_cast<int>(i))) snap.plugins.push_back(std::move(*info));
  }
  snap.parked = listParked();
  snap.superseded = superseded();
  snap.taken_unix_ms = nowUnixMs();
  snap.taken_mono_ns = nowMonoNs();
  return snap;
}

}  // namespace krane::ipc
