// Reads committed changes of a region with the current state of each changed resource.
// Shared by the tailer (for every stream of this replica) and by a stream catching up.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "controlplane/db/connection.h"
#include "controlplane/feed/hub.h"
#include "controlplane/feed/resource_table.h"

namespace krane::feed {

// The changes of `region` with versions in (after, through], at most `limit` of them, as watch
// events. Each resource is loaded once per call; an event carries the resource as it is now
// (APPLY if it is live, DELETE if not), so a later state may arrive early, never an older one.
// `batch.through` is the last version read (less than `through` when `limit` cut it short).
// OUT_OF_RANGE when a version in the range is missing (pruned): the reader must resync.
absl::StatusOr<EventBatch> readChanges(db::Connection& conn, const ResourceTables& tables,
                                       const std::string& region, uint64_t after, uint64_t through,
                                       size_t limit);

// Builds the event for one resource as it is stored now.
std::shared_ptr<const WatchEvent> makeChangeEvent(uint64_t version, const ResourceKey& key,
                                                  const std::optional<StoredResource>& stored);

}  // namespace krane::feed
