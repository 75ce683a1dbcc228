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

TEST_CASE("toGrpc cuts a message longer than the metadata can carry", "[quote]") {
  const grpc::Status st = toGrpc(absl::InvalidArgumentError(std::string(100000, 'm')));
  CHECK(st.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(st.error_message().size() < 2100u);
  CHECK_THAT(st.error_message(), Catch::EndsWith("... (message cut)"));
  CHECK(toGrpc(absl::NotFoundError("short")).error_message() == "short");
}

}  // namespace
}  // namespace krane
