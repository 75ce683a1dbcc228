// The deterministic workload of the crash test and the model that says which store states a kill
// may leave behind.
//
// The writer (store_child writer) performs operation `seq` = 1, 2, 3, ... of a run, each a pure
// function of (seed, seq), and advances the watermark to `seq` right after the operation. So
// after a SIGKILL the watermark W says: operations up to W completed, operation W + 1 may or may
// not have, and nothing later started. Every version encodes its key in the low 16 bits, so a
// version found under the wrong key (what publishing a key before its value would leave) is
// caught, as is a lost update (below what W proves) or a version from the future (above W + 1).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/strings.h"
#include "ipc/cursor_store.h"

namespace krane::ipc::testing {

inline constexpr std::string_view kCrashType = "deployment";
inline constexpr std::string_view kCrashPlugin = "crash-writer";
inline constexpr uint64_t kCrashKeys = 4096;
inline constexpr uint64_t kKeyBits = 16;

inline std::string crashId(uint64_t key) { return strCat("app-", key); }
inline uint64_t crashVersion(uint64_t seq, uint64_t key) { return (seq << kKeyBits) | key; }
inline uint64_t keyOfVersion(uint64_t version) { return version & ((1u << kKeyBits) - 1); }
inline uint64_t seqOfVersion(uint64_t version) { return version >> kKeyBits; }
inline std::string parkError(uint64_t version) {
  return strCat("apply failed at version ", version);
}
inline uint32_t parkAttempts(uint64_t seq) { return static_cast<uint32_t>(seq % 5 + 1); }

enum class CrashOpKind { kRecord, kForget, kPark, kUnpark };

struct CrashOp {
  uint64_t key;
  CrashOpKind kind;
};

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

inline CrashOp crashOp(uint64_t seed, uint64_t seq) {
  const uint64_t r = splitmix64(splitmix64(seed) ^ seq);
  const uint64_t pick = (r >> 32) % 64;
  CrashOpKind kind = CrashOpKind::kRecord;
  if (pick < 6) {
    kind = CrashOpKind::kForget;
  } else if (pick < 8) {
    kind = CrashOpKind::kPark;
  } else if (pick < 10) {
    kind = CrashOpKind::kUnpark;
  }
  return CrashOp{r % kCrashKeys, kind};
}

// Performs operation `seq` of the run with `seed`, then advances the watermark to `seq`.
inline absl::Status runCrashOp(CursorStore& store, uint64_t seed, uint64_t seq) {
  const CrashOp op = crashOp(seed, seq);
  const uint64_t version = crashVersion(seq, op.key);
  const std::string id = crashId(op.key);
  switch (op.kind) {
    case CrashOpKind::kRecord:
      if (absl::Status s = store.recordApplied(kCrashType, id, version); !s.ok()) return s;
      break;
    case CrashOpKind::kForget:
      store.forget(kCrashType, id);
      break;
    case CrashOpKind::kPark:
      if (absl::Status s = store.park({std::string(kCrashType), id, version, parkAttempts(seq),
                                       parkError(version), static_cast<int64_t>(seq)});
          !s.ok()) {
        return s;
      }
      break;
    case CrashOpKind::kUnpark:
      store.unpark(kCrashType, id);
      break;
  }
  store.advanceWatermark(seq);
  return absl::OkStatus();
}

// Per key, the set of states the store may hold for the table and for the parked list.
class CrashModel {
 public:
  static constexpr uint64_t kAbsent = ~uint64_t{0};

  CrashModel() : table_(kCrashKeys, {kAbsent}), parked_(kCrashKeys, {kAbsent}) {}

  // Operations [from, to] of the run with `seed` completed.
  void completed(uint64_t seed, uint64_t from, uint64_t to) {
    for (uint64_t seq = from; seq <= to; ++seq) apply(seed, seq, /*maybe=*/false);
  }
  // Operation `seq` may or may not have taken effect.
  void maybe(uint64_t seed, uint64_t seq) { apply(seed, seq, /*maybe=*/true); }

  // Compares the store with the model; afterwards the model holds exactly what the store holds
  // (the truth for the next run). Returns the problems found.
  std::vector<std::string> check(const CursorStore& store) {
    std::vector<std::string> problems;
    auto problem = [&problems](std::string text) {
      if (problems.size() < 20) problems.push_back(std::move(text));
    };
    uint64_t present = 0;
    for (uint64_t k = 0; k < kCrashKeys; ++k) {
      const auto found = store.lastApplied(kCrashType, crashId(k));
      const uint64_t actual = found.value_or(kAbsent);
      present += found.has_value();
      if (found && keyOfVersion(*found) != k) {
        problem(strCat("key ", k, " holds version ", *found, " which belongs to key ",
                       keyOfVersion(*found)));
      }
      if (std::find(table_[k].begin(), table_[k].end(), actual) == table_[k].end()) {
        problem(strCat("key ", k, " holds ", describe(actual), ", expected one of ",
                       describe(table_[k])));
      }
      table_[k] = {actual};
    }
    std::vector<uint64_t> parked(kCrashKeys, kAbsent);
    for (const ParkedEvent& e : store.listParked()) {
      const uint64_t k = keyOfVersion(e.version);
      if (e.type != kCrashType || e.id != crashId(k) || e.last_error != parkError(e.version) ||
          e.attempts != parkAttempts(seqOfVersion(e.version)) ||
          e.parked_unix_ms != static_cast<int64_t>(seqOfVersion(e.version))) {
        problem(strCat("torn parked event ", e.type, "/", e.id, " version ", e.version,
                       " attempts ", e.attempts, " error '", e.last_error, "'"));
        continue;
      }
      if (parked[k] != kAbsent) problem(strCat("key ", k, " parked twice"));
      parked[k] = e.version;
    }
    for (uint64_t k = 0; k < kCrashKeys; ++k) {
      if (std::find(parked_[k].begin(), parked_[k].end(), parked[k]) == parked_[k].end()) {
        problem(strCat("key ", k, " parked ", describe(parked[k]), ", expected one of ",
                       describe(parked_[k])));
      }
      parked_[k] = {parked[k]};
    }
    const TableStats stats = store.tableStats();
    if (stats.damaged != 0) problem(strCat(stats.damaged, " damaged table entries"));
    if (stats.live != present) {
      problem(strCat("table scan finds ", stats.live, " live entries, lookups ", present));
    }
    if (store.trackedResources() != present) {
      problem(strCat("tracked counter ", store.trackedResources(), ", lookups find ", present));
    }
    return problems;
  }

 private:
  static std::string describe(uint64_t v) {
    return v == kAbsent ? std::string("absent")
                        : strCat(v, " (seq ", seqOfVersion(v), " key ", keyOfVersion(v), ")");
  }
  static std::string describe(const std::vector<uint64_t>& vs) {
    std::string out = "{";
    for (uint64_t v : vs) strAppend(&out, out.size() > 1 ? ", " : "", describe(v));
    return out + "}";
  }

  void apply(uint64_t seed, uint64_t seq, bool maybe) {
    const CrashOp op = crashOp(seed, seq);
    const uint64_t version = crashVersion(seq, op.key);
    const bool table_op = op.kind == CrashOpKind::kRecord || op.kind == CrashOpKind::kForget;
    std::vector<uint64_t>& states = table_op ? table_[op.key] : parked_[op.key];
    std::vector<uint64_t> next;
    for (uint64_t s : states) {
      switch (op.kind) {
        case CrashOpKind::kRecord:
          next.push_back(s == kAbsent ? version : std::max(s, version));
          break;
        case CrashOpKind::kPark:
          next.push_back(version);
          break;
        case CrashOpKind::kForget:
        case CrashOpKind::kUnpark:
          next.push_back(kAbsent);
          break;
      }
    }
    if (maybe) next.insert(next.end(), states.begin(), states.end());
    std::sort(next.begin(), next.end());
    next.erase(std::unique(next.begin(), next.end()), next.end());
    states = std::move(next);
  }

  std::vector<std::vector<uint64_t>> table_;
  std::vector<std::vector<uint64_t>> parked_;
};

}  // namespace krane::ipc::testing
