// tools/supervise.sh, which keeps krane-ctrl and the agents of `./dev up` running, with small
// scripts that die: the restart delays, the log lines, and the stop (also during a delay, and of
// a process that ignores SIGTERM).
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <regex>
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
using testing::ChildProcess;
using testing::eventually;
using testing::runCommand;
using testing::runfile;
using testing::slurp;

// What the supervisor said about restarts: "0.1s", "0.2s", ... in order.
std::vector<std::string> restartDelays(const std::string& log) {
  std::vector<std::string> out;
  static const std::regex line(R"(up: \S+ \(pid \d+\) .* after \d+s; restarting in ([0-9.]+s))");
  for (std::sregex_iterator it(log.begin(), log.end(), line), end; it != end; ++it) {
    out.push_back((*it)[1]);
  }
  return out;
}

// run_supervised NAME LOG PIDFILE COMMAND... in a bash of its own (the supervisor's pid is the
// ChildProcess's), its standard error in `dir`/supervisor.log.
std::unique_ptr<ChildProcess> supervise(const ShortTmpDir& dir, const std::string& command,
                                        std::map<std::string, std::string> env) {
  env["DIR"] = dir.path();
  return std::make_unique<ChildProcess>(
      std::vector<std::string>{"/bin/bash", "-c", "source \"$0\"; run_supervised \"$@\"",
                               runfile("tools/supervise.sh"), "child", dir / "child.log",
                               dir / "child.pid", "/bin/sh", "-c", command},
      dir / "supervisor.log", env);
}

TEST_CASE(
    "a process that dies is restarted after doubling delays, back to the first once it "
    "stayed up",
    "[supervisor]") {
  ShortTmpDir dir;
  // Runs 1-4 and 6 fail at once, run 5 stays up 1.5 s (longer than the stable time) and fails,
  // run 7 keeps running.
  const std::string script = R"(
    n=$(cat "$DIR/count" 2>/dev/null || echo 0); n=$((n + 1)); echo $n > "$DIR/count"
    echo "run $n"
    case $n in 5) sleep 1.5; exit 4 ;; 7) exec sleep 1000 ;; esac
    exit 3)";
  auto supervisor = supervise(dir, script,
                              {{"KRANE_UP_BACKOFF_MS", "100"},
                               {"KRANE_UP_BACKOFF_MAX_MS", "400"},
                               {"KRANE_UP_STABLE_S", "1"}});
  REQUIRE(eventually([&] { return slurp(dir / "count") == "7\n"; }, 20s));
  REQUIRE(eventually([&] { return alive(readPid(dir / "child.pid")); }, 5s));
  const int child = readPid(dir / "child.pid");
  REQUIRE(
      eventually([&] { return count(slurp(dir / "supervisor.log"), "restarted (pid") == 6u; }, 5s));
  const std::string log = slurp(dir / "supervisor.log");
  INFO(log);
  CHECK(restartDelays(log) ==
        std::vector<std::string>{"0.1s", "0.2s", "0.4s", "0.4s", "0.1s", "0.2s"});
  CHECK_THAT(log, Catch::Contains("up: child (pid ") &&
                      Catch::Contains(") exited with status 3 after 0s; restarting in 0.1s"));
  CHECK(std::regex_search(log,
                          std::regex(R"(exited with status 4 after [12]s; restarting in 0.1s)")));
  CHECK_THAT(log, Catch::Contains(strCat("up: child restarted (pid ", child, ", restart 6)")));
  // The command's own log has its output and the same lines, timed.
  const std::string child_log = slurp(dir / "child.log");
  CHECK_THAT(child_log, Catch::Contains("run 7"));
  CHECK(restartDelays(child_log) == restartDelays(log));

  supervisor->signal(SIGTERM);
  const auto asked = std::chrono::steady_clock::now();
  CHECK(supervisor->wait() == 0);
  CHECK(std::chrono::steady_clock::now() - asked < 3s);
  CHECK_FALSE(alive(child));
  CHECK_FALSE(fs::exists(dir / "child.pid"));
}

TEST_CASE("a kill is named by its signal, and a stop during the delay is immediate",
          "[supervisor]") {
  ShortTmpDir dir;
  auto supervisor = supervise(dir, R"(echo started >> "$DIR/runs"; exec sleep 1000)",
                              {{"KRANE_UP_BACKOFF_MS", "5000"}});
  REQUIRE(eventually([&] { return slurp(dir / "runs") == "started\n"; }, 5s));
  const int child = readPid(dir / "child.pid");
  REQUIRE(alive(child));
  REQUIRE(::kill(child, SIGKILL) == 0);
  REQUIRE(eventually(
      [&] {
        return slurp(dir / "supervisor.log")
                   .find(strCat("up: child (pid ", child,
                                ") was killed by SIGKILL after 0s; restarting in 5s")) !=
               std::string::npos;
      },
      5s));
  supervisor->signal(SIGTERM);
  const auto asked = std::chrono::steady_clock::now();
  CHECK(supervisor->wait() == 0);
  CHECK(std::chrono::steady_clock::now() - asked < 2s);
  CHECK(slurp(dir / "runs") == "started\n");  // not started again
}

TEST_CASE("a process that ignores SIGTERM is killed after the grace period", "[supervisor]") {
  ShortTmpDir dir;
  auto supervisor = supervise(dir, R"(trap '' TERM; echo ignoring > "$DIR/ready"; exec sleep 1000)",
                              {{"KRANE_UP_STOP_GRACE_S", "1"}});
  REQUIRE(eventually([&] { return slurp(dir / "ready") == "ignoring\n"; }, 5s));
  const int child = readPid(dir / "child.pid");
  REQUIRE(alive(child));
  supervisor->signal(SIGTERM);
  const auto asked = std::chrono::steady_clock::now();
  CHECK(supervisor->wait() == 0);
  const auto took = std::chrono::steady_clock::now() - asked;
  CHECK(took >= 900ms);
  CHECK(took < 4s);
  CHECK_FALSE(alive(child));
  CHECK_THAT(
      slurp(dir / "supervisor.log"),
      Catch::Contains(strCat("up: child (pid ", child, ") did not stop within 1s; killing it")));
}

}  // namespace
}  // namespace krane
