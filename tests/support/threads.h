// Failures seen on threads that a test starts.
//
// Catch2's assertions belong to the thread that runs the test case: an assertion on another
// thread races with the reporter, and a failed REQUIRE there throws where nothing catches it.
// Threads record what went wrong in a ThreadFailures; the test checks it after joining them:
//
//   ThreadFailures failures;
//   std::thread writer([&] { failures.expectOk(writer.put(r), "put"); });
//   writer.join();
//   CHECK(failures.all() == std::vector<std::string>{});
#pragma once

#include <mutex>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace krane::testing {

class ThreadFailures {
 public:
  void add(std::string what) {
    std::lock_guard lock(mutex_);
    failures_.push_back(std::move(what));
  }

  // Records `what` with the status unless it is OK; returns whether it was OK. Takes anything
  // with ok() that can be streamed (absl::Status) or has status() (absl::StatusOr).
  template <typename S>
  bool expectOk(const S& status, std::string_view what) {
    if (status.ok()) return true;
    std::ostringstream out;
    out << what << ": ";
    if constexpr (requires { status.status(); }) {
      out << status.status();
    } else {
      out << status;
    }
    add(out.str());
    return false;
  }

  // Records `what` unless `condition` holds; returns `condition`.
  bool expect(bool condition, std::string_view what) {
    if (!condition) add(std::string(what));
    return condition;
  }

  std::vector<std::string> all() const {
    std::lock_guard lock(mutex_);
    return failures_;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<std::string> failures_;
};

}  // namespace krane::testing
