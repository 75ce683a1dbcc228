#include "controlplane/feed/change_reader.h"

#include <map>

#include "common/status.h"
#include "common/strings.h"
#include "controlplane/feed/encoded_event.h"

namespace krane::feed {

std::shared_ptr<const WatchEvent> makeChangeEvent(uint64_t version, const ResourceKey& key,
                                                  const std::optional<StoredResource>& stored) {
  auto event = std::make_shared<WatchEvent>();
  auto* change = event->mutable_change();
  change->set_version(version);
  if (stored && !stored->deleted) {
    change->set_op(cluster::v1::CHANGE_OP_APPLY);
    *change->mutable_resource() = stored->resource;
  } else {
    change->set_op(cluster::v1::CHANGE_OP_DELETE);
    auto* r = change->mutable_resource();
    r->set_type(key.type);
    r->set_id(key.id);
    r->set_region(key.region);
    r->set_version(stored ? stored->resource.version() : version);
  }
  return event;
}

absl::StatusOr<EventBatch> readChanges(db::Connection& conn, const ResourceTables& tables,
                                       const std::string& region, uint64_t after, uint64_t through,
                                       size_t limit) {
  struct Row {
    uint64_t version;
    ResourceKey key;
    std::string op;
    int64_t committed_ms;
  };
  std::vector<Row> rows;
  KRANE_RETURN_IF_ERROR(conn.queryEach(
      "SELECT version, resource_type, resource_id, op, created_at FROM resource_changes"
      " WHERE region_id = ? AND version > ? AND version <= ? ORDER BY version LIMIT ?",
      {region, after, through, static_cast<uint64_t>(limit)}, [&](const db::Row& row) {
        rows.push_back(
            Row{row.u64(0), ResourceKey{row.str(1), row.str(2), region}, row.str(3), row.i64(4)});
        return absl::OkStatus();
      }));
  EventBatch batch;
  batch.region = region;
  batch.after = after;
  batch.through = after;
  uint64_t expected = after + 1;
  for (const Row& row : rows) {
    if (row.version != expected) {
      return absl::OutOfRangeError(strCat("changes of region ", region, " from version ", expected,
                                          " are no longer available (pruned)"));
    }
    ++expected;
  }
  if (rows.empty() && through > after) {
    // Nothing in a range that should hold changes: they were pruned.
    return absl::OutOfRangeError(strCat("changes of region ", region, " after version ", after,
                                        " are no longer available (pruned)"));
  }
  std::map<std::pair<std::string, std::string>, std::optional<StoredResource>> loaded;
  for (const Row& row : rows) {
    auto key = std::make_pair(row.key.type, row.key.id);
    if (loaded.count(key) == 0) {
      KRANE_ASSIGN_OR_RETURN(loaded[key], tables.forType(row.key.type).load(conn, row.key));
    }
  }
  batch.events.reserve(rows.size());
  for (const Row& row : rows) {
    const auto& stored = loaded[std::make_pair(row.key.type, row.key.id)];
    auto event = makeChangeEvent(row.version, row.key, stored);
    grpc::Slice wire = encodeEvent(*event);
    batch.events.push_back(FeedEvent{row.version, row.key.type, std::move(event), row.op,
                                     row.committed_ms, std::move(wire)});
    batch.through = row.version;
  }
  return batch;
}

}  // namespace krane::feed
