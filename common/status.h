// Expected failures are values: absl::Status / absl::StatusOr<T>, never exceptions across modules.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define KRANE_CONCAT_INNER_(a, b) a##b
#define KRANE_CONCAT_(a, b) KRANE_CONCAT_INNER_(a, b)

// Returns the status from the enclosing function when `expr` is not OK.
#define KRANE_RETURN_IF_ERROR(expr)                \
  do {                                             \
    ::absl::Status krane_status_ = (expr);         \
    if (!krane_status_.ok()) return krane_status_; \
  } while (false)

// `KRANE_ASSIGN_OR_RETURN(auto x, f());` unwraps a StatusOr or returns its error.
#define KRANE_ASSIGN_OR_RETURN(lhs, expr) \
  KRANE_ASSIGN_OR_RETURN_IMPL_(KRANE_CONCAT_(krane_statusor_, __LINE__), lhs, expr)
#define KRANE_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return std::move(tmp).status();     \
  lhs = std::move(*tmp)

namespace krane {

// `st` with "<context>: " in front of its message (same code); OK stays OK.
inline absl::Status withContext(const absl::Status& st, std::string_view context) {
  if (st.ok()) return st;
  std::string message(context);
  message += ": ";
  message.append(st.message().data(), st.message().size());
  return absl::Status(st.code(), message);
}

}  // namespace krane
