#include "bench/feed/measure.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <unordered_map>

#include "common/strings.h"

namespace krane::bench {

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

cluster::v1::Resource timedResource(const std::string& region, const std::string& id, int64_t send_ns) {
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

WriteLoad::WriteLoad(PutFn put, std::string region, double rate, size_t distinct_ids)
    : put_(std::move(put)), region_(std::move(region)), rate_(rate), distinct_ids_(distinct_ids) {}

WriteLoad::~WriteLoad() { stop(); }

void WriteLoad::start() {
  stopping_ = false;
  thread_ = std::thread([this] { run(); });
}

void WriteLoad::stop() {
  stopping_ = true;
  if (thread_.joinable()) thread_.join();
}

void WriteLoad::run() {
  const auto period = std::chrono::nanoseconds(static_cast<int64_t>(1e9 / rate_));
  auto next = std::chrono::steady_clock::now();
  for (uint64_t i = 0; !stopping_; ++i) {
    std::this_thread::sleep_until(next);
    next += period;
    // A put that took longer than a period makes the next one go at once, but the load never
    // bursts to make up for more than one missed slot.
    const auto now = std::chrono::steady_clock::now();
    if (next < now - period) next = now;
    const int64_t send_ns = nowNs();
    char id[32];
    std::snprintf(id, sizeof(id), "lat-%04zu", static_cast<size_t>(i % distinct_ids_));
    auto version = put_(timedResource(region_, id, send_ns));
    const double ms = static_cast<double>(nowNs() - send_ns) / 1e6;
    if (!version.ok()) {
      if (errors_++ < 5) std::fprintf(stderr, "bench: put failed: %s\n", std::string(toStd(version.status().message())).c_str());
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

double quantile(std::vector<double>& values, double q) {
  if (values.empty()) return 0;
  const size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(values.size())));
  const size_t index = std::min(values.size() - 1, rank == 0 ? 0 : rank - 1);
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(index), values.end());
  return values[index];
}

LatencySummary summarizeLatency(const std::vector<std::vector<Sample>>& per_receiver, const std::vector<Sent>& sent,
                                int64_t from_ns, int64_t to_ns) {
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

QueryCounter::QueryCounter(std::unique_ptr<db::Connection> admin) : admin_(std::move(admin)) {}

uint64_t QueryCounter::read() {
  auto rows = admin_->query("SHOW GLOBAL STATUS LIKE 'Questions'");
  if (!rows.ok()) throw std::runtime_error(strCat("SHOW GLOBAL STATUS: ", rows.status().message()));
  if (rows->empty()) throw std::runtime_error("SHOW GLOBAL STATUS LIKE 'Questions' returned nothing");
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
