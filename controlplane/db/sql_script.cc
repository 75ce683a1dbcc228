#include "controlplane/db/sql_script.h"

#include <cctype>

#include "common/strings.h"

namespace krane::db {

absl::StatusOr<std::vector<SqlStatement>> splitSqlScript(std::string_view script) {
  std::vector<SqlStatement> out;
  std::string current;
  int line = 1;
  int start_line = 0;  // 0 until the current statement has a non-blank character
  size_t i = 0;
  auto flush = [&] {
    if (start_line != 0) out.push_back(SqlStatement{current, start_line});
    current.clear();
    start_line = 0;
  };
  auto at = [&](size_t k) { return k < script.size() ? script[k] : '\0'; };

  while (i < script.size()) {
    const char c = script[i];
    // Comments are dropped from the statement text.
    if ((c == '-' && at(i + 1) == '-' &&
         (at(i + 2) == ' ' || at(i + 2) == '\t' || at(i + 2) == '\n' || at(i + 2) == '\0')) ||
        c == '#') {
      while (i < script.size() && script[i] != '\n') ++i;
      continue;
    }
    if (c == '/' && at(i + 1) == '*') {
      const int opened = line;
      i += 2;
      while (i < script.size() && !(script[i] == '*' && at(i + 1) == '/')) {
        if (script[i] == '\n') ++line;
        ++i;
      }
      if (i >= script.size()) {
        return absl::InvalidArgumentError(strCat("line ", opened, ": unterminated /* comment"));
      }
      i += 2;
      current.push_back(' ');
      continue;
    }
    if (c == '\'' || c == '"' || c == '`') {
      const int opened = line;
      if (start_line == 0) start_line = line;
      current.push_back(c);
      ++i;
      bool closed = false;
      while (i < script.size()) {
        const char q = script[i];
        current.push_back(q);
        ++i;
        if (q == '\n') ++line;
        if (q == '\\' && c != '`' && i < script.size()) {
          if (script[i] == '\n') ++line;
          current.push_back(script[i]);
          ++i;
          continue;
        }
        if (q == c) {
          if (at(i) == c) {  // doubled quote inside the literal
            current.push_back(c);
            ++i;
            continue;
          }
          closed = true;
          break;
        }
      }
      if (!closed) {
        return absl::InvalidArgumentError(
            strCat("line ", opened, ": unterminated ", std::string(1, c), " quote"));
      }
      continue;
    }
    if (c == ';') {
      flush();
      ++i;
      continue;
    }
    if (c == '\n') ++line;
    if (start_line == 0 && !std::isspace(static_cast<unsigned char>(c))) start_line = line;
    if (start_line != 0) current.push_back(c);
    ++i;
  }
  if (start_line != 0) {
    return absl::InvalidArgumentError(
        strCat("line ", start_line, ": the last statement does not end with ';'"));
  }
  // Trim trailing whitespace of each statement.
  for (auto& s : out) {
    while (!s.text.empty() && std::isspace(static_cast<unsigned char>(s.text.back()))) {
      s.text.pop_back();
    }
  }
  return out;
}

}  // namespace krane::db
