#include "bench/feed/baseline.h"

#include <cstdio>

#include "common/strings.h"
#include "controlplane/db/connection.h"

namespace krane::bench {
namespace {

constexpr const char* kChangesSql =
    "SELECT version, resource_type, resource_id FROM resource_changes"
    " WHERE region_id = ? AND version > ? ORDER BY version LIMIT 100";
constexpr const char* kLookupSql =
    "SELECT type, id, region_id, workspace_id, spec, content_type, version, deleted_at"
    " FROM resources WHERE type = ? AND id = ? AND region_id = ?";

}  // namespace

BaselinePollers::BaselinePollers(const db::Dsn& dsn, std::string region, size_t pollers,
                                 uint64_t start_version, size_t connections,
                                 std::chrono::milliseconds interval)
    : dsn_(dsn), region_(std::move(region)), interval_(interval), pollers_(pollers) {
  // Spread the first polls evenly over one interval, as agents started at random times would be.
  const auto start = Clock::now();
  for (size_t i = 0; i < pollers; ++i) {
    pollers_[i].cursor = start_version;
    schedule_.push(Due{start + interval_ * i / std::max<size_t>(pollers, 1), i});
  }
  for (size_t i = 0; i < connections; ++i) workers_.emplace_back([this] { work(); });
}

BaselinePollers::~BaselinePollers() { stop(); }

void BaselinePollers::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (auto& w : workers_) w.join();
  workers_.clear();
}

double BaselinePollers::takeMaxLateMs() {
  return static_cast<double>(max_late_ns_.exchange(0)) / 1e6;
}

std::vector<std::vector<Sample>> BaselinePollers::takeSamples() {
  std::vector<std::vector<Sample>> out;
  out.reserve(pollers_.size());
  for (auto& p : pollers_) out.push_back(std::exchange(p.samples, {}));
  return out;
}

void BaselinePollers::work() {
  auto opened = db::Connection::open(dsn_);
  if (!opened.ok()) {
    std::fprintf(stderr, "bench: baseline poller cannot connect: %s\n",
                 std::string(toStd(opened.status().message())).c_str());
    ++errors_;
    return;
  }
  db::Connection& conn = **opened;
  std::unique_lock lock(mutex_);
  for (;;) {
    // Wait for the earliest poller to be due.
    while (!stopping_) {
      if (schedule_.empty()) {
        wake_.wait(lock);
      } else if (schedule_.top().at > Clock::now()) {
        wake_.wait_until(lock, schedule_.top().at);
      } else {
        break;
      }
    }
    if (stopping_) return;
    const Due due = schedule_.top();
    schedule_.pop();
    lock.unlock();

    const auto started = Clock::now();
    const int64_t late =
        std::chrono::duration_cast<std::chrono::nanoseconds>(started - due.at).count();
    int64_t seen = max_late_ns_.load();
    while (late > seen && !max_late_ns_.compare_exchange_weak(seen, late)) {
    }
    // The poller is out of the schedule while it runs: only this thread touches it.
    Poller& poller = pollers_[due.poller];
    ++polls_;
    struct Change {
      uint64_t version;
      std::string type;
      std::string id;
    };
    std::vector<Change> changes;
    auto st = conn.queryEach(kChangesSql, {region_, poller.cursor}, [&](const db::Row& row) {
      changes.push_back(Change{row.u64(0), row.str(1), row.str(2)});
      return absl::OkStatus();
    });
    if (!st.ok()) {
      if (errors_++ < 5)
        std::fprintf(stderr, "bench: baseline poll failed: %s\n",
                     std::string(toStd(st.message())).c_str());
    }
    for (const auto& change : changes) {
      ++lookups_;
      auto rows = conn.query(kLookupSql, {change.type, change.id, region_});
      if (!rows.ok()) {
        if (errors_++ < 5) {
          std::fprintf(stderr, "bench: baseline lookup failed: %s\n",
                       std::string(toStd(rows.status().message())).c_str());
        }
        break;
      }
      const int64_t seen_ns = nowNs();
      if (recording_.load(std::memory_order_relaxed) && !rows->empty()) {
        const auto& row = rows->rows[0];
        Sample sample{change.version, seen_ns, -1};
        if (row.u64(6) == change.version) sample.send_ns = parseSendNs(row.str(4));
        poller.samples.push_back(sample);
      }
      poller.cursor = change.version;
    }

    lock.lock();
    auto next = due.at + interval_;
    const auto now = Clock::now();
    if (next + interval_ < now) {
      skipped_ += static_cast<uint64_t>((now - next) / interval_);
      next = now;
    }
    schedule_.push(Due{next, due.poller});
    wake_.notify_one();
  }
}

}  // namespace krane::bench
