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

// How error messages quote what a caller sent: between `mark`s (double quotes by default), at
// most `max_bytes` of it (cut at a character boundary; a longer value ends in `..." (N bytes)`),
// with the mark, backslashes, control characters and bytes that are not UTF-8 escaped (`\"`,
// `\\`, `\x0a`). So
// a message stays short and printable whatever the input: gRPC sends it as metadata, which has
// a size limit. Every error that quotes input uses it.
inline std::string quote(std::string_view value, size_t max_bytes = 64, char mark = '"') {
  std::string out(1, mark);
  size_t i = 0;
  while (i < value.size() && i < max_bytes) {
    const auto c = static_cast<unsigned char>(value[i]);
    // Length of the UTF-8 sequence starting here, 0 when it is not one.
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    if (n > 1) {
      if (i + n > value.size()) n = 0;
      for (size_t k = 1; k < n; ++k) {
        if ((static_cast<unsigned char>(value[i + k]) & 0xc0) != 0x80) n = 0;
      }
      if (n > 1 && i + n > max_bytes) break;  // keep whole characters only
    }
    if (n > 1) {
      out.append(value.substr(i, n));
      i += n;
      continue;
    }
    if (c == static_cast<unsigned char>(mark) || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (n == 1 && c >= 0x20 && c != 0x7f) {
      out.push_back(static_cast<char>(c));
    } else {
      fmt::format_to(std::back_inserter(out), "\\x{:02x}", c);
    }
    ++i;
  }
  out.push_back(mark);
  if (i < value.size()) {
    out.insert(out.size() - 1, "...");
    fmt::format_to(std::back_inserter(out), " ({} bytes)", value.size());
  }
  return out;
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
