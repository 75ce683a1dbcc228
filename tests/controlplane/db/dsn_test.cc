#include "controlplane/db/dsn.h"

#include <catch2/catch.hpp>

#include "common/strings.h"
#include "tests/support/matchers.h"

namespace krane::db {
namespace {

std::string errorOf(std::string_view text) {
  auto dsn = parseDsn(text);
  INFO(text);
  CHECK_FALSE(dsn.ok());
  return dsn.ok() ? "" : std::string(toStd(dsn.status().message()));
}

TEST_CASE("parses every part", "[dsn]") {
  auto dsn =
      parseDsn("mysql://krane:s%40cret@db.internal:3307/krane?connect_timeout=2&read_timeout=9");
  REQUIRE_THAT(dsn, IsOk());
  CHECK(dsn->user == "krane");
  CHECK(dsn->password == "s@cret");
  CHECK(dsn->host == "db.internal");
  CHECK(dsn->port == 3307u);
  CHECK(dsn->database == "krane");
  CHECK(dsn->connect_timeout == std::chrono::seconds(2));
  CHECK(dsn->read_timeout == std::chrono::seconds(9));
}

TEST_CASE("defaults port and accepts socket", "[dsn]") {
  auto dsn = parseDsn("mysql://root@localhost/krane?socket=/run/mysqld/mysqld.sock");
  REQUIRE_THAT(dsn, IsOk());
  CHECK(dsn->port == 3306u);
  CHECK(dsn->password == "");
  CHECK(dsn->socket == "/run/mysqld/mysqld.sock");
  CHECK(dsn->where() == "/run/mysqld/mysqld.sock/krane");
}

TEST_CASE("redacts the password", "[dsn]") {
  auto dsn = parseDsn("mysql://u:topsecret@h:1/d");
  REQUIRE_THAT(dsn, IsOk());
  CHECK_THAT(dsn->redacted(), !Catch::Contains("topsecret"));
  CHECK_THAT(dsn->redacted(), Catch::Contains("u:***@h:1/d"));
}

TEST_CASE("errors name the wrong part", "[dsn]") {
  CHECK_THAT(errorOf("postgres://u@h/d"), Catch::Contains("must start with mysql://"));
  CHECK_THAT(errorOf("mysql://h/d"), Catch::Contains("missing user"));
  CHECK_THAT(errorOf("mysql://u@h"), Catch::Contains("missing database"));
  CHECK_THAT(errorOf("mysql://u@h:99999/d"), Catch::Contains("port must be a number up to 65535"));
  CHECK_THAT(errorOf("mysql://u@h:abc/d"), Catch::Contains("port"));
  CHECK_THAT(errorOf("mysql://u@:3306/d"), Catch::Contains("missing host"));
  CHECK_THAT(errorOf("mysql://u@h/d?sslmode=on"), Catch::Contains("unknown option \"sslmode\""));
  CHECK_THAT(errorOf("mysql://u@h/d?socket=relative"), Catch::Contains("absolute path"));
  CHECK_THAT(errorOf("mysql://u:%zz@h/d"), Catch::Contains("percent-encoding in the password"));
  // Every error shows the expected form so the fix is obvious.
  CHECK_THAT(errorOf("mysql://u@h"),
             Catch::Contains("mysql://user[:password]@host[:port]/database"));
}

}  // namespace
}  // namespace krane::db
