#include "controlplane/feed/single_type_table.h"

#include "common/status.h"
#include "common/strings.h"

namespace krane::feed {

absl::StatusOr<std::optional<RowInfo>> SingleTypeTable::lock(db::Connection& conn,
                                                             const ResourceKey& key) const {
  const std::string sql = strCat(
      "SELECT region_id, version, deleted_at IS NOT NULL AS deleted FROM ", table_, " WHERE ",
      id_column_, " = ?", unique_per_region_ ? " AND region_id = ?" : "", " FOR UPDATE");
  db::Params params = {key.id};
  if (unique_per_region_) params.emplace_back(key.region);
  KRANE_ASSIGN_OR_RETURN(auto rows, conn.query(sql, params));
  if (rows.empty()) return std::optional<RowInfo>();
  const auto& row = rows.rows[0];
  return std::optional<RowInfo>(RowInfo{row.str(0), row.u64(1), row.i64(2) != 0});
}

absl::StatusOr<std::optional<StoredResource>> SingleTypeTable::load(db::Connection& conn,
                                                                    const ResourceKey& key) const {
  KRANE_ASSIGN_OR_RETURN(
      auto rows, conn.query(strCat("SELECT ", columns_, " FROM ", table_, " WHERE ", id_column_,
                                   " = ? AND region_id = ?"),
                            {key.id, key.region}));
  if (rows.empty()) return std::optional<StoredResource>();
  KRANE_ASSIGN_OR_RETURN(Resource resource, decode(rows.rows[0]));
  return std::optional<StoredResource>(
      StoredResource{std::move(resource), !rows.rows[0].isNull("deleted_at")});
}

absl::StatusOr<std::vector<Resource>> SingleTypeTable::list(db::Connection& conn,
                                                            std::string_view region,
                                                            std::string_view type,
                                                            const ListCursor& after,
                                                            size_t limit) const {
  std::vector<Resource> out;
  // One type per table: listing order (type, region, id) is (region, id) here.
  if (!type.empty() && type != type_) return out;
  if (after.type > type_) return out;
  // Read page after page from the (region_id, id) index. The cursor's comparison is spelled
  // out, since a row comparison gets no index range.
  std::string sql = strCat("SELECT ", columns_, " FROM ", table_, " WHERE deleted_at IS NULL");
  db::Params params;
  if (!region.empty()) {
    if (after.type == type_ && after.region > region) return out;
    strAppend(&sql, " AND region_id = ?");
    params.emplace_back(region);
    if (after.type == type_ && after.region == region) {
      strAppend(&sql, " AND ", id_column_, " > ?");
      params.emplace_back(after.id);
    }
  } else if (after.type == type_) {
    strAppend(&sql, " AND (region_id > ? OR (region_id = ? AND ", id_column_, " > ?))");
    params.insert(params.end(), {after.region, after.region, after.id});
  }
  strAppend(&sql, " ORDER BY region_id, ", id_column_, " LIMIT ?");
  params.emplace_back(static_cast<uint64_t>(limit));
  KRANE_RETURN_IF_ERROR(conn.queryEach(sql, params, [&](const db::Row& row) -> absl::Status {
    KRANE_ASSIGN_OR_RETURN(Resource resource, decode(row));
    out.push_back(std::move(resource));
    return absl::OkStatus();
  }));
  return out;
}

absl::StatusOr<uint64_t> SingleTypeTable::purgeDeleted(db::Connection& conn, int64_t cutoff_ms,
                                                       size_t limit) const {
  return conn.exec(
      strCat("DELETE FROM ", table_, " WHERE deleted_at IS NOT NULL AND deleted_at < ? LIMIT ?"),
      {cutoff_ms, static_cast<uint64_t>(limit)});
}

absl::Status SingleTypeTable::markDeleted(db::Connection& conn, const ResourceKey& key,
                                          uint64_t version, int64_t now_ms) const {
  return conn
      .exec(strCat("UPDATE ", table_, " SET deleted_at = ?, updated_at = ?, version = ? WHERE ",
                   id_column_, " = ? AND region_id = ?"),
            {now_ms, now_ms, version, key.id, key.region})
      .status();
}

}  // namespace krane::feed
