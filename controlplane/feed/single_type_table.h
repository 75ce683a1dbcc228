// The SQL shared by the tables that hold one resource type each (deployment_topology, sentinels,
// cilium_network_policies): locking, loading, scanning, listing, deleting and purging by
// (id column, region_id) with `version` and `deleted_at` columns. A subclass names its table and
// columns, decodes a row, and keeps its own validation and write.
#pragma once

#include <string>
#include <string_view>

#include "controlplane/feed/resource_table.h"

namespace krane::feed {

class SingleTypeTable : public ResourceTable {
 public:
  std::string_view type() const override { return type_; }
  absl::StatusOr<std::optional<RowInfo>> lock(db::Connection& conn,
                                              const ResourceKey& key) const override;
  absl::StatusOr<std::optional<StoredResource>> load(db::Connection& conn,
                                                     const ResourceKey& key) const override;
  absl::StatusOr<std::vector<Resource>> list(db::Connection& conn, std::string_view region,
                                             std::string_view type, const ListCursor& after,
                                             size_t limit) const override;
  absl::StatusOr<uint64_t> purgeDeleted(db::Connection& conn, int64_t cutoff_ms,
                                        size_t limit) const override;

 protected:
  // `columns` must include `deleted_at`. With `unique_per_region`, the id repeats across regions
  // (a deployment has one topology per region); otherwise an id is unique across all of them.
  SingleTypeTable(std::string_view type, std::string_view table, std::string_view id_column,
                  std::string_view columns, bool unique_per_region)
      : type_(type),
        table_(table),
        id_column_(id_column),
        columns_(columns),
        unique_per_region_(unique_per_region) {}

  // The resource of one row of `columns`, envelope and kind filled in.
  virtual absl::StatusOr<Resource> decode(const db::Row& row) const = 0;

  absl::Status markDeleted(db::Connection& conn, const ResourceKey& key, uint64_t version,
                           int64_t now_ms) const override;

 private:
  std::string type_;
  std::string table_;
  std::string id_column_;
  std::string columns_;
  bool unique_per_region_;
};

}  // namespace krane::feed
