// host:port addresses as the configurations give them: IPv4, bracketed and bare IPv6, "*".
#include "common/host_port.h"

#include <catch2/catch.hpp>

namespace krane {
namespace {

TEST_CASE("host:port is split at the last colon, IPv6 brackets kept", "[host-port]") {
  CHECK(splitHostPort("10.0.0.7:7072") == std::pair<std::string, std::string>{"10.0.0.7", "7072"});
  CHECK(splitHostPort("[fd00::7]:7072") ==
        std::pair<std::string, std::string>{"[fd00::7]", "7072"});
  CHECK(splitHostPort("fd00::7:7072") == std::pair<std::string, std::string>{"fd00::7", "7072"});
  CHECK(splitHostPort("nohost") == std::pair<std::string, std::string>{"nohost", ""});
  CHECK(portOf("127.0.0.1:00") == 0);
  CHECK(portOf("[::1]:65535") == 65535);
}

TEST_CASE("a valid host:port has a host and a port up to 65535", "[host-port]") {
  CHECK(validHostPort("127.0.0.1:0"));
  CHECK(validHostPort("*:7072"));
  CHECK(validHostPort("[::1]:7072"));
  CHECK_FALSE(validHostPort(":7072"));
  CHECK_FALSE(validHostPort("host:"));
  CHECK_FALSE(validHostPort("host"));
  CHECK_FALSE(validHostPort("host:65536"));
  CHECK_FALSE(validHostPort("host:7o72"));
  CHECK_FALSE(validHostPort("host:123456"));
}

TEST_CASE("IP literals and every-interface hosts", "[host-port]") {
  CHECK(isIpLiteral("10.0.0.7"));
  CHECK(isIpLiteral("[fd00::7]"));
  CHECK_FALSE(isIpLiteral("fd00::7"));  // a listen address's IPv6 host takes brackets
  CHECK_FALSE(isIpLiteral("localhost"));
  CHECK_FALSE(isIpLiteral("*"));
  CHECK_FALSE(isIpLiteral("[not-an-ip]"));

  for (const char* any : {"*", "0.0.0.0", "[::]", "[0::0]", "::", "0:0:0:0:0:0:0:0"}) {
    INFO(any);
    CHECK(isAnyAddress(any));
  }
  for (const char* one : {"10.0.0.7", "[::1]", "::1", "fd00::7", "localhost", ""}) {
    INFO(one);
    CHECK_FALSE(isAnyAddress(one));
  }
}

}  // namespace
}  // namespace krane
