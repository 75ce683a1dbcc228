// Typed statement parameters and result rows. Values are always bound, never spliced into SQL.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

namespace krane::db {

// Binary data, bound as a BLOB rather than as text in the connection's character set.
struct Blob {
  std::string bytes;
};

// One statement parameter or result cell. NULL is std::monostate.
class Value {
 public:
  using Storage = std::variant<std::monostate, int64_t, uint64_t, double, std::string, Blob>;

  Value() = default;
  Value(std::nullptr_t) {}
  Value(bool v) : storage_(int64_t{v}) {}
  template <typename T,
            std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, int> = 0>
  Value(T v) {
    if constexpr (std::is_signed_v<T>) {
      storage_ = static_cast<int64_t>(v);
    } else {
      storage_ = static_cast<uint64_t>(v);
    }
  }
  Value(double v) : storage_(v) {}
  Value(std::string v) : storage_(std::move(v)) {}
  Value(std::string_view v) : storage_(std::string(v)) {}
  Value(const char* v) : storage_(std::string(v)) {}
  Value(Blob v) : storage_(std::move(v)) {}
  template <typename T>
  Value(const std::optional<T>& v) {
    if (v) *this = Value(*v);
  }

  bool isNull() const { return std::holds_alternative<std::monostate>(storage_); }
  const Storage& storage() const { return storage_; }

 private:
  Storage storage_;
};

using Params = std::vector<Value>;

// "?,?,?": `n` (at least 1) placeholders, for an IN list of `n` values.
std::string placeholders(size_t n);

// How many values an IN list of `n` is padded to: the next power of two, at least `at_least`.
// Lists of every length then share a few statement texts, each prepared once per connection
// (Connection::kMaxPreparedStatements); the caller pads with a value that adds no row (one that
// matches nothing, or one already in the list).
size_t paddedListSize(size_t n, size_t at_least = 1);

// Appends `values` to `params` as an IN list padded to paddedListSize(size) by repeating the
// first value, and returns the list's placeholders (an empty list is one NULL, which no row
// matches). A repeated value matches, and
// locks, only what the list already does (a value that matches nothing would lock the gap where
// it would be in a locking read).
std::string appendInList(Params& params, const Params& values);

// Column names of a result, shared by all its rows.
struct Columns {
  std::vector<std::string> names;
  // Index of `name`; crashes when the column does not exist (a programming error).
  size_t indexOf(std::string_view name) const;
};

// One result row. Accessors crash on a NULL or a type that cannot hold the value: callers
// check isNull() for nullable columns. Integers come back as int64/uint64, FLOAT/DOUBLE as
// double, everything else (text, blobs, DECIMAL, dates) as bytes in a string.
class Row {
 public:
  Row(std::shared_ptr<const Columns> columns, std::vector<Value> values)
      : columns_(std::move(columns)), values_(std::move(values)) {}

  size_t size() const { return values_.size(); }
  bool isNull(size_t i) const { return values_.at(i).isNull(); }
  int64_t i64(size_t i) const;
  uint64_t u64(size_t i) const;
  double f64(size_t i) const;
  const std::string& str(size_t i) const;
  std::optional<std::string> optStr(size_t i) const;
  std::optional<int64_t> optI64(size_t i) const;

  bool isNull(std::string_view c) const { return isNull(columns_->indexOf(c)); }
  int64_t i64(std::string_view c) const { return i64(columns_->indexOf(c)); }
  uint64_t u64(std::string_view c) const { return u64(columns_->indexOf(c)); }
  double f64(std::string_view c) const { return f64(columns_->indexOf(c)); }
  const std::string& str(std::string_view c) const { return str(columns_->indexOf(c)); }
  std::optional<std::string> optStr(std::string_view c) const {
    return optStr(columns_->indexOf(c));
  }
  std::optional<int64_t> optI64(std::string_view c) const { return optI64(columns_->indexOf(c)); }

  const Value& value(size_t i) const { return values_.at(i); }

 private:
  std::shared_ptr<const Columns> columns_;
  std::vector<Value> values_;
};

struct ResultSet {
  std::shared_ptr<const Columns> columns;
  std::vector<Row> rows;
  bool empty() const { return rows.empty(); }
};

}  // namespace krane::db
