// The real `krane` binary against a real krane-ctrl: apply, kill -9 and resume from the
// watermark without a full sync, and two agents of one region with one leader.
#include <httplib.h>
#include <signal.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>
#include <sstream>
#include <thread>

#include <catch2/catch.hpp>

#include "common/strings.h"
#include "nlohmann/json.hpp"
#include "tests/support/control_plane.h"
#include "tests/support/fake_kube_api.h"
#include "tests/support/mariadb.h"
#include "tests/support/matchers.h"
#include "tests/support/process.h"
#include "tests/support/tcp_relay.h"
#include "tests/support/wait.h"

namespace krane {
namespace {

using krane::testing::eventually;

using krane::testing::ChildProcess;
using krane::testing::runCommand;
using krane::testing::runfile;
using krane::testing::slurp;
using krane::testing::TestControlPlane;

cluster::v1::Resource bucket(const std::string& id, const std::string& spec) {
  cluster::v1::Resource r;
  r.set_type("example.krane.dev/bucket");
  r.set_id(id);
  r.set_region("eu-1");
  r.mutable_generic()->set_spec(spec);
  return r;
}

// Puts buckets b<from> .. b<to - 1> (spec: the number) through `server`.
void putBuckets(ctrl::Server& server, int from, int to) {
  for (int i = from; i < to; ++i)
    REQUIRE_THAT(server.writer().put(bucket(strCat("b", i), strCat(i))), IsOk());
}

struct AgentSetup {
  std::string dir;
  std::string config;
  std::map<std::string, std::string> env;
};

// An agent of eu-1 with the recording plugin, with `watch_address` as its
// control_plane.watch_address when given; `address` (default: replica 0's gRPC port) and
// `control_plane_keys` (more lines of control_plane) for the connection itself.
AgentSetup setUp(TestControlPlane& cp, const std::string& watch_address = "",
                 const std::string& address = "", const std::string& control_plane_keys = "") {
  char pattern[] = "/tmp/krane-agent-XXXXXX";
  AgentSetup s;
  s.dir = ::mkdtemp(pattern);
  s.config = s.dir + "/agent.yaml";
  std::ofstream(s.config) << strCat(
      "region: eu-1\n"
      "state_dir: ",
      s.dir,
      "/state\n"
      "reconnect_min_ms: 50\nreconnect_max_ms: 200\n"
      "control_plane:\n  address: ",
      address.empty() ? strCat("127.0.0.1:", cp.replica(0).grpcPort()) : address, "\n",
      watch_address.empty() ? "" : strCat("  watch_address: \"", watch_address, "\"\n"),
      control_plane_keys,
      "reporter:\n  heartbeat_interval_ms: 200\n"
      "plugins:\n"
      "  - name: recording\n"
      "    path: ",
      runfile("tests/support/plugins/librecording.so"),
      "\n"
      "    config_text: |\n      log=",
      s.dir, "/calls.log\n      types=example.krane.dev/bucket\n");
  s.env = {{"KRANE_AGENT_TOKEN", cp.agentToken("eu-1")}};
  return s;
}

std::vector<std::string> agentArgs(const AgentSetup& s) {
  return {runfile("agent/krane"),
          "run",
          "--config",
          s.config,
          "--plugin-host",
          runfile("agent/krane-plugin-host")};
}

// The watermark the agent persisted, read with `krane inspect --json`.
uint64_t watermark(const AgentSetup& s) {
  auto r =
      runCommand({runfile("agent/krane"), "inspect", "--json", "--state-dir", s.dir + "/state"});
  std::smatch m;
  if (r.exit_code != 0 ||
      !std::regex_search(r.out, m, std::regex("\"watermark\":\\s*\\{[^}]*\"version\":\\s*(\\d+)")))
    return 0;
  return std::stoull(m[1]);
}

// The control plane lists an agent, the first of which has no lag (and leads, if `leader`).
bool firstAgentCurrent(TestControlPlane& cp, bool leader) {
  krane::api::v1::ListAgentsResponse response;
  const bool ok =
      cp.agents()
          ->ListAgents(TestControlPlane::withToken(krane::testing::kOperatorToken).get(), {},
                       &response)
          .ok();
  return ok && response.agents_size() >= 1 && response.agents(0).lag() == 0 &&
         (!leader || response.agents(0).is_leader());
}

TEST_CASE("applies and resumes from the watermark after kill9", "[agent][slow]") {
  TestControlPlane cp;
  auto& server = cp.startReplica();
  const AgentSetup s = setUp(cp);
  for (int i = 0; i < 20; ++i)
    REQUIRE_THAT(server.writer().put(bucket(strCat("b", i % 7), strCat(i))), IsOk());
  {
    ChildProcess agent(agentArgs(s), s.dir + "/agent1.log", s.env);
    INFO(slurp(s.dir + "/agent1.log"));
    REQUIRE(eventually([&] { return watermark(s) == 20; }));
    CHECK_THAT(slurp(s.dir + "/agent1.log"), Catch::Contains("from version=0 (full sync)"));
    // `krane inspect` shows the plugin's slot, written by its host, and the full sync.
    auto inspect = runCommand({runfile("agent/krane"), "inspect", "--state-dir", s.dir + "/state"});
    INFO(inspect.err);
    CHECK(inspect.exit_code == 0);
    CHECK_THAT(inspect.out, Catch::Contains("recording"));
    auto json =
        runCommand({runfile("agent/krane"), "inspect", "--json", "--state-dir", s.dir + "/state"});
    CHECK_THAT(json.out, ContainsRegex("\"applied\": *[1-9]"));
    CHECK_THAT(json.out, ContainsRegex("\"full_sync\": *\\{[^}]*\"version\": *20"));
    // Changes keep flowing while the agent is killed at a random point.
    for (int i = 20; i < 40; ++i)
      REQUIRE_THAT(server.writer().put(bucket(strCat("b", i % 7), strCat(i))), IsOk());
    agent.signal(SIGKILL);
    agent.wait();
  }
  const uint64_t persisted = watermark(s);
  CHECK(persisted >= 20u);
  for (int i = 40; i < 50; ++i)
    REQUIRE_THAT(server.writer().put(bucket(strCat("b", i % 7), strCat(i))), IsOk());
  ChildProcess agent(agentArgs(s), s.dir + "/agent2.log", s.env);
  INFO(slurp(s.dir + "/agent2.log"));
  REQUIRE(eventually([&] { return watermark(s) == 50; }));
  const std::string log = slurp(s.dir + "/agent2.log");
  CHECK_THAT(log, Catch::Contains(strCat("from version=", persisted)));
  INFO("resumed without a full sync");
  CHECK_THAT(log, !Catch::Contains("full sync"));
  // The control plane sees the agent current.
  REQUIRE(eventually([&] { return firstAgentCurrent(cp, /*leader=*/true); }));
  agent.signal(SIGTERM);
  CHECK(agent.wait() == 0);
}

TEST_CASE("an agent watching on the watch listener applies and reports on the grpc port",
          "[agent][slow]") {
  TestControlPlane cp;
  auto& server =
      cp.startReplica([](ctrl::CtrlConfig& config) { config.feed.watch_listen = "127.0.0.1:0"; });
  REQUIRE(server.watchPort() > 0);
  const AgentSetup s = setUp(cp, strCat("127.0.0.1:", server.watchPort()));
  putBuckets(server, 0, 10);
  ChildProcess agent(agentArgs(s), s.dir + "/agent.log", s.env);
  INFO(slurp(s.dir + "/agent.log"));
  REQUIRE(eventually([&] { return watermark(s) == 10; }));
  putBuckets(server, 10, 20);
  REQUIRE(eventually([&] { return watermark(s) == 20; }));
  // The stream is the listener's; the heartbeats went to the gRPC port.
  CHECK_THAT(server.metricsText(), Catch::Contains("krane_feed_watch_listener_calls 1"));
  REQUIRE(eventually([&] { return firstAgentCurrent(cp, /*leader=*/false); }));
  agent.signal(SIGTERM);
  CHECK(agent.wait() == 0);
}

TEST_CASE("two agents one region only the leader applies and the standby takes over",
          "[agent][slow]") {
  TestControlPlane cp;
  auto& server = cp.startReplica();
  const AgentSetup s = setUp(cp);
  auto first = std::make_unique<ChildProcess>(agentArgs(s), s.dir + "/a.log", s.env);
  REQUIRE(eventually(
      [&] { return slurp(s.dir + "/a.log").find("agent: running") != std::string::npos; }));
  ChildProcess second(agentArgs(s), s.dir + "/b.log", s.env);
  REQUIRE(
      eventually([&] { return slurp(s.dir + "/b.log").find("standing by") != std::string::npos; }));
  for (int i = 0; i < 10; ++i)
    REQUIRE_THAT(server.writer().put(bucket(strCat("b", i), "x")), IsOk());
  REQUIRE(eventually([&] { return watermark(s) == 10; }));
  CHECK_THAT(slurp(s.dir + "/b.log"), !Catch::Contains("agent: running"));

  first->signal(SIGKILL);
  first->wait();
  first.reset();
  for (int i = 10; i < 20; ++i)
    REQUIRE_THAT(server.writer().put(bucket(strCat("b", i), "x")), IsOk());
  INFO(slurp(s.dir + "/b.log"));
  REQUIRE(eventually([&] { return watermark(s) == 20; }));
  CHECK_THAT(slurp(s.dir + "/b.log"), Catch::Contains("agent: running"));
  second.signal(SIGTERM);
  CHECK(second.wait() == 0);
}

// leader.mode lease: two agents with their own state directories (two nodes of a DaemonSet)
// share a coordination.k8s.io Lease on the (fake) API server.
TEST_CASE("lease mode one leader and the standby takes over when it is killed", "[agent][slow]") {
  krane::testing::FakeKubeApi api;
  api.put({{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", "krane-system"}}}});
  TestControlPlane cp;
  auto& server = cp.startReplica();
  AgentSetup a = setUp(cp);
  AgentSetup b = setUp(cp);
  for (AgentSetup* s : {&a, &b}) {
    const std::string id = s == &a ? "agent-a" : "agent-b";
    std::ofstream(s->dir + "/kubeconfig") << api.kubeconfigYaml();
    std::ofstream(s->config, std::ios::app) << strCat(
        "agent_id: ", id,
        "\nleader:\n  mode: lease\n  lease_duration_s: 3\n  lease_namespace: krane-system\n",
        "  kubeconfig: ", s->dir, "/kubeconfig\n");
  }
  auto first = std::make_unique<ChildProcess>(agentArgs(a), a.dir + "/a.log", a.env);
  INFO(slurp(a.dir + "/a.log"));
  REQUIRE(eventually(
      [&] { return slurp(a.dir + "/a.log").find("agent: running") != std::string::npos; }));
  ChildProcess second(agentArgs(b), b.dir + "/b.log", b.env);
  INFO(slurp(b.dir + "/b.log"));
  REQUIRE(
      eventually([&] { return slurp(b.dir + "/b.log").find("standing by") != std::string::npos; }));
  auto lease = api.object("coordination.k8s.io/v1", "Lease", "krane-system", "krane-agent-eu-1");
  REQUIRE(lease.has_value());
  INFO(lease->dump());
  CHECK((*lease)["spec"]["holderIdentity"] == "agent-a");
  for (int i = 0; i < 10; ++i)
    REQUIRE_THAT(server.writer().put(bucket(strCat("b", i), "x")), IsOk());
  REQUIRE(eventually([&] { return watermark(a) == 10; }));
  INFO("the standby applies nothing");
  CHECK(watermark(b) == 0u);

  first->signal(SIGKILL);
  first->wait();
  first.reset();
  for (int i = 10; i < 20; ++i)
    REQUIRE_THAT(server.writer().put(bucket(strCat("b", i), "x")), IsOk());
  INFO(slurp(b.dir + "/b.log"));
  REQUIRE(eventually([&] { return watermark(b) == 20; }, std::chrono::seconds(30)));
  lease = api.object("coordination.k8s.io/v1", "Lease", "krane-system", "krane-agent-eu-1");
  INFO(lease->dump());
  CHECK((*lease)["spec"]["holderIdentity"] == "agent-b");
  second.signal(SIGTERM);
  CHECK(second.wait() == 0);
}

std::string hexOf(const std::string& bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

// The control plane's database is restored from a backup while the agent runs: the region's
// versions go back. The agent resyncs, and changes written after the restore (with versions it
// has seen before) are applied, not skipped as stale.
TEST_CASE("a database restored from a backup is followed with nothing skipped", "[agent][slow]") {
  TestControlPlane cp;
  cp.startReplica([](ctrl::CtrlConfig& c) { c.listen = "127.0.0.1:0"; });
  const int port = cp.replica(0).grpcPort();
  const AgentSetup s = setUp(cp);
  for (int i = 0; i < 5; ++i)
    REQUIRE_THAT(cp.replica(0).writer().put(bucket(strCat("b", i), "before-backup")), IsOk());
  const std::string backup = cp.dsn().database + "_backup";
  krane::testing::ScratchMariaDb::instance().copyDatabase(cp.dsn().database, backup);
  for (int i = 0; i < 5; ++i)
    REQUIRE_THAT(cp.replica(0).writer().put(bucket(strCat("b", i), "lost")), IsOk());
  REQUIRE_THAT(cp.replica(0).writer().put(bucket("made-after-backup", "lost")), IsOk());

  ChildProcess agent(agentArgs(s), s.dir + "/agent.log", s.env);
  INFO(slurp(s.dir + "/agent.log"));
  REQUIRE(eventually([&] { return watermark(s) == 11; }));

  cp.stopReplica(0);
  krane::testing::ScratchMariaDb::instance().copyDatabase(backup, cp.dsn().database);
  auto& restored =
      cp.startReplica([&](ctrl::CtrlConfig& c) { c.listen = strCat("127.0.0.1:", port); });
  // The agent asks for version 11; the restored database is at 5: a full sync at 5.
  INFO(slurp(s.dir + "/agent.log"));
  REQUIRE(eventually([&] { return watermark(s) == 5; }));
  // New writes reuse versions 6 and 7, which the agent applied before with other contents.
  REQUIRE_THAT(restored.writer().put(bucket("b0", "after-restore")), IsOk());
  REQUIRE_THAT(restored.writer().put(bucket("made-after-backup", "after-restore-too")), IsOk());
  INFO(slurp(s.dir + "/agent.log"));
  REQUIRE(eventually([&] { return watermark(s) == 7; }));
  const std::string calls = slurp(s.dir + "/calls.log");
  CHECK_THAT(calls, Catch::Contains(hexOf("after-restore")));
  CHECK_THAT(calls, Catch::Contains(hexOf("after-restore-too")));
  const std::string log = slurp(s.dir + "/agent.log");
  CHECK_THAT(log, Catch::Contains("cursor expired"));
  CHECK_THAT(log, Catch::Contains("did not contain 1 tracked resources"));
  agent.signal(SIGTERM);
  CHECK(agent.wait() == 0);
}

// An in-process plugin's slot is kept by the agent: heartbeats, applied and failed counts, and
// the poison event it parked, all visible in `krane inspect`.
TEST_CASE("an in process plugins counters and parked events show in inspect", "[agent][slow]") {
  TestControlPlane cp;
  auto& server = cp.startReplica();
  AgentSetup s = setUp(cp);
  std::ofstream(s.config) << strCat(
      "region: eu-1\nstate_dir: ", s.dir,
      "/state\n"
      "reconnect_min_ms: 50\nreconnect_max_ms: 200\n"
      "dispatch:\n  max_attempts: 2\n"
      "control_plane:\n  address: 127.0.0.1:",
      cp.replica(0).grpcPort(),
      "\n"
      "plugins:\n"
      "  - name: failing\n    isolation: in_process\n    path: ",
      runfile("tests/support/plugins/libfailing.so"),
      "\n    config_text: |\n      invalid_prefix=poison\n      types=example.krane.dev/bucket\n");
  REQUIRE_THAT(server.writer().put(bucket("b1", "x")), IsOk());
  REQUIRE_THAT(server.writer().put(bucket("poison-1", "x")), IsOk());
  REQUIRE_THAT(server.writer().put(bucket("b2", "x")), IsOk());
  ChildProcess agent(agentArgs(s), s.dir + "/agent.log", s.env);
  INFO(slurp(s.dir + "/agent.log"));
  REQUIRE(eventually([&] { return watermark(s) == 3; }));
  nlohmann::json plugin;
  nlohmann::json state;
  INFO(plugin.dump());
  REQUIRE(eventually([&] {
    auto r =
        runCommand({runfile("agent/krane"), "inspect", "--json", "--state-dir", s.dir + "/state"});
    if (r.exit_code != 0) return false;
    state = nlohmann::json::parse(r.out);
    plugin = state["plugins"][0];
    return plugin["parked"] == 1;
  }));
  CHECK(plugin["name"] == "failing");
  INFO("the agent itself runs it");
  CHECK(plugin["pid"] == agent.pid());
  CHECK(plugin["applied"] == 2);
  INFO("two attempts of the poison event");
  CHECK(plugin["failed"] == 2);
  REQUIRE(state["parked"].size() == 1u);
  CHECK(state["parked"][0]["id"] == "poison-1");
  CHECK(state["parked"][0]["attempts"] == 2);
  // The heartbeat moves while the agent runs.
  const auto first = plugin["heartbeat_mono_ns"].get<uint64_t>();
  CHECK(eventually([&] {
    auto r =
        runCommand({runfile("agent/krane"), "inspect", "--json", "--state-dir", s.dir + "/state"});
    return r.exit_code == 0 &&
           nlohmann::json::parse(r.out)["plugins"][0]["heartbeat_mono_ns"].get<uint64_t>() > first;
  }));
  agent.signal(SIGTERM);
  CHECK(agent.wait() == 0);
}

// A change failing for a transient reason holds the agent's cursor (nothing passes a change
// that was not applied) and shows as retrying; one refused as invalid is parked and shows as
// parked; both through the agent's heartbeat, in the control plane's agent list.
TEST_CASE("retrying and parked changes hold or free the cursor and show in the agent list",
          "[agent][slow]") {
  TestControlPlane cp;
  auto& server = cp.startReplica();
  AgentSetup s = setUp(cp);
  std::ofstream(s.config) << strCat(
      "region: eu-1\nstate_dir: ", s.dir,
      "/state\n"
      "reconnect_min_ms: 50\nreconnect_max_ms: 200\n"
      "reporter:\n  heartbeat_interval_ms: 200\n"
      "control_plane:\n  address: 127.0.0.1:",
      cp.replica(0).grpcPort(),
      "\n"
      "plugins:\n"
      "  - name: failing\n    path: ",
      runfile("tests/support/plugins/libfailing.so"),
      "\n    config_text: |\n      retryable_prefix=down\n      invalid_prefix=bad\n"
      "      types=example.krane.dev/bucket\n");
  REQUIRE_THAT(server.writer().put(bucket("b1", "x")), IsOk());  // 1
  ChildProcess agent(agentArgs(s), s.dir + "/agent.log", s.env);
  INFO(slurp(s.dir + "/agent.log"));
  REQUIRE(eventually([&] { return watermark(s) == 1; }));            // its full sync is done
  REQUIRE_THAT(server.writer().put(bucket("bad-1", "x")), IsOk());   // 2: parked
  REQUIRE_THAT(server.writer().put(bucket("b2", "x")), IsOk());      // 3
  REQUIRE_THAT(server.writer().put(bucket("down-1", "x")), IsOk());  // 4: retried
  REQUIRE_THAT(server.writer().put(bucket("b3", "x")), IsOk());      // 5
  auto agents = cp.agents();
  krane::api::v1::Agent seen;
  // The one agent as ListAgents shows it (in `seen`) satisfies `want`.
  const auto agentShows = [&](const std::function<bool(const krane::api::v1::Agent&)>& want) {
    krane::api::v1::ListAgentsResponse response;
    if (!agents
             ->ListAgents(TestControlPlane::withToken(krane::testing::kOperatorToken).get(), {},
                          &response)
             .ok() ||
        response.agents_size() != 1) {
      return false;
    }
    seen = response.agents(0);
    return want(seen);
  };
  REQUIRE(eventually([&] {
    return agentShows(
        [](const auto& a) { return a.parked_events() == 1 && a.retrying_events() == 1; });
  }));
  INFO("the cursor stops before the change still being retried, past the parked one");
  // (b2, version 3, may still be on its way through the plugin when the counts show.)
  CHECK(eventually([&] { return watermark(s) == 3u; }));
  REQUIRE(eventually(
      [&] { return agentShows([](const auto& a) { return a.applied_version() == 3u; }); }));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  CHECK(watermark(s) == 3u);  // and it stays there while version 4 is retried
  const auto kranectl = runCommand({runfile("cli/kranectl"), "--server",
                                    strCat("127.0.0.1:", cp.replica(0).grpcPort()), "--token",
                                    krane::testing::kOperatorToken, "agents"});
  CHECK(kranectl.exit_code == 0);
  CHECK_THAT(kranectl.out, Catch::Contains("RETRYING") && Catch::Contains("PARKED"));
  httplib::Client http("127.0.0.1", server.httpPort());
  auto metrics = http.Get("/metrics");
  REQUIRE(metrics);
  CHECK_THAT(metrics->body,
             ContainsRegex(R"(krane_agent_retrying_events\{[^}]*region="eu-1"[^}]*\} 1\b)"));
  CHECK_THAT(metrics->body,
             ContainsRegex(R"(krane_agent_parked_events\{[^}]*region="eu-1"[^}]*\} 1\b)"));
  INFO("still held a while later: a transient failure is never parked");
  std::this_thread::sleep_for(std::chrono::seconds(2));
  CHECK(watermark(s) == 3u);
  INFO("a change being retried does not hold the shutdown");
  const auto asked = std::chrono::steady_clock::now();
  agent.signal(SIGTERM);
  CHECK(agent.wait() == 0);
  CHECK(std::chrono::steady_clock::now() - asked < std::chrono::seconds(20));
  CHECK(watermark(s) == 3u);
}

// Permission bits of a path (0 when it does not exist).
mode_t modeOf(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? (st.st_mode & 07777) : 0;
}

TEST_CASE("the state directory and what the agent writes there are private to its user",
          "[agent][slow]") {
  TestControlPlane cp;
  auto& server = cp.startReplica();
  const AgentSetup s = setUp(cp);
  // Left by an earlier agent that did not care: a world-readable directory and configuration.
  const std::string state = s.dir + "/state";
  REQUIRE(::mkdir(state.c_str(), 0755) == 0);
  REQUIRE(::chmod(state.c_str(), 0755) == 0);
  std::ofstream(state + "/host-recording.json") << "{}";
  REQUIRE(::chmod((state + "/host-recording.json").c_str(), 0644) == 0);
  REQUIRE_THAT(server.writer().put(bucket("b1", "x")), IsOk());
  // Whatever the umask, nothing may be readable by others.
  const mode_t old_umask = ::umask(0);
  ChildProcess agent(agentArgs(s), s.dir + "/agent.log", s.env);
  ::umask(old_umask);
  INFO(slurp(s.dir + "/agent.log"));
  REQUIRE(eventually([&] { return watermark(s) == 1; }));
  CHECK(modeOf(state) == 0700);
  for (const char* file : {"cursor.store", "cursor.store.lock", "leader.lock",
                           "host-recording.json", "host-recording.log", "host-recording-1.sock"}) {
    INFO(file);
    CHECK(modeOf(strCat(state, "/", file)) == 0600);
  }
  // Nothing else in the directory is readable by the group or others either.
  for (const auto& entry : std::filesystem::directory_iterator(state)) {
    INFO(entry.path().string());
    CHECK((modeOf(entry.path().string()) & 077) == 0);
  }
  agent.signal(SIGTERM);
  CHECK(agent.wait() == 0);
}

TEST_CASE("start up failures name the step", "[agent][slow]") {
  TestControlPlane cp;
  cp.startReplica();
  AgentSetup s = setUp(cp);
  std::ofstream(s.config, std::ios::app)
      << "  - name: broken\n    path: /nonexistent/libbroken.so\n    isolation: in_process\n";
  auto r = runCommand(agentArgs(s), s.env);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Catch::Contains("start-up step \"plugins\" failed"));
  CHECK_THAT(r.err, Catch::Contains("/nonexistent/libbroken.so"));
  auto no_token = runCommand(agentArgs(s));
  CHECK_THAT(no_token.err, Catch::Contains("krane-ctrl token create --region eu-1"));
}

TEST_CASE("with no watch_address, an agent follows krane-ctrl to its watch listener",
          "[agent][slow]") {
  TestControlPlane cp;
  // Where the listener listens: on the agent's control plane host, or on another address of the
  // machine, where the agent (which pairs the port with its address's host) cannot reach it.
  const std::string listen = GENERATE(std::string("127.0.0.1:0"), std::string("127.0.0.2:0"));
  const bool reachable = listen == "127.0.0.1:0";
  CAPTURE(listen);
  auto& server =
      cp.startReplica([&](ctrl::CtrlConfig& config) { config.feed.watch_listen = listen; });
  const AgentSetup s = setUp(cp);
  putBuckets(server, 0, 10);
  ChildProcess agent(agentArgs(s), s.dir + "/agent.log", s.env);
  INFO(slurp(s.dir + "/agent.log"));
  REQUIRE(eventually([&] { return watermark(s) == 10; }));
  const std::string listener = strCat("127.0.0.1:", server.watchPort());
  REQUIRE(eventually([&] {
    return slurp(s.dir + "/agent.log").find(strCat("watching at ", listener)) != std::string::npos;
  }));
  if (reachable) {
    // The stream moved (and resumed from the cursor: nothing lost, no second full sync).
    REQUIRE(eventually([&] {
      return server.metricsText().find("krane_feed_watch_listener_calls 1") != std::string::npos;
    }));
  } else {
    // Refused there three times: back on the gRPC port, and said so.
    REQUIRE(eventually([&] {
      return slurp(s.dir + "/agent.log").find("failed before their first event") !=
             std::string::npos;
    }));
    CHECK_THAT(server.metricsText(), Catch::Contains("krane_feed_watch_listener_calls 0"));
  }
  putBuckets(server, 10, 20);
  REQUIRE(eventually([&] { return watermark(s) == 20; }));
  if (reachable) {
    // One full sync: the stream moved once the snapshot was applied and resumed from there
    // (refused attempts at the unreachable listener would each log one).
    const std::string log = slurp(s.dir + "/agent.log");
    CHECK(log.find("(full sync)") == log.rfind("(full sync)"));
  }
  agent.signal(SIGTERM);
  CHECK(agent.wait() == 0);
}

TEST_CASE("an agent goes back to the grpc port when krane-ctrl's listener is turned off",
          "[agent][slow]") {
  TestControlPlane cp;
  auto& first =
      cp.startReplica([](ctrl::CtrlConfig& config) { config.feed.watch_listen = "127.0.0.1:0"; });
  const int port = first.grpcPort();
  const AgentSetup s = setUp(cp);
  putBuckets(first, 0, 10);
  ChildProcess agent(agentArgs(s), s.dir + "/agent.log", s.env);
  INFO(slurp(s.dir + "/agent.log"));
  REQUIRE(eventually([&] { return watermark(s) == 10; }));
  REQUIRE(eventually([&] {
    return first.metricsText().find("krane_feed_watch_listener_calls 1") != std::string::npos;
  }));
  // The same address, no listener any more: every heartbeat answer says so.
  cp.stopReplica(0);
  auto& second =
      cp.startReplica([&](ctrl::CtrlConfig& c) { c.listen = strCat("127.0.0.1:", port); });
  putBuckets(second, 10, 20);
  REQUIRE(eventually([&] { return watermark(s) == 20; }));
  // 30 answers without a port (heartbeats every 200 ms): the agent stops trying the listener.
  REQUIRE(eventually([&] {
    return slurp(s.dir + "/agent.log").find("told of no watch listener in 30 heartbeats") !=
           std::string::npos;
  }));
  agent.signal(SIGTERM);
  CHECK(agent.wait() == 0);
}

TEST_CASE("a Watch whose connection goes silent starts over on a new one", "[agent][slow]") {
  TestControlPlane cp;
  auto& server =
      cp.startReplica([](ctrl::CtrlConfig& config) { config.feed.watch_listen = "127.0.0.1:0"; });
  // The Watch goes through a relay that can go silent for good (no FIN, no RST, as a partition
  // or a vanished host does): on the gRPC port, with the heartbeats, or on the watch listener.
  const bool listener = GENERATE(false, true);
  CAPTURE(listener);
  testing::TcpRelay relay(strCat("127.0.0.1:", listener ? server.watchPort() : server.grpcPort()));
  const std::string keepalive = "  keepalive_ms: 1000\n  keepalive_timeout_ms: 1000\n";
  const AgentSetup s = listener ? setUp(cp, relay.address(), "", keepalive)
                                : setUp(cp, "off", relay.address(), keepalive);
  putBuckets(server, 0, 10);
  ChildProcess agent(agentArgs(s), s.dir + "/agent.log", s.env);
  INFO(slurp(s.dir + "/agent.log"));
  REQUIRE(eventually([&] { return watermark(s) == 10; }));
  auto streams = [&] {
    const std::string log = slurp(s.dir + "/agent.log");
    size_t n = 0;
    for (size_t at = log.find("agent: watching region="); at != std::string::npos;
         at = log.find("agent: watching region=", at + 1))
      ++n;
    return n;
  };
  // Pinged every second and answered: the stream stays (krane-ctrl does not refuse the pings).
  std::this_thread::sleep_for(std::chrono::seconds(3));
  CHECK(streams() == 1);
  CHECK(relay.accepted() == 1);

  relay.blackHole();
  putBuckets(server, 10, 20);
  // The unanswered ping closes the silent connection; the next stream resumes from the cursor
  // on a new one, with no second full sync.
  REQUIRE(eventually([&] { return watermark(s) == 20; }));
  CHECK(relay.accepted() >= 2);
  const std::string log = slurp(s.dir + "/agent.log");
  CHECK(log.find("(full sync)") == log.rfind("(full sync)"));
  agent.signal(SIGTERM);
  CHECK(agent.wait() == 0);
}

TEST_CASE("watch_address off keeps the Watch on the grpc port", "[agent][slow]") {
  TestControlPlane cp;
  auto& server =
      cp.startReplica([](ctrl::CtrlConfig& config) { config.feed.watch_listen = "127.0.0.1:0"; });
  const AgentSetup s = setUp(cp, "off");
  putBuckets(server, 0, 10);
  ChildProcess agent(agentArgs(s), s.dir + "/agent.log", s.env);
  INFO(slurp(s.dir + "/agent.log"));
  REQUIRE(eventually([&] { return watermark(s) == 10; }));
  // Heartbeats (every 200 ms) told it of the listener meanwhile.
  REQUIRE(eventually([&] { return firstAgentCurrent(cp, /*leader=*/false); }));
  std::this_thread::sleep_for(std::chrono::seconds(1));
  CHECK_THAT(server.metricsText(), Catch::Contains("krane_feed_watch_listener_calls 0"));
  CHECK_THAT(slurp(s.dir + "/agent.log"), !Catch::Contains("watching at"));
  agent.signal(SIGTERM);
  CHECK(agent.wait() == 0);
}

}  // namespace
}  // namespace krane
