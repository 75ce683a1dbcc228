#include "controlplane/db/value.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <optional>

namespace krane::db {
namespace {

[[noreturn]] void misuse(const char* what, size_t i) {
  std::fprintf(stderr, "krane::db::Row: column %zu: %s\n", i, what);
  std::abort();
}

// DECIMAL results (SUM, COALESCE of mixed integer types) arrive as text: accept whole numbers.
std::optional<__int128> parseWhole(const Value::Storage& s) {
  const auto* text = std::get_if<std::string>(&s);
  if (text == nullptr || text->empty() || text->size() > 40) return std::nullopt;
  __int128 value = 0;
  size_t i = (*text)[0] == '-' ? 1 : 0;
  if (i == text->size()) return std::nullopt;
  for (; i < text->size(); ++i) {
    const char c = (*text)[i];
    if (c == '.') {
      // "12.000" is whole; "12.5" is not.
      for (size_t j = i + 1; j < text->size(); ++j) {
        if ((*text)[j] != '0') return std::nullopt;
      }
      break;
    }
    if (c < '0' || c > '9') return std::nullopt;
    value = value * 10 + (c - '0');
    if (value > (static_cast<__int128>(1) << 65)) return std::nullopt;
  }
  return (*text)[0] == '-' ? -value : value;
}

}  // namespace

size_t Columns::indexOf(std::string_view name) const {
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == name) return i;
  }
  std::fprintf(stderr, "krane::db::Row: no column named \"%.*s\"\n", static_cast<int>(name.size()),
               name.data());
  std::abort();
}

int64_t Row::i64(size_t i) const {
  const auto& s = values_.at(i).storage();
  if (const auto* v = std::get_if<int64_t>(&s)) return *v;
  if (const auto* v = std::get_if<uint64_t>(&s)) {
    if (*v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      misuse("unsigned value too large for int64", i);
    }
    return static_cast<int64_t>(*v);
  }
  if (auto whole = parseWhole(s)) {
    if (*whole < std::numeric_limits<int64_t>::min() ||
        *whole > std::numeric_limits<int64_t>::max()) {
      misuse("decimal value out of int64 range", i);
    }
    return static_cast<int64_t>(*whole);
  }
  misuse(isNull(i) ? "is NULL" : "is not an integer", i);
}

uint64_t Row::u64(size_t i) const {
  const auto& s = values_.at(i).storage();
  if (const auto* v = std::get_if<uint64_t>(&s)) return *v;
  if (const auto* v = std::get_if<int64_t>(&s)) {
    if (*v < 0) misuse("negative value read as unsigned", i);
    return static_cast<uint64_t>(*v);
  }
  if (auto whole = parseWhole(s)) {
    if (*whole < 0 || *whole > std::numeric_limits<uint64_t>::max())
      misuse("decimal value out of uint64 range", i);
    return static_cast<uint64_t>(*whole);
  }
  misuse(isNull(i) ? "is NULL" : "is not an integer", i);
}

double Row::f64(size_t i) const {
  const auto& s = values_.at(i).storage();
  if (const auto* v = std::get_if<double>(&s)) return *v;
  if (const auto* v = std::get_if<int64_t>(&s)) return static_cast<double>(*v);
  if (const auto* v = std::get_if<uint64_t>(&s)) return static_cast<double>(*v);
  misuse(isNull(i) ? "is NULL" : "is not a number", i);
}

const std::string& Row::str(size_t i) const {
  const auto& s = values_.at(i).storage();
  if (const auto* v = std::get_if<std::string>(&s)) return *v;
  if (const auto* v = std::get_if<Blob>(&s)) return v->bytes;
  misuse(isNull(i) ? "is NULL" : "is not text", i);
}

std::optional<std::string> Row::optStr(size_t i) const {
  if (isNull(i)) return std::nullopt;
  return str(i);
}

std::optional<int64_t> Row::optI64(size_t i) const {
  if (isNull(i)) return std::nullopt;
  return i64(i);
}

std::string placeholders(size_t n) {
  std::string out = "?";
  for (size_t i = 1; i < n; ++i) out += ",?";
  return out;
}

size_t paddedListSize(size_t n, size_t at_least) {
  size_t padded = std::max<size_t>(at_least, 1);
  while (padded < n) padded *= 2;
  return padded;
}

std::string appendInList(Params& params, const Params& values) {
  if (values.empty()) {  // NULL: no row has it
    params.emplace_back();
    return placeholders(1);
  }
  const size_t n = paddedListSize(values.size());
  params.insert(params.end(), values.begin(), values.end());
  for (size_t i = values.size(); i < n; ++i) params.push_back(values.front());
  return placeholders(n);
}

}  // namespace krane::db
