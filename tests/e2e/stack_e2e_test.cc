// The whole stack as an operator runs it, every part a real process: MariaDB, `krane-ctrl serve`,
// `krane` agents with the deployment plugin on the process runtime (instances are real demo-app
// processes), and `kranectl`. Faults are real too: kill -9 of an agent and of krane-ctrl, a
// MariaDB restart, two agents of one region, a token of the wrong region.
#include <httplib.h>
#include <signal.h>
#include <unistd.h>

#include <fstream>
#include <regex>
#include <set>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/strings.h"
#include "tests/support/mariadb.h"
#include "tests/support/process.h"
#include "tests/support/wait.h"

namespace krane {
namespace {

using krane::testing::ChildProcess;
using krane::testing::CommandResult;
using krane::testing::eventually;
using krane::testing::runCommand;
using krane::testing::runfile;
using krane::testing::ScratchMariaDb;
using krane::testing::slurp;
using ::testing::HasSubstr;

constexpr char kOperatorToken[] = "e2e-operator-token-0123456789abcdef";

// One stack per test; `base` keeps the ports of tests apart (they may run side by side).
class Stack {
 public:
  explicit Stack(int base) : grpc_port_(base), http_port_(base + 1), instance_port_(base + 10) {
    char pattern[] = "/tmp/krane-e2e-XXXXXX";
    dir_ = ::mkdtemp(pattern);
    dsn_ = ScratchMariaDb::instance().freshDatabase();
    dsn_text_ = strCat("mysql://", dsn_.user, "@127.0.0.1:", dsn_.port, "/", dsn_.database);
    expectOk(ctrl({"migrate", "--dsn", dsn_text_}));
    for (const char* region : {"r1", "r2"}) {
      expectOk(ctrl({"region", "add", region, "--dsn", dsn_text_}));
      auto token = ctrl({"token", "create", "--region", region, "--dsn", dsn_text_});
      expectOk(token);
      std::string t = token.out;
      while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back()))) t.pop_back();
      tokens_[region] = t.substr(t.rfind('\n') + 1);
    }
    startCtrl();
  }
  ~Stack() {
    agents_.clear();  // SIGKILL, as a crash would
    ctrl_.reset();
    // Instances outlive a killed agent by design; the test must not leave them behind.
    runCommand(
        {"/bin/sh", "-c",
         strCat("for f in $(find ", dir_, " -name instance.json); do ",
                "p=$(sed -n 's/.*\"pid\": *\\([0-9]*\\).*/\\1/p' $f); ",
                // pid 0: a record written before its fork ("kill 0" would hit this shell's group)
                "[ \"${p:-0}\" -gt 0 ] && kill -9 $p 2>/dev/null; done")});
  }

  static void expectOk(const CommandResult& r) { ASSERT_EQ(r.exit_code, 0) << r.out << r.err; }
  CommandResult ctrl(std::vector<std::string> args) {
    args.insert(args.begin(), runfile("controlplane/krane-ctrl"));
    return runCommand(args);
  }

  void startCtrl() {
    ctrl_ = std::make_unique<ChildProcess>(
        std::vector<std::string>{runfile("controlplane/krane-ctrl"), "serve", "--dsn", dsn_text_,
                                 "--listen", strCat("127.0.0.1:", grpc_port_), "--http-listen",
                                 strCat("127.0.0.1:", http_port_)},
        strCat(dir_, "/ctrl.log"),
        std::map<std::string, std::string>{{"KRANE_OPERATOR_TOKEN", kOperatorToken}});
    ASSERT_TRUE(eventually([&] { return kranectl({"get"}).exit_code == 0; }))
        << slurp(dir_ + "/ctrl.log");
  }
  void killCtrl() {
    ctrl_->signal(SIGKILL);
    ctrl_->wait();
    ctrl_.reset();
  }

  // Starts agent `name` of `region` (state directory `state`, default its own), with `token`
  // (default: the region's).
  void startAgent(const std::string& name, const std::string& region, std::string state = "",
                  std::string token = "") {
    if (state.empty()) state = strCat(dir_, "/", name);
    if (token.empty()) token = tokens_.at(region);
    const std::string config = strCat(dir_, "/", name, ".yaml");
    const int from = instance_port_ + (region == "r1" ? 0 : 40);
    std::ofstream(config) << strCat(
        "region: ", region, "\nagent_id: ", name, "\nstate_dir: ", state,
        "\nreconnect_min_ms: 50\nreconnect_max_ms: 300\n",
        "control_plane:\n  address: 127.0.0.1:", grpc_port_, "\n",
        "reporter:\n  heartbeat_interval_ms: 200\n", "plugins:\n  - name: deployment\n    path: ",
        runfile("plugins/deployment/libdeployment.so"),
        "\n    config:\n      runtime: process\n      process:\n        state_dir: ", state,
        "/deployments\n        ports: {from: ", from, ", to: ", from + 39, "}\n",
        "        images:\n          krane.dev/demo-app: [",
        runfile("tests/support/demo_app/krane-demo-app"), ", --version, \"{tag}\"]\n");
    agents_[name] = std::make_unique<ChildProcess>(
        std::vector<std::string>{runfile("agent/krane"), "run", "--config", config, "--plugin-host",
                                 runfile("agent/krane-plugin-host")},
        strCat(dir_, "/", name, ".log"),
        std::map<std::string, std::string>{{"KRANE_AGENT_TOKEN", token}});
  }
  void killAgent(const std::string& name) {
    agents_.at(name)->signal(SIGKILL);
    agents_.at(name)->wait();
    agents_.erase(name);
  }
  std::string agentLog(const std::string& name) { return slurp(strCat(dir_, "/", name, ".log")); }

  CommandResult kranectl(std::vector<std::string> args,
                         std::map<std::string, std::string> env = {}) {
    args.insert(args.begin(), runfile("cli/kranectl"));
    env.emplace("KRANE_SERVER", strCat("127.0.0.1:", grpc_port_));
    env.emplace("KRANE_TOKEN", kOperatorToken);
    return runCommand(args, env, std::chrono::seconds(120));
  }
  // `kranectl watch` in the background: stdout in watch.out, stderr in watch.err.
  std::unique_ptr<ChildProcess> watch(const std::string& region) {
    return std::make_unique<ChildProcess>(
        std::vector<std::string>{"/bin/sh", "-c",
                                 strCat("exec ", runfile("cli/kranectl"), " watch --region ",
                                        region, " 2>", dir_, "/watch.err >", dir_, "/watch.out")},
        "",
        std::map<std::string, std::string>{{"KRANE_SERVER", strCat("127.0.0.1:", grpc_port_)},
                                           {"KRANE_TOKEN", kOperatorToken}});
  }
  // Writes a file for `kranectl apply -f`.
  std::string file(const std::string& name, const std::string& yaml) {
    const std::string path = strCat(dir_, "/", name);
    std::ofstream(path) << yaml;
    return path;
  }
  CommandResult waitConverged(const std::string& id, const std::string& region) {
    return kranectl({"status", "deployment", id, "--region", region, "--wait", "--timeout", "90"});
  }
  // The instances' addresses, as kranectl reports them.
  std::vector<std::string> addresses(const std::string& id, const std::string& region) {
    auto r = kranectl({"status", "deployment", id, "--region", region, "-o", "json"});
    std::vector<std::string> out;
    std::regex re("\"address\": \"([^\"]+)\"");
    for (auto it = std::sregex_iterator(r.out.begin(), r.out.end(), re);
         it != std::sregex_iterator(); ++it)
      out.push_back((*it)[1]);
    return out;
  }

  const std::string& dir() const { return dir_; }
  const std::string& token(const std::string& region) const { return tokens_.at(region); }

 private:
  int grpc_port_, http_port_, instance_port_;
  std::string dir_;
  db::Dsn dsn_;
  std::string dsn_text_;
  std::map<std::string, std::string> tokens_;
  std::unique_ptr<ChildProcess> ctrl_;
  std::map<std::string, std::unique_ptr<ChildProcess>> agents_;
};

std::string deployment(const std::string& id, const std::string& region, int replicas,
                       const std::string& tag, const std::string& extra_env = "") {
  return strCat(
      "kind: Deployment\nid: ", id, "\nregion: ", region,
      "\nspec:\n  workspaceId: ws\n  projectId: p\n  appId: a\n  environmentId: e\n",
      "  image: krane.dev/demo-app:", tag, "\n  port: 8080\n  replicas: ", replicas,
      "\n  cpuMillicores: 50\n  memoryMib: 32\n",
      "  healthcheck: {readiness: {path: /healthz/ready, periodSeconds: 1}}\n",
      extra_env.empty() ? "" : strCat("  env: [{name: MARK, value: \"", extra_env, "\"}]\n"));
}

std::string get(const std::string& address) {
  const auto colon = address.rfind(':');
  httplib::Client client(address.substr(0, colon), std::stoi(address.substr(colon + 1)));
  client.set_connection_timeout(1);
  auto res = client.Get("/");
  return res && res->status == 200 ? res->body : "";
}

TEST(StackE2e, ApplyConvergeServeReportAndDeleteWithKranectl) {
  Stack stack(27000);
  stack.startAgent("a1", "r1");
  auto watch = stack.watch("r1");
  ASSERT_TRUE(eventually([&] {
    return slurp(stack.dir() + "/watch.err").find("watching r1") != std::string::npos;
  })) << slurp(stack.dir() + "/watch.err");
  auto applied =
      stack.kranectl({"apply", "-f", stack.file("app.yaml", deployment("web", "r1", 2, "v1"))});
  ASSERT_EQ(applied.exit_code, 0) << applied.err;
  EXPECT_THAT(applied.out, HasSubstr("deployment_topology/web (r1) created, version 1"));
  auto waited = stack.waitConverged("web", "r1");
  ASSERT_EQ(waited.exit_code, 0) << waited.out << waited.err << stack.agentLog("a1");
  EXPECT_THAT(waited.out, HasSubstr("converged in"));

  const auto addresses = stack.addresses("web", "r1");
  ASSERT_EQ(addresses.size(), 2u);
  for (const auto& a : addresses) EXPECT_THAT(get(a), HasSubstr("krane-demo-app v1")) << a;

  auto listed = stack.kranectl({"get", "deployments", "-o", "yaml"});
  EXPECT_EQ(listed.exit_code, 0);
  EXPECT_THAT(listed.out, HasSubstr("image: krane.dev/demo-app:v1"));
  ASSERT_TRUE(eventually([&] {
    auto agents = stack.kranectl({"agents"});
    return std::regex_search(agents.out, std::regex("a1 +r1 +yes +\\S+ +1 +1 +0 "));
  })) << stack.kranectl({"agents"}).out;

  auto deleted = stack.kranectl({"delete", "deployment", "web", "--region", "r1"});
  EXPECT_EQ(deleted.exit_code, 0) << deleted.err;
  for (const auto& a : addresses)
    EXPECT_TRUE(eventually([&] { return get(a).empty(); })) << a << " still serves";
  EXPECT_EQ(stack.kranectl({"status", "deployment", "web", "--region", "r1"}).exit_code, 5);
  // `kranectl watch` saw both changes, live.
  EXPECT_TRUE(eventually([&] {
    const std::string seen = slurp(stack.dir() + "/watch.out");
    return std::regex_search(seen, std::regex("r1 +apply +deployment_topology/web +version 1")) &&
           std::regex_search(seen, std::regex("r1 +delete +deployment_topology/web +version 2"));
  })) << slurp(stack.dir() + "/watch.out");
}

TEST(StackE2e, KranectlErrorsAreClearWithStableExitCodes) {
  Stack stack(27100);
  auto unreachable = stack.kranectl({"get", "--server", "127.0.0.1:1", "--request-timeout", "2"});
  EXPECT_EQ(unreachable.exit_code, 3);
  EXPECT_THAT(unreachable.err, HasSubstr("cannot reach krane-ctrl at 127.0.0.1:1"));
  auto bad_token = stack.kranectl({"get", "--token", "nope"});
  EXPECT_EQ(bad_token.exit_code, 4);
  EXPECT_THAT(bad_token.err, HasSubstr("refused the token"));
  EXPECT_EQ(stack.kranectl({"watch", "--token", "nope"}).exit_code, 4);
  auto bad_file = stack.kranectl(
      {"apply", "-f",
       stack.file("bad.yaml",
                  deployment("ok", "r1", 1, "v1") + "---\n" +
                      "kind: Deployment\nid: broken\nregion: r1\nspec:\n  replicas: many\n")});
  EXPECT_EQ(bad_file.exit_code, 2);
  EXPECT_THAT(bad_file.err, HasSubstr("bad.yaml: document 2 (Deployment broken): spec: "));
  EXPECT_THAT(bad_file.err, HasSubstr("replicas"));
  EXPECT_THAT(stack.kranectl({"get"}).out, HasSubstr("no resources")) << "nothing half-applied";
  auto refused =
      stack.kranectl({"apply", "-f", stack.file("norg.yaml", deployment("d", "nowhere", 1, "v1"))});
  EXPECT_EQ(refused.exit_code, 5) << "an unknown region";
  EXPECT_THAT(refused.err, HasSubstr("nowhere"));
  EXPECT_EQ(stack.kranectl({"get", "deployment", "missing"}).exit_code, 5);
  auto zero = stack.kranectl(
      {"apply", "-f",
       stack.file("zero.yaml", deployment("z", "r1", 1, "v1") + "  cpuMillicores: 0\n")});
  EXPECT_NE(zero.exit_code, 0);
  EXPECT_EQ(stack.kranectl({"frobnicate"}).exit_code, 2);
  EXPECT_EQ(stack.kranectl({"apply", "--help"}).exit_code, 0);
}

// Updates stream in while the agent is killed; a new agent on the same state directory catches
// up, and every deployment ends on its last spec.
TEST(StackE2e, AgentKilledDuringAStreamOfUpdatesConvergesWithNothingMissed) {
  Stack stack(27200);
  stack.startAgent("a1", "r1");
  constexpr int kApps = 4;
  for (int round = 0; round < 4; ++round) {
    if (round == 2) stack.killAgent("a1");
    for (int i = 0; i < kApps; ++i) {
      auto r = stack.kranectl(
          {"apply", "-f",
           stack.file(strCat("app", i, ".yaml"),
                      deployment(strCat("app", i), "r1", 1, "v1", strCat("round-", round)))});
      ASSERT_EQ(r.exit_code, 0) << r.err;
    }
    if (round == 2) stack.startAgent("a1", "r1");
  }
  for (int i = 0; i < kApps; ++i) {
    auto waited = stack.waitConverged(strCat("app", i), "r1");
    ASSERT_EQ(waited.exit_code, 0) << waited.out << waited.err << stack.agentLog("a1");
  }
  // (Whether the restarted agent resumed from its watermark or, killed before persisting one,
  // did a full sync depends on the moment of the kill; agent_e2e_test covers the resume.)
  // Each app runs one instance, of the last round's spec.
  for (int i = 0; i < kApps; ++i) {
    auto json =
        stack.kranectl({"status", "deployment", strCat("app", i), "--region", "r1", "-o", "json"});
    EXPECT_THAT(json.out, HasSubstr("\"current_instances\": 1")) << json.out;
    EXPECT_EQ(stack.addresses(strCat("app", i), "r1").size(), 1u);
  }
}

TEST(StackE2e, CtrlKilledAndMariaDbRestartedAgentsReconnectAndCatchUp) {
  Stack stack(27300);
  stack.startAgent("a1", "r1");
  stack.startAgent("a2", "r2");
  ASSERT_EQ(stack.kranectl({"apply", "-f", stack.file("a.yaml", deployment("one", "r1", 1, "v1"))})
                .exit_code,
            0);
  ASSERT_EQ(stack.waitConverged("one", "r1").exit_code, 0);

  stack.killCtrl();
  stack.startCtrl();
  ASSERT_EQ(stack.kranectl({"apply", "-f", stack.file("b.yaml", deployment("two", "r2", 1, "v1"))})
                .exit_code,
            0);
  auto two = stack.waitConverged("two", "r2");
  ASSERT_EQ(two.exit_code, 0) << two.out << two.err << stack.agentLog("a2");

  ScratchMariaDb::instance().restart();
  ASSERT_TRUE(eventually([&] {
    return stack.kranectl({"apply", "-f", stack.file("c.yaml", deployment("one", "r1", 2, "v2"))})
               .exit_code == 0;
  }));
  auto one = stack.waitConverged("one", "r1");
  ASSERT_EQ(one.exit_code, 0) << one.out << one.err << stack.agentLog("a1");
  for (const auto& a : stack.addresses("one", "r1")) EXPECT_THAT(get(a), HasSubstr("v2"));
  ASSERT_TRUE(eventually([&] {
    auto agents = stack.kranectl({"agents", "-o", "json"});
    return agents.exit_code == 0 && agents.out.find("\"lag\": \"") == std::string::npos;
  })) << "every agent caught up (lag 0 is left out of the JSON)";
}

TEST(StackE2e, TwoAgentsOfOneRegionOneLeaderAndTheOtherTakesOver) {
  Stack stack(27400);
  const std::string shared = stack.dir() + "/shared-state";
  stack.startAgent("first", "r1", shared);
  ASSERT_TRUE(eventually(
      [&] { return stack.agentLog("first").find("agent: running") != std::string::npos; }));
  stack.startAgent("second", "r1", shared);
  ASSERT_TRUE(eventually(
      [&] { return stack.agentLog("second").find("standing by") != std::string::npos; }));
  ASSERT_EQ(stack.kranectl({"apply", "-f", stack.file("a.yaml", deployment("app", "r1", 1, "v1"))})
                .exit_code,
            0);
  ASSERT_EQ(stack.waitConverged("app", "r1").exit_code, 0);
  EXPECT_THAT(stack.agentLog("second"), Not(HasSubstr("agent: running")));

  stack.killAgent("first");
  ASSERT_EQ(stack.kranectl({"apply", "-f", stack.file("a.yaml", deployment("app", "r1", 2, "v2"))})
                .exit_code,
            0);
  auto waited = stack.waitConverged("app", "r1");
  ASSERT_EQ(waited.exit_code, 0) << waited.out << stack.agentLog("second");
  EXPECT_THAT(stack.agentLog("second"), HasSubstr("agent: running"));
  auto agents = stack.kranectl({"agents"});
  EXPECT_TRUE(std::regex_search(agents.out, std::regex("second +r1 +yes"))) << agents.out;
}

TEST(StackE2e, ATokenOfRegionR1IsRefusedForRegionR2) {
  Stack stack(27500);
  stack.startAgent("intruder", "r2", "", stack.token("r1"));
  ASSERT_EQ(stack.kranectl({"apply", "-f", stack.file("a.yaml", deployment("app", "r2", 1, "v1"))})
                .exit_code,
            0);
  ASSERT_TRUE(eventually([&] {
    const std::string log = stack.agentLog("intruder");
    return log.find("this agent token is for region \"r1\", not \"r2\"") != std::string::npos;
  })) << stack.agentLog("intruder");
  auto status = stack.kranectl({"status", "deployment", "app", "--region", "r2", "-o", "json"});
  EXPECT_THAT(status.out, Not(HasSubstr("address"))) << "nothing ran in r2";
  EXPECT_THAT(stack.kranectl({"agents"}).out, Not(HasSubstr("intruder")));
}

}  // namespace
}  // namespace krane
