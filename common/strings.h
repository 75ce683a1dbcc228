// String building that accepts std::string_view, absl::string_view and numbers alike.
//
// Debian's Abseil is built with its own absl::string_view (not an alias of std::string_view), so
// absl::StrCat does not take std::string_view; Krane uses these helpers and fmt instead, and keeps
// Abseil for Status / StatusOr only.
#pragma once

#include <charconv>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

#include <fmt/format.h>

#include "absl/strings/string_view.h"

namespace krane {

inline std::string_view toStd(absl::string_view s) { return std::string_view(s.data(), s.size()); }

// `text` as a whole decimal uint64 ("12"); nullopt for "", a sign, trailing text or an overflow.
inline std::optional<uint64_t> parseUint64(std::string_view text) {
  uint64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

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

// Length of the UTF-8 character that starts at value[i]: 1 to 4, or 0 when the bytes there are
// not one (a stray continuation byte, a cut or overlong sequence, a surrogate, beyond U+10FFFF),
// as MariaDB's utf8mb4 and protobuf's string fields judge it.
inline size_t utf8CharAt(std::string_view value, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(value[i + k]); };
  const unsigned char c = byte(0);
  if (c < 0x80) return 1;
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xbf;  // the allowed range of the second byte
  if (c >= 0xc2 && c <= 0xdf) {
    n = 2;
  } else if (c >= 0xe0 && c <= 0xef) {
    n = 3;
    if (c == 0xe0) lo = 0xa0;  // overlong
    if (c == 0xed) hi = 0x9f;  // surrogates
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 4;
    if (c == 0xf0) lo = 0x90;  // overlong
    if (c == 0xf4) hi = 0x8f;  // beyond U+10FFFF
  } else {
    return 0;
  }
  if (i + n > value.size() || byte(1) < lo || byte(1) > hi) return 0;
  for (size_t k = 2; k < n; ++k) {
    if ((byte(k) & 0xc0) != 0x80) return 0;
  }
  return n;
}

// `text` made fit for a utf8mb4 column in strict mode and for a protobuf string, which refuse
// bytes that are not UTF-8 and text that is too long: such bytes become U+FFFD, and the text is
// cut between characters after `max_chars` characters or before `max_bytes` bytes.
inline std::string clampUtf8(std::string_view text, size_t max_chars = std::string::npos,
                             size_t max_bytes = std::string::npos) {
  std::string out;
  size_t chars = 0;
  for (size_t i = 0; i < text.size() && chars < max_chars;) {
    const size_t n = utf8CharAt(text, i);
    const std::string_view piece = n == 0 ? std::string_view("\xef\xbf\xbd") : text.substr(i, n);
    if (out.size() + piece.size() > max_bytes) break;
    out.append(piece);
    i += n == 0 ? 1 : n;
    ++chars;
  }
  return out;
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
    const size_t n = utf8CharAt(value, i);
    if (n > 1 && i + n > max_bytes) break;  // keep whole characters only
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
