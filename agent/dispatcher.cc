#include "agent/dispatcher.h"

#include "common/strings.h"
#include "spdlog/spdlog.h"

namespace krane::agent {

// One plugin's share: a queue per resource, so that one resource's changes stay in order while
// the workers take different resources in parallel.
struct Dispatcher::Lane {
  std::shared_ptr<PluginEndpoint> plugin;
  std::map<std::string, std::deque<Work>> queues;  // by "type/id"
  std::deque<std::string> ready;                   // resources with work and no worker on them
  std::set<std::string> busy;                      // resources a worker is applying now
  size_t queued = 0;
  std::condition_variable has_work;
  std::condition_variable has_room;
  std::vector<std::thread> workers;
};

Dispatcher::Dispatcher(std::vector<std::shared_ptr<PluginEndpoint>> plugins, ResourceLedger& ledger,
                       WatermarkTracker& watermark, FailureReporter report,
                       DispatcherOptions options)
    : ledger_(ledger), watermark_(watermark), report_(std::move(report)), options_(options) {
  for (auto& plugin : plugins) {
    auto lane = std::make_unique<Lane>();
    lane->plugin = plugin;
    for (const auto& type : plugin->resourceTypes()) by_type_[type] = lane.get();
    lanes_.push_back(std::move(lane));
  }
  for (auto& lane : lanes_) {
    for (size_t i = 0; i < std::max<size_t>(1, options_.workers_per_plugin); ++i) {
      lane->workers.emplace_back([this, l = lane.get()] { work(*l); });
    }
  }
}

Dispatcher::~Dispatcher() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  for (auto& lane : lanes_) {
    lane->has_work.notify_all();
    lane->has_room.notify_all();
  }
  for (auto& lane : lanes_) {
    for (auto& t : lane->workers) t.join();
  }
}

void Dispatcher::syncBegin(uint64_t snapshot_version) {
  watermark_.syncBegin();
  {
    std::lock_guard lock(mutex_);
    sync_ids_.clear();
  }
  for (auto& lane : lanes_) {
    if (auto st = lane->plugin->syncBegin(snapshot_version); !st.ok()) {
      spdlog::warn("agent: plugin={} sync begin failed: {}", lane->plugin->name(), st.message());
    }
  }
}

void Dispatcher::change(const cluster::v1::Change& change, bool in_sync) {
  const auto& resource = change.resource();
  if (in_sync) {
    watermark_.syncReceived();
    std::lock_guard lock(mutex_);
    sync_ids_[resource.type()].insert(resource.id());
  } else {
    watermark_.received(change.version());
  }
  Work work{change, in_sync};
  auto it = by_type_.find(resource.type());
  if (it == by_type_.end()) {
    const absl::Status error = absl::FailedPreconditionError(
        strCat("no loaded plugin owns resource type \"", resource.type(), "\""));
    spdlog::error("agent: type={} id={} version={}: {}", resource.type(), resource.id(),
                  change.version(), error.message());
    ledger_.park(resource.type(), resource.id(), change.version(), 0,
                 std::string(toStd(error.message())));
    report_(change, error, 0);
    {
      std::lock_guard lock(mutex_);
      ++stats_.unowned;
    }
    finish(work);
    return;
  }
  Lane& lane = *it->second;
  const std::string key = strCat(resource.type(), "/", resource.id());
  std::unique_lock lock(mutex_);
  lane.has_room.wait(lock, [&] { return lane.queued < options_.max_queued || stopping_; });
  if (stopping_) return;
  auto& queue = lane.queues[key];
  const bool was_idle = queue.empty() && lane.busy.count(key) == 0;
  queue.push_back(std::move(work));
  ++lane.queued;
  ++in_flight_;
  if (was_idle) {
    lane.ready.push_back(key);
    lane.has_work.notify_one();
  }
}

void Dispatcher::syncEnd(uint64_t version) {
  // Garbage collection only once every synced resource is applied: otherwise a plugin could
  // delete an object a queued apply is about to recreate.
  drain();
  std::map<std::string, std::set<std::string>> ids;
  {
    std::lock_guard lock(mutex_);
    ids.swap(sync_ids_);
  }
  for (auto& lane : lanes_) {
    std::map<std::string, std::set<std::string>> mine;
    for (const auto& type : lane->plugin->resourceTypes()) mine[type] = ids[type];
    if (auto st = lane->plugin->syncEnd(version, mine); !st.ok()) {
      spdlog::warn("agent: plugin={} garbage collection after sync failed: {}",
                   lane->plugin->name(), st.message());
    }
  }
  ledger_.retainOnly(ids);
  watermark_.syncEnd(version);
  if (options_.on_sync_end) options_.on_sync_end(version);
}

void Dispatcher::bookmark(uint64_t version) { watermark_.bookmark(version); }

void Dispatcher::work(Lane& lane) {
  for (;;) {
    std::string key;
    Work item;
    {
      std::unique_lock lock(mutex_);
      lane.has_work.wait(lock, [&] { return stopping_ || !lane.ready.empty(); });
      if (stopping_) return;
      key = lane.ready.front();
      lane.ready.pop_front();
      auto& queue = lane.queues[key];
      item = std::move(queue.front());
      queue.pop_front();
      lane.busy.insert(key);
    }
    applyOne(lane, item);
    {
      std::lock_guard lock(mutex_);
      lane.busy.erase(key);
      --lane.queued;
      auto it = lane.queues.find(key);
      if (!it->second.empty()) {
        lane.ready.push_back(key);
        lane.has_work.notify_one();
      } else {
        lane.queues.erase(it);
      }
      lane.has_room.notify_one();
    }
    finish(item);
    {
      std::lock_guard lock(mutex_);
      --in_flight_;
      if (in_flight_ == 0) idle_.notify_all();
    }
  }
}

void Dispatcher::applyOne(Lane& lane, const Work& work) {
  const auto& c = work.change;
  const auto& r = c.resource();
  // Ordering by resource state: an APPLY carries the resource's own version; a DELETE is
  // ordered by the change's version.
  const uint64_t version =
      c.op() == cluster::v1::CHANGE_OP_APPLY ? std::max(r.version(), c.version()) : c.version();
  if (!work.in_sync && !ledger_.shouldApply(r.type(), r.id(), version)) {
    std::lock_guard lock(mutex_);
    ++stats_.skipped_stale;
    return;
  }
  Backoff backoff(options_.retry);
  absl::Status status;
  int attempt = 0;
  for (attempt = 1; attempt <= options_.max_attempts; ++attempt) {
    status = lane.plugin->handle(c);
    if (status.ok()) break;
    {
      std::lock_guard lock(mutex_);
      if (stopping_) return;
      ++stats_.retried;
    }
    spdlog::warn("agent: plugin={} type={} id={} version={} attempt={} failed: {}",
                 lane.plugin->name(), r.type(), r.id(), c.version(), attempt, status.message());
    if (attempt < options_.max_attempts) std::this_thread::sleep_for(backoff.next());
  }
  if (status.ok()) {
    if (c.op() == cluster::v1::CHANGE_OP_DELETE) {
      ledger_.forget(r.type(), r.id());
    } else if (work.in_sync) {
      ledger_.recordSynced(r.type(), r.id(), version);
    } else {
      ledger_.recordApplied(r.type(), r.id(), version);
    }
    ledger_.unpark(r.type(), r.id());
    std::lock_guard lock(mutex_);
    ++stats_.applied;
    return;
  }
  // Poison: park it, say so, and let everything else flow. The next full sync tries again.
  const int attempts = std::min(attempt, options_.max_attempts);
  ledger_.park(r.type(), r.id(), c.version(), attempts, std::string(toStd(status.message())));
  report_(c, status, attempts);
  spdlog::error("agent: parked type={} id={} version={} after {} attempts: {}", r.type(), r.id(),
                c.version(), attempts, status.message());
  std::lock_guard lock(mutex_);
  ++stats_.parked;
}

void Dispatcher::finish(const Work& work) {
  if (work.in_sync) {
    watermark_.syncAcknowledged();
  } else {
    watermark_.acknowledged(work.change.version());
  }
}

void Dispatcher::drain() {
  std::unique_lock lock(mutex_);
  idle_.wait(lock, [&] { return in_flight_ == 0 || stopping_; });
}

DispatcherStats Dispatcher::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

}  // namespace krane::agent
