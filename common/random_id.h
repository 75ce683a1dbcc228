// Random identifiers: not secrets (use OpenSSL for those), just ids that do not collide.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace krane {

// 2 * `bytes` lowercase hex digits.
std::string randomHex(size_t bytes);

// "<prefix>_" and 16 hex digits, e.g. "dep_5c1a0f9e2b7d4a31".
inline std::string newId(std::string_view prefix) {
  return std::string(prefix) + "_" + randomHex(8);
}

// "<host>-<pid>-<6 hex digits>": names this process (a replica, a worker) in leases, tables and
// logs; unique even when a restarted process gets the same pid.
std::string processInstanceId();

}  // namespace krane
