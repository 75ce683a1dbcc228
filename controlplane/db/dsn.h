// Where the control plane's MySQL / MariaDB lives.
#pragma once

#include <chrono>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace krane::db {

// Parsed form of `mysql://user[:password]@host[:port]/database[?option=value&...]`.
// Options: socket=/path (Unix socket instead of TCP), connect_timeout=SECONDS,
// read_timeout=SECONDS, write_timeout=SECONDS. User and password may be percent-encoded.
struct Dsn {
  std::string user;
  std::string password;
  std::string host = "127.0.0.1";
  unsigned port = 3306;
  std::string database;
  std::string socket;
  std::chrono::seconds connect_timeout{5};
  std::chrono::seconds read_timeout{30};
  std::chrono::seconds write_timeout{30};

  // The DSN with the password masked, for logs and error messages.
  std::string redacted() const;
  // "host:port/database" or "socket/database": names the server in errors.
  std::string where() const;
};

// Fails with INVALID_ARGUMENT naming the part that is wrong and the expected form.
absl::StatusOr<Dsn> parseDsn(std::string_view text);

}  // namespace krane::db
