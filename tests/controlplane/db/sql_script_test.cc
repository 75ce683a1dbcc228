#include "controlplane/db/sql_script.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/strings.h"

namespace krane::db {
namespace {

using ::testing::HasSubstr;

TEST(SqlScript, SplitsOnSemicolonsOutsideQuotesAndComments) {
  auto statements = splitSqlScript(
      "-- a comment; with a semicolon\n"
      "CREATE TABLE a (x VARCHAR(10) DEFAULT 'a;b');\n"
      "\n"
      "/* block; comment */ INSERT INTO a VALUES ('it''s; fine'), (\"q;\"), ('back\\'slash;');\n"
      "# hash comment;\n"
      "UPDATE `we;ird` SET x = 1;\n");
  ASSERT_TRUE(statements.ok()) << statements.status();
  ASSERT_EQ(statements->size(), 3u);
  EXPECT_EQ((*statements)[0].text, "CREATE TABLE a (x VARCHAR(10) DEFAULT 'a;b')");
  EXPECT_EQ((*statements)[0].line, 2);
  EXPECT_THAT((*statements)[1].text, HasSubstr("'it''s; fine'"));
  EXPECT_THAT((*statements)[1].text, HasSubstr("'back\\'slash;'"));
  EXPECT_EQ((*statements)[1].line, 4);
  EXPECT_EQ((*statements)[2].text, "UPDATE `we;ird` SET x = 1");
  EXPECT_EQ((*statements)[2].line, 6);
}

TEST(SqlScript, DropsEmptyStatements) {
  auto statements = splitSqlScript(";;\n  ;\nSELECT 1;;");
  ASSERT_TRUE(statements.ok());
  ASSERT_EQ(statements->size(), 1u);
}

TEST(SqlScript, RejectsUnterminatedPieces) {
  auto quote = splitSqlScript("SELECT 1;\nSELECT 'oops;\n");
  ASSERT_FALSE(quote.ok());
  EXPECT_THAT(toStd(quote.status().message()), HasSubstr("line 2: unterminated ' quote"));

  auto comment = splitSqlScript("SELECT 1;\n\n/* never closed\n");
  ASSERT_FALSE(comment.ok());
  EXPECT_THAT(toStd(comment.status().message()), HasSubstr("line 3: unterminated /* comment"));

  auto trailing = splitSqlScript("SELECT 1;\nSELECT 2\n");
  ASSERT_FALSE(trailing.ok());
  EXPECT_THAT(toStd(trailing.status().message()),
              HasSubstr("line 2: the last statement does not end with ';'"));
}

}  // namespace
}  // namespace krane::db
