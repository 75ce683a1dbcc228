// The feed.peer_hints keys of krane-ctrl's configuration: where the advertised address comes from
// (the file, then $KRANE_PEER_HINTS_ADVERTISE, then the listen address), and the addresses that
// cannot work refused at start-up, naming the key.
#include <stdlib.h>

#include <string>

#include <catch2/catch.hpp>

#include "controlplane/config.h"
#include "tests/support/matchers.h"

namespace krane::ctrl {
namespace {

// The config of `hints` (the lines under feed.peer_hints), finished as `serve` does, with the
// environment variable set to `env` (unset when empty).
absl::StatusOr<CtrlConfig> withHints(const std::string& hints, const std::string& env = "") {
  auto config = parseCtrlConfig("database:\n  dsn: mysql://u@h/d\nfeed:\n  peer_hints:\n" + hints,
                                "ctrl.yaml");
  if (!config.ok()) return config.status();
  if (env.empty()) {
    unsetenv("KRANE_PEER_HINTS_ADVERTISE");
  } else {
    setenv("KRANE_PEER_HINTS_ADVERTISE", env.c_str(), 1);
  }
  absl::Status finished = finishCtrlConfig(*config);
  unsetenv("KRANE_PEER_HINTS_ADVERTISE");
  if (!finished.ok()) return finished;
  return config;
}

std::string errorOf(const absl::StatusOr<CtrlConfig>& c) {
  REQUIRE_FALSE(c.ok());
  return std::string(c.status().message());
}

TEST_CASE("the advertised address: the file's, else the environment's, else listen's",
          "[config][hints]") {
  auto own = withHints("    listen: 10.0.0.7:7072\n");
  REQUIRE_THAT(own, IsOk());
  CHECK(own->feed.peer_hints.advertise.empty());  // PeerHints takes listen's address

  auto from_env = withHints("    listen: \"*:7072\"\n", "10.0.0.8:7072");
  REQUIRE_THAT(from_env, IsOk());
  CHECK(from_env->feed.peer_hints.advertise == "10.0.0.8:7072");

  auto from_file =
      withHints("    listen: \"*:7072\"\n    advertise: 10.0.0.9:7072\n", "10.0.0.8:7072");
  REQUIRE_THAT(from_file, IsOk());
  CHECK(from_file->feed.peer_hints.advertise == "10.0.0.9:7072");

  auto v6 = withHints("    listen: \"[::1]:0\"\n");
  CHECK_THAT(v6, IsOk());
  INFO("an IPv6 pod address, as $(POD_IP):7072 gives it: without brackets");
  auto bare_v6 = withHints("    listen: \"*:7072\"\n", "fd00::7:7072");
  REQUIRE_THAT(bare_v6, IsOk());
  CHECK(bare_v6->feed.peer_hints.advertise == "fd00::7:7072");
  auto off = withHints("", "10.0.0.8:7072");
  REQUIRE_THAT(off, IsOk());
  CHECK(off->feed.peer_hints.advertise.empty());  // no listen: hints are off, the variable unused
}

TEST_CASE("peer hint addresses that cannot work are refused naming the key", "[config][hints]") {
  CHECK_THAT(errorOf(withHints("    listen: \"*:7072\"\n")),
             Catch::Contains("feed.peer_hints.advertise: required when feed.peer_hints.listen"));
  CHECK_THAT(errorOf(withHints("    listen: \"[::]:7072\"\n")),
             Catch::Contains("feed.peer_hints.advertise: required"));
  CHECK_THAT(errorOf(withHints("    listen: 0.0.0.0:7072\n")),
             Catch::Contains("feed.peer_hints.advertise: required"));
  CHECK_THAT(errorOf(withHints("    listen: localhost:7072\n")),
             Catch::Contains("feed.peer_hints.listen: \"localhost:7072\": the host must be an IP"));
  CHECK_THAT(errorOf(withHints("    listen: 10.0.0.7:0\n    advertise: 10.0.0.7:7072\n")),
             Catch::Contains("feed.peer_hints.listen: \"10.0.0.7:0\" picks a free port"));
  CHECK_THAT(errorOf(withHints("    listen: \"*:7072\"\n    advertise: 10.0.0.7:0\n")),
             Catch::Contains("feed.peer_hints.advertise: \"10.0.0.7:0\": port 0"));
  CHECK_THAT(errorOf(withHints("    listen: \"*:7072\"\n    advertise: \"*:7072\"\n")),
             Catch::Contains("feed.peer_hints.advertise: \"*:7072\": every interface"));
  CHECK_THAT(errorOf(withHints("    listen: \"*:7072\"\n", "$(POD_IP):7072")),
             Catch::Contains("feed.peer_hints.advertise (from $KRANE_PEER_HINTS_ADVERTISE):"
                             " \"$(POD_IP):7072\" has an unexpanded variable"));
  CHECK_THAT(errorOf(withHints("    advertise: 10.0.0.7:7072\n")),
             Catch::Contains("feed.peer_hints.advertise: needs feed.peer_hints.listen"));
  CHECK_THAT(errorOf(withHints("    listen: \"::1:7072\"\n")),
             Catch::Contains("feed.peer_hints.listen: \"::1:7072\": the host must be an IP"));
  CHECK_THAT(errorOf(withHints("    listen: \"[0::0]:7072\"\n")),
             Catch::Contains("feed.peer_hints.advertise: required"));
  CHECK_THAT(errorOf(withHints("    listen: 10.0.0.7:00\n    advertise: 10.0.0.7:7072\n")),
             Catch::Contains("feed.peer_hints.listen: \"10.0.0.7:00\" picks a free port"));
  CHECK_THAT(errorOf(withHints("    listen: 10.0.0.7:0\n", "10.0.0.7:7072")),
             Catch::Contains("feed.peer_hints.listen: \"10.0.0.7:0\" picks a free port"));
  CHECK_THAT(errorOf(withHints("    listen: \"*:7072\"\n    advertise: tcp://10.0.0.8:7072\n")),
             Catch::Contains("feed.peer_hints.advertise: \"tcp://10.0.0.8:7072\": host:port only"));
  CHECK_THAT(errorOf(withHints("    listen: \"*:7072\"\n", ":::7072")),
             Catch::Contains("\":::7072\": every interface cannot be dialled"));
  CHECK_THAT(errorOf(withHints("    listen: \"*:7072\"\n", "pod-ip")),
             Catch::Contains("feed.peer_hints.advertise (from $KRANE_PEER_HINTS_ADVERTISE):"
                             " \"pod-ip\" is not host:port"));
}

}  // namespace
}  // namespace krane::ctrl
