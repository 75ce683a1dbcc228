#include "controlplane/db/dsn.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/strings.h"

namespace krane::db {
namespace {

using ::testing::HasSubstr;

std::string errorOf(std::string_view text) {
  auto dsn = parseDsn(text);
  EXPECT_FALSE(dsn.ok()) << text;
  return dsn.ok() ? "" : std::string(toStd(dsn.status().message()));
}

TEST(Dsn, ParsesEveryPart) {
  auto dsn =
      parseDsn("mysql://krane:s%40cret@db.internal:3307/krane?connect_timeout=2&read_timeout=9");
  ASSERT_TRUE(dsn.ok()) << dsn.status();
  EXPECT_EQ(dsn->user, "krane");
  EXPECT_EQ(dsn->password, "s@cret");
  EXPECT_EQ(dsn->host, "db.internal");
  EXPECT_EQ(dsn->port, 3307u);
  EXPECT_EQ(dsn->database, "krane");
  EXPECT_EQ(dsn->connect_timeout, std::chrono::seconds(2));
  EXPECT_EQ(dsn->read_timeout, std::chrono::seconds(9));
}

TEST(Dsn, DefaultsPortAndAcceptsSocket) {
  auto dsn = parseDsn("mysql://root@localhost/krane?socket=/run/mysqld/mysqld.sock");
  ASSERT_TRUE(dsn.ok()) << dsn.status();
  EXPECT_EQ(dsn->port, 3306u);
  EXPECT_EQ(dsn->password, "");
  EXPECT_EQ(dsn->socket, "/run/mysqld/mysqld.sock");
  EXPECT_EQ(dsn->where(), "/run/mysqld/mysqld.sock/krane");
}

TEST(Dsn, RedactsThePassword) {
  auto dsn = parseDsn("mysql://u:topsecret@h:1/d");
  ASSERT_TRUE(dsn.ok());
  EXPECT_THAT(dsn->redacted(), Not(HasSubstr("topsecret")));
  EXPECT_THAT(dsn->redacted(), HasSubstr("u:***@h:1/d"));
}

TEST(Dsn, ErrorsNameTheWrongPart) {
  EXPECT_THAT(errorOf("postgres://u@h/d"), HasSubstr("must start with mysql://"));
  EXPECT_THAT(errorOf("mysql://h/d"), HasSubstr("missing user"));
  EXPECT_THAT(errorOf("mysql://u@h"), HasSubstr("missing database"));
  EXPECT_THAT(errorOf("mysql://u@h:99999/d"), HasSubstr("port must be a number up to 65535"));
  EXPECT_THAT(errorOf("mysql://u@h:abc/d"), HasSubstr("port"));
  EXPECT_THAT(errorOf("mysql://u@:3306/d"), HasSubstr("missing host"));
  EXPECT_THAT(errorOf("mysql://u@h/d?sslmode=on"), HasSubstr("unknown option \"sslmode\""));
  EXPECT_THAT(errorOf("mysql://u@h/d?socket=relative"), HasSubstr("absolute path"));
  EXPECT_THAT(errorOf("mysql://u:%zz@h/d"), HasSubstr("percent-encoding in the password"));
  // Every error shows the expected form so the fix is obvious.
  EXPECT_THAT(errorOf("mysql://u@h"), HasSubstr("mysql://user[:password]@host[:port]/database"));
}

}  // namespace
}  // namespace krane::db
