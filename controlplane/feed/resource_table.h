// How each resource type is stored: one ResourceTable per state table.
//
// The writer (writer.h) is the only caller of the mutating methods; everything else reads.
// Implementations hold no state and are shared by all threads; every method runs on the
// connection it is given, inside the caller's transaction when there is one.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "controlplane/db/connection.h"
#include "krane/cluster/v1/state.pb.h"

namespace krane::feed {

using cluster::v1::Resource;

// Names of the resource types the core knows; any other type is a generic resource.
inline constexpr std::string_view kDeploymentTopology = "deployment_topology";
inline constexpr std::string_view kSentinel = "sentinel";
inline constexpr std::string_view kCiliumNetworkPolicy = "cilium_network_policy";

struct ResourceKey {
  std::string type;
  std::string id;
  std::string region;
};

// What the writer needs to know about the row a key occupies.
struct RowInfo {
  std::string region;
  uint64_t version = 0;
  bool deleted = false;
};

struct StoredResource {
  Resource resource;  // version set; kind set (for deleted rows too)
  bool deleted = false;
};

// A position in a listing: rows strictly after (type, region, id).
struct ListCursor {
  std::string region;
  std::string type;
  std::string id;
};

class ResourceTable {
 public:
  virtual ~ResourceTable() = default;
  // Only the writer mutates state rows: it is what writes the change record in the same
  // transaction, so nothing else can forget to.
  friend class Writer;
  friend class WriteTx;
  // Tests of the tables reach write() and markDeleted() through a class of this name that the
  // test defines, with static functions forwarding to them.
  friend class ResourceTableTestPeer;

  // The type stored here; empty for the generic table, which stores every other type.
  virtual std::string_view type() const = 0;

  // Checks a resource for a put (type, id and region already checked by the caller). Fails with
  // INVALID_ARGUMENT naming the field, e.g. "sentinel.replicas: must be at most 100".
  virtual absl::Status validate(const Resource& resource) const = 0;

  // Locks (SELECT ... FOR UPDATE) and describes the row `key` occupies. For tables keyed by id
  // alone this is the row with that id in any region, so the writer can refuse a put that would
  // silently move a live resource to another region.
  virtual absl::StatusOr<std::optional<RowInfo>> lock(db::Connection& conn,
                                                      const ResourceKey& key) const = 0;

  // The row of `key` in its region, live or deleted.
  virtual absl::StatusOr<std::optional<StoredResource>> load(db::Connection& conn,
                                                             const ResourceKey& key) const = 0;

  // Live resources after `after` in (type, region, id) order, at most `limit`; `region` and
  // `type` filter when not empty. A full sync pages through a region with this.
  virtual absl::StatusOr<std::vector<Resource>> list(db::Connection& conn, std::string_view region,
                                                     std::string_view type, const ListCursor& after,
                                                     size_t limit) const = 0;

  // Removes rows deleted before `cutoff_ms`, at most `limit` of them; returns how many.
  virtual absl::StatusOr<uint64_t> purgeDeleted(db::Connection& conn, int64_t cutoff_ms,
                                                size_t limit) const = 0;

 protected:
  // Inserts or replaces the row of `resource` as live, at `version`.
  virtual absl::Status write(db::Connection& conn, const Resource& resource, uint64_t version,
                             int64_t now_ms) const = 0;

  // Marks the row deleted at `version`; the row stays so the delete can be streamed.
  virtual absl::Status markDeleted(db::Connection& conn, const ResourceKey& key, uint64_t version,
                                   int64_t now_ms) const = 0;
};

// Common checks shared by the tables: ids are 1-64 of [A-Za-z0-9._:-], and the like.
absl::Status checkId(std::string_view field, std::string_view value);
absl::Status checkNotEmpty(std::string_view field, std::string_view value, size_t max_size);
absl::Status checkMax(std::string_view field, uint64_t value, uint64_t max);
// An HTTP probe of a deployment or a sentinel: a path starting with '/', bounded numbers.
absl::Status checkProbe(std::string_view field, const cluster::v1::HttpProbe& probe, bool liveness);

// The tables of the core, and the generic table for every other type.
class ResourceTables {
 public:
  ResourceTables();
  // The table storing `type` (the generic one for unknown types).
  const ResourceTable& forType(std::string_view type) const;
  // All tables, typed ones first, generic last.
  const std::vector<std::unique_ptr<ResourceTable>>& all() const { return tables_; }

 private:
  std::vector<std::unique_ptr<ResourceTable>> tables_;
};

}  // namespace krane::feed
