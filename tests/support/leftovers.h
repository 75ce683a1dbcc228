// Cleanup for tests that run the process runtime: its instances outlive the plugin (by design),
// so a test kills what is still running under its directory before removing it.
#pragma once

#include <signal.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

namespace krane::testing {

// Kills (SIGKILL, whole process group) every instance recorded in an instance.json under `dir`,
// removes `dir`, and returns how many were still running.
inline int killInstancesAndRemove(const std::string& dir) {
  namespace fs = std::filesystem;
  int killed = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec);
       it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (it->path().filename() != "instance.json") continue;
    std::ifstream in(it->path());
    const int64_t pid = nlohmann::json::parse(in, nullptr, false).value("pid", 0);
    if (pid > 0 && ::kill(static_cast<pid_t>(-pid), SIGKILL) == 0) ++killed;
  }
  fs::remove_all(dir, ec);
  return killed;
}

}  // namespace krane::testing
