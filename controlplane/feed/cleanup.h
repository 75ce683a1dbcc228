// Deletes change rows older than the TTL, in batches, and remembers per region how far it went
// (region_versions.pruned_version) so that a cursor older than that is told to resync instead
// of silently missing changes. Also removes soft-deleted state rows older than the TTL: an agent
// that could still need their delete events resyncs anyway.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

#include "absl/status/statusor.h"
#include "controlplane/db/pool.h"
#include "controlplane/feed/resource_table.h"

namespace krane::feed {

struct CleanupOptions {
  std::chrono::seconds ttl{7 * 24 * 3600};
  std::chrono::seconds interval{60};
  size_t batch = 10000;  // rows per DELETE, at most 10,000
};

struct CleanupResult {
  uint64_t changes_deleted = 0;
  uint64_t rows_purged = 0;
};

class Cleanup {
 public:
  Cleanup(std::shared_ptr<db::Pool> pool, std::shared_ptr<const ResourceTables> tables,
          CleanupOptions options);
  ~Cleanup();
  void start();
  void stop();
  // One full pass: every region, batch after batch, until nothing older than the TTL is left.
  absl::StatusOr<CleanupResult> runOnce(std::chrono::system_clock::time_point now);

 private:
  std::shared_ptr<db::Pool> pool_;
  std::shared_ptr<const ResourceTables> tables_;
  CleanupOptions options_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace krane::feed
