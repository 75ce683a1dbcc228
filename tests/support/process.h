// Running Krane's own binaries from tests and checking what they print and return.
#pragma once

#include <chrono>
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

// Absolute path of a file in this test's runfiles, e.g. runfile("controlplane/krane-ctrl").
std::string runfile(std::string_view path_in_workspace);

}  // namespace krane::testing
