// tools/local-stack.sh (`./dev up`) for real: MariaDB, krane-ctrl, two agents and real
// instances; krane-ctrl and an agent are killed with SIGKILL and come back (the agent adopts its
// instances), and SIGTERM leaves nothing of the stack running.
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "common/strings.h"
#include "tests/support/process.h"
#include "tests/support/wait.h"
#include "tests/tools/helpers.h"

namespace krane {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using stack_test::alive;
using stack_test::count;
using stack_test::readPid;
using stack_test::ShortTmpDir;
using stack_test::writeFile;
using testing::ChildProcess;
using testing::eventually;
using testing::runCommand;
using testing::runfile;
using testing::slurp;

int freePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  socklen_t len = sizeof(addr);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// Every process (but this test) whose command line mentions `dir` or whose working directory is
// in it: what a stack living in `dir` runs.
std::set<int> processesOf(const std::string& dir) {
  std::set<int> out;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return out;
  while (dirent* entry = ::readdir(proc)) {
    const int pid = std::atoi(entry->d_name);
    if (pid <= 0 || pid == ::getpid() || !alive(pid)) continue;
    std::string cmdline = slurp(strCat("/proc/", pid, "/cmdline"));
    std::error_code ec;
    const std::string cwd = fs::read_symlink(strCat("/proc/", pid, "/cwd"), ec).string();
    if (cmdline.find(dir) != std::string::npos || cwd.rfind(dir, 0) == 0) out.insert(pid);
  }
  ::closedir(proc);
  return out;
}

// The whole stack of ./dev up, as tools/local-stack.sh runs it.
class LocalStack {
 public:
  LocalStack()
      : grpc_port_(freePort()), http_port_(freePort()), watch_port_(freePort()), bin_([] {
          const std::string ctrl = runfile("controlplane/krane-ctrl");
          return ctrl.substr(0, ctrl.size() - std::string("/controlplane/krane-ctrl").size());
        }()) {
    // Instances take ports from ranges of 200 per agent and plugin, below the ephemeral ports
    // (32768 and up) that freePort() hands out.
    const int instance_port = 20000 + static_cast<int>(::getpid() % 30) * 400;
    stack_ = std::make_unique<ChildProcess>(
        std::vector<std::string>{"/bin/bash", runfile("tools/local-stack.sh")}, dir_ / "stack.log",
        std::map<std::string, std::string>{
            {"BIN", bin_},
            {"KRANE_LOCAL_DIR", dir_ / "local"},
            {"KRANE_DB_PORT", std::to_string(freePort())},
            {"KRANE_GRPC_PORT", std::to_string(grpc_port_)},
            {"KRANE_HTTP_PORT", std::to_string(http_port_)},
            {"KRANE_WATCH_PORT", std::to_string(watch_port_)},
            {"KRANE_INSTANCE_PORT", std::to_string(instance_port)},
            {"PATH", strCat(std::getenv("PATH") ? std::getenv("PATH") : "/usr/bin:/bin",
                            ":/usr/sbin:/sbin")}});
  }
  ~LocalStack() {
    if (stack_->running()) {
      stack_->signal(SIGTERM);
      stack_->wait();
    }
  }

  std::string local(const std::string& name) const { return strCat(dir_.path(), "/local/", name); }
  std::string log() const { return slurp(dir_ / "stack.log"); }
  int pidOf(const std::string& name) const { return readPid(local(strCat("run/", name, ".pid"))); }
  ChildProcess& process() { return *stack_; }
  int watchPort() const { return watch_port_; }
  const std::string& dir() const { return dir_.path(); }

  // Applies a deployment of the demo app with `replicas` instances in `region` and waits until
  // it converged (30 s at most); false (with what kranectl said) when it did not.
  bool deploy(const std::string& id, const std::string& region, int replicas) {
    const std::string path = strCat(dir(), "/", id, ".yaml");
    writeFile(path, strCat("kind: Deployment\nid: ", id, "\nregions: [", region,
                           "]\nspec:\n  workspaceId: ws-up\n  projectId: proj-up\n  appId: "
                           "app-up\n  environmentId: env-up\n  image: krane.dev/demo-app:v1\n  "
                           "port: 8080\n  replicas: ",
                           replicas, "\n  cpuMillicores: 100\n  memoryMib: 64\n"));
    auto applied = kranectl({"apply", "-f", path});
    if (applied.exit_code != 0) {
      UNSCOPED_INFO("kranectl apply: " << applied.out << applied.err);
      return false;
    }
    auto converged =
        kranectl({"status", "deployment", id, "--region", region, "--wait", "--timeout", "30"});
    if (converged.exit_code != 0)
      UNSCOPED_INFO("kranectl status: " << converged.out << converged.err);
    return converged.exit_code == 0;
  }

  testing::CommandResult kranectl(std::vector<std::string> args) {
    args.insert(args.begin(),
                {strCat(bin_, "/cli/kranectl"), "--server", strCat("127.0.0.1:", grpc_port_),
                 "--token-file", local("operator.token")});
    return runCommand(args, {}, 60s);
  }
  bool ctrlReady() {
    return runCommand({"/usr/bin/curl", "-fsS", "--max-time", "1",
                       strCat("http://127.0.0.1:", http_port_, "/readyz")})
               .exit_code == 0;
  }

 private:
  ShortTmpDir dir_;
  int grpc_port_;
  int http_port_;
  int watch_port_;
  std::string bin_;
  std::unique_ptr<ChildProcess> stack_;
};

TEST_CASE("krane-ctrl and an agent killed with SIGKILL are restarted, and SIGTERM stops it all",
          "[local-stack][slow]") {
  LocalStack stack;
  REQUIRE(eventually([&] { return fs::exists(stack.local("env")) || !stack.process().running(); },
                     60s));
  INFO(stack.log());
  REQUIRE(fs::exists(stack.local("env")));

  // Two real instances in local-1, to see that they outlive their agent's crash and are stopped
  // at the end.
  REQUIRE(stack.deploy("supervised", "local-1", 2));
  const std::set<int> before = processesOf(stack.dir());
  const int mariadb = readPid(stack.local("mariadb/mysqld.pid"));
  CHECK(alive(mariadb));

  // krane-ctrl: killed, reported with its signal, back within the first delay (1 s) and ready.
  const int ctrl = stack.pidOf("krane-ctrl");
  REQUIRE(alive(ctrl));
  REQUIRE(::kill(ctrl, SIGKILL) == 0);
  CHECK(eventually(
      [&] {
        const int now = stack.pidOf("krane-ctrl");
        return now != ctrl && alive(now) && stack.ctrlReady();
      },
      20s));
  CHECK_THAT(stack.log(), Catch::Contains(strCat("up: krane-ctrl (pid ", ctrl,
                                                 ") was killed by SIGKILL after ")) &&
                              Catch::Contains("s; restarting in 1s") &&
                              Catch::Contains("up: krane-ctrl restarted (pid "));
  CHECK(count(slurp(stack.local("logs/krane-ctrl.log")), "ctrl: serving") == 2u);

  // An agent: the same, and the restarted agent adopts its running instances.
  const int agent = stack.pidOf("agent-local-1");
  REQUIRE(alive(agent));
  REQUIRE(::kill(agent, SIGKILL) == 0);
  CHECK(eventually(
      [&] {
        const int now = stack.pidOf("agent-local-1");
        return now != agent && alive(now) &&
               count(slurp(stack.local("logs/agent-local-1.log")),
                     "agent: running region=local-1") == 2u;
      },
      20s));
  CHECK_THAT(stack.log(), Catch::Contains(strCat("up: agent local-1 (pid ", agent,
                                                 ") was killed by SIGKILL after ")) &&
                              Catch::Contains("up: agent local-1 restarted (pid "));
  auto again = stack.kranectl(
      {"status", "deployment", "supervised", "--region", "local-1", "--wait", "--timeout", "30"});
  INFO(again.out << again.err);
  CHECK(again.exit_code == 0);
  CHECK(stack.pidOf("agent-local-2") > 0);
  CHECK(alive(stack.pidOf("agent-local-2")));
  // local-2's agent watches on krane-ctrl's watch listener: after krane-ctrl's SIGKILL it is
  // back on the new one and applies what comes.
  CHECK(stack.deploy("watched", "local-2", 1));
  // It found the listener through heartbeats, and its stream is there again after the restart.
  const std::string log2 = slurp(stack.local("logs/agent-local-2.log"));
  CHECK_THAT(log2, Catch::Contains(strCat("watching at 127.0.0.1:", stack.watchPort())));
  REQUIRE(log2.rfind("agent: watching region=local-2") != std::string::npos);
  const std::string last_stream = log2.substr(log2.rfind("agent: watching region=local-2"));
  CHECK_THAT(last_stream.substr(0, last_stream.find('\n')),
             Catch::EndsWith(strCat(" at 127.0.0.1:", stack.watchPort())));
  CHECK_THAT(slurp(stack.local("agent-local-1.yaml")), Catch::Contains("watch_address: off"));

  // Instances of local-1 are the same processes as before the kill: adopted, not restarted.
  std::set<int> instances;
  for (const auto& entry : fs::recursive_directory_iterator(stack.local("agents/local-1"))) {
    if (entry.path().filename() != "instance.json") continue;
    static const std::regex pid_field(R"("pid":\s*(\d+))");
    std::smatch m;
    const std::string record = slurp(entry.path().string());
    if (std::regex_search(record, m, pid_field)) instances.insert(std::stoi(m[1]));
  }
  CHECK(instances.size() == 2u);
  for (int pid : instances) {
    INFO(pid);
    CHECK(alive(pid));
    CHECK(before.count(pid) == 1u);
  }

  // SIGTERM (what Ctrl-C leads to) stops everything: nothing of the stack is left.
  const std::set<int> running = processesOf(stack.dir());
  for (int pid : {mariadb, stack.pidOf("krane-ctrl"), stack.pidOf("agent-local-1"),
                  stack.pidOf("agent-local-2")}) {
    INFO(pid);
    CHECK(running.count(pid) == 1u);
  }
  CHECK(running.size() >= 4 + instances.size() + 4);  // and the agents' plugin hosts
  stack.process().signal(SIGTERM);
  CHECK(stack.process().wait() == 143);
  const std::string log = stack.log();
  INFO(log);
  CHECK_THAT(log, Catch::Contains("up: stopped; logs are in"));
  CHECK_FALSE(alive(mariadb));
  for (int pid : running) {
    INFO("pid " << pid << " " << slurp(strCat("/proc/", pid, "/cmdline")));
    CHECK_FALSE(alive(pid));
  }
  CHECK(processesOf(stack.dir()).empty());
  CHECK_FALSE(fs::exists(stack.local("env")));
}

}  // namespace
}  // namespace krane
