#include "controlplane/workflow/journal_cache.h"

namespace krane::workflow {

size_t JournalCache::sizeOf(const std::vector<JournalEntry>& journal) {
  size_t n = sizeof(Entry) + 64;  // the entry, its list node and its map slot, roughly
  for (const JournalEntry& e : journal) {
    n += sizeof(JournalEntry) + e.kind.capacity() + e.name.capacity() +
         (e.payload ? e.payload->capacity() : 0) + e.error.message().size();
  }
  return n;
}

void JournalCache::eraseLocked(
    std::unordered_map<std::string, std::list<Entry>::iterator>::iterator it) {
  bytes_ -= it->second->bytes;
  lru_.erase(it->second);
  by_id_.erase(it);
}

void JournalCache::put(const std::string& id, int64_t token, std::vector<JournalEntry> journal) {
  const size_t bytes = sizeOf(journal);
  std::lock_guard lock(mutex_);
  if (auto it = by_id_.find(id); it != by_id_.end()) eraseLocked(it);
  if (bytes > max_bytes_) return;
  lru_.push_front(Entry{id, token, bytes, std::move(journal)});
  by_id_.emplace(id, lru_.begin());
  bytes_ += bytes;
  while (bytes_ > max_bytes_ && !lru_.empty()) eraseLocked(by_id_.find(lru_.back().id));
}

std::optional<std::vector<JournalEntry>> JournalCache::take(const std::string& id,
                                                            int64_t claim_token) {
  std::lock_guard lock(mutex_);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return std::nullopt;
  std::optional<std::vector<JournalEntry>> out;
  if (it->second->token + 1 == claim_token) out = std::move(it->second->journal);
  eraseLocked(it);
  return out;
}

void JournalCache::erase(const std::string& id) {
  std::lock_guard lock(mutex_);
  if (auto it = by_id_.find(id); it != by_id_.end()) eraseLocked(it);
}

size_t JournalCache::bytes() const {
  std::lock_guard lock(mutex_);
  return bytes_;
}

size_t JournalCache::size() const {
  std::lock_guard lock(mutex_);
  return lru_.size();
}

}  // namespace krane::workflow
