// krane::quote, which every error message uses to show input, and toGrpc's last-resort cut: a
// message stays short and printable whatever it quotes.
#include "common/strings.h"

#include <string>

#include <catch2/catch.hpp>

#include "common/grpc_status.h"

namespace krane {
namespace {

TEST_CASE("a short value is quoted whole", "[quote]") {
  CHECK(quote("eu-1") == "\"eu-1\"");
  CHECK(quote("") == "\"\"");
  CHECK(quote("grüße") == "\"grüße\"");
  CHECK(quote("it's", 64, '\'') == "'it\\'s'");
}

TEST_CASE("quotes backslashes control characters and bytes that are not utf8 are escaped",
          "[quote]") {
  CHECK(quote("a\"b\\c") == "\"a\\\"b\\\\c\"");
  CHECK(quote("line\nnext\x7f") == "\"line\\x0anext\\x7f\"");
  CHECK(quote(std::string("\xff\xc3(", 3)) == "\"\\xff\\xc3(\"");
  CHECK(quote(std::string("a\0b", 3)) == "\"a\\x00b\"");
}

TEST_CASE("a long value is cut at a character boundary and its size is given", "[quote]") {
  const std::string huge(1 << 20, 'x');
  const std::string shown = quote(huge);
  CHECK(shown == "\"" + std::string(64, 'x') + "...\" (1048576 bytes)");
  // A two-byte character across the cut is left out whole.
  const std::string umlauts = std::string(63, 'a') + "ü" + "zz";
  CHECK(quote(umlauts) == "\"" + std::string(63, 'a') + "...\" (67 bytes)");
}

TEST_CASE("utf8 is judged as the database and protobuf judge it", "[utf8]") {
  CHECK(utf8CharAt("a", 0) == 1u);
  CHECK(utf8CharAt("\xc3\xbc", 0) == 2u);          // ü
  CHECK(utf8CharAt("\xe2\x9c\x93", 0) == 3u);      // ✓
  CHECK(utf8CharAt("\xf0\x9f\x9a\x80", 0) == 4u);  // 🚀
  CHECK(utf8CharAt("\xc3", 0) == 0u);              // cut
  CHECK(utf8CharAt("\xbc", 0) == 0u);              // a continuation byte alone
  CHECK(utf8CharAt("\xc0\xaf", 0) == 0u);          // overlong
  CHECK(utf8CharAt("\xe0\x80\xaf", 0) == 0u);      // overlong
  CHECK(utf8CharAt("\xed\xa0\x80", 0) == 0u);      // a surrogate
  CHECK(utf8CharAt("\xf4\x90\x80\x80", 0) == 0u);  // beyond U+10FFFF
  CHECK(utf8CharAt("\xff", 0) == 0u);
}

TEST_CASE("clampUtf8 replaces what is not utf8 and cuts between characters", "[utf8]") {
  CHECK(clampUtf8("plain") == "plain");
  CHECK(clampUtf8(std::string("a\xff\xc3(b", 5)) == "a\xef\xbf\xbd\xef\xbf\xbd(b");
  // 255 characters, not bytes (utf8mb4 VARCHAR(255)); never half a character.
  const std::string checks = std::string(254, 'x') + "\xe2\x9c\x93\xe2\x9c\x93";
  CHECK(clampUtf8(checks, 255) == std::string(254, 'x') + "\xe2\x9c\x93");
  CHECK(clampUtf8(checks, 1000, 256) == std::string(254, 'x'));
  CHECK(clampUtf8(checks, 1000, 257) == std::string(254, 'x') + "\xe2\x9c\x93");
  CHECK(clampUtf8("", 10) == "");
}

TEST_CASE("toGrpc cuts a message longer than the metadata can carry", "[quote]") {
  const grpc::Status st = toGrpc(absl::InvalidArgumentError(std::string(100000, 'm')));
  CHECK(st.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(st.error_message().size() < 2100u);
  CHECK_THAT(st.error_message(), Catch::EndsWith("... (message cut)"));
  CHECK(toGrpc(absl::NotFoundError("short")).error_message() == "short");
}

}  // namespace
}  // namespace krane
