// The output every benchmark prints: a readable table (stdout, or stderr with --json) and, with
// --json, one JSON object {"figures": [{"name", "value", "unit"}]} on stdout.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace krane::bench {

struct Figure {
  std::string name;
  double value = 0;
  std::string unit;
  std::string target = {};  // shown as "target <target> PASS|FAIL" when set
  bool passed = true;
};

// `figures` go to the table and the JSON; `extra` to the table only.
void report(bool json, const std::string& title, const std::vector<Figure>& figures,
            const std::vector<Figure>& extra = {}, const std::string& notes = "");

// The command line every benchmark takes: --json, --quick, --help. Runs `run(json, quick)`;
// prints `usage` for --help (exit 0) or an unknown argument (exit 2).
int benchMain(int argc, char** argv, const char* usage, int (*run)(bool json, bool quick));

// Sends the process's logs to stderr, so that stdout carries only the table or the JSON.
void logsToStderr();

double median(std::vector<double> values);
// The p-th percentile (0-100), nearest rank.
double percentile(std::vector<double> values, double p);

// A benchmark stops at the first error: it prints what failed and exits 1 at once (threads it
// started may still run, so no static destructors run).
inline void check(const absl::Status& s, const char* what) {
  if (s.ok()) return;
  std::fprintf(stderr, "%s: %s\n", what,
               std::string(s.message().data(), s.message().size()).c_str());
  std::fflush(stderr);
  std::_Exit(1);
}
template <typename T>
T check(absl::StatusOr<T> v, const char* what) {
  check(v.status(), what);
  return *std::move(v);
}

}  // namespace krane::bench
