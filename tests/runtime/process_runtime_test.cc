// The process runtime with real processes (the demo app): start, health, restart, crash loop,
// rolling replacement, graceful stop, re-adoption after kill -9 of its owner. Every test ends
// with no process left behind (the fixture checks, and kills what it finds).
#include "plugins/runtime/process/process_runtime.h"

#include <httplib.h>
#include <signal.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <set>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/strings.h"
#include "nlohmann/json.hpp"
#include "tests/support/process.h"
#include "tests/support/wait.h"

namespace krane::runtime {
namespace {

using krane::testing::eventually;
using krane::testing::runfile;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

// Running (a zombie waiting for its parent to reap it counts as gone).
bool alive(int64_t pid) {
  if (pid <= 0) return false;
  std::ifstream in(strCat("/proc/", pid, "/stat"));
  std::string stat;
  if (!std::getline(in, stat)) return false;
  const auto close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] != 'Z';
}

std::string get(int port, const std::string& path = "/") {
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(1, 0);
  auto res = client.Get(path);
  return res ? res->body : "";
}

// Every pid an instance record in `dir` names.
std::set<int64_t> recordedPids(const std::string& dir) {
  std::set<int64_t> pids;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec);
       it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (it->path().filename() != "instance.json") continue;
    std::ifstream in(it->path());
    try {
      pids.insert(nlohmann::json::parse(in).value("pid", 0));
    } catch (const std::exception&) {
    }
  }
  return pids;
}

class ProcessRuntimeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/krane-rt-XXXXXX";
    dir_ = ::mkdtemp(pattern);
    demo_app_ = runfile("tests/support/demo_app/krane-demo-app");
  }

  void TearDown() override {
    if (runtime_) runtime_->shutdown(/*stop_instances=*/true);
    runtime_.reset();
    std::set<int64_t> leaked;
    for (int64_t pid : recordedPids(dir_)) {
      if (alive(pid)) {
        leaked.insert(pid);
        ::kill(static_cast<pid_t>(-pid), SIGKILL);
      }
    }
    EXPECT_TRUE(leaked.empty()) << "processes left behind: " << leaked.size();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  ProcessRuntimeOptions options(int port_from) {
    ProcessRuntimeOptions o;
    o.state_dir = dir_;
    o.port_from = port_from;
    o.port_to = port_from + 99;
    o.images["krane.dev/demo-app"] = {demo_app_, "--version", "{tag}"};
    o.restart = {std::chrono::milliseconds(50), 2.0, std::chrono::milliseconds(400), 0.1};
    o.tick = std::chrono::milliseconds(20);
    return o;
  }

  void start(ProcessRuntimeOptions o) {
    auto r = ProcessRuntime::start(std::move(o));
    ASSERT_TRUE(r.ok()) << r.status();
    runtime_ = *std::move(r);
  }

  static WorkloadSpec demo(const std::string& id, int replicas, const std::string& tag = "v1") {
    WorkloadSpec spec;
    spec.id = id;
    spec.image = "krane.dev/demo-app:" + tag;
    spec.replicas = replicas;
    spec.readiness.path = "/healthz/ready";
    spec.readiness.interval = std::chrono::milliseconds(50);
    spec.liveness.path = "/healthz/live";
    spec.liveness.interval = std::chrono::milliseconds(100);
    spec.grace = std::chrono::milliseconds(2000);
    return spec;
  }

  bool converged(const std::string& id) {
    auto s = runtime_->status(id);
    return s && s->converged;
  }

  std::string dir_;
  std::string demo_app_;
  std::unique_ptr<ProcessRuntime> runtime_;
};

TEST_F(ProcessRuntimeTest, StartsInstancesOnTheirOwnPortsAndTheyBecomeReady) {
  start(options(22000));
  auto spec = demo("web", 3);
  spec.env["GREETING"] = "hello";
  ASSERT_TRUE(runtime_->apply(spec).ok());
  ASSERT_TRUE(eventually([&] { return converged("web"); }));
  const auto s = *runtime_->status("web");
  ASSERT_EQ(s.instances.size(), 3u);
  std::set<int> ports;
  for (const auto& i : s.instances) {
    ports.insert(i.port);
    EXPECT_EQ(i.phase, InstancePhase::kRunning);
    EXPECT_TRUE(i.ready);
    EXPECT_GE(i.port, 22000);
    EXPECT_LE(i.port, 22099);
    EXPECT_EQ(i.address, strCat("127.0.0.1:", i.port));
    // The app got PORT and its own instance name.
    EXPECT_EQ(get(i.port), strCat("krane-demo-app v1 instance=", i.name, "\n"));
  }
  EXPECT_EQ(ports.size(), 3u) << "one port per instance";
  EXPECT_EQ(s.ready, 3);
  EXPECT_EQ(s.updated_ready, 3);
  EXPECT_EQ(runtime_->commandLine(spec).value(),
            (std::vector<std::string>{demo_app_, "--version", "v1"}));
}

TEST_F(ProcessRuntimeTest, ACommandOverridesTheImageAndArgsAreAppended) {
  start(options(22100));
  auto spec = demo("cmd", 1);
  spec.command = {demo_app_};
  spec.args = {"--version", "from-args"};
  ASSERT_TRUE(runtime_->apply(spec).ok());
  ASSERT_TRUE(eventually([&] { return converged("cmd"); }));
  EXPECT_THAT(get(runtime_->status("cmd")->instances[0].port), HasSubstr("from-args"));
}

TEST_F(ProcessRuntimeTest, ADeadInstanceIsRestarted) {
  start(options(22200));
  ASSERT_TRUE(runtime_->apply(demo("web", 2)).ok());
  ASSERT_TRUE(eventually([&] { return converged("web"); }));
  const auto before = runtime_->status("web")->instances[0];
  ::kill(static_cast<pid_t>(before.pid), SIGKILL);
  ASSERT_TRUE(eventually([&] {
    const auto s = runtime_->status("web");
    return s->converged && s->instances[0].pid != before.pid && s->instances[0].restarts == 1;
  }));
  const auto after = runtime_->status("web")->instances[0];
  EXPECT_EQ(after.name, before.name);
  EXPECT_EQ(after.port, before.port) << "a restart keeps the port";
  EXPECT_THAT(after.reason, ::testing::IsEmpty()) << "cleared once ready again";
  EXPECT_FALSE(alive(before.pid));
}

TEST_F(ProcessRuntimeTest, ACrashLoopIsReportedAsFailedWithTheExitCodeAndTheLastOutput) {
  start(options(22300));
  auto spec = demo("broken", 1);
  spec.args = {"--exit-on-start", "3"};
  ASSERT_TRUE(runtime_->apply(spec).ok());
  ASSERT_TRUE(eventually([&] {
    const auto s = runtime_->status("broken");
    return !s->instances.empty() && s->instances[0].phase == InstancePhase::kFailed;
  }));
  const auto i = runtime_->status("broken")->instances[0];
  EXPECT_THAT(i.reason, HasSubstr("crash loop: exited with code 3"));
  EXPECT_GE(i.restarts, 3);
  EXPECT_THAT(i.last_output, ::testing::Contains(HasSubstr("exiting at start with code 3")));
  EXPECT_FALSE(runtime_->status("broken")->converged);
}

TEST_F(ProcessRuntimeTest, AMissingBinaryIsAFailureThatSaysSo) {
  start(options(22400));
  auto spec = demo("missing", 1);
  spec.command = {"/nonexistent/server"};
  ASSERT_TRUE(runtime_->apply(spec).ok());
  ASSERT_TRUE(eventually([&] {
    const auto s = runtime_->status("missing");
    return !s->instances.empty() && s->instances[0].phase == InstancePhase::kFailed;
  }));
  const auto i = runtime_->status("missing")->instances[0];
  EXPECT_THAT(i.reason, HasSubstr("exited with code 127"));
  EXPECT_THAT(i.last_output,
              ::testing::Contains(HasSubstr("cannot run /nonexistent/server: No such file")));
}

TEST_F(ProcessRuntimeTest, ARollingReplacementNeverDropsBelowTheReplicasOrExceedsOneExtra) {
  auto o = options(22500);
  std::mutex mutex;
  int min_ready = 1000;
  size_t max_live = 0;
  bool rolling = false;
  o.on_change = [&](const WorkloadStatus& s) {
    std::lock_guard lock(mutex);
    if (!rolling) return;
    min_ready = std::min(min_ready, s.ready);
    size_t live = 0;
    for (const auto& i : s.instances) live += i.phase != InstancePhase::kTerminating ? 1 : 0;
    max_live = std::max(max_live, live);
  };
  start(o);
  ASSERT_TRUE(runtime_->apply(demo("web", 3, "v1")).ok());
  ASSERT_TRUE(eventually([&] { return converged("web"); }));
  const auto old = *runtime_->status("web");
  {
    std::lock_guard lock(mutex);
    rolling = true;
  }
  auto v2 = demo("web", 3, "v2");
  v2.readiness.initial_delay = std::chrono::milliseconds(150);  // new instances take a moment
  ASSERT_TRUE(runtime_->apply(v2).ok());
  ASSERT_TRUE(eventually([&] {
    const auto s = runtime_->status("web");
    return s->converged && s->revision != old.revision && s->instances.size() == 3;
  }));
  for (const auto& i : runtime_->status("web")->instances) {
    EXPECT_THAT(get(i.port), HasSubstr("krane-demo-app v2"));
  }
  for (const auto& i : old.instances) EXPECT_FALSE(alive(i.pid)) << i.name;
  {
    std::lock_guard lock(mutex);
    rolling = false;
    EXPECT_GE(min_ready, 3) << "unavailable 0";
    EXPECT_LE(max_live, 4u) << "surge 1";
  }
  // The callback uses this test's locals: stop the runtime before they go.
  runtime_->shutdown(/*stop_instances=*/true);
}

TEST_F(ProcessRuntimeTest, ScalingStartsAndStopsInstancesWithoutARollout) {
  start(options(22600));
  ASSERT_TRUE(runtime_->apply(demo("web", 1)).ok());
  ASSERT_TRUE(eventually([&] { return converged("web"); }));
  const int64_t first = runtime_->status("web")->instances[0].pid;
  ASSERT_TRUE(runtime_->apply(demo("web", 3)).ok());
  ASSERT_TRUE(eventually([&] { return converged("web") && runtime_->status("web")->ready == 3; }));
  EXPECT_TRUE(alive(first)) << "scaling up keeps the running instance";
  ASSERT_TRUE(runtime_->apply(demo("web", 1)).ok());
  ASSERT_TRUE(eventually(
      [&] { return converged("web") && runtime_->status("web")->instances.size() == 1; }));
  EXPECT_EQ(runtime_->status("web")->instances[0].pid, first) << "the newest go first";
}

TEST_F(ProcessRuntimeTest, StopIsGracefulThenForcedAfterTheGracePeriod) {
  start(options(22700));
  WorkloadSpec stubborn;
  stubborn.id = "stubborn";
  stubborn.command = {"/bin/sh", "-c",
                      "trap '' TERM; echo ignoring TERM; while :; do sleep 0.05; done"};
  stubborn.grace = std::chrono::milliseconds(300);
  ASSERT_TRUE(runtime_->apply(stubborn).ok());
  ASSERT_TRUE(runtime_->apply(demo("polite", 1)).ok());
  ASSERT_TRUE(eventually([&] { return converged("stubborn") && converged("polite"); }));
  const int64_t stubborn_pid = runtime_->status("stubborn")->instances[0].pid;
  const auto polite = runtime_->status("polite")->instances[0];
  ASSERT_TRUE(runtime_->remove("polite").ok());
  ASSERT_TRUE(runtime_->remove("stubborn").ok());
  EXPECT_FALSE(runtime_->status("polite").has_value());
  ASSERT_TRUE(eventually([&] { return !alive(stubborn_pid) && !alive(polite.pid); }));
  // Both directories are gone once the processes are.
  ASSERT_TRUE(eventually([&] { return recordedPids(dir_).empty(); }));
}

TEST_F(ProcessRuntimeTest, BadSpecsAreRefusedNamingTheField) {
  start(options(22800));
  auto unknown = demo("x", 1);
  unknown.image = "registry.example/unknown:1";
  auto st = runtime_->apply(unknown);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(toStd(st.message())),
              HasSubstr("image: \"registry.example/unknown:1\" has no rule"));
  EXPECT_THAT(std::string(toStd(st.message())), HasSubstr("known: krane.dev/demo-app"));
  auto negative = demo("x", -1);
  EXPECT_THAT(std::string(toStd(runtime_->apply(negative).message())),
              HasSubstr("replicas: must be between 0 and 1000, got -1"));
  auto probe = demo("x", 1);
  probe.readiness.path = "healthz";
  EXPECT_THAT(std::string(toStd(runtime_->apply(probe).message())),
              HasSubstr("readiness.path: \"healthz\" must start with /"));
  auto relative = demo("x", 1);
  relative.command = {"server"};
  EXPECT_THAT(std::string(toStd(runtime_->apply(relative).message())),
              HasSubstr("command: \"server\" must be an absolute path"));
  EXPECT_TRUE(runtime_->workloads().empty()) << "nothing half-applied";
  auto bad_range = options(22800);
  bad_range.port_to = 100;
  EXPECT_THAT(std::string(toStd(ProcessRuntime::start(bad_range).status().message())),
              HasSubstr("not a valid port range"));
}

TEST_F(ProcessRuntimeTest, AfterItsOwnerIsKilledInstancesAreAdoptedOrStoppedNeverLeaked) {
  const std::string log = dir_ + "-driver.log";
  std::set<int64_t> pids;
  {
    krane::testing::ChildProcess driver({runfile("tests/runtime/process_driver"), dir_, demo_app_},
                                        log);
    ASSERT_TRUE(eventually([&] {
      std::ifstream in(log);
      std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      return all.find("converged") != std::string::npos;
    }));
    pids = recordedPids(dir_);
    ASSERT_EQ(pids.size(), 4u);
    driver.signal(SIGKILL);
    driver.wait();
  }
  for (int64_t pid : pids) EXPECT_TRUE(alive(pid)) << "instances outlive their owner";
  // The workload "drop" was deleted while nobody was watching.
  for (const auto& e : fs::directory_iterator(dir_ + "/workloads")) {
    if (e.path().filename().string().rfind("drop-", 0) == 0) fs::remove(e.path());
  }
  start(options(21000));
  ASSERT_TRUE(eventually([&] { return converged("keep"); }));
  const auto keep = *runtime_->status("keep");
  ASSERT_EQ(keep.instances.size(), 2u);
  for (const auto& i : keep.instances) {
    EXPECT_TRUE(i.adopted) << i.name;
    EXPECT_TRUE(pids.count(i.pid)) << "the same process, not a new one";
    EXPECT_THAT(get(i.port), HasSubstr("krane-demo-app v1"));
  }
  EXPECT_FALSE(runtime_->status("drop").has_value());
  // Drop's instances are stopped; keep's keep running.
  ASSERT_TRUE(eventually([&] {
    int running = 0;
    for (int64_t pid : pids) running += alive(pid) ? 1 : 0;
    return running == 2;
  }));
  // An adopted instance that dies is noticed and replaced.
  ::kill(static_cast<pid_t>(keep.instances[0].pid), SIGKILL);
  ASSERT_TRUE(eventually([&] {
    const auto s = runtime_->status("keep");
    return s->converged && s->instances[0].pid != keep.instances[0].pid;
  }));
  EXPECT_THAT(runtime_->status("keep")->instances[0].reason, ::testing::IsEmpty());
  fs::remove(log);
}

// The owner was killed at the worst moments of a start: after creating the instance's folder
// but before its record (nothing runs), and after the fork but before the record got the pid (a
// process runs that no record names). The next owner starts (no crash on the half-written
// state), cleans both up and leaks nothing.
TEST_F(ProcessRuntimeTest, AnOwnerKilledMidStartLeavesNothingBehind) {
  fs::create_directories(dir_ + "/instances/w/w-abc123-0/work");  // no record
  const std::string name = "w-abc123-1";
  const std::string idir = dir_ + "/instances/w/" + name;
  fs::create_directories(idir + "/work");
  std::ofstream(idir + "/instance.json")
      << R"({"workload": "w", "name": ")" << name
      << R"(", "index": 1, "revision": "abc123", "pid": 0, "start_ticks": 0, "port": 21150})";
  // The child the dead owner had forked.
  const std::string script =
      strCat("exec env KRANE_INSTANCE=", name, " PORT=21150 ", demo_app_, " --version v1");
  krane::testing::ChildProcess orphan({"/bin/sh", "-c", script});
  ASSERT_TRUE(eventually([&] { return !get(21150).empty(); })) << "the orphan serves";

  start(options(21100));
  EXPECT_TRUE(eventually([&] { return get(21150).empty(); })) << "the orphan was stopped";
  EXPECT_EQ(orphan.wait(), -SIGKILL);
  EXPECT_FALSE(fs::exists(dir_ + "/instances/w/w-abc123-0"));
  EXPECT_FALSE(fs::exists(idir));
  // And the runtime works.
  ASSERT_TRUE(runtime_->apply(demo("fresh", 1)).ok());
  EXPECT_TRUE(eventually([&] { return converged("fresh"); }));
}

}  // namespace
}  // namespace krane::runtime
