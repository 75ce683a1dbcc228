// Running Krane's own binaries from tests and checking what they print and return.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace krane::testing {

struct CommandResult {
  int exit_code = -1;  // -1 when killed by a signal (see signal)
  int signal = 0;
  std::string out;
  std::string err;
};

// Runs argv[0] with the given arguments and extra environment, waits at most `timeout` (then
// SIGKILL) and collects stdout and stderr. The child dies with the test (PR_SET_PDEATHSIG).
CommandResult runCommand(const std::vector<std::string>& argv,
                         const std::map<std::string, std::string>& env = {},
                         std::chrono::seconds timeout = std::chrono::seconds(60));

// A child process running in the background (for crash tests): killed with SIGKILL if still
// running when destroyed. Its output goes to `log_path` (or /dev/null when empty).
class ChildProcess {
 public:
  ChildProcess(const std::vector<std::string>& argv, const std::string& log_path = "",
               const std::map<std::string, std::string>& env = {});
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  int pid() const { return pid_; }
  bool running();
  void signal(int sig);
  // Waits for the exit; returns the exit code, or -signal when killed by one.
  int wait();

 private:
  int pid_ = -1;
  int status_ = 0;
  bool reaped_ = false;
};

// What became of `body` run in a forked copy of this process (a death test).
struct Death {
  bool died = false;  // killed by a signal or exited non-zero before `body` returned
  int signal = 0;
  int exit_code = 0;
  std::string err;  // everything the child wrote to stderr
};

// Runs `body` in a child made with fork(), its stderr captured, and reports how it ended. A body
// that returns counts as surviving (exit 0). The parent's state is untouched whatever the body
// does.
Death runInChild(const std::function<void()>& body);

// The whole file, or "" when it cannot be read (logs in failure messages).
std::string slurp(const std::string& path);

// Absolute path of a file in this test's runfiles, e.g. runfile("controlplane/krane-ctrl").
std::string runfile(std::string_view path_in_workspace);

}  // namespace krane::testing
