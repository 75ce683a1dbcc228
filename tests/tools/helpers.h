// Small helpers of the tests of tools/: short temporary directories, pid files, processes.
#pragma once

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <catch2/catch.hpp>

#include "common/strings.h"
#include "tests/support/process.h"

namespace krane::stack_test {

using testing::slurp;

// A directory with a short path (Unix socket paths are limited to 108 bytes, TEST_TMPDIR is
// longer), removed afterwards unless KRANE_TEST_KEEP is set.
class ShortTmpDir {
 public:
  ShortTmpDir() {
    char pattern[] = "/tmp/krane-up-XXXXXX";
    REQUIRE(::mkdtemp(pattern) != nullptr);
    path_ = pattern;
  }
  ~ShortTmpDir() {
    if (std::getenv("KRANE_TEST_KEEP") == nullptr) {
      std::error_code ec;
      std::filesystem::remove_all(path_, ec);
    }
  }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return strCat(path_, "/", name); }

 private:
  std::string path_;
};

inline void writeFile(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

inline int readPid(const std::string& path) {
  std::ifstream in(path);
  int pid = 0;
  in >> pid;
  return pid;
}

// Running, not a zombie waiting to be reaped.
inline bool alive(int pid) {
  if (pid <= 0 || ::kill(pid, 0) != 0) return false;
  const std::string stat = slurp(strCat("/proc/", pid, "/stat"));
  const auto paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] != 'Z';
}

inline size_t count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (auto at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

}  // namespace krane::stack_test
