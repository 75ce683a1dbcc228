// String building that accepts std::string_view, absl::string_view and numbers alike.
//
// Debian's Abseil is built with its own absl::string_view (not an alias of std::string_view), so
// absl::StrCat does not take std::string_view; Krane uses these helpers and fmt instead, and keeps
// Abseil for Status / StatusOr only.
#pragma once

#include <string>
#include <string_view>
#include <type_traits>

#include <fmt/format.h>

#include "absl/strings/string_view.h"

namespace krane {

inline std::string_view toStd(absl::string_view s) { return std::string_view(s.data(), s.size()); }

namespace strings_internal {
inline void appendPiece(std::string& out, std::string_view s) { out.append(s); }
inline void appendPiece(std::string& out, const std::string& s) { out.append(s); }
inline void appendPiece(std::string& out, const char* s) { out.append(s); }
inline void appendPiece(std::string& out, absl::string_view s) { out.append(s.data(), s.size()); }
inline void appendPiece(std::string& out, char c) { out.push_back(c); }
template <typename T,
          std::enable_if_t<std::is_arithmetic_v<T> && !std::is_same_v<T, char>, int> = 0>
void appendPiece(std::string& out, T value) {
  fmt::format_to(std::back_inserter(out), "{}", value);
}
}  // namespace strings_internal

template <typename... Pieces>
std::string strCat(const Pieces&... pieces) {
  std::string out;
  (strings_internal::appendPiece(out, pieces), ...);
  return out;
}

template <typename... Pieces>
void strAppend(std::string* out, const Pieces&... pieces) {
  (strings_internal::appendPiece(*out, pieces), ...);
}

}  // namespace krane

// Lets fmt and spdlog print absl::string_view (e.g. status.message()) directly.
template <>
struct fmt::formatter<absl::string_view> : fmt::formatter<std::string_view> {
  template <typename FormatContext>
  auto format(absl::string_view s, FormatContext& ctx) const {
    return fmt::formatter<std::string_view>::format(std::string_view(s.data(), s.size()), ctx);
  }
};
