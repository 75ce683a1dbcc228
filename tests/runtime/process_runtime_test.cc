// The process runtime with real processes (the demo app): start, health, restart, crash loop,
// rolling replacement, graceful stop, re-adoption after kill -9 of its owner. Every test ends
// with no process left behind (the fixture checks, and kills what it finds).
#include "plugins/runtime/process/process_runtime.h"

#include <httplib.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>

#include <filesystem>
#include <fstream>
#include <set>

#include <catch2/catch.hpp>

#include "common/strings.h"
#include "nlohmann/json.hpp"
#include "tests/support/matchers.h"
#include "tests/support/process.h"
#include "tests/support/wait.h"

namespace krane::runtime {
namespace {

using krane::testing::eventually;
using krane::testing::runfile;
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

// Follows a roll through the runtime's status callbacks: between begin() and end(), the fewest
// ready instances and the most live (not terminating) ones any change showed.
struct RollWatch {
  std::function<void(const WorkloadStatus&)> callback() {
    return [this](const WorkloadStatus& s) {
      std::lock_guard lock(mutex);
      if (!rolling) return;
      min_ready = std::min(min_ready, s.ready);
      size_t live = 0;
      for (const auto& i : s.instances) live += i.phase != InstancePhase::kTerminating ? 1 : 0;
      max_live = std::max(max_live, live);
    };
  }
  void begin() {
    std::lock_guard lock(mutex);
    rolling = true;
  }
  void end() {
    std::lock_guard lock(mutex);
    rolling = false;
  }
  std::mutex mutex;
  bool rolling = false;
  int min_ready = 1000;
  size_t max_live = 0;
};

class ProcessRuntimeTest {
 protected:
  ProcessRuntimeTest() {
    char pattern[] = "/tmp/krane-rt-XXXXXX";
    dir_ = ::mkdtemp(pattern);
    demo_app_ = runfile("tests/support/demo_app/krane-demo-app");
  }

  ~ProcessRuntimeTest() {
    if (runtime_) runtime_->shutdown(/*stop_instances=*/true);
    runtime_.reset();
    std::set<int64_t> leaked;
    for (int64_t pid : recordedPids(dir_)) {
      if (alive(pid)) {
        leaked.insert(pid);
        ::kill(static_cast<pid_t>(-pid), SIGKILL);
      }
    }
    INFO("processes left behind: " << leaked.size());
    CHECK(leaked.empty());
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
    REQUIRE_THAT(r, IsOk());
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

TEST_CASE_METHOD(ProcessRuntimeTest, "starts instances on their own ports and they become ready",
                 "[process-runtime]") {
  start(options(22000));
  auto spec = demo("web", 3);
  spec.env["GREETING"] = "hello";
  REQUIRE_THAT(runtime_->apply(spec), IsOk());
  REQUIRE(eventually([&] { return converged("web"); }));
  const auto s = *runtime_->status("web");
  REQUIRE(s.instances.size() == 3u);
  std::set<int> ports;
  for (const auto& i : s.instances) {
    ports.insert(i.port);
    CHECK(i.phase == InstancePhase::kRunning);
    CHECK(i.ready);
    CHECK(i.port >= 22000);
    CHECK(i.port <= 22099);
    CHECK(i.address == strCat("127.0.0.1:", i.port));
    // The app got PORT and its own instance name.
    CHECK(get(i.port) == strCat("krane-demo-app v1 instance=", i.name, "\n"));
  }
  INFO("one port per instance");
  CHECK(ports.size() == 3u);
  CHECK(s.ready == 3);
  CHECK(s.updated_ready == 3);
  CHECK(runtime_->commandLine(spec).value() ==
        (std::vector<std::string>{demo_app_, "--version", "v1"}));
}

// A workload that asks for a health port: each instance gets a second port of its own in the
// variable it names, and the probes go there. The demo app then serves /healthz only on it, so
// the instances become ready only if the runtime probes the health port.
TEST_CASE_METHOD(ProcessRuntimeTest, "probes go to the health port a workload asks for",
                 "[process-runtime]") {
  start(options(22100));
  auto spec = demo("web", 2);
  spec.health_port_env = "KRANE_HEALTH_PORT";
  REQUIRE_THAT(runtime_->apply(spec), IsOk());
  REQUIRE(eventually([&] { return converged("web"); }, std::chrono::seconds(10)));
  const auto s = *runtime_->status("web");
  std::set<int> ports;
  for (const auto& i : s.instances) {
    INFO(i.name);
    ports.insert({i.port, i.health_port});
    CHECK(i.health_port >= 22100);
    CHECK(i.health_port <= 22199);
    CHECK(get(i.health_port, "/healthz/ready") == "ready\n");
    CHECK(get(i.port, "/healthz/ready").empty());  // 404: not served there
    CHECK_THAT(get(i.port), Catch::Contains("krane-demo-app v1"));
  }
  INFO("every port differs, across instances too");
  CHECK(ports.size() == 4u);

  INFO(
      "the field shapes the revision only when set: a spec without it is stored, and hashed, as"
      " before the field existed, so an upgrade adopts its instances instead of replacing them");
  const auto plain = demo("web", 2);
  CHECK(toJson(plain).find("health_port_env") == std::string::npos);
  CHECK(revisionOf(plain) != revisionOf(spec));

  INFO("a restarted instance keeps its ports");
  const auto first = s.instances[0];
  ::kill(static_cast<pid_t>(first.pid), SIGKILL);
  REQUIRE(eventually([&] {
    const auto now = runtime_->status("web");
    return now->converged && now->instances[0].pid != first.pid;
  }));
  const auto again = runtime_->status("web")->instances[0];
  CHECK(again.port == first.port);
  CHECK(again.health_port == first.health_port);
}

TEST_CASE_METHOD(ProcessRuntimeTest, "a command overrides the image and args are appended",
                 "[process-runtime]") {
  start(options(22100));
  auto spec = demo("cmd", 1);
  spec.command = {demo_app_};
  spec.args = {"--version", "from-args"};
  REQUIRE_THAT(runtime_->apply(spec), IsOk());
  REQUIRE(eventually([&] { return converged("cmd"); }));
  CHECK_THAT(get(runtime_->status("cmd")->instances[0].port), Catch::Contains("from-args"));
}

TEST_CASE_METHOD(ProcessRuntimeTest, "a dead instance is restarted", "[process-runtime]") {
  start(options(22200));
  REQUIRE_THAT(runtime_->apply(demo("web", 2)), IsOk());
  REQUIRE(eventually([&] { return converged("web"); }));
  const auto before = runtime_->status("web")->instances[0];
  ::kill(static_cast<pid_t>(before.pid), SIGKILL);
  REQUIRE(eventually([&] {
    const auto s = runtime_->status("web");
    return s->converged && s->instances[0].pid != before.pid && s->instances[0].restarts == 1;
  }));
  const auto after = runtime_->status("web")->instances[0];
  CHECK(after.name == before.name);
  INFO("a restart keeps the port");
  CHECK(after.port == before.port);
  INFO("cleared once ready again");
  CHECK(after.reason.empty());
  CHECK_FALSE(alive(before.pid));
}

TEST_CASE_METHOD(ProcessRuntimeTest,
                 "a crash loop is reported as failed with the exit code and the last output",
                 "[process-runtime]") {
  start(options(22300));
  auto spec = demo("broken", 1);
  spec.args = {"--exit-on-start", "3"};
  REQUIRE_THAT(runtime_->apply(spec), IsOk());
  REQUIRE(eventually([&] {
    const auto s = runtime_->status("broken");
    return !s->instances.empty() && s->instances[0].phase == InstancePhase::kFailed;
  }));
  const auto i = runtime_->status("broken")->instances[0];
  CHECK_THAT(i.reason, Catch::Contains("crash loop: exited with code 3"));
  CHECK(i.restarts >= 3);
  CHECK_THAT(i.last_output, AnyElementContains("exiting at start with code 3"));
  CHECK_FALSE(runtime_->status("broken")->converged);
}

// An instance's output may be anything: what goes into reports (protobuf strings) and the
// database (utf8mb4) must be UTF-8, or the report is refused whole.
TEST_CASE_METHOD(ProcessRuntimeTest, "output that is not utf8 is reported with replacement marks",
                 "[process-runtime]") {
  start(options(22350));
  auto spec = demo("binary", 1);
  spec.command = {"/bin/sh", "-c", "printf 'bad \\377\\376 bytes\\n'; exit 3"};
  REQUIRE_THAT(runtime_->apply(spec), IsOk());
  REQUIRE(eventually([&] {
    const auto s = runtime_->status("binary");
    return !s->instances.empty() && s->instances[0].phase == InstancePhase::kFailed;
  }));
  const auto i = runtime_->status("binary")->instances[0];
  CHECK_THAT(i.last_output, AnyElementContains("bad \xef\xbf\xbd\xef\xbf\xbd bytes"));
  for (const auto& line : i.last_output) CHECK(line == clampUtf8(line));
}

// A full disk: a spec that cannot be stored is not applied (the agent retries it), and the stored
// one stays whole, so a next runtime adopts the instances instead of stopping them as strays.
TEST_CASE_METHOD(ProcessRuntimeTest, "a spec that cannot be stored is refused and the old one kept",
                 "[process-runtime]") {
  start(options(22380));
  REQUIRE_THAT(runtime_->apply(demo("web", 1, "v1")), IsOk());
  REQUIRE(eventually([&] { return converged("web"); }));
  const std::string revision = runtime_->status("web")->revision;
  // Writes past 16 bytes fail with EFBIG, as they would with ENOSPC.
  struct rlimit before {};
  ::getrlimit(RLIMIT_FSIZE, &before);
  auto* const previous_handler = ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit tiny = before;
  tiny.rlim_cur = 16;
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &tiny) == 0);
  const absl::Status refused = runtime_->apply(demo("web", 1, "v2"));
  const absl::Status refused_new = runtime_->apply(demo("other", 1, "v1"));
  ::setrlimit(RLIMIT_FSIZE, &before);
  ::signal(SIGXFSZ, previous_handler);
  CHECK(absl::IsUnavailable(refused));
  CHECK_THAT(std::string(toStd(refused.message())), Catch::Contains("workloads/"));
  CHECK(absl::IsUnavailable(refused_new));
  CHECK(runtime_->status("web")->revision == revision);
  CHECK_FALSE(runtime_->status("other").has_value());
  // A next runtime reads the stored spec whole and adopts the running instance.
  const int64_t pid = runtime_->status("web")->instances.at(0).pid;
  runtime_->shutdown(/*stop_instances=*/false);
  runtime_.reset();
  start(options(22380));
  REQUIRE(eventually([&] { return converged("web"); }));
  CHECK(runtime_->status("web")->revision == revision);
  CHECK(runtime_->status("web")->instances.at(0).pid == pid);
}

TEST_CASE_METHOD(ProcessRuntimeTest, "a missing binary is a failure that says so",
                 "[process-runtime]") {
  start(options(22400));
  auto spec = demo("missing", 1);
  spec.command = {"/nonexistent/server"};
  REQUIRE_THAT(runtime_->apply(spec), IsOk());
  REQUIRE(eventually([&] {
    const auto s = runtime_->status("missing");
    return !s->instances.empty() && s->instances[0].phase == InstancePhase::kFailed;
  }));
  const auto i = runtime_->status("missing")->instances[0];
  CHECK_THAT(i.reason, Catch::Contains("exited with code 127"));
  CHECK_THAT(i.last_output, AnyElementContains("cannot run /nonexistent/server: No such file"));
}

TEST_CASE_METHOD(ProcessRuntimeTest,
                 "a rolling replacement never drops below the replicas or exceeds one extra",
                 "[process-runtime]") {
  auto o = options(22500);
  RollWatch watch;
  o.on_change = watch.callback();
  start(o);
  REQUIRE_THAT(runtime_->apply(demo("web", 3, "v1")), IsOk());
  REQUIRE(eventually([&] { return converged("web"); }));
  const auto old = *runtime_->status("web");
  watch.begin();
  auto v2 = demo("web", 3, "v2");
  v2.readiness.initial_delay = std::chrono::milliseconds(150);  // new instances take a moment
  REQUIRE_THAT(runtime_->apply(v2), IsOk());
  REQUIRE(eventually([&] {
    const auto s = runtime_->status("web");
    return s->converged && s->revision != old.revision && s->instances.size() == 3;
  }));
  for (const auto& i : runtime_->status("web")->instances) {
    CHECK_THAT(get(i.port), Catch::Contains("krane-demo-app v2"));
  }
  for (const auto& i : old.instances) {
    INFO(i.name);
    CHECK_FALSE(alive(i.pid));
  }
  watch.end();
  INFO("unavailable 0");
  CHECK(watch.min_ready >= 3);
  INFO("surge 1");
  CHECK(watch.max_live <= 4u);
  // The callback uses this test's locals: stop the runtime before they go.
  runtime_->shutdown(/*stop_instances=*/true);
}

// The roll follows the spec: surge 0 never runs more than the replicas (the default surge 1
// would), unavailable 2 lets it drain two at a time but never more.
TEST_CASE_METHOD(ProcessRuntimeTest, "a roll follows the spec's surge and unavailable",
                 "[process-runtime]") {
  auto o = options(22600);
  RollWatch watch;
  o.on_change = watch.callback();
  start(o);
  auto v1 = demo("api", 4, "v1");
  v1.max_surge = 0;
  v1.max_unavailable = 2;
  v1.min_ready = std::chrono::milliseconds(200);
  REQUIRE_THAT(runtime_->apply(v1), IsOk());
  REQUIRE(eventually([&] { return converged("api"); }));
  const auto old = *runtime_->status("api");
  watch.begin();
  auto v2 = demo("api", 4, "v2");
  v2.max_surge = 0;
  v2.max_unavailable = 2;
  v2.min_ready = std::chrono::milliseconds(200);
  REQUIRE_THAT(runtime_->apply(v2), IsOk());
  REQUIRE(eventually([&] {
    const auto s = runtime_->status("api");
    return s->converged && s->revision != old.revision && s->instances.size() == 4;
  }));
  watch.end();
  INFO("surge 0: never above 4");
  CHECK(watch.max_live <= 4u);
  INFO("unavailable 2: never below 2 ready");
  CHECK(watch.min_ready >= 2);
  INFO("surge and unavailable shape the roll, not the instances: same revision");
  auto v2_wider = v2;
  v2_wider.max_surge = 3;
  CHECK(revisionOf(v2_wider) == revisionOf(v2));
  runtime_->shutdown(/*stop_instances=*/true);
}

TEST_CASE_METHOD(ProcessRuntimeTest, "scaling starts and stops instances without a rollout",
                 "[process-runtime]") {
  start(options(22600));
  REQUIRE_THAT(runtime_->apply(demo("web", 1)), IsOk());
  REQUIRE(eventually([&] { return converged("web"); }));
  const int64_t first = runtime_->status("web")->instances[0].pid;
  REQUIRE_THAT(runtime_->apply(demo("web", 3)), IsOk());
  REQUIRE(eventually([&] { return converged("web") && runtime_->status("web")->ready == 3; }));
  INFO("scaling up keeps the running instance");
  CHECK(alive(first));
  REQUIRE_THAT(runtime_->apply(demo("web", 1)), IsOk());
  REQUIRE(eventually(
      [&] { return converged("web") && runtime_->status("web")->instances.size() == 1; }));
  INFO("the newest go first");
  CHECK(runtime_->status("web")->instances[0].pid == first);
}

TEST_CASE_METHOD(ProcessRuntimeTest,
                 "the endpoints file lists the ready instances and goes with the workload",
                 "[process-runtime]") {
  start(options(21200));
  const std::string file = endpointsFile(dir_, "deployment/web");
  const auto endpoints = [&] {
    std::ifstream in(file);
    if (!in) return std::set<std::string>{"<no file>"};
    auto doc = nlohmann::json::parse(in, nullptr, false);
    if (doc.is_discarded()) return std::set<std::string>{"<not json>"};
    CHECK(doc.value("workload", "") == "deployment/web");
    return doc.value("endpoints", nlohmann::json::array()).get<std::set<std::string>>();
  };
  REQUIRE_THAT(runtime_->apply(demo("deployment/web", 2)), IsOk());
  REQUIRE(eventually([&] { return converged("deployment/web"); }));
  std::set<std::string> ready;
  for (const auto& i : runtime_->status("deployment/web")->instances) ready.insert(i.address);
  REQUIRE(eventually([&] { return endpoints() == ready; }, std::chrono::seconds(5)));

  INFO("an instance that stops leaves the list before it is gone");
  REQUIRE_THAT(runtime_->apply(demo("deployment/web", 1)), IsOk());
  REQUIRE(eventually([&] { return endpoints().size() == 1u; }, std::chrono::seconds(5)));
  std::string removed;
  for (const auto& a : ready) {
    if (!endpoints().count(a)) removed = a;
  }
  REQUIRE_FALSE(removed.empty());
  const int removed_port = std::stoi(removed.substr(removed.rfind(':') + 1));
  INFO("it still answers for the deregistration delay after leaving the list, then stops");
  CHECK_THAT(get(removed_port), Catch::Contains("krane-demo-app"));
  CHECK(eventually([&] { return get(removed_port).empty(); }, std::chrono::seconds(5)));

  REQUIRE_THAT(runtime_->remove("deployment/web"), IsOk());
  CHECK(!fs::exists(file));
}

TEST_CASE_METHOD(ProcessRuntimeTest, "stop is graceful then forced after the grace period",
                 "[process-runtime]") {
  start(options(22700));
  WorkloadSpec stubborn;
  stubborn.id = "stubborn";
  stubborn.command = {"/bin/sh", "-c",
                      "trap '' TERM; echo ignoring TERM; while :; do sleep 0.05; done"};
  stubborn.grace = std::chrono::milliseconds(300);
  REQUIRE_THAT(runtime_->apply(stubborn), IsOk());
  REQUIRE_THAT(runtime_->apply(demo("polite", 1)), IsOk());
  REQUIRE(eventually([&] { return converged("stubborn") && converged("polite"); }));
  const int64_t stubborn_pid = runtime_->status("stubborn")->instances[0].pid;
  const auto polite = runtime_->status("polite")->instances[0];
  REQUIRE_THAT(runtime_->remove("polite"), IsOk());
  REQUIRE_THAT(runtime_->remove("stubborn"), IsOk());
  CHECK_FALSE(runtime_->status("polite").has_value());
  REQUIRE(eventually([&] { return !alive(stubborn_pid) && !alive(polite.pid); }));
  // Both directories are gone once the processes are.
  REQUIRE(eventually([&] { return recordedPids(dir_).empty(); }));
}

TEST_CASE_METHOD(ProcessRuntimeTest, "bad specs are refused naming the field",
                 "[process-runtime]") {
  start(options(22800));
  auto unknown = demo("x", 1);
  unknown.image = "registry.example/unknown:1";
  auto st = runtime_->apply(unknown);
  CHECK(st.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(toStd(st.message())),
             Catch::Contains("image: \"registry.example/unknown:1\" has no rule"));
  CHECK_THAT(std::string(toStd(st.message())), Catch::Contains("known: krane.dev/demo-app"));
  auto negative = demo("x", -1);
  CHECK_THAT(std::string(toStd(runtime_->apply(negative).message())),
             Catch::Contains("replicas: must be between 0 and 1000, got -1"));
  auto probe = demo("x", 1);
  probe.readiness.path = "healthz";
  CHECK_THAT(std::string(toStd(runtime_->apply(probe).message())),
             Catch::Contains("readiness.path: \"healthz\" must start with /"));
  auto health = demo("x", 1);
  health.health_port_env = "PORT";
  CHECK_THAT(std::string(toStd(runtime_->apply(health).message())),
             Catch::Contains("health_port_env: \"PORT\" must be an environment variable name"));
  health.health_port_env = "health-port";
  CHECK_THAT(std::string(toStd(runtime_->apply(health).message())),
             Catch::Contains("health_port_env: \"health-port\""));
  auto relative = demo("x", 1);
  relative.command = {"server"};
  CHECK_THAT(std::string(toStd(runtime_->apply(relative).message())),
             Catch::Contains("command: \"server\" must be an absolute path"));
  INFO("nothing half-applied");
  CHECK(runtime_->workloads().empty());
  auto bad_range = options(22800);
  bad_range.port_to = 100;
  CHECK_THAT(std::string(toStd(ProcessRuntime::start(bad_range).status().message())),
             Catch::Contains("not a valid port range"));
}

TEST_CASE_METHOD(ProcessRuntimeTest,
                 "after its owner is killed instances are adopted or stopped never leaked",
                 "[process-runtime]") {
  const std::string log = dir_ + "-driver.log";
  std::set<int64_t> pids;
  {
    krane::testing::ChildProcess driver({runfile("tests/runtime/process_driver"), dir_, demo_app_},
                                        log);
    REQUIRE(eventually([&] {
      std::ifstream in(log);
      std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      return all.find("converged") != std::string::npos;
    }));
    pids = recordedPids(dir_);
    REQUIRE(pids.size() == 4u);
    driver.signal(SIGKILL);
    driver.wait();
  }
  for (int64_t pid : pids) {
    INFO("instances outlive their owner");
    CHECK(alive(pid));
  }
  // The workload "drop" was deleted while nobody was watching.
  for (const auto& e : fs::directory_iterator(dir_ + "/workloads")) {
    if (e.path().filename().string().rfind("drop-", 0) == 0) fs::remove(e.path());
  }
  start(options(21000));
  REQUIRE(eventually([&] { return converged("keep"); }));
  const auto keep = *runtime_->status("keep");
  REQUIRE(keep.instances.size() == 2u);
  for (const auto& i : keep.instances) {
    INFO(i.name);
    CHECK(i.adopted);
    INFO("the same process, not a new one");
    CHECK(pids.count(i.pid));
    CHECK_THAT(get(i.port), Catch::Contains("krane-demo-app v1"));
    INFO("its health port is adopted with it, and probed there (the main port has no /healthz)");
    CHECK(i.health_port != 0);
    CHECK(i.ready);
    CHECK(get(i.health_port, "/healthz/ready") == "ready\n");
  }
  CHECK_FALSE(runtime_->status("drop").has_value());
  // Drop's instances are stopped; keep's keep running.
  REQUIRE(eventually([&] {
    int running = 0;
    for (int64_t pid : pids) running += alive(pid) ? 1 : 0;
    return running == 2;
  }));
  // An adopted instance that dies is noticed and replaced.
  ::kill(static_cast<pid_t>(keep.instances[0].pid), SIGKILL);
  REQUIRE(eventually([&] {
    const auto s = runtime_->status("keep");
    return s->converged && s->instances[0].pid != keep.instances[0].pid;
  }));
  CHECK(runtime_->status("keep")->instances[0].reason.empty());
  fs::remove(log);
}

// The owner was killed at the worst moments of a start: after creating the instance's folder
// but before its record (nothing runs), and after the fork but before the record got the pid (a
// process runs that no record names). The next owner starts (no crash on the half-written
// state), cleans both up and leaks nothing.
TEST_CASE_METHOD(ProcessRuntimeTest, "an owner killed mid start leaves nothing behind",
                 "[process-runtime]") {
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
  INFO("the orphan serves");
  REQUIRE(eventually([&] { return !get(21150).empty(); }));

  start(options(21100));
  INFO("the orphan was stopped");
  CHECK(eventually([&] { return get(21150).empty(); }));
  CHECK(orphan.wait() == -SIGKILL);
  CHECK_FALSE(fs::exists(dir_ + "/instances/w/w-abc123-0"));
  CHECK_FALSE(fs::exists(idir));
  // And the runtime works.
  REQUIRE_THAT(runtime_->apply(demo("fresh", 1)), IsOk());
  CHECK(eventually([&] { return converged("fresh"); }));
}

}  // namespace
}  // namespace krane::runtime
