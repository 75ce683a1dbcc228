#include "controlplane/db/value.h"

#include <cstdio>
#include <cstdlib>
#include <limits>

namespace krane::db {
namespace {

[[noreturn]] void misuse(const char* what, size_t i) {
  std::fprintf(stderr, "krane::db::Row: column %zu: %s\n", i, what);
  std::abort();
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
  misuse(isNull(i) ? "is NULL" : "is not an integer", i);
}

uint64_t Row::u64(size_t i) const {
  const auto& s = values_.at(i).storage();
  if (const auto* v = std::get_if<uint64_t>(&s)) return *v;
  if (const auto* v = std::get_if<int64_t>(&s)) {
    if (*v < 0) misuse("negative value read as unsigned", i);
    return static_cast<uint64_t>(*v);
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

}  // namespace krane::db
