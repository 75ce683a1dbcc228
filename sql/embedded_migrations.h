// The migration files of this folder, compiled into krane-ctrl so that it carries its schema.
#pragma once

#include <string_view>
#include <vector>

namespace krane::sql {

struct EmbeddedFile {
  std::string_view name;  // e.g. "0001_tenancy.sql"
  std::string_view contents;
};

// In file-name order.
const std::vector<EmbeddedFile>& embeddedMigrationFiles();

}  // namespace krane::sql
