#include "controlplane/feed/writer.h"

#include <algorithm>
#include <chrono>
#include <map>

#include "common/clock.h"
#include "common/status.h"
#include "common/strings.h"
#include "spdlog/spdlog.h"

namespace krane::feed {
namespace {

constexpr size_t kChangeRowsPerInsert = 50;

}  // namespace

absl::Status checkType(std::string_view field, std::string_view type) {
  if (type.empty()) return absl::InvalidArgumentError(strCat(field, ": required"));
  if (type.size() > 64) return absl::InvalidArgumentError(strCat(field, ": at most 64 characters"));
  const bool ok = std::all_of(type.begin(), type.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-' || c == '/';
  });
  if (!ok) {
    return absl::InvalidArgumentError(strCat(
        field, ": ", quote(type), " may only contain letters, digits, '.', '_', '-' and '/'"));
  }
  return absl::OkStatus();
}

absl::Status checkResourceKey(std::string_view field, const ResourceKey& key) {
  KRANE_RETURN_IF_ERROR(checkType(strCat(field, ".type"), key.type));
  KRANE_RETURN_IF_ERROR(checkId(strCat(field, ".id"), key.id));
  return checkId(strCat(field, ".region"), key.region);
}

absl::Status WriteTx::checkRegion(const std::string& region) {
  if (std::find(known_regions_.begin(), known_regions_.end(), region) != known_regions_.end()) {
    return absl::OkStatus();
  }
  KRANE_ASSIGN_OR_RETURN(auto rows, conn_.query("SELECT 1 FROM regions WHERE id = ?", {region}));
  if (rows.empty()) {
    return absl::NotFoundError(strCat("region ", quote(region),
                                      " is not registered (add it with `krane-ctrl region add ",
                                      region, "`)"));
  }
  known_regions_.push_back(region);
  return absl::OkStatus();
}

absl::Status WriteTx::put(const Resource& resource, uint64_t expected_version) {
  const ResourceKey key{resource.type(), resource.id(), resource.region()};
  KRANE_RETURN_IF_ERROR(checkResourceKey("resource", key));
  const ResourceTable& table = tables_.forType(key.type);
  KRANE_RETURN_IF_ERROR(table.validate(resource));
  KRANE_RETURN_IF_ERROR(checkRegion(key.region));
  KRANE_ASSIGN_OR_RETURN(auto row, table.lock(conn_, key));
  if (row && !row->deleted && row->region != key.region) {
    return absl::FailedPreconditionError(
        strCat(key.type, " ", quote(key.id), " exists in region ", quote(row->region),
               "; delete it there before putting it in ", quote(key.region)));
  }
  const bool live = row && !row->deleted && row->region == key.region;
  if (expected_version != 0 && (!live || row->version != expected_version)) {
    return absl::AbortedError(strCat(key.type, " ", quote(key.id), " is at version ",
                                     live ? row->version : 0, ", not the expected ",
                                     expected_version));
  }
  Pending pending{&table, resource, false, !live};
  pending.resource.set_version(0);
  pending_.push_back(std::move(pending));
  return absl::OkStatus();
}

absl::StatusOr<bool> WriteTx::update(const ResourceKey& key,
                                     const std::function<bool(Resource&)>& change) {
  KRANE_RETURN_IF_ERROR(checkResourceKey("resource", key));
  KRANE_ASSIGN_OR_RETURN(auto stored, tables_.forType(key.type).load(conn_, key));
  if (!stored || stored->deleted) return false;
  Resource next = stored->resource;
  if (!change(next)) return false;
  KRANE_RETURN_IF_ERROR(put(next, stored->resource.version()));
  return true;
}

absl::Status purgeStatus(db::Connection& conn, const ResourceKey& key) {
  if (key.type == kDeploymentTopology) {
    KRANE_RETURN_IF_ERROR(conn.exec("DELETE FROM instances WHERE deployment_id = ? AND"
                                    " region_id = ?",
                                    {key.id, key.region})
                              .status());
  }
  return conn
      .exec(
          "DELETE FROM resource_status WHERE region_id = ? AND resource_type = ? AND"
          " resource_id = ?",
          {key.region, key.type, key.id})
      .status();
}

absl::Status WriteTx::remove(const ResourceKey& key, uint64_t expected_version) {
  KRANE_RETURN_IF_ERROR(checkResourceKey("resource", key));
  const ResourceTable& table = tables_.forType(key.type);
  KRANE_ASSIGN_OR_RETURN(auto row, table.lock(conn_, key));
  if (!row || row->deleted || row->region != key.region) {
    return absl::NotFoundError(
        strCat(key.type, " ", quote(key.id), " does not exist in region ", quote(key.region)));
  }
  if (expected_version != 0 && row->version != expected_version) {
    return absl::AbortedError(strCat(key.type, " ", quote(key.id), " is at version ", row->version,
                                     ", not the expected ", expected_version));
  }
  // What agents reported about it goes with it (before the version counter is locked).
  KRANE_RETURN_IF_ERROR(purgeStatus(conn_, key));
  Pending pending{&table, Resource(), true, false};
  pending.resource.set_type(key.type);
  pending.resource.set_id(key.id);
  pending.resource.set_region(key.region);
  pending_.push_back(std::move(pending));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<WriteResult>> WriteTx::commitChanges(int64_t now_ms) {
  std::vector<WriteResult> results;
  if (pending_.empty()) return results;
  // Versions last: regions in a fixed order (no deadlock between two multi-region writers),
  // one counter statement per region, holding each counter's lock only until COMMIT.
  std::map<std::string, std::vector<size_t>> by_region;
  for (size_t i = 0; i < pending_.size(); ++i)
    by_region[pending_[i].resource.region()].push_back(i);
  std::vector<uint64_t> versions(pending_.size());
  for (const auto& [region, indexes] : by_region) {
    const uint64_t count = indexes.size();
    KRANE_RETURN_IF_ERROR(
        conn_
            .exec("INSERT INTO region_versions (region_id, version) VALUES (?, LAST_INSERT_ID(?))"
                  " ON DUPLICATE KEY UPDATE version = LAST_INSERT_ID(version + ?)",
                  {region, count, count})
            .status());
    const uint64_t last = conn_.lastInsertId();
    if (last < count) {
      return absl::InternalError(
          strCat("region_versions returned version ", last, " for ", count, " changes"));
    }
    for (size_t k = 0; k < count; ++k) versions[indexes[k]] = last - count + 1 + k;
  }
  for (size_t i = 0; i < pending_.size(); ++i) {
    Pending& p = pending_[i];
    p.resource.set_version(versions[i]);
    if (p.remove) {
      KRANE_RETURN_IF_ERROR(p.table->markDeleted(
          conn_, ResourceKey{p.resource.type(), p.resource.id(), p.resource.region()}, versions[i],
          now_ms));
    } else {
      KRANE_RETURN_IF_ERROR(p.table->write(conn_, p.resource, versions[i], now_ms));
    }
  }
  for (size_t start = 0; start < pending_.size(); start += kChangeRowsPerInsert) {
    const size_t end = std::min(pending_.size(), start + kChangeRowsPerInsert);
    std::string sql =
        "INSERT INTO resource_changes (region_id, resource_type, resource_id, op, version, "
        "created_at) VALUES ";
    db::Params params;
    for (size_t i = start; i < end; ++i) {
      strAppend(&sql, i == start ? "" : ", ", "(?, ?, ?, ?, ?, ?)");
      const Pending& p = pending_[i];
      params.insert(params.end(), {p.resource.region(), p.resource.type(), p.resource.id(),
                                   p.remove ? "delete" : "apply", versions[i], now_ms});
    }
    KRANE_RETURN_IF_ERROR(conn_.exec(sql, params).status());
  }
  for (const Pending& p : pending_) {
    results.push_back(WriteResult{p.resource, p.resource.version(), p.created, p.remove});
  }
  return results;
}

Writer::Writer(std::shared_ptr<db::Pool> pool, std::shared_ptr<const ResourceTables> tables)
    : pool_(std::move(pool)), tables_(std::move(tables)) {}

void Writer::onCommit(std::function<void(const std::vector<std::string>&)> listener) {
  listeners_.push_back(std::move(listener));
}

absl::StatusOr<std::vector<WriteResult>> Writer::transact(
    std::string_view name, const std::function<absl::Status(WriteTx&)>& body) {
  std::vector<WriteResult> results;
  db::TxOptions options;
  options.isolation = db::Isolation::kReadCommitted;
  KRANE_RETURN_IF_ERROR(pool_->transact(
      name,
      [&](db::Connection& conn) -> absl::Status {
        KRANE_ASSIGN_OR_RETURN(results, transactIn(conn, body));
        return absl::OkStatus();
      },
      options));
  committed(results);
  return results;
}

absl::StatusOr<std::vector<WriteResult>> Writer::transactIn(
    db::Connection& conn, const std::function<absl::Status(WriteTx&)>& body) {
  WriteTx tx(conn, *tables_);
  KRANE_RETURN_IF_ERROR(body(tx));
  return tx.commitChanges(unixMillis());
}

void Writer::committed(const std::vector<WriteResult>& results) {
  for (const auto& r : results) {
    spdlog::debug("feed: committed op={} region={} type={} id={} version={}",
                  r.deleted ? "delete" : "apply", r.resource.region(), r.resource.type(),
                  r.resource.id(), r.version);
  }
  if (results.empty()) return;
  std::vector<std::string> regions;
  for (const auto& r : results) {
    if (std::find(regions.begin(), regions.end(), r.resource.region()) == regions.end()) {
      regions.push_back(r.resource.region());
    }
  }
  for (const auto& listener : listeners_) listener(regions);
}

absl::StatusOr<WriteResult> Writer::put(const Resource& resource, uint64_t expected_version) {
  std::vector<WriteResult> results;
  db::TxOptions options;
  options.isolation = db::Isolation::kReadCommitted;
  KRANE_RETURN_IF_ERROR(pool_->transact(
      "put",
      [&](db::Connection& conn) -> absl::Status {
        KRANE_ASSIGN_OR_RETURN(results, transactIn(conn, [&](WriteTx& tx) {
                                 return tx.put(resource, expected_version);
                               }));
        // The resource as the table stores it (what a read returns), from the same transaction.
        const ResourceKey key{resource.type(), resource.id(), resource.region()};
        KRANE_ASSIGN_OR_RETURN(auto stored, tables_->forType(key.type).load(conn, key));
        if (!stored || stored->deleted) {
          return absl::InternalError(strCat(key.type, " ", quote(key.id), " was not stored"));
        }
        results.at(0).resource = std::move(stored->resource);
        return absl::OkStatus();
      },
      options));
  committed(results);
  return results.at(0);
}

absl::StatusOr<WriteResult> Writer::remove(const ResourceKey& key, uint64_t expected_version) {
  KRANE_ASSIGN_OR_RETURN(auto results, transact("delete", [&](WriteTx& tx) {
                           return tx.remove(key, expected_version);
                         }));
  return results.at(0);
}

}  // namespace krane::feed
