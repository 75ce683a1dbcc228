#include "controlplane/feed/tailer.h"

#include "common/status.h"
#include "common/strings.h"
#include "controlplane/feed/change_reader.h"
#include "spdlog/spdlog.h"

namespace krane::feed {

Tailer::Tailer(std::shared_ptr<db::Pool> pool, std::shared_ptr<const ResourceTables> tables,
               std::shared_ptr<Hub> hub, TailerOptions options)
    : pool_(std::move(pool)), tables_(std::move(tables)), hub_(std::move(hub)), options_(options) {
  on_error_ = [](const absl::Status& status) {
    spdlog::warn("feed: tailer poll failed: {}", status.message());
  };
}

Tailer::~Tailer() { stop(); }

void Tailer::start() {
  std::lock_guard lock(mutex_);
  if (thread_.joinable()) return;
  stopping_ = false;
  thread_ = std::thread([this] { run(); });
}

void Tailer::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Tailer::notify() {
  {
    std::lock_guard lock(mutex_);
    notified_ = true;
  }
  wake_.notify_one();
}

TailerStats Tailer::stats() const {
  return TailerStats{polls_.load(), changes_read_.load(), errors_.load(), behind_.load()};
}

void Tailer::run() {
  uint64_t failing_polls = 0;
  std::chrono::steady_clock::time_point last_report;
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    notified_ = false;
    lock.unlock();
    absl::Status status = pollOnce();
    if (!status.ok()) {
      ++errors_;
      // A database outage fails every poll: say so at once, then every 10 s, not 20 times a second.
      const auto now = std::chrono::steady_clock::now();
      if (failing_polls == 0 || now - last_report > std::chrono::seconds(10)) {
        on_error_(status);
        last_report = now;
      }
      ++failing_polls;
    } else if (failing_polls > 0) {
      spdlog::info("feed: tailer recovered after {} failed polls", failing_polls);
      failing_polls = 0;
    }
    lock.lock();
    if (!notified_ && !stopping_) {
      wake_.wait_for(lock, options_.poll_interval, [&] { return notified_ || stopping_; });
    }
  }
}

absl::Status Tailer::pollOnce() {
  ++polls_;
  KRANE_ASSIGN_OR_RETURN(auto conn, pool_->acquire());
  std::vector<std::pair<std::string, uint64_t>> heads;
  KRANE_RETURN_IF_ERROR(conn->queryEach("SELECT region_id, version FROM region_versions", {},
                                        [&](const db::Row& row) {
                                          heads.emplace_back(row.str(0), row.u64(1));
                                          return absl::OkStatus();
                                        }));
  uint64_t behind = 0;
  for (const auto& [region, head] : heads) {
    uint64_t position = hub_->published(region);
    if (head <= position) continue;
    if (hub_->skipIfUnwatched(region, head)) continue;
    // Read in bounded batches; a busy region does not starve the others for long.
    auto batch = readChanges(*conn, *tables_, region, position, head, options_.batch_limit);
    if (absl::IsOutOfRange(batch.status())) {
      spdlog::warn("feed: region={} changes after version {} were pruned before they were streamed",
                   region, position);
      hub_->expireRegion(region, head, std::string(toStd(batch.status().message())));
      continue;
    }
    if (!batch.ok()) return batch.status();
    changes_read_ += batch->events.size();
    behind += head - batch->through;
    hub_->publish(std::make_shared<const EventBatch>(*std::move(batch)));
  }
  behind_ = behind;
  if (behind > 0) notify();  // more to read: go again without waiting
  return absl::OkStatus();
}

}  // namespace krane::feed
