// Catch2 matchers and printers for the status types Krane's code returns.
//
//   REQUIRE_THAT(pool, IsOk());           // absl::Status, absl::StatusOr<T>, grpc::Status
//   CHECK_THAT(st, IsError(absl::StatusCode::kNotFound));
//
// On failure the status is printed with its code and message, so a test never needs to stream
// `status()` into the assertion by hand.
#pragma once

#include <regex>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace krane::testing {

// "OK" or "CODE: message" for anything with ok() and either status(), error_message() or message().
template <typename S>
std::string describeStatus(const S& s) {
  if constexpr (requires { s.status(); }) {
    return describeStatus(s.status());
  } else if constexpr (std::is_same_v<S, absl::Status>) {
    return s.ToString();
  } else if constexpr (requires {
                         s.error_message();
                         s.error_code();
                       }) {  // grpc::Status
    if (s.ok()) return "OK";
    std::ostringstream out;
    out << "gRPC code " << static_cast<int>(s.error_code()) << ": " << s.error_message();
    return out.str();
  } else {
    return s.ok() ? "OK" : "not OK";
  }
}

class IsOkMatcher {
 public:
  template <typename S>
  bool match(const S& s) const {
    return s.ok();
  }
  std::string toString() const { return "is OK"; }
};

class IsErrorMatcher {
 public:
  explicit IsErrorMatcher(absl::StatusCode code) : code_(code) {}
  template <typename S>
  bool match(const S& s) const {
    if constexpr (requires { s.status(); }) {
      return s.status().code() == code_;
    } else if constexpr (requires { s.error_code(); }) {
      return static_cast<int>(s.error_code()) == static_cast<int>(code_);
    } else {
      return s.code() == code_;
    }
  }
  std::string toString() const { return "has code " + absl::StatusCodeToString(code_); }

 private:
  absl::StatusCode code_;
};

// Some element of a vector of strings contains `part`.
class AnyElementContainsMatcher : public Catch::MatcherBase<std::vector<std::string>> {
 public:
  explicit AnyElementContainsMatcher(std::string part) : part_(std::move(part)) {}
  bool match(const std::vector<std::string>& v) const override {
    for (const std::string& s : v) {
      if (s.find(part_) != std::string::npos) return true;
    }
    return false;
  }
  std::string describe() const override { return "has an element containing \"" + part_ + "\""; }

 private:
  std::string part_;
};

// The regular expression (ECMAScript) matches somewhere in the string.
class ContainsRegexMatcher : public Catch::MatcherBase<std::string> {
 public:
  explicit ContainsRegexMatcher(std::string pattern) : pattern_(std::move(pattern)) {}
  bool match(const std::string& s) const override {
    return std::regex_search(s, std::regex(pattern_));
  }
  std::string describe() const override { return "contains a match of /" + pattern_ + "/"; }

 private:
  std::string pattern_;
};

}  // namespace krane::testing

namespace krane {

// A status (or StatusOr) that is OK.
inline testing::IsOkMatcher IsOk() { return {}; }
// An absl::Status (or StatusOr) with this code.
inline testing::IsErrorMatcher IsError(absl::StatusCode code) {
  return testing::IsErrorMatcher(code);
}
// Some string of a std::vector<std::string> contains `part`.
inline testing::AnyElementContainsMatcher AnyElementContains(std::string part) {
  return testing::AnyElementContainsMatcher(std::move(part));
}
// `pattern` matches somewhere in the string (Catch::Matches must match all of it).
inline testing::ContainsRegexMatcher ContainsRegex(std::string pattern) {
  return testing::ContainsRegexMatcher(std::move(pattern));
}

}  // namespace krane

namespace Catch {

template <typename T>
struct StringMaker<absl::StatusOr<T>> {
  static std::string convert(const absl::StatusOr<T>& s) {
    return krane::testing::describeStatus(s);
  }
};

// grpc::Status, recognised by its members so this header does not need gRPC's.
template <typename S>
struct StringMaker<S, std::void_t<decltype(std::declval<const S&>().error_message()),
                                  decltype(std::declval<const S&>().error_details())>> {
  static std::string convert(const S& s) { return krane::testing::describeStatus(s); }
};

}  // namespace Catch
