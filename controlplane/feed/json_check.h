// Validation of JSON documents stored in JSON columns (sentinel config, Cilium policies).
#pragma once

#include <string_view>

#include "absl/status/status.h"

namespace krane::feed {

// MariaDB's JSON_VALID (the CHECK of JSON columns) refuses documents nested 32 levels deep or
// more (MySQL allows 100): refuse them here, naming the field, instead of at the database.
inline constexpr size_t kMaxJsonDepth = 31;

enum class JsonShape { kAny, kObject };

// INVALID_ARGUMENT naming `field` unless `text` is valid JSON, at most kMaxJsonDepth deep, and
// an object when `shape` asks for one ("<field>: must be a JSON object").
absl::Status checkJsonDocument(std::string_view field, std::string_view text, JsonShape shape);

}  // namespace krane::feed
