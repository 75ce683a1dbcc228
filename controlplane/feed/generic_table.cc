// Resources of plugin-declared types, in table `resources` (spec stored as opaque bytes).
#include "common/status.h"
#include "common/strings.h"
#include "controlplane/feed/tables.h"

namespace krane::feed {
namespace {

constexpr size_t kMaxSpecBytes = 1 << 20;
constexpr std::string_view kColumns =
    "type, id, region_id, workspace_id, spec, content_type, version, deleted_at";

Resource fromRow(const db::Row& row) {
  Resource r;
  r.set_type(row.str("type"));
  r.set_id(row.str("id"));
  r.set_region(row.str("region_id"));
  r.set_version(row.u64("version"));
  auto* g = r.mutable_generic();
  g->set_type(r.type());
  g->set_id(r.id());
  g->set_region(r.region());
  if (!row.isNull("workspace_id")) g->set_workspace_id(row.str("workspace_id"));
  g->set_spec(row.str("spec"));
  g->set_content_type(row.str("content_type"));
  return r;
}

class GenericTable final : public ResourceTable {
 public:
  std::string_view type() const override { return ""; }

  absl::Status validate(const Resource& r) const override {
    if (!r.has_generic()) {
      return absl::InvalidArgumentError(
          strCat("resource.generic: required for type ", quote(r.type())));
    }
    const auto& g = r.generic();
    if (!g.type().empty() && g.type() != r.type()) {
      return absl::InvalidArgumentError(strCat("resource.generic.type: ", quote(g.type()),
                                               " differs from resource.type ", quote(r.type())));
    }
    if (!g.id().empty() && g.id() != r.id()) {
      return absl::InvalidArgumentError("resource.generic.id: differs from resource.id");
    }
    if (!g.region().empty() && g.region() != r.region()) {
      return absl::InvalidArgumentError("resource.generic.region: differs from resource.region");
    }
    if (!g.workspace_id().empty())
      KRANE_RETURN_IF_ERROR(checkId("resource.generic.workspace_id", g.workspace_id()));
    if (g.spec().size() > kMaxSpecBytes) {
      return absl::InvalidArgumentError(strCat("resource.generic.spec: at most ", kMaxSpecBytes,
                                               " bytes, got ", g.spec().size()));
    }
    if (g.content_type().size() > 255) {
      return absl::InvalidArgumentError("resource.generic.content_type: at most 255 characters");
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::optional<RowInfo>> lock(db::Connection& conn,
                                              const ResourceKey& key) const override {
    KRANE_ASSIGN_OR_RETURN(auto rows,
                           conn.query("SELECT region_id, version, deleted_at IS NOT NULL AS deleted"
                                      " FROM resources WHERE type = ? AND id = ? FOR UPDATE",
                                      {key.type, key.id}));
    if (rows.empty()) return std::optional<RowInfo>();
    const auto& row = rows.rows[0];
    return std::optional<RowInfo>(RowInfo{row.str(0), row.u64(1), row.i64(2) != 0});
  }

  absl::StatusOr<std::optional<StoredResource>> load(db::Connection& conn,
                                                     const ResourceKey& key) const override {
    KRANE_ASSIGN_OR_RETURN(
        auto rows, conn.query(strCat("SELECT ", kColumns,
                                     " FROM resources WHERE type = ? AND id = ? AND region_id = ?"),
                              {key.type, key.id, key.region}));
    if (rows.empty()) return std::optional<StoredResource>();
    return std::optional<StoredResource>(
        StoredResource{fromRow(rows.rows[0]), !rows.rows[0].isNull("deleted_at")});
  }

  absl::StatusOr<std::vector<Resource>> list(db::Connection& conn, std::string_view region,
                                             std::string_view type, const ListCursor& after,
                                             size_t limit) const override {
    std::vector<Resource> out;
    std::string sql;
    db::Params params;
    if (!region.empty()) {
      // One region: (type, id) order, read from resources_region_list page after page. The
      // cursor's comparison is spelled out, since a row comparison gets no index range.
      // The index is named: at some cursors the optimizer would otherwise read the region from
      // its first row, or scan the primary key.
      sql = strCat("SELECT ", kColumns,
                   " FROM resources FORCE INDEX (resources_region_list) WHERE region_id = ? AND"
                   " deleted_at IS NULL");
      params = {region};
      if (!type.empty()) {
        strAppend(&sql, " AND type = ?");
        params.emplace_back(type);
      }
      if (after.region == region) {
        strAppend(&sql, " AND (type > ? OR (type = ? AND id > ?))");
        params.insert(params.end(), {after.type, after.type, after.id});
      } else if (after.region < region) {
        strAppend(&sql, " AND type >= ?");
        params.emplace_back(after.type);
      } else {
        strAppend(&sql, " AND type > ?");
        params.emplace_back(after.type);
      }
      strAppend(&sql, " ORDER BY type, id LIMIT ?");
    } else {
      // All regions: (type, region, id) order, read from resources_type_list page after page,
      // the cursor's comparison spelled out as for one region. The index is named: with a type
      // given, the optimizer would otherwise read the type from its first row (an equality on
      // the index's first column), past every row before the cursor, instead of the range.
      sql = strCat("SELECT ", kColumns,
                   " FROM resources FORCE INDEX (resources_type_list) WHERE deleted_at IS NULL");
      if (!type.empty()) {
        strAppend(&sql, " AND type = ?");
        params.emplace_back(type);
      }
      strAppend(&sql,
                " AND (type > ? OR (type = ? AND (region_id > ? OR (region_id = ? AND id > ?))))"
                " ORDER BY type, region_id, id LIMIT ?");
      params.insert(params.end(), {after.type, after.type, after.region, after.region, after.id});
    }
    params.emplace_back(static_cast<uint64_t>(limit));
    KRANE_RETURN_IF_ERROR(conn.queryEach(sql, params, [&](const db::Row& row) {
      out.push_back(fromRow(row));
      return absl::OkStatus();
    }));
    return out;
  }

  absl::StatusOr<uint64_t> purgeDeleted(db::Connection& conn, int64_t cutoff_ms,
                                        size_t limit) const override {
    return conn.exec(
        "DELETE FROM resources WHERE deleted_at IS NOT NULL AND deleted_at < ? LIMIT ?",
        {cutoff_ms, static_cast<uint64_t>(limit)});
  }

 protected:
  absl::Status write(db::Connection& conn, const Resource& r, uint64_t version,
                     int64_t now_ms) const override {
    const auto& g = r.generic();
    return conn
        .exec(
            "INSERT INTO resources (type, id, region_id, workspace_id, spec, content_type, version,"
            " created_at, updated_at, deleted_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, NULL)"
            " ON DUPLICATE KEY UPDATE region_id = VALUES(region_id), workspace_id = "
            "VALUES(workspace_id),"
            " spec = VALUES(spec), content_type = VALUES(content_type), version = VALUES(version),"
            " updated_at = VALUES(updated_at), deleted_at = NULL",
            {r.type(), r.id(), r.region(),
             g.workspace_id().empty() ? db::Value() : db::Value(g.workspace_id()),
             db::Blob{g.spec()}, g.content_type(), version, now_ms, now_ms})
        .status();
  }

  absl::Status markDeleted(db::Connection& conn, const ResourceKey& key, uint64_t version,
                           int64_t now_ms) const override {
    return conn
        .exec(
            "UPDATE resources SET deleted_at = ?, updated_at = ?, version = ? WHERE type = ? AND "
            "id = ?"
            " AND region_id = ?",
            {now_ms, now_ms, version, key.type, key.id, key.region})
        .status();
  }
};

}  // namespace

std::unique_ptr<ResourceTable> makeGenericTable() { return std::make_unique<GenericTable>(); }

}  // namespace krane::feed
