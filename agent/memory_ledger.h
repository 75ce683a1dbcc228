// A ResourceLedger in memory, with the cursor store's semantics (recordApplied only raises, a
// full sync replaces). For tests and tools that need a dispatcher without a state directory.
#pragma once

#include <algorithm>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>

#include "agent/dispatcher.h"
#include "common/strings.h"

namespace krane::agent {

class MemoryLedger final : public ResourceLedger {
 public:
  bool shouldApply(const std::string& type, const std::string& id, uint64_t version) override {
    std::lock_guard lock(mutex_);
    auto it = applied_.find(key(type, id));
    return it == applied_.end() || version > it->second;
  }
  void recordApplied(const std::string& type, const std::string& id, uint64_t version) override {
    std::lock_guard lock(mutex_);
    auto& v = applied_[key(type, id)];
    v = std::max(v, version);
  }
  void recordSynced(const std::string& type, const std::string& id, uint64_t version) override {
    std::lock_guard lock(mutex_);
    applied_[key(type, id)] = version;
  }
  void retainOnly(const std::map<std::string, std::set<std::string>>& ids) override {
    std::lock_guard lock(mutex_);
    std::erase_if(applied_, [&](const auto& entry) {
      const auto slash = entry.first.find('\n');
      auto it = ids.find(entry.first.substr(0, slash));
      return it == ids.end() || it->second.count(entry.first.substr(slash + 1)) == 0;
    });
  }
  void forget(const std::string& type, const std::string& id) override {
    std::lock_guard lock(mutex_);
    applied_.erase(key(type, id));
  }
  void park(const std::string& type, const std::string& id, uint64_t version, int,
            const std::string& error) override {
    std::lock_guard lock(mutex_);
    parked_[key(type, id)] = strCat(version, ": ", error);
  }
  void unpark(const std::string& type, const std::string& id) override {
    std::lock_guard lock(mutex_);
    parked_.erase(key(type, id));
  }

  // "type\nid" -> last applied version
  std::map<std::string, uint64_t> applied() const {
    std::lock_guard lock(mutex_);
    return applied_;
  }
  std::optional<uint64_t> appliedVersion(const std::string& type, const std::string& id) const {
    std::lock_guard lock(mutex_);
    auto it = applied_.find(key(type, id));
    return it == applied_.end() ? std::nullopt : std::optional<uint64_t>(it->second);
  }
  // "type\nid" -> "version: error"
  std::map<std::string, std::string> parked() const {
    std::lock_guard lock(mutex_);
    return parked_;
  }
  static std::string key(const std::string& type, const std::string& id) {
    return strCat(type, "\n", id);
  }

 private:
  mutable std::mutex mutex_;
  std::map<std::string, uint64_t> applied_;
  std::map<std::string, std::string> parked_;
};

}  // namespace krane::agent
