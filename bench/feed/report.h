// The benchmark's results: named figures, the project's targets, a table for people and one
// JSON object for machines.
#pragma once

#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace krane::bench {

struct Figure {
  std::string name;
  double value = 0;
  std::string unit;
  std::string target;          // e.g. "<= 25 ms"; empty when the project sets none
  std::optional<bool> passed;  // set when there is a target

  // Sets the target (`shown`) and the result: passed when the value was measured (not
  // negative) and is at most `limit`.
  void atMost(double limit, std::string shown) {
    target = std::move(shown);
    passed = value >= 0 && value <= limit;
  }
};

// One row of the Krane-versus-baseline comparison.
struct StreamRow {
  size_t streams = 0;
  double krane_p50 = 0, krane_p99 = 0, krane_idle_qps = 0, krane_load_qps = 0;
  double base_p50 = 0, base_p99 = 0, base_idle_qps = 0, base_load_qps = 0;
  std::string krane_note, base_note;  // missing changes, skipped polls
};

class Report {
 public:
  Figure& add(std::string name, double value, std::string unit);
  Figure* find(const std::string& name);
  const std::vector<Figure>& figures() const { return figures_; }

  std::vector<StreamRow> rows;
  std::vector<std::string> header;  // what ran, on what
  std::vector<std::string> notes;   // how to read the figures

  void printTable(std::FILE* out) const;
  // {"figures": [{"name": ..., "value": ..., "unit": ...}, ...]}
  void printJson(std::FILE* out) const;

 private:
  std::vector<Figure> figures_;
};

}  // namespace krane::bench
