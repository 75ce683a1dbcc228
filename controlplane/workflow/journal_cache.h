// Journals of invocations this replica suspended (or put back to wait for a retry), kept so that
// the next execution does not read its whole history from the database again.
//
// An entry is stamped with the lease token under which its journal was committed. Every claim
// increments the token, and only the holder of the current token can append to a journal, so a
// claim whose token is exactly one more than the stamp is the first claim since that commit: no
// other replica (nor an earlier claim of this one) can have appended anything in between. Any
// other token means someone else held the invocation meanwhile and the entry is dropped.
//
// Thread-safety: every method may be called from any thread. Bounded by bytes; the least recently
// stored entries go first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "controlplane/workflow/context_impl.h"

namespace krane::workflow {

class JournalCache {
 public:
  explicit JournalCache(size_t max_bytes) : max_bytes_(max_bytes) {}

  // Keeps `journal`, committed under lease `token`, replacing what was kept for `id`.
  void put(const std::string& id, int64_t token, std::vector<JournalEntry> journal);
  // The journal kept for `id` if `claim_token` is the first claim after the one it was stamped
  // with; the entry is removed in any case (the new execution owns the journal now).
  std::optional<std::vector<JournalEntry>> take(const std::string& id, int64_t claim_token);
  void erase(const std::string& id);

  size_t bytes() const;
  size_t size() const;

 private:
  struct Entry {
    std::string id;
    int64_t token = 0;
    size_t bytes = 0;
    std::vector<JournalEntry> journal;
  };
  static size_t sizeOf(const std::vector<JournalEntry>& journal);
  void eraseLocked(std::unordered_map<std::string, std::list<Entry>::iterator>::iterator it);

  const size_t max_bytes_;
  mutable std::mutex mutex_;
  std::list<Entry> lru_;  // most recently stored first
  std::unordered_map<std::string, std::list<Entry>::iterator> by_id_;
  size_t bytes_ = 0;
};

}  // namespace krane::workflow
