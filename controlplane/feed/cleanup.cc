#include "controlplane/feed/cleanup.h"

#include <algorithm>

#include "common/status.h"
#include "common/strings.h"
#include "spdlog/spdlog.h"

namespace krane::feed {

Cleanup::Cleanup(std::shared_ptr<db::Pool> pool, std::shared_ptr<const ResourceTables> tables,
                 CleanupOptions options)
    : pool_(std::move(pool)), tables_(std::move(tables)), options_(options) {
  options_.batch = std::clamp<size_t>(options_.batch, 1, 10000);
}

Cleanup::~Cleanup() { stop(); }

void Cleanup::start() {
  thread_ = std::thread([this] {
    std::unique_lock lock(mutex_);
    while (!stopping_) {
      lock.unlock();
      auto result = runOnce(std::chrono::system_clock::now());
      if (!result.ok()) {
        spdlog::warn("feed: cleanup failed: {}", result.status().message());
      } else if (result->changes_deleted + result->rows_purged > 0) {
        spdlog::info("feed: cleanup deleted {} change rows and {} deleted resources",
                     result->changes_deleted, result->rows_purged);
      }
      lock.lock();
      wake_.wait_for(lock, options_.interval, [&] { return stopping_; });
    }
  });
}

void Cleanup::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

absl::StatusOr<CleanupResult> Cleanup::runOnce(std::chrono::system_clock::time_point now) {
  const int64_t cutoff =
      std::chrono::duration_cast<std::chrono::milliseconds>((now - options_.ttl).time_since_epoch())
          .count();
  CleanupResult result;
  std::vector<std::string> regions;
  {
    KRANE_ASSIGN_OR_RETURN(auto conn, pool_->acquire());
    KRANE_RETURN_IF_ERROR(
        conn->queryEach("SELECT region_id FROM region_versions", {}, [&](const db::Row& row) {
          regions.push_back(row.str(0));
          return absl::OkStatus();
        }));
  }
  for (const std::string& region : regions) {
    for (;;) {
      // The pruned range is always a prefix of the region's versions. Each round: find how many
      // of the oldest changes (at most one batch) are older than the TTL, without locking; record
      // the new boundary first (one short UPDATE of the counter row, which writers of the region
      // need too), so that a reader behind it is told to resync rather than find rows missing;
      // then delete those rows in their own transaction, which locks only them.
      KRANE_ASSIGN_OR_RETURN(auto conn, pool_->acquire());
      KRANE_ASSIGN_OR_RETURN(
          auto head,
          conn->query("SELECT pruned_version FROM region_versions WHERE region_id = ?", {region}));
      if (head.empty()) break;
      const uint64_t pruned = head.rows[0].u64(0);
      uint64_t boundary = pruned;
      const absl::Status scan = conn->queryEach(
          "SELECT version, created_at FROM resource_changes WHERE region_id = ? AND version > ?"
          " ORDER BY version LIMIT ?",
          {region, pruned, static_cast<uint64_t>(options_.batch)}, [&](const db::Row& row) {
            if (row.i64(1) >= cutoff)
              return absl::CancelledError("first change younger than the TTL");
            boundary = row.u64(0);
            return absl::OkStatus();
          });
      if (!scan.ok() && !absl::IsCancelled(scan)) return scan;
      if (boundary > pruned) {
        KRANE_RETURN_IF_ERROR(
            conn->exec("UPDATE region_versions SET pruned_version = GREATEST(pruned_version, ?)"
                       " WHERE region_id = ?",
                       {boundary, region})
                .status());
      }
      // Everything up to the recorded boundary goes, including what an interrupted earlier round
      // recorded but did not delete.
      KRANE_ASSIGN_OR_RETURN(
          auto recorded,
          conn->query("SELECT pruned_version FROM region_versions WHERE region_id = ?", {region}));
      const uint64_t upto = recorded.empty() ? 0 : recorded.rows[0].u64(0);
      uint64_t deleted = 0;
      for (;;) {
        KRANE_ASSIGN_OR_RETURN(
            const uint64_t n,
            conn->exec("DELETE FROM resource_changes WHERE region_id = ? AND version <= ?"
                       " ORDER BY version LIMIT ?",
                       {region, upto, static_cast<uint64_t>(options_.batch)}));
        deleted += n;
        if (n < options_.batch) break;
      }
      result.changes_deleted += deleted;
      if (boundary == pruned || boundary - pruned < options_.batch) break;
    }
  }
  for (const auto& table : tables_->all()) {
    for (;;) {
      KRANE_ASSIGN_OR_RETURN(auto conn, pool_->acquire());
      KRANE_ASSIGN_OR_RETURN(auto purged, table->purgeDeleted(*conn, cutoff, options_.batch));
      result.rows_purged += purged;
      if (purged < options_.batch) break;
    }
  }
  return result;
}

}  // namespace krane::feed
