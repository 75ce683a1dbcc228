// Wall-clock time as stored in the database and the cursor store: Unix epoch milliseconds.
#pragma once

#include <chrono>
#include <cstdint>

namespace krane {

inline int64_t unixMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace krane
