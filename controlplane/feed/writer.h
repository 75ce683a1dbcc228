// The one way to change desired state. Every put or delete writes the state row and its change
// record in the same transaction, with a version from its region's counter.
//
// Versions: each region has a counter row in `region_versions`. A transaction increments it
// (by the number of changes it makes in that region) after its other statements, just before
// COMMIT. The row lock is held until COMMIT, so no other transaction of that region can take a
// higher version and commit first: versions become visible in order, without holes. A reader
// that has seen version N of a region has seen every change up to N. See docs/change-feed.md.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "controlplane/db/pool.h"
#include "controlplane/feed/resource_table.h"

namespace krane::feed {

struct WriteResult {
  Resource resource;  // as stored, version set (type/id/region only for a delete)
  uint64_t version = 0;
  bool created = false;  // a put of a resource that did not exist (or was deleted)
  bool deleted = false;  // a delete
};

// The mutations of one transaction. Obtained from Writer::transact; valid only inside it.
class WriteTx {
 public:
  // Queues a put. Validates the resource (INVALID_ARGUMENT naming the field), checks the
  // region (NOT_FOUND), and `expected_version` when not 0 (ABORTED on mismatch).
  absl::Status put(const Resource& resource, uint64_t expected_version = 0);
  // Queues a delete. NOT_FOUND when the resource does not exist or is already deleted.
  absl::Status remove(const ResourceKey& key, uint64_t expected_version = 0);
  // Loads the stored resource at `key` and, when it exists (not deleted) and `change` returns
  // true for it, queues a put of the changed resource at the version it was loaded at. Returns
  // whether it queued one: a resource that is gone, or that `change` leaves alone, is no error.
  absl::StatusOr<bool> update(const ResourceKey& key, const std::function<bool(Resource&)>& change);
  // The transaction's connection, for rows of the caller's own that must commit together with
  // the changes (never for state tables: use put/remove).
  db::Connection& connection() { return conn_; }

 private:
  friend class Writer;
  struct Pending {
    const ResourceTable* table;
    Resource resource;  // full for a put; type/id/region for a delete
    bool remove = false;
    bool created = false;
  };
  WriteTx(db::Connection& conn, const ResourceTables& tables) : conn_(conn), tables_(tables) {}
  absl::Status checkRegion(const std::string& region);
  absl::StatusOr<std::vector<WriteResult>> commitChanges(int64_t now_ms);

  db::Connection& conn_;
  const ResourceTables& tables_;
  std::vector<Pending> pending_;
  std::vector<std::string> known_regions_;
};

// Deletes what agents reported about a resource (its resource_status row, and the instances of
// a deployment_topology), on `conn`. The writer calls it when the resource is deleted; the
// ingestor when an agent reports it gone.
absl::Status purgeStatus(db::Connection& conn, const ResourceKey& key);

class Writer {
 public:
  Writer(std::shared_ptr<db::Pool> pool, std::shared_ptr<const ResourceTables> tables);

  // Runs `body` and then writes every queued change, in one retried transaction. Returns the
  // results in the order the mutations were queued.
  absl::StatusOr<std::vector<WriteResult>> transact(
      std::string_view name, const std::function<absl::Status(WriteTx&)>& body);

  // The same on `conn`, in a transaction the caller owns and commits: for a workflow step
  // (Context::runTx), whose changes then commit together with its journal entry, exactly once.
  // The region counters are taken last, and their row locks are held until the caller's COMMIT:
  // write nothing slow after this. After the caller committed, pass the results to committed().
  absl::StatusOr<std::vector<WriteResult>> transactIn(
      db::Connection& conn, const std::function<absl::Status(WriteTx&)>& body);
  // Tells the listeners (the tailer) about changes a caller committed.
  void committed(const std::vector<WriteResult>& results);

  // `resource` of the result is the resource as stored, read back in the same transaction: what
  // a read returns (ids the table fills in, version).
  absl::StatusOr<WriteResult> put(const Resource& resource, uint64_t expected_version = 0);
  absl::StatusOr<WriteResult> remove(const ResourceKey& key, uint64_t expected_version = 0);

  // Called after every commit with the regions it changed (the tailer uses it to wake up).
  // Listeners must be quick and must not throw; register them before writing starts.
  void onCommit(std::function<void(const std::vector<std::string>& regions)> listener);

  const ResourceTables& tables() const { return *tables_; }

 private:
  std::shared_ptr<db::Pool> pool_;
  std::shared_ptr<const ResourceTables> tables_;
  std::vector<std::function<void(const std::vector<std::string>&)>> listeners_;
};

// Checks the envelope of a resource (type, id, region) the way every entry point must.
absl::Status checkResourceKey(std::string_view field, const ResourceKey& key);
absl::Status checkType(std::string_view field, std::string_view type);

}  // namespace krane::feed
