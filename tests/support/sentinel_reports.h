// Standing in for agents that run sentinels: the reports they send once a sentinel runs as the
// database now describes it. No Catch2 macros, so that threads playing a fleet can call them.
#pragma once

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/clock.h"
#include "controlplane/db/pool.h"
#include "controlplane/ingest/ingestor.h"
#include "krane/cluster/v1/cluster.pb.h"

namespace krane::testing {

// The report of sentinel `id` running its desired image and replicas, at the version stored,
// healthy or not; nullopt when it cannot be read.
inline std::optional<cluster::v1::ReportSentinelStatusRequest> sentinelReport(db::Pool& pool,
                                                                              const std::string& id,
                                                                              bool healthy) {
  auto conn = pool.acquire();
  if (!conn.ok()) return std::nullopt;
  auto rows = (*conn)->query(
      "SELECT region_id, image, replicas, version FROM sentinels WHERE id = ?", {id});
  if (!rows.ok() || rows->empty()) return std::nullopt;
  const db::Row& row = rows->rows[0];
  const auto replicas = static_cast<uint32_t>(row.u64("replicas"));
  cluster::v1::ReportSentinelStatusRequest r;
  r.set_sentinel_id(id);
  r.set_region(row.str("region_id"));
  r.set_running_image(row.str("image"));
  r.set_available_replicas(healthy ? replicas : 0);
  r.set_updated_replicas(replicas);
  r.set_ready_replicas(healthy ? replicas : 0);
  r.set_observed_generation(static_cast<int64_t>(row.u64("version")));
  r.set_applied_version(row.u64("version"));
  r.set_health(healthy ? cluster::v1::SENTINEL_HEALTH_HEALTHY
                       : cluster::v1::SENTINEL_HEALTH_UNHEALTHY);
  r.set_agent_id("agent-" + row.str("region_id"));
  r.set_observed_at_ms(unixMillis());
  return r;
}

// The sentinels in `progressing` (of `region`; of all regions when empty), at most 1,000.
inline std::vector<std::string> progressingSentinels(db::Pool& pool,
                                                     const std::string& region = "") {
  std::vector<std::string> ids;
  auto conn = pool.acquire();
  if (!conn.ok()) return ids;
  auto rows = (*conn)->query(
      "SELECT id FROM sentinels WHERE deploy_status = 'progressing' AND (? = '' OR"
      " region_id = ?) ORDER BY id LIMIT 1000",
      {region, region});
  if (!rows.ok()) return ids;
  for (const db::Row& row : rows->rows) ids.push_back(row.str(0));
  return ids;
}

// Reports every sentinel in `progressing` (of `region`; of all regions when empty), healthy
// unless in `failing`. Returns how many reports were accepted.
inline int settleSentinels(db::Pool& pool, ingest::Ingestor& ingestor,
                           const std::string& region = "",
                           const std::set<std::string>& failing = {}) {
  int accepted = 0;
  for (const auto& id : progressingSentinels(pool, region)) {
    auto r = sentinelReport(pool, id, failing.count(id) == 0);
    if (r && ingestor.reportSentinelStatus(r->region(), *r).ok()) ++accepted;
  }
  return accepted;
}

}  // namespace krane::testing
