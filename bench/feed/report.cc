#include "bench/feed/report.h"

#include <cmath>

#include <nlohmann/json.hpp>

#include "common/strings.h"

namespace krane::bench {
namespace {

std::string number(double v) {
  if (std::fabs(v) >= 1000) return fmt::format("{:.0f}", v);
  if (std::fabs(v) >= 100) return fmt::format("{:.1f}", v);
  return fmt::format("{:.2f}", v);
}

}  // namespace

Figure& Report::add(std::string name, double value, std::string unit) {
  figures_.push_back(Figure{std::move(name), value, std::move(unit), "", std::nullopt});
  return figures_.back();
}

Figure* Report::find(const std::string& name) {
  for (auto& f : figures_) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

void Report::printTable(std::FILE* out) const {
  for (const auto& line : header) fmt::print(out, "{}\n", line);
  if (!rows.empty()) {
    fmt::print(out, "\nWatch streams (Krane) vs. polling once a second (baseline)\n");
    fmt::print(out, "{:>8} | {:>9} {:>9} {:>12} {:>12} | {:>9} {:>9} {:>12} {:>12}\n", "", "Krane",
               "", "", "", "baseline", "", "", "");
    fmt::print(out, "{:>8} | {:>9} {:>9} {:>12} {:>12} | {:>9} {:>9} {:>12} {:>12}\n", "streams",
               "p50 ms", "p99 ms", "db q/s idle", "db q/s load", "p50 ms", "p99 ms", "db q/s idle",
               "db q/s load");
    fmt::print(out, "{:->8}-+-{:->9}-{:->9}-{:->12}-{:->12}-+-{:->9}-{:->9}-{:->12}-{:->12}\n", "",
               "", "", "", "", "", "", "", "");
    for (const auto& r : rows) {
      fmt::print(out, "{:>8} | {:>9} {:>9} {:>12} {:>12} | {:>9} {:>9} {:>12} {:>12}\n", r.streams,
                 number(r.krane_p50), number(r.krane_p99), number(r.krane_idle_qps),
                 number(r.krane_load_qps), number(r.base_p50), number(r.base_p99),
                 number(r.base_idle_qps), number(r.base_load_qps));
    }
    for (const auto& r : rows) {
      if (!r.krane_note.empty())
        fmt::print(out, "  Krane, {} streams: {}\n", r.streams, r.krane_note);
      if (!r.base_note.empty())
        fmt::print(out, "  baseline, {} streams: {}\n", r.streams, r.base_note);
    }
  }
  fmt::print(out, "\n{:<40} {:>10} {:<5} {:<34} {}\n", "figure", "value", "unit", "target",
             "result");
  fmt::print(out, "{:-<40} {:->10} {:-<5} {:-<34} {:-<6}\n", "", "", "", "", "");
  for (const auto& f : figures_) {
    const std::string result = !f.passed ? "" : (*f.passed ? "PASS" : "FAIL");
    fmt::print(out, "{:<40} {:>10} {:<5} {:<34} {}\n", f.name, number(f.value), f.unit, f.target,
               result);
  }
  if (!notes.empty()) {
    fmt::print(out, "\nNotes\n");
    for (const auto& n : notes) fmt::print(out, "- {}\n", n);
  }
  std::fflush(out);
}

void Report::printJson(std::FILE* out) const {
  nlohmann::ordered_json figures = nlohmann::ordered_json::array();
  for (const auto& f : figures_) {
    nlohmann::ordered_json item;
    item["name"] = f.name;
    item["value"] = std::round(f.value * 1000.0) / 1000.0;
    item["unit"] = f.unit;
    figures.push_back(std::move(item));
  }
  nlohmann::ordered_json root;
  root["figures"] = std::move(figures);
  fmt::print(out, "{}\n", root.dump());
  std::fflush(out);
}

}  // namespace krane::bench
