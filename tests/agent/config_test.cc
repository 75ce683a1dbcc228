#include "agent/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/strings.h"

namespace krane::agent {
namespace {

using ::testing::HasSubstr;

std::string errorOf(const std::string& yaml) {
  auto c = parseAgentConfig(yaml, "agent.yaml");
  EXPECT_FALSE(c.ok()) << yaml;
  return c.ok() ? "" : std::string(toStd(c.status().message()));
}

TEST(AgentConfig, ParsesEveryKeyWithDefaults) {
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
    config:
      runtime: process
      ports: {from: 20000, to: 20999}
  - name: cilium
    path: /usr/lib/krane/libcilium.so
    isolation: in_process
)",
                            "agent.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->region, "eu-1");
  EXPECT_EQ(c->resync_interval, std::chrono::seconds(300));
  EXPECT_EQ(c->leader.mode, "lockfile");
  ASSERT_EQ(c->plugins.size(), 2u);
  EXPECT_EQ(c->plugins[0].workers, 8u);
  EXPECT_EQ(c->plugins[0].isolation, "process");
  EXPECT_EQ(c->plugins[0].config_json,
            R"({"ports":{"from":20000,"to":20999},"runtime":"process"})");
  EXPECT_EQ(c->plugins[1].isolation, "in_process");
  EXPECT_EQ(c->plugins[1].config_json, "{}");
  EXPECT_EQ(c->dispatch.max_attempts, 5);
  EXPECT_EQ(c->dispatch.batch, 32);
}

TEST(AgentConfig, RefusesBadInputNamingTheKey) {
  EXPECT_THAT(errorOf("region: eu-1\nplugns: []\n"), HasSubstr("agent.yaml: plugns: unknown key"));
  EXPECT_THAT(errorOf("plugins: []\n"), HasSubstr("region: required"));
  EXPECT_THAT(errorOf("region: eu-1\nruntime: docker\n"),
              HasSubstr("runtime: \"docker\" is not one of: process, kubernetes"));
  EXPECT_THAT(errorOf("region: eu-1\nplugins:\n  - name: a\n    path: a.so\n    workers: 0\n"),
              HasSubstr("plugins[0].workers: must be between 1 and 64, got 0"));
  EXPECT_THAT(errorOf("region: eu-1\nplugins:\n  - name: a\n"),
              HasSubstr("plugins[0].path: required"));
  EXPECT_THAT(errorOf("region: eu-1\nplugins:\n  - name: a\n    path: x\n    colour: red\n"),
              HasSubstr("plugins[0].colour: unknown key"));
  EXPECT_THAT(errorOf("region: eu-1\nplugins:\n  - {name: a, path: x}\n  - {name: a, path: y}\n"),
              HasSubstr("plugins[1].name: \"a\" is configured twice"));
  EXPECT_THAT(errorOf("region: eu-1\ncontrol_plane:\n  address: nowhere\n"),
              HasSubstr("control_plane.address"));
  EXPECT_THAT(errorOf("region: eu-1\nleader:\n  mode: vote\n"), HasSubstr("leader.mode"));
  EXPECT_THAT(errorOf("region: [\n"), HasSubstr("not valid YAML"));
  EXPECT_THAT(errorOf("region: eu-1\ndispatch:\n  batch: 0\n"),
              HasSubstr("dispatch.batch: must be between 1 and 1024, got 0"));
}

TEST(AgentConfig, NeedsAToken) {
  auto c = parseAgentConfig("region: eu-1\n", "agent.yaml");
  ASSERT_TRUE(c.ok());
  unsetenv("KRANE_AGENT_TOKEN");
  auto st = finishAgentConfig(*c);
  EXPECT_THAT(std::string(toStd(st.message())), HasSubstr("krane-ctrl token create --region eu-1"));
  setenv("KRANE_AGENT_TOKEN", "krane_agent_x", 1);
  EXPECT_TRUE(finishAgentConfig(*c).ok());
  EXPECT_EQ(c->control_plane.token, "krane_agent_x");
  EXPECT_FALSE(c->agent_id.empty());
}

}  // namespace
}  // namespace krane::agent
