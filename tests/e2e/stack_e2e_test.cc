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

#include <catch2/catch.hpp>

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

  static void expectOk(const CommandResult& r) {
    {
      INFO(r.out << r.err);
      REQUIRE(r.exit_code == 0);
    }
  }
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
    INFO(slurp(dir_ + "/ctrl.log"));
    REQUIRE(eventually([&] { return kranectl({"get"}).exit_code == 0; }));
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

TEST_CASE("apply converge serve report and delete with kranectl", "[stack-e2e][slow]") {
  Stack stack(27000);
  stack.startAgent("a1", "r1");
  auto watch = stack.watch("r1");
  INFO(slurp(stack.dir() + "/watch.err"));
  REQUIRE(eventually(
      [&] { return slurp(stack.dir() + "/watch.err").find("watching r1") != std::string::npos; }));
  auto applied =
      stack.kranectl({"apply", "-f", stack.file("app.yaml", deployment("web", "r1", 2, "v1"))});
  INFO(applied.err);
  REQUIRE(applied.exit_code == 0);
  CHECK_THAT(applied.out, Catch::Contains("deployment_topology/web (r1) created, version 1"));
  auto waited = stack.waitConverged("web", "r1");
  INFO(waited.out << waited.err << stack.agentLog("a1"));
  REQUIRE(waited.exit_code == 0);
  CHECK_THAT(waited.out, Catch::Contains("converged in"));

  const auto addresses = stack.addresses("web", "r1");
  REQUIRE(addresses.size() == 2u);
  for (const auto& a : addresses) {
    INFO(a);
    CHECK_THAT(get(a), Catch::Contains("krane-demo-app v1"));
  }

  auto listed = stack.kranectl({"get", "deployments", "-o", "yaml"});
  CHECK(listed.exit_code == 0);
  CHECK_THAT(listed.out, Catch::Contains("image: krane.dev/demo-app:v1"));
  INFO(stack.kranectl({"agents"}).out);
  REQUIRE(eventually([&] {
    auto agents = stack.kranectl({"agents"});
    return std::regex_search(agents.out, std::regex("a1 +r1 +yes +\\S+ +1 +1 +0 "));
  }));

  auto deleted = stack.kranectl({"delete", "deployment", "web", "--region", "r1"});
  INFO(deleted.err);
  CHECK(deleted.exit_code == 0);
  for (const auto& a : addresses) {
    INFO(a << " still serves");
    CHECK(eventually([&] { return get(a).empty(); }));
  }
  CHECK(stack.kranectl({"status", "deployment", "web", "--region", "r1"}).exit_code == 5);
  // `kranectl watch` saw both changes, live.
  INFO(slurp(stack.dir() + "/watch.out"));
  CHECK(eventually([&] {
    const std::string seen = slurp(stack.dir() + "/watch.out");
    return std::regex_search(seen, std::regex("r1 +apply +deployment_topology/web +version 1")) &&
           std::regex_search(seen, std::regex("r1 +delete +deployment_topology/web +version 2"));
  }));
}

TEST_CASE("kranectl errors are clear with stable exit codes", "[stack-e2e][slow]") {
  Stack stack(27100);
  auto unreachable = stack.kranectl({"get", "--server", "127.0.0.1:1", "--request-timeout", "2"});
  CHECK(unreachable.exit_code == 3);
  CHECK_THAT(unreachable.err, Catch::Contains("cannot reach krane-ctrl at 127.0.0.1:1"));
  auto bad_token = stack.kranectl({"get", "--token", "nope"});
  CHECK(bad_token.exit_code == 4);
  CHECK_THAT(bad_token.err, Catch::Contains("refused the token"));
  CHECK(stack.kranectl({"watch", "--token", "nope"}).exit_code == 4);
  auto bad_file = stack.kranectl(
      {"apply", "-f",
       stack.file("bad.yaml",
                  deployment("ok", "r1", 1, "v1") + "---\n" +
                      "kind: Deployment\nid: broken\nregion: r1\nspec:\n  replicas: many\n")});
  CHECK(bad_file.exit_code == 2);
  CHECK_THAT(bad_file.err, Catch::Contains("bad.yaml: document 2 (Deployment broken): spec: "));
  CHECK_THAT(bad_file.err, Catch::Contains("replicas"));
  INFO("nothing half-applied");
  CHECK_THAT(stack.kranectl({"get"}).out, Catch::Contains("no resources"));
  auto refused =
      stack.kranectl({"apply", "-f", stack.file("norg.yaml", deployment("d", "nowhere", 1, "v1"))});
  INFO("an unknown region");
  CHECK(refused.exit_code == 5);
  CHECK_THAT(refused.err, Catch::Contains("nowhere"));
  CHECK(stack.kranectl({"get", "deployment", "missing"}).exit_code == 5);
  auto zero = stack.kranectl(
      {"apply", "-f",
       stack.file("zero.yaml", deployment("z", "r1", 1, "v1") + "  cpuMillicores: 0\n")});
  CHECK(zero.exit_code != 0);
  CHECK(stack.kranectl({"frobnicate"}).exit_code == 2);
  CHECK(stack.kranectl({"apply", "--help"}).exit_code == 0);
}

// Updates stream in while the agent is killed; a new agent on the same state directory catches
// up, and every deployment ends on its last spec.
TEST_CASE("agent killed during a stream of updates converges with nothing missed",
          "[stack-e2e][slow]") {
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
      INFO(r.err);
      REQUIRE(r.exit_code == 0);
    }
    if (round == 2) stack.startAgent("a1", "r1");
  }
  for (int i = 0; i < kApps; ++i) {
    auto waited = stack.waitConverged(strCat("app", i), "r1");
    INFO(waited.out << waited.err << stack.agentLog("a1"));
    REQUIRE(waited.exit_code == 0);
  }
  // (Whether the restarted agent resumed from its watermark or, killed before persisting one,
  // did a full sync depends on the moment of the kill; agent_e2e_test covers the resume.)
  // Each app runs one instance, of the last round's spec.
  for (int i = 0; i < kApps; ++i) {
    auto json =
        stack.kranectl({"status", "deployment", strCat("app", i), "--region", "r1", "-o", "json"});
    INFO(json.out);
    CHECK_THAT(json.out, Catch::Contains("\"current_instances\": 1"));
    CHECK(stack.addresses(strCat("app", i), "r1").size() == 1u);
  }
}

TEST_CASE("ctrl killed and maria db restarted agents reconnect and catch up", "[stack-e2e][slow]") {
  Stack stack(27300);
  stack.startAgent("a1", "r1");
  stack.startAgent("a2", "r2");
  REQUIRE(stack.kranectl({"apply", "-f", stack.file("a.yaml", deployment("one", "r1", 1, "v1"))})
              .exit_code == 0);
  REQUIRE(stack.waitConverged("one", "r1").exit_code == 0);

  stack.killCtrl();
  stack.startCtrl();
  REQUIRE(stack.kranectl({"apply", "-f", stack.file("b.yaml", deployment("two", "r2", 1, "v1"))})
              .exit_code == 0);
  auto two = stack.waitConverged("two", "r2");
  INFO(two.out << two.err << stack.agentLog("a2"));
  REQUIRE(two.exit_code == 0);

  ScratchMariaDb::instance().restart();
  REQUIRE(eventually([&] {
    return stack.kranectl({"apply", "-f", stack.file("c.yaml", deployment("one", "r1", 2, "v2"))})
               .exit_code == 0;
  }));
  auto one = stack.waitConverged("one", "r1");
  INFO(one.out << one.err << stack.agentLog("a1"));
  REQUIRE(one.exit_code == 0);
  for (const auto& a : stack.addresses("one", "r1")) CHECK_THAT(get(a), Catch::Contains("v2"));
  INFO("every agent caught up (lag 0 is left out of the JSON)");
  REQUIRE(eventually([&] {
    auto agents = stack.kranectl({"agents", "-o", "json"});
    return agents.exit_code == 0 && agents.out.find("\"lag\": \"") == std::string::npos;
  }));
}

TEST_CASE("two agents of one region one leader and the other takes over", "[stack-e2e][slow]") {
  Stack stack(27400);
  const std::string shared = stack.dir() + "/shared-state";
  stack.startAgent("first", "r1", shared);
  REQUIRE(eventually(
      [&] { return stack.agentLog("first").find("agent: running") != std::string::npos; }));
  stack.startAgent("second", "r1", shared);
  REQUIRE(eventually(
      [&] { return stack.agentLog("second").find("standing by") != std::string::npos; }));
  REQUIRE(stack.kranectl({"apply", "-f", stack.file("a.yaml", deployment("app", "r1", 1, "v1"))})
              .exit_code == 0);
  REQUIRE(stack.waitConverged("app", "r1").exit_code == 0);
  CHECK_THAT(stack.agentLog("second"), !Catch::Contains("agent: running"));

  stack.killAgent("first");
  REQUIRE(stack.kranectl({"apply", "-f", stack.file("a.yaml", deployment("app", "r1", 2, "v2"))})
              .exit_code == 0);
  auto waited = stack.waitConverged("app", "r1");
  INFO(waited.out << stack.agentLog("second"));
  REQUIRE(waited.exit_code == 0);
  CHECK_THAT(stack.agentLog("second"), Catch::Contains("agent: running"));
  auto agents = stack.kranectl({"agents"});
  INFO(agents.out);
  CHECK(std::regex_search(agents.out, std::regex("second +r1 +yes")));
}

TEST_CASE("a token of region R1 is refused for region R2", "[stack-e2e][slow]") {
  Stack stack(27500);
  stack.startAgent("intruder", "r2", "", stack.token("r1"));
  REQUIRE(stack.kranectl({"apply", "-f", stack.file("a.yaml", deployment("app", "r2", 1, "v1"))})
              .exit_code == 0);
  INFO(stack.agentLog("intruder"));
  REQUIRE(eventually([&] {
    const std::string log = stack.agentLog("intruder");
    return log.find("this agent token is for region \"r1\", not \"r2\"") != std::string::npos;
  }));
  auto status = stack.kranectl({"status", "deployment", "app", "--region", "r2", "-o", "json"});
  INFO("nothing ran in r2");
  CHECK_THAT(status.out, !Catch::Contains("address"));
  CHECK_THAT(stack.kranectl({"agents"}).out, !Catch::Contains("intruder"));
}

}  // namespace
}  // namespace krane
