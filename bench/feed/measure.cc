#include "bench/feed/measure.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <unordered_map>

#include "common/strings.h"

namespace krane::bench {

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

cluster::v1::Resource timedResource(const std::string& region, const std::string& id,
                                    int64_t send_ns) {
  cluster::v1::Resource r;
  r.set_type(kBenchType);
  r.set_id(id);
  r.set_region(region);
  auto* g = r.mutable_generic();
  g->set_spec(strCat(send_ns));
  g->set_content_type("text/plain");
  return r;
}

int64_t parseSendNs(const std::string& spec) {
  int64_t value = -1;
  const auto [end, ec] = std::from_chars(spec.data(), spec.data() + spec.size(), value);
  if (ec != std::errc() || end != spec.data() + spec.size()) return -1;
  return value;
}

WriteLoad::WriteLoad(PutFn put, std::string region, double rate, size_t senders,
                     size_t distinct_ids)
    : put_(std::move(put)),
      region_(std::move(region)),
      period_(static_cast<int64_t>(1e9 / rate)),
      senders_(senders),
      distinct_ids_(distinct_ids) {}

WriteLoad::~WriteLoad() { stop(); }

void WriteLoad::start() {
  stopping_ = false;
  start_ = std::chrono::steady_clock::now();
  for (size_t i = 0; i < senders_; ++i) threads_.emplace_back([this] { run(); });
}

void WriteLoad::stop() {
  stopping_ = true;
  for (auto& t : threads_) t.join();
  threads_.clear();
}

void WriteLoad::run() {
  while (!stopping_) {
    const uint64_t slot = next_slot_++;
    const std::chrono::steady_clock::time_point due = start_ + period_ * static_cast<int64_t>(slot);
    // Sleep in short steps so that stop() does not wait for a far slot.
    while (!stopping_ && std::chrono::steady_clock::now() < due) {
      const std::chrono::steady_clock::time_point step =
          std::chrono::steady_clock::now() + std::chrono::milliseconds(50);
      std::this_thread::sleep_until(due < step ? due : step);
    }
    if (stopping_) return;
    if (std::chrono::steady_clock::now() - due > std::chrono::seconds(1)) {
      ++skipped_;
      continue;
    }
    const int64_t send_ns = nowNs();
    char id[32];
    std::snprintf(id, sizeof(id), "lat-%04zu", static_cast<size_t>(slot % distinct_ids_));
    auto version = put_(timedResource(region_, id, send_ns));
    const double ms = static_cast<double>(nowNs() - send_ns) / 1e6;
    if (!version.ok()) {
      if (errors_++ < 5) {
        std::fprintf(stderr, "bench: put failed: %s\n",
                     std::string(toStd(version.status().message())).c_str());
      }
      continue;
    }
    std::lock_guard lock(mutex_);
    sent_.push_back(Sent{*version, send_ns});
    put_ms_.push_back(ms);
  }
}

std::vector<Sent> WriteLoad::sent() const {
  std::lock_guard lock(mutex_);
  return sent_;
}

std::vector<double> WriteLoad::putMillis() const {
  std::lock_guard lock(mutex_);
  return put_ms_;
}

double processCpuSeconds(int pid, bool system_only) {
  std::FILE* f = std::fopen(strCat("/proc/", pid, "/stat").c_str(), "r");
  if (f == nullptr) return -1;
  char buf[2048] = {0};
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  // Fields after the command name (which may hold spaces) start after the last ')'.
  const char* p = std::strrchr(buf, ')');
  if (n == 0 || p == nullptr) return -1;
  unsigned long long utime = 0, stime = 0;
  // state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime
  if (std::sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &utime, &stime) !=
      2)
    return -1;
  return static_cast<double>(system_only ? stime : utime + stime) /
         static_cast<double>(::sysconf(_SC_CLK_TCK));
}

MachineCpu machineCpu() {
  MachineCpu out;
  std::FILE* f = std::fopen("/proc/stat", "r");
  if (f == nullptr) return out;
  unsigned long long v[8] = {0};
  const int got = std::fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2],
                              &v[3], &v[4], &v[5], &v[6], &v[7]);
  std::fclose(f);
  if (got < 4) return out;
  const double tick = static_cast<double>(::sysconf(_SC_CLK_TCK));
  unsigned long long total = 0;
  for (auto x : v) total += x;
  const unsigned long long idle = v[3] + v[4];  // idle + iowait
  out.total = static_cast<double>(total) / tick;
  out.busy = static_cast<double>(total - idle) / tick;
  return out;
}

double quantile(std::vector<double>& values, double q) {
  if (values.empty()) return 0;
  const size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(values.size())));
  const size_t index = std::min(values.size() - 1, rank == 0 ? 0 : rank - 1);
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(index),
                   values.end());
  return values[index];
}

LatencySummary summarizeLatency(const std::vector<std::vector<Sample>>& per_receiver,
                                const std::vector<Sent>& sent, int64_t from_ns, int64_t to_ns) {
  std::unordered_map<uint64_t, int64_t> in_window;  // version -> send time
  for (const auto& s : sent) {
    if (s.send_ns >= from_ns && s.send_ns < to_ns) in_window[s.version] = s.send_ns;
  }
  LatencySummary out;
  out.receivers = per_receiver.size();
  out.changes = in_window.size();
  std::vector<double> ms;
  for (const auto& samples : per_receiver) {
    for (const auto& sample : samples) {
      auto it = in_window.find(sample.version);
      if (it == in_window.end()) continue;
      const int64_t send = sample.send_ns >= 0 ? sample.send_ns : it->second;
      ms.push_back(static_cast<double>(sample.receive_ns - send) / 1e6);
    }
  }
  out.samples = ms.size();
  const size_t expected = out.receivers * out.changes;
  out.missing = expected > out.samples ? expected - out.samples : 0;
  if (!ms.empty()) {
    out.max_ms = *std::max_element(ms.begin(), ms.end());
    out.p99_ms = quantile(ms, 0.99);
    out.p50_ms = quantile(ms, 0.50);
  }
  return out;
}

FanOutSummary summarizeFanOut(const std::vector<std::vector<Sample>>& per_receiver,
                              const std::vector<Sent>& sent, int64_t from_ns, int64_t to_ns) {
  struct Seen {
    int64_t send_ns;
    int64_t first_ns = INT64_MAX;
    int64_t last_ns = INT64_MIN;
  };
  std::unordered_map<uint64_t, Seen> changes;
  for (const auto& s : sent) {
    if (s.send_ns >= from_ns && s.send_ns < to_ns) changes.emplace(s.version, Seen{s.send_ns});
  }
  for (const auto& samples : per_receiver) {
    for (const auto& sample : samples) {
      auto it = changes.find(sample.version);
      if (it == changes.end()) continue;
      it->second.first_ns = std::min(it->second.first_ns, sample.receive_ns);
      it->second.last_ns = std::max(it->second.last_ns, sample.receive_ns);
    }
  }
  std::vector<double> spread;
  std::vector<double> first;
  for (const auto& [version, seen] : changes) {
    if (seen.first_ns == INT64_MAX) continue;
    spread.push_back(static_cast<double>(seen.last_ns - seen.first_ns) / 1e6);
    first.push_back(static_cast<double>(seen.first_ns - seen.send_ns) / 1e6);
  }
  FanOutSummary out;
  out.spread_p50_ms = quantile(spread, 0.5);
  out.spread_p99_ms = quantile(spread, 0.99);
  out.first_p50_ms = quantile(first, 0.5);
  out.first_p99_ms = quantile(first, 0.99);
  return out;
}

QueryCounter::QueryCounter(std::unique_ptr<db::Connection> admin) : admin_(std::move(admin)) {}

uint64_t QueryCounter::read() {
  auto rows = admin_->query("SHOW GLOBAL STATUS LIKE 'Questions'");
  if (!rows.ok()) throw std::runtime_error(strCat("SHOW GLOBAL STATUS: ", rows.status().message()));
  if (rows->empty())
    throw std::runtime_error("SHOW GLOBAL STATUS LIKE 'Questions' returned nothing");
  return std::strtoull(rows->rows[0].str(1).c_str(), nullptr, 10);
}

void QueryCounter::calibrate() {
  // Nothing else talks to the server yet: consecutive reads differ by what a read costs.
  read();
  const uint64_t a = read();
  const uint64_t b = read();
  const uint64_t c = read();
  self_cost_ = std::min(b - a, c - b);
}

double QueryCounter::rate(std::chrono::milliseconds window) {
  const uint64_t before = read();
  const int64_t start = nowNs();
  std::this_thread::sleep_for(window);
  const uint64_t after = read();
  const int64_t end = nowNs();
  const uint64_t delta = after - before;
  const uint64_t others = delta > self_cost_ ? delta - self_cost_ : 0;
  return static_cast<double>(others) / (static_cast<double>(end - start) / 1e9);
}

}  // namespace krane::bench
