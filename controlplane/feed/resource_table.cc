#include "controlplane/feed/resource_table.h"

#include <algorithm>

#include "common/strings.h"
#include "controlplane/feed/tables.h"

namespace krane::feed {

absl::Status checkId(std::string_view field, std::string_view value) {
  if (value.empty()) return absl::InvalidArgumentError(strCat(field, ": required"));
  if (value.size() > 64) {
    return absl::InvalidArgumentError(strCat(field, ": at most 64 characters, got ", value.size()));
  }
  const bool ok = std::all_of(value.begin(), value.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-' || c == ':';
  });
  if (!ok) {
    return absl::InvalidArgumentError(strCat(
        field, ": ", quote(value), " may only contain letters, digits, '.', '_', '-' and ':'"));
  }
  return absl::OkStatus();
}

absl::Status checkNotEmpty(std::string_view field, std::string_view value, size_t max_size) {
  if (value.empty()) return absl::InvalidArgumentError(strCat(field, ": required"));
  if (value.size() > max_size) {
    return absl::InvalidArgumentError(
        strCat(field, ": at most ", max_size, " bytes, got ", value.size()));
  }
  return absl::OkStatus();
}

absl::Status checkMax(std::string_view field, uint64_t value, uint64_t max) {
  if (value > max) {
    return absl::InvalidArgumentError(strCat(field, ": must be at most ", max, ", got ", value));
  }
  return absl::OkStatus();
}

ResourceTables::ResourceTables() {
  tables_.push_back(makeDeploymentTopologyTable());
  tables_.push_back(makeSentinelTable());
  tables_.push_back(makeCiliumPolicyTable());
  tables_.push_back(makeGenericTable());
}

const ResourceTable& ResourceTables::forType(std::string_view type) const {
  for (const auto& table : tables_) {
    if (table->type() == type) return *table;
  }
  return *tables_.back();
}

}  // namespace krane::feed
