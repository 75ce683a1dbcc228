#include "bench/support/figures.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "spdlog/sinks/stdout_sinks.h"
#include "spdlog/spdlog.h"

namespace krane::bench {

void report(bool json, const std::string& title, const std::vector<Figure>& figures,
            const std::vector<Figure>& extra, const std::string& notes) {
  std::FILE* table = json ? stderr : stdout;
  std::fprintf(table, "\n%s\n", title.c_str());
  auto print = [&](const Figure& f) {
    const std::string target =
        f.target.empty() ? "" : fmt::format("target {}  {}", f.target, f.passed ? "PASS" : "FAIL");
    std::fprintf(table, "  %-38s %12.3f %-8s %s\n", f.name.c_str(), f.value, f.unit.c_str(),
                 target.c_str());
  };
  for (const auto& f : figures) print(f);
  for (const auto& f : extra) print(f);
  if (!notes.empty()) std::fprintf(table, "\n%s\n", notes.c_str());
  if (!json) return;
  std::string out = "{\"figures\": [";
  for (size_t i = 0; i < figures.size(); ++i) {
    out += fmt::format(R"({}{{"name": "{}", "value": {:.4f}, "unit": "{}"}})", i ? ", " : "",
                       figures[i].name, figures[i].value, figures[i].unit);
  }
  out += "]}\n";
  std::fputs(out.c_str(), stdout);
  std::fflush(stdout);
}

int benchMain(int argc, char** argv, const char* usage, int (*run)(bool json, bool quick)) {
  bool json = false, quick = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--json") {
      json = true;
    } else if (arg == "--quick") {
      quick = true;
    } else if (arg == "--help" || arg == "-h") {
      std::fputs(usage, stdout);
      return 0;
    } else {
      std::fprintf(stderr, "unknown argument '%s'\n%s", arg.c_str(), usage);
      return 2;
    }
  }
  return run(json, quick);
}

void logsToStderr() { spdlog::set_default_logger(spdlog::stderr_logger_mt("bench")); }

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2.0;
}

double percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double rank = std::ceil(p / 100.0 * static_cast<double>(values.size()));
  const size_t i = static_cast<size_t>(std::max(1.0, rank)) - 1;
  return values[std::min(i, values.size() - 1)];
}

}  // namespace krane::bench
