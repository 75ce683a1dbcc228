#include "controlplane/db/sql_script.h"

#include <catch2/catch.hpp>

#include "common/strings.h"
#include "tests/support/matchers.h"

namespace krane::db {
namespace {

TEST_CASE("splits on semicolons outside quotes and comments", "[sql-script]") {
  auto statements = splitSqlScript(
      "-- a comment; with a semicolon\n"
      "CREATE TABLE a (x VARCHAR(10) DEFAULT 'a;b');\n"
      "\n"
      "/* block; comment */ INSERT INTO a VALUES ('it''s; fine'), (\"q;\"), ('back\\'slash;');\n"
      "# hash comment;\n"
      "UPDATE `we;ird` SET x = 1;\n");
  REQUIRE_THAT(statements, IsOk());
  REQUIRE(statements->size() == 3u);
  CHECK((*statements)[0].text == "CREATE TABLE a (x VARCHAR(10) DEFAULT 'a;b')");
  CHECK((*statements)[0].line == 2);
  CHECK_THAT((*statements)[1].text, Catch::Contains("'it''s; fine'"));
  CHECK_THAT((*statements)[1].text, Catch::Contains("'back\\'slash;'"));
  CHECK((*statements)[1].line == 4);
  CHECK((*statements)[2].text == "UPDATE `we;ird` SET x = 1");
  CHECK((*statements)[2].line == 6);
}

TEST_CASE("drops empty statements", "[sql-script]") {
  auto statements = splitSqlScript(";;\n  ;\nSELECT 1;;");
  REQUIRE_THAT(statements, IsOk());
  REQUIRE(statements->size() == 1u);
}

TEST_CASE("rejects unterminated pieces", "[sql-script]") {
  auto quote = splitSqlScript("SELECT 1;\nSELECT 'oops;\n");
  REQUIRE_FALSE(quote.ok());
  CHECK_THAT(std::string(quote.status().message()),
             Catch::Contains("line 2: unterminated ' quote"));

  auto comment = splitSqlScript("SELECT 1;\n\n/* never closed\n");
  REQUIRE_FALSE(comment.ok());
  CHECK_THAT(std::string(comment.status().message()),
             Catch::Contains("line 3: unterminated /* comment"));

  auto trailing = splitSqlScript("SELECT 1;\nSELECT 2\n");
  REQUIRE_FALSE(trailing.ok());
  CHECK_THAT(std::string(trailing.status().message()),
             Catch::Contains("line 2: the last statement does not end with ';'"));
}

}  // namespace
}  // namespace krane::db
