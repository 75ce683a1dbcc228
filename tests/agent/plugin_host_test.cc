// Plugin hosts as separate processes over ZeroMQ: round trip, crash and restart, refusal at
// start-up, and a host killed mid-stream under the real dispatcher without losing a change.
#include <signal.h>

#include <algorithm>
#include <fstream>
#include <mutex>
#include <set>
#include <thread>

#include <catch2/catch.hpp>

#include "agent/dispatcher.h"
#include "agent/memory_ledger.h"
#include "agent/plugin_endpoints.h"
#include "common/strings.h"
#include "tests/support/matchers.h"
#include "tests/support/process.h"
#include "tests/support/wait.h"

namespace krane::agent {
namespace {

using krane::testing::runfile;

std::string stateDir() {
  // Short: ipc:// socket paths are limited to 108 bytes.
  char pattern[] = "/tmp/krane-host-XXXXXX";
  return ::mkdtemp(pattern);
}

HostOptions hostFor(const std::string& plugin, const std::string& config, const std::string& dir) {
  HostOptions o;
  o.name = plugin;
  o.plugin_path = runfile(strCat("tests/support/plugins/lib", plugin, ".so"));
  o.config_json = config;
  o.host_binary = runfile("agent/krane-plugin-host");
  o.state_dir = dir;
  o.heartbeat = std::chrono::milliseconds(50);
  o.restart = {std::chrono::milliseconds(20), 2.0, std::chrono::milliseconds(200), 0.2};
  return o;
}

cluster::v1::Change change(const std::string& type, const std::string& id, uint64_t version) {
  cluster::v1::Change c;
  c.set_op(cluster::v1::CHANGE_OP_APPLY);
  c.set_version(version);
  c.mutable_resource()->set_type(type);
  c.mutable_resource()->set_id(id);
  c.mutable_resource()->set_region("eu-1");
  c.mutable_resource()->set_version(version);
  return c;
}

// Versions the recording plugin applied, decoded from its log.
std::multiset<uint64_t> recordedVersions(const std::string& log) {
  std::multiset<uint64_t> out;
  std::ifstream in(log);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("apply ", 0) != 0) continue;
    const std::string hex = line.substr(6);
    std::string bytes;
    for (size_t i = 0; i + 1 < hex.size(); i += 2)
      bytes.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
    cluster::v1::Change c;
    if (c.ParseFromString(bytes)) out.insert(c.version());
  }
  return out;
}

// The lines of the slow plugin's log that start with `prefix`.
std::vector<std::string> logLines(const std::string& log, const std::string& prefix) {
  std::vector<std::string> out;
  std::ifstream in(log);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(prefix, 0) == 0) out.push_back(line);
  }
  return out;
}

TEST_CASE("applies through a host process", "[plugin-host]") {
  const std::string dir = stateDir();
  const std::string log = dir + "/calls.log";
  HostEndpoint host(hostFor("recording", strCat("log=", log, "\ntypes=bucket\n"), dir), {});
  REQUIRE_THAT(host.start(), IsOk());
  CHECK(host.resourceTypes() == std::vector<std::string>{"bucket"});
  CHECK(host.stats().pid > 0);
  REQUIRE_THAT(host.handle(change("bucket", "a", 1)), IsOk());
  REQUIRE_THAT(host.handle(change("bucket", "b", 2)), IsOk());
  host.stop();  // the plugin's log is complete once it shut down
  CHECK(recordedVersions(log) == (std::multiset<uint64_t>{1, 2}));
}

// A runtime reports what it adopted from an earlier host while the plugin starts, once: the
// report must reach the agent, not be dropped for want of a channel.
TEST_CASE("reports made while the plugin starts reach the agent", "[plugin-host]") {
  const std::string dir = stateDir();
  std::mutex mutex;
  std::vector<plugin::v1::StatusReport> reports;
  HostEndpoint host(
      hostFor("recording",
              strCat("log=", dir, "/calls.log\ntypes=bucket\n", "report_at_init=bucket/adopted\n"),
              dir),
      [&](const plugin::v1::StatusReport& r) {
        std::lock_guard lock(mutex);
        reports.push_back(r);
      });
  REQUIRE_THAT(host.start(), IsOk());
  CHECK(krane::testing::eventually(
      [&] {
        std::lock_guard lock(mutex);
        return std::any_of(reports.begin(), reports.end(), [](const plugin::v1::StatusReport& r) {
          return r.has_resource() && r.resource().id() == "adopted";
        });
      },
      std::chrono::seconds(5)));
  host.stop();
}

TEST_CASE("a crashing plugin takes down its host only and is restarted", "[plugin-host]") {
  const std::string dir = stateDir();
  HostEndpoint host(hostFor("crashing", "types=bucket\n", dir), {});
  REQUIRE_THAT(host.start(), IsOk());
  const int first_pid = host.stats().pid;
  auto crashed = host.handle(change("bucket", "will-crash", 1));
  INFO(crashed);
  CHECK(absl::IsUnavailable(crashed));
  CHECK_THAT(std::string(toStd(crashed.message())), Catch::Contains("killed by signal"));
  // The agent (this process) is fine, and a new host serves the next change.
  absl::Status next;
  for (int i = 0; i < 100; ++i) {
    next = host.handle(change("bucket", "fine", 2));
    if (next.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CHECK_THAT(next, IsOk());
  CHECK(host.stats().restarts >= 1u);
  CHECK(host.stats().pid != first_pid);
  host.stop();
}

TEST_CASE("a start refusal carries the loaders reason", "[plugin-host]") {
  const std::string dir = stateDir();
  HostEndpoint host(hostFor("abi_mismatch", "", dir), {});
  auto st = host.start();
  REQUIRE_FALSE(st.ok());
  CHECK_THAT(std::string(toStd(st.message())), Catch::Contains("did not start"));
  CHECK_THAT(std::string(toStd(st.message())), Catch::Contains("ABI"));
}

TEST_CASE("a host that speaks another plugin ABI is refused naming both versions",
          "[plugin-host]") {
  const std::string dir = stateDir();
  HostOptions options = hostFor("recording", "", dir);
  options.host_binary = runfile("tests/agent/other_abi_host");
  HostEndpoint host(options, {});
  const auto started = std::chrono::steady_clock::now();
  auto st = host.start();
  REQUIRE_THAT(st, IsError(absl::StatusCode::kFailedPrecondition));
  const std::string message(toStd(st.message()));
  CHECK_THAT(message,
             Catch::Contains(strCat("speaks plugin ABI ", KRANE_PLUGIN_ABI_MAJOR + 1, ".0")));
  CHECK_THAT(message, Catch::Contains(strCat("this agent speaks ", KRANE_PLUGIN_ABI_MAJOR, ".",
                                             KRANE_PLUGIN_ABI_MINOR)));
  // Refused at its hello, not after the start timeout.
  CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(5));
  // Nothing is delivered to it.
  CHECK_THAT(host.handle(change("app", "a", 1)), IsError(absl::StatusCode::kUnavailable));
  host.stop();
}

TEST_CASE("killed mid stream nothing is lost", "[plugin-host]") {
  const std::string dir = stateDir();
  const std::string log = dir + "/calls.log";
  auto host = std::make_shared<HostEndpoint>(
      hostFor("recording", strCat("log=", log, "\ntypes=bucket\n"), dir), StatusSink{});
  REQUIRE_THAT(host->start(), IsOk());
  MemoryLedger ledger;
  WatermarkTracker watermark;
  DispatcherOptions options;
  options.workers_per_plugin = 4;
  options.retry = {std::chrono::milliseconds(10), 2.0, std::chrono::milliseconds(100), 0.5};
  Dispatcher dispatcher(
      {host}, ledger, watermark, [](const auto&, const auto&, int) {}, options);
  constexpr uint64_t kChanges = 3000;
  std::thread feeder([&] {
    for (uint64_t v = 1; v <= kChanges; ++v)
      dispatcher.change(change("bucket", strCat("r", v % 50), v), false);
  });
  // Kill the host twice while changes flow.
  for (int kill = 0; kill < 2; ++kill) {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    ::kill(host->stats().pid, SIGKILL);
  }
  feeder.join();
  dispatcher.drain();
  CHECK(host->stats().restarts >= 1u);
  CHECK(ledger.parked().empty());
  CHECK(watermark.watermark() == kChanges);
  host->stop();  // the plugin's log is complete once it shut down
  // Every version reached the plugin at least once (some twice: redelivered after the kill),
  // except one that failed with the kill while a newer change of its resource was queued: the
  // newer one replaced it (it carries the whole state) and must have reached the plugin.
  const auto seen = recordedVersions(log);
  for (uint64_t v = 1; v <= kChanges; ++v) {
    bool reached = seen.count(v) > 0;
    for (uint64_t newer = v + 50; !reached && newer <= kChanges; newer += 50)
      reached = seen.count(newer) > 0;
    INFO("version " << v << " was lost");
    REQUIRE(reached);
  }
  // The last version of every resource was applied.
  for (uint64_t v = kChanges - 49; v <= kChanges; ++v) {
    INFO("version " << v << " was lost");
    REQUIRE(seen.count(v) >= 1u);
  }
  host->stop();
}

TEST_CASE("a garbage collection longer than the missed heartbeats keeps its host alive",
          "[plugin-host][slow]") {
  const std::string dir = stateDir();
  const std::string log = dir + "/calls.log";
  HostOptions options = hostFor("slow", strCat("sync_ms=2000\nlog=", log, "\ntypes=bucket\n"), dir);
  // Hung after 600 ms without a heartbeat; the garbage collection takes more than three times as
  // long, and the host must keep answering heartbeats meanwhile.
  options.heartbeat = std::chrono::milliseconds(100);
  options.missed_heartbeats = 6;
  HostEndpoint host(options, {});
  REQUIRE_THAT(host.start(), IsOk());
  const int pid = host.stats().pid;
  CHECK_THAT(host.syncEnd(7, "eu-1", {{"bucket", {"a"}}}), IsOk());
  CHECK(host.stats().restarts == 0u);
  CHECK(host.stats().pid == pid);
  host.stop();
  CHECK(logLines(log, "end sync").size() == 1u);
}

TEST_CASE("a call that answers after its deadline counts and nothing runs twice", "[plugin-host]") {
  const std::string dir = stateDir();
  const std::string log = dir + "/calls.log";
  // The first apply of each resource takes 800 ms; the agent gives up after 250 ms.
  HostOptions options =
      hostFor("slow", strCat("apply_ms=800\nslow_calls=1\nlog=", log, "\ntypes=bucket\n"), dir);
  options.call_timeout = std::chrono::milliseconds(250);
  auto host = std::make_shared<HostEndpoint>(options, StatusSink{});
  REQUIRE_THAT(host->start(), IsOk());
  MemoryLedger ledger;
  WatermarkTracker watermark;
  DispatcherOptions dispatcher_options;
  dispatcher_options.retry = {std::chrono::milliseconds(10), 2.0, std::chrono::milliseconds(50),
                              0.0};
  Dispatcher dispatcher(
      {host}, ledger, watermark, [](const auto&, const auto&, int) {}, dispatcher_options);
  dispatcher.change(change("bucket", "a", 1), false);
  dispatcher.change(change("bucket", "b", 2), false);
  dispatcher.drain();
  CHECK(watermark.watermark() == 2u);
  CHECK(ledger.parked().empty());
  INFO("the late OK is the apply's answer: an apply that always outlives call_timeout would");
  INFO("otherwise be applied again and again, never counted");
  CHECK(dispatcher.stats().retried == 0u);
  CHECK(host->stats().cancelled == 2u);
  CHECK(host->stats().restarts == 0u);
  host->stop();
  CHECK(logLines(log, "start bucket/a").size() == 1u);
  CHECK(logLines(log, "start bucket/b").size() == 1u);
  CHECK(logLines(log, "overlap") == std::vector<std::string>{});
}

TEST_CASE("an apply that never ends in time is parked instead of restarting its host for ever",
          "[plugin-host]") {
  const std::string dir = stateDir();
  HostOptions options = hostFor("slow", "apply_ms=5000\ntypes=bucket\n", dir);
  options.call_timeout = std::chrono::milliseconds(100);
  options.cancel_grace = std::chrono::milliseconds(100);
  options.restart = {std::chrono::milliseconds(10), 2.0, std::chrono::milliseconds(50), 0.0};
  auto host = std::make_shared<HostEndpoint>(options, StatusSink{});
  REQUIRE_THAT(host->start(), IsOk());
  MemoryLedger ledger;
  WatermarkTracker watermark;
  DispatcherOptions dispatcher_options;
  dispatcher_options.max_attempts = 2;
  dispatcher_options.retry = {std::chrono::milliseconds(10), 2.0, std::chrono::milliseconds(50),
                              0.0};
  std::mutex mutex;
  std::vector<std::string> reported;
  Dispatcher dispatcher(
      {host}, ledger, watermark,
      [&](const cluster::v1::Change&, const absl::Status& st, int attempts) {
        std::lock_guard lock(mutex);
        reported.push_back(strCat(absl::StatusCodeToString(st.code()), " after ", attempts, ": ",
                                  toStd(st.message())));
      },
      dispatcher_options);
  dispatcher.change(change("bucket", "a", 1), false);
  REQUIRE(krane::testing::eventually([&] { return watermark.watermark() == 1u; },
                                     std::chrono::seconds(10)));
  REQUIRE(ledger.parked().size() == 1u);
  {
    std::lock_guard lock(mutex);
    REQUIRE(reported.size() == 1u);
    CHECK_THAT(reported[0], Catch::StartsWith("DEADLINE_EXCEEDED after "));
    CHECK_THAT(reported[0], Catch::Contains("plugin slow did not answer within 100 ms"));
  }
  INFO("two calls timed out (max_attempts), each ended by a host restart");
  CHECK(host->stats().cancelled == 2u);
  dispatcher.stop(std::chrono::milliseconds(0), std::chrono::milliseconds(500));
  host->stop();
}

TEST_CASE("changes of a call cancelled at its deadline that had not started never run",
          "[plugin-host]") {
  const std::string dir = stateDir();
  const std::string log = dir + "/calls.log";
  HostOptions options = hostFor("slow", strCat("apply_ms=500\nlog=", log, "\ntypes=bucket\n"), dir);
  options.workers = 1;  // b and c wait behind a in the host
  options.call_timeout = std::chrono::milliseconds(200);
  HostEndpoint host(options, {});
  REQUIRE_THAT(host.start(), IsOk());
  const auto a = change("bucket", "a", 1);
  const auto b = change("bucket", "b", 2);
  const auto c = change("bucket", "c", 3);
  const auto results = host.handleBatch({&a, &b, &c});
  REQUIRE(results.size() == 3u);
  INFO("a ran to its end, late: its answer stands");
  CHECK_THAT(results[0], IsOk());
  CHECK_THAT(results[1], IsError(absl::StatusCode::kDeadlineExceeded));
  CHECK_THAT(results[2], IsError(absl::StatusCode::kDeadlineExceeded));
  INFO("never started: a plain retry, not a timeout that counts toward parking");
  CHECK_FALSE(isCallTimeout(results[1]));
  CHECK_FALSE(isCallTimeout(results[2]));
  // Give a host that ignored the cancel the time to start the next one.
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  CHECK(host.stats().restarts == 0u);
  host.stop();
  CHECK(logLines(log, "start ") == std::vector<std::string>{"start bucket/a"});
}

TEST_CASE("a call still running after its deadline and the cancel grace ends with its host",
          "[plugin-host]") {
  const std::string dir = stateDir();
  HostOptions options = hostFor("slow", "apply_ms=5000\ntypes=bucket\n", dir);
  options.call_timeout = std::chrono::milliseconds(200);
  options.cancel_grace = std::chrono::milliseconds(300);
  HostEndpoint host(options, {});
  REQUIRE_THAT(host.start(), IsOk());
  const int first_pid = host.stats().pid;
  const auto started = std::chrono::steady_clock::now();
  const absl::Status st = host.handle(change("bucket", "a", 1));
  CHECK_THAT(st, IsError(absl::StatusCode::kDeadlineExceeded));
  CHECK_THAT(std::string(toStd(st.message())), Catch::Contains("ended with the host"));
  // Not after the plugin's 5 s: the host that would not let go was restarted.
  CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(3));
  for (int i = 0; i < 100 && host.stats().restarts == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(host.stats().restarts >= 1u);
  CHECK(host.stats().pid != first_pid);
  CHECK(host.stats().cancelled == 1u);
  host.stop();
}

TEST_CASE("a sync call waits for the applies sent before it and runs alone", "[plugin-host]") {
  const std::string dir = stateDir();
  const std::string log = dir + "/calls.log";
  HostEndpoint host(hostFor("slow", strCat("apply_ms=300\nlog=", log, "\ntypes=bucket\n"), dir),
                    {});
  REQUIRE_THAT(host.start(), IsOk());
  const auto a = change("bucket", "a", 1);
  const auto b = change("bucket", "b", 2);
  std::vector<absl::Status> applied;
  std::thread applier([&] { applied = host.handleBatch({&a, &b}); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK_THAT(host.syncBegin(5), IsOk());
  applier.join();
  REQUIRE(applied.size() == 2u);
  CHECK_THAT(applied[0], IsOk());
  CHECK_THAT(applied[1], IsOk());
  host.stop();
  CHECK(logLines(log, "overlap") == std::vector<std::string>{});
  CHECK(logLines(log, "end sync").size() == 1u);
}

}  // namespace
}  // namespace krane::agent
