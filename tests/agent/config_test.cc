#include "agent/config.h"

#include <catch2/catch.hpp>

#include "common/strings.h"
#include "tests/support/matchers.h"

namespace krane::agent {
namespace {

std::string errorOf(const std::string& yaml) {
  auto c = parseAgentConfig(yaml, "agent.yaml");
  INFO(yaml);
  CHECK_FALSE(c.ok());
  return c.ok() ? "" : std::string(toStd(c.status().message()));
}

TEST_CASE("parses every key with defaults", "[agent-config]") {
  auto c = parseAgentConfig(R"(
region: eu-1
state_dir: /tmp/krane
control_plane:
  address: ctrl.internal:7070
  token_file: /etc/krane/token
plugins:
  - name: deployment
    path: /usr/lib/krane/libdeployment.so
    workers: 8
    call_timeout_ms: 600000
    config:
      runtime: process
      ports: {from: 20000, to: 20999}
  - name: cilium
    path: /usr/lib/krane/libcilium.so
    isolation: in_process
)",
                            "agent.yaml");
  REQUIRE_THAT(c, IsOk());
  CHECK(c->region == "eu-1");
  CHECK(c->resync_interval == std::chrono::seconds(300));
  CHECK(c->leader.mode == "lockfile");
  REQUIRE(c->plugins.size() == 2u);
  CHECK(c->plugins[0].workers == 8u);
  CHECK(c->plugins[0].call_timeout == std::chrono::minutes(10));
  CHECK(c->plugins[1].call_timeout == std::chrono::minutes(2));
  CHECK(c->plugins[1].cancel_grace == std::chrono::seconds(10));
  CHECK(c->plugins[0].isolation == "process");
  CHECK(c->plugins[0].config_json == R"({"ports":{"from":20000,"to":20999},"runtime":"process"})");
  CHECK(c->plugins[1].isolation == "in_process");
  CHECK(c->plugins[1].config_json == "{}");
  CHECK(c->dispatch.max_attempts == 3);
  CHECK(c->dispatch.batch == 32);
}

TEST_CASE("refuses bad input naming the key", "[agent-config]") {
  CHECK_THAT(errorOf("region: eu-1\nplugns: []\n"),
             Catch::Contains("agent.yaml: plugns: unknown key"));
  CHECK_THAT(errorOf("plugins: []\n"), Catch::Contains("region: required"));
  CHECK_THAT(errorOf("region: eu-1\nruntime: docker\n"),
             Catch::Contains("runtime: \"docker\" is not one of: process, kubernetes"));
  CHECK_THAT(errorOf("region: eu-1\nplugins:\n  - name: a\n    path: a.so\n    workers: 0\n"),
             Catch::Contains("plugins[0].workers: must be between 1 and 64, got 0"));
  CHECK_THAT(
      errorOf("region: eu-1\nplugins:\n  - name: a\n    path: a.so\n    call_timeout_ms: 5\n"),
      Catch::Contains("plugins[0].call_timeout_ms: must be between 100 and 3600000, got 5"));
  CHECK_THAT(errorOf("region: eu-1\nplugins:\n  - name: a\n"),
             Catch::Contains("plugins[0].path: required"));
  CHECK_THAT(errorOf("region: eu-1\nplugins:\n  - name: a\n    path: x\n    colour: red\n"),
             Catch::Contains("plugins[0].colour: unknown key"));
  CHECK_THAT(errorOf("region: eu-1\nplugins:\n  - {name: a, path: x}\n  - {name: a, path: y}\n"),
             Catch::Contains("plugins[1].name: \"a\" is configured twice"));
  CHECK_THAT(errorOf("region: eu-1\ncontrol_plane:\n  address: nowhere\n"),
             Catch::Contains("control_plane.address"));
  CHECK_THAT(errorOf("region: eu-1\ncontrol_plane:\n  watch_address: nowhere\n"),
             Catch::Contains(
                 "control_plane.watch_address: \"nowhere\" is not host:port, \"off\" or empty"));
  CHECK_THAT(errorOf("region: eu-1\ncontrol_plane:\n  keepalive_ms: 500\n"),
             Catch::Contains("control_plane.keepalive_ms: must be 0 (off) or at least 1000 "
                             "(krane-ctrl refuses pings more frequent than that), got 500"));
  CHECK_THAT(errorOf("region: eu-1\ncontrol_plane:\n  keepalive_timeout_ms: 10\n"),
             Catch::Contains("control_plane.keepalive_timeout_ms: must be between 1000 and"));
  CHECK_THAT(errorOf("region: eu-1\nleader:\n  mode: vote\n"), Catch::Contains("leader.mode"));
  CHECK_THAT(errorOf("region: [\n"), Catch::Contains("not valid YAML"));
  CHECK_THAT(errorOf("region: eu-1\ndispatch:\n  batch: 0\n"),
             Catch::Contains("dispatch.batch: must be between 1 and 1024, got 0"));
}

TEST_CASE("needs a token", "[agent-config]") {
  auto c = parseAgentConfig("region: eu-1\n", "agent.yaml");
  REQUIRE_THAT(c, IsOk());
  unsetenv("KRANE_AGENT_TOKEN");
  auto st = finishAgentConfig(*c);
  CHECK_THAT(std::string(toStd(st.message())),
             Catch::Contains("krane-ctrl token create --region eu-1"));
  setenv("KRANE_AGENT_TOKEN", "krane_agent_x", 1);
  CHECK_THAT(finishAgentConfig(*c), IsOk());
  CHECK(c->control_plane.token == "krane_agent_x");
  CHECK_FALSE(c->agent_id.empty());
}

TEST_CASE("the watch address is parsed and checked", "[agent-config]") {
  auto c = parseAgentConfig(
      "region: eu-1\ncontrol_plane:\n  address: ctrl:7070\n  watch_address: ctrl:7073\n  "
      "ca_file: /etc/ca.pem\n",
      "agent.yaml");
  REQUIRE_THAT(c, IsOk());
  CHECK(c->control_plane.watch_address == "ctrl:7073");
  CHECK(c->control_plane.address == "ctrl:7070");
}

TEST_CASE("keepalive pings are on by default and can be turned off", "[agent-config]") {
  auto defaults = parseAgentConfig("region: eu-1\n", "agent.yaml");
  REQUIRE_THAT(defaults, IsOk());
  CHECK(defaults->control_plane.keepalive == std::chrono::seconds(30));
  CHECK(defaults->control_plane.keepalive_timeout == std::chrono::seconds(10));
  auto off = parseAgentConfig("region: eu-1\ncontrol_plane:\n  keepalive_ms: 0\n", "agent.yaml");
  REQUIRE_THAT(off, IsOk());
  CHECK(off->control_plane.keepalive.count() == 0);
  auto set = parseAgentConfig(
      "region: eu-1\ncontrol_plane:\n  keepalive_ms: 1000\n  keepalive_timeout_ms: 2000\n",
      "agent.yaml");
  REQUIRE_THAT(set, IsOk());
  CHECK(set->control_plane.keepalive == std::chrono::seconds(1));
  CHECK(set->control_plane.keepalive_timeout == std::chrono::seconds(2));
}

}  // namespace
}  // namespace krane::agent
