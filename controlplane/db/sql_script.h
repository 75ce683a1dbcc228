// Splits a migration file into statements, so that a failure can name the statement and line.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace krane::db {

struct SqlStatement {
  std::string text;  // without the trailing ';'
  int line = 0;      // 1-based line where the statement starts
};

// Statements end with ';' outside quotes ('', "", ``) and comments (--, #, /* */). Empty
// statements are dropped. Fails naming the line of an unterminated quote or comment.
absl::StatusOr<std::vector<SqlStatement>> splitSqlScript(std::string_view script);

}  // namespace krane::db
