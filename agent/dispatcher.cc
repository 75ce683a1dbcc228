#include "agent/dispatcher.h"

#include "absl/strings/cord.h"
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
  size_t idle = 0;  // workers waiting for work (notify only when someone listens)
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
    auto it = options_.workers_by_plugin.find(lane->plugin->name());
    const size_t workers =
        it != options_.workers_by_plugin.end() ? it->second : options_.workers_per_plugin;
    for (size_t i = 0; i < std::max<size_t>(1, workers); ++i) {
      lane->workers.emplace_back([this, l = lane.get()] { work(*l); });
    }
  }
}

Dispatcher::~Dispatcher() {
  stop(std::chrono::milliseconds(0));
  for (auto& lane : lanes_) {
    for (auto& t : lane->workers) t.join();
  }
}

void Dispatcher::stop(std::chrono::milliseconds grace, std::chrono::milliseconds calls_grace) {
  {
    std::unique_lock lock(mutex_);
    idle_.wait_for(lock, grace, [&] { return in_flight_ == 0 || stopping_; });
    stopping_ = true;
  }
  idle_.notify_all();
  stop_wake_.notify_all();
  for (auto& lane : lanes_) {
    lane->has_work.notify_all();
    lane->has_room.notify_all();
  }
  std::unique_lock lock(mutex_);
  const auto done = [&] { return plugin_calls_ == 0; };
  if (calls_grace == std::chrono::milliseconds::max()) {
    plugin_calls_done_.wait(lock, done);
    return;
  }
  if (plugin_calls_done_.wait_for(lock, calls_grace, done)) return;
  lock.unlock();
  spdlog::warn(
      "agent: plugin calls still under way {} ms after the dispatcher stopped; ending them",
      calls_grace.count());
  for (auto& lane : lanes_) lane->plugin->abandonCalls("the agent stopped applying");
  lock.lock();
  plugin_calls_done_.wait(lock, done);
}

bool Dispatcher::enterPlugin() {
  std::lock_guard lock(mutex_);
  if (stopping_) return false;
  ++plugin_calls_;
  return true;
}

void Dispatcher::leavePlugin() {
  std::lock_guard lock(mutex_);
  if (--plugin_calls_ == 0) plugin_calls_done_.notify_all();
}

void Dispatcher::syncBegin(uint64_t snapshot_version) {
  watermark_.syncBegin();
  {
    std::lock_guard lock(mutex_);
    sync_ids_.clear();
    sync_received_ = 0;
  }
  for (auto& lane : lanes_) {
    if (!enterPlugin()) return;
    const absl::Status st = lane->plugin->syncBegin(snapshot_version);
    leavePlugin();
    if (!st.ok()) {
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
    ++sync_received_;
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
    if (lane.idle > 0) lane.has_work.notify_one();
  }
}

bool Dispatcher::syncEnd(uint64_t version, uint64_t resource_count) {
  // Garbage collection only once every synced resource is applied: otherwise a plugin could
  // delete an object a queued apply is about to recreate.
  drain();
  {
    // Stopped before every synced resource was applied: neither collect garbage nor claim the
    // sync's version (the watermark must not pass what was not applied).
    std::lock_guard lock(mutex_);
    if (stopping_) return false;
  }
  std::map<std::string, std::set<std::string>> ids;
  uint64_t received = 0;
  {
    std::lock_guard lock(mutex_);
    ids.swap(sync_ids_);
    received = sync_received_;
  }
  if (received != resource_count) {
    // A sync that lost (or gained) resources on the way must not delete anything: what is
    // missing from it would be taken for gone. Nor may it claim its version.
    spdlog::error(
        "agent: full sync at version={} brought {} resources, the server sent {}: no garbage"
        " collection, starting over",
        version, received, resource_count);
    std::lock_guard lock(mutex_);
    ++stats_.syncs_refused;
    return false;
  }
  for (auto& lane : lanes_) {
    std::map<std::string, std::set<std::string>> mine;
    for (const auto& type : lane->plugin->resourceTypes()) mine[type] = ids[type];
    // Stopped (demoted) meanwhile: no more garbage collection, and the sync does not end.
    if (!enterPlugin()) return false;
    const absl::Status st = lane->plugin->syncEnd(version, options_.region, mine);
    leavePlugin();
    if (!st.ok()) {
      spdlog::warn("agent: plugin={} garbage collection after sync failed: {}",
                   lane->plugin->name(), st.message());
    }
  }
  ledger_.retainOnly(ids);
  watermark_.syncEnd(version);
  if (options_.on_sync_end) options_.on_sync_end(version);
  return true;
}

void Dispatcher::bookmark(uint64_t version) { watermark_.bookmark(version); }

void Dispatcher::work(Lane& lane) {
  const size_t max_batch = std::max<size_t>(1, options_.batch);
  std::vector<std::string> keys;
  std::vector<Work> items;
  std::vector<Work*> batch;
  for (;;) {
    keys.clear();
    items.clear();
    {
      std::unique_lock lock(mutex_);
      ++lane.idle;
      lane.has_work.wait(lock, [&] { return stopping_ || !lane.ready.empty(); });
      --lane.idle;
      if (stopping_) return;
      // Share the ready resources with the other workers rather than taking them all.
      const size_t take = std::min(
          max_batch, std::max<size_t>(1, lane.ready.size() / std::max<size_t>(1, lane.idle + 1)));
      while (keys.size() < take && !lane.ready.empty()) {
        std::string key = std::move(lane.ready.front());
        lane.ready.pop_front();
        auto& queue = lane.queues[key];
        items.push_back(std::move(queue.front()));
        queue.pop_front();
        lane.busy.insert(key);
        keys.push_back(std::move(key));
      }
      if (!lane.ready.empty() && lane.idle > 0) lane.has_work.notify_one();
    }
    batch.clear();
    for (auto& item : items) batch.push_back(&item);
    // Successes are released at once; a failure is retried alone, so that its backoff holds
    // back only its own resource.
    const std::vector<std::pair<size_t, absl::Status>> failed = applyBatch(lane, batch);
    std::vector<size_t> done;
    for (size_t i = 0, f = 0; i < items.size(); ++i) {
      if (f < failed.size() && failed[f].first == i) {
        ++f;
      } else {
        done.push_back(i);
      }
    }
    release(lane, keys, items, done);
    for (const auto& [i, status] : failed) {
      // Not acknowledged when the dispatcher stops first: the watermark must stay below it.
      if (!retry(lane, items[i], status)) return;
      release(lane, keys, items, {i});
    }
  }
}

void Dispatcher::release(Lane& lane, const std::vector<std::string>& keys,
                         const std::vector<Work>& items, const std::vector<size_t>& which) {
  if (which.empty()) return;
  {
    std::lock_guard lock(mutex_);
    for (size_t i : which) {
      lane.busy.erase(keys[i]);
      auto it = lane.queues.find(keys[i]);
      if (!it->second.empty()) {
        lane.ready.push_back(keys[i]);
      } else {
        lane.queues.erase(it);
      }
    }
    lane.queued -= which.size();
    if (!lane.ready.empty() && lane.idle > 0) lane.has_work.notify_one();
    lane.has_room.notify_one();
  }
  for (size_t i : which) finish(items[i]);
  std::lock_guard lock(mutex_);
  in_flight_ -= which.size();
  if (in_flight_ == 0) idle_.notify_all();
}

uint64_t Dispatcher::orderingVersion(const cluster::v1::Change& c) {
  // Ordering by resource state: an APPLY carries the resource's own version; a DELETE is
  // ordered by the change's version.
  return c.op() == cluster::v1::CHANGE_OP_APPLY ? std::max(c.resource().version(), c.version())
                                                : c.version();
}

std::vector<std::pair<size_t, absl::Status>> Dispatcher::applyBatch(
    Lane& lane, const std::vector<Work*>& batch) {
  std::vector<size_t> todo;  // indices into `batch`
  std::vector<const cluster::v1::Change*> changes;
  std::vector<std::pair<size_t, absl::Status>> failed;
  uint64_t stale = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const Work* w = batch[i];
    const auto& r = w->change.resource();
    if (!w->in_sync && !ledger_.shouldApply(r.type(), r.id(), orderingVersion(w->change))) {
      ++stale;
      continue;
    }
    todo.push_back(i);
    changes.push_back(&w->change);
  }
  if (stale > 0) {
    std::lock_guard lock(mutex_);
    stats_.skipped_stale += stale;
  }
  if (todo.empty()) return failed;
  if (!enterPlugin()) {
    // Stopped: none of them is applied or acknowledged (retry() gives them up).
    for (size_t i : todo) failed.emplace_back(i, absl::CancelledError("the dispatcher stopped"));
    return failed;
  }
  const std::vector<absl::Status> results = lane.plugin->handleBatch(changes);
  leavePlugin();
  uint64_t applied = 0;
  for (size_t i = 0; i < todo.size(); ++i) {
    absl::Status status =
        i < results.size() ? results[i] : absl::InternalError("plugin endpoint lost the answer");
    if (status.ok()) {
      recordSuccess(*batch[todo[i]]);
      ++applied;
    } else {
      failed.emplace_back(todo[i], std::move(status));
    }
  }
  std::lock_guard lock(mutex_);
  stats_.applied += applied;
  return failed;
}

void Dispatcher::recordSuccess(const Work& work) {
  const auto& c = work.change;
  const auto& r = c.resource();
  if (c.op() == cluster::v1::CHANGE_OP_DELETE) {
    ledger_.forget(r.type(), r.id());
  } else if (work.in_sync) {
    ledger_.recordSynced(r.type(), r.id(), orderingVersion(c));
  } else {
    ledger_.recordApplied(r.type(), r.id(), orderingVersion(c));
  }
  ledger_.unpark(r.type(), r.id());
}

namespace {
constexpr absl::string_view kCallTimeoutPayload = "krane.dev/plugin-call-timeout";
}  // namespace

absl::Status callTimedOut(absl::Status status) {
  status.SetPayload(kCallTimeoutPayload, absl::Cord("1"));
  return status;
}

bool isCallTimeout(const absl::Status& status) {
  return status.GetPayload(kCallTimeoutPayload).has_value();
}

bool Dispatcher::isPermanent(const absl::Status& status) {
  // The plugin says the change itself is wrong (KRANE_INVALID): it fails the same way every
  // time. Or its apply never ended in time: tried again, it would time out (and cost a plugin
  // host restart) again.
  return absl::IsInvalidArgument(status) || isCallTimeout(status);
}

bool Dispatcher::supersededWhileRetrying(Lane& lane, const Work& work) {
  const auto& r = work.change.resource();
  std::lock_guard lock(mutex_);
  auto it = lane.queues.find(strCat(r.type(), "/", r.id()));
  if (it == lane.queues.end()) return false;
  for (const Work& queued : it->second) {
    // A newer change, or the resource's state in a full sync, carries everything this one does.
    // The same change delivered again (a stream resumed from the watermark while this one was
    // retried) does not: acknowledging this one would let the watermark pass a change that the
    // copy may never apply.
    if (queued.in_sync || orderingVersion(queued.change) > orderingVersion(work.change)) {
      return true;
    }
  }
  return false;
}

bool Dispatcher::retry(Lane& lane, const Work& work, absl::Status status) {
  const auto& c = work.change;
  const auto& r = c.resource();
  Backoff backoff(options_.retry);
  int attempt = 1;
  int permanent_failures = 0;  // the attempts that ended invalid or timed out
  {
    std::lock_guard lock(mutex_);
    ++stats_.retrying;
  }
  auto done_retrying = [&] {
    std::lock_guard lock(mutex_);
    --stats_.retrying;
  };
  for (;;) {
    {
      std::lock_guard lock(mutex_);
      if (stopping_) {
        --stats_.retrying;
        return false;
      }
      ++stats_.retried;
    }
    const bool permanent = isPermanent(status);
    if (permanent) ++permanent_failures;
    // A transient failure is logged at its first attempts, then every 10th, not every second.
    if (permanent || attempt <= 3 || attempt % 10 == 0) {
      spdlog::warn("agent: plugin={} type={} id={} version={} attempt={} failed{}: {}",
                   lane.plugin->name(), r.type(), r.id(), c.version(), attempt,
                   !permanent              ? ", retrying"
                   : isCallTimeout(status) ? " (timed out)"
                                           : " (invalid)",
                   status.message());
    }
    if (permanent && permanent_failures >= options_.max_attempts) break;
    if (!permanent && supersededWhileRetrying(lane, work)) {
      // A newer change of the resource (or its full-sync state) is queued behind this one and
      // carries its whole state: it is applied instead (acknowledging this one loses nothing).
      spdlog::info("agent: type={} id={} version={} replaced by a newer change while retrying",
                   r.type(), r.id(), c.version());
      done_retrying();
      std::lock_guard lock(mutex_);
      ++stats_.superseded;
      return true;
    }
    {
      std::unique_lock lock(mutex_);
      if (stop_wake_.wait_for(lock, backoff.next(), [&] { return stopping_; })) {
        --stats_.retrying;
        return false;
      }
    }
    ++attempt;
    if (!enterPlugin()) {
      done_retrying();
      return false;
    }
    status = lane.plugin->handle(c);
    leavePlugin();
    if (status.ok()) {
      recordSuccess(work);
      done_retrying();
      std::lock_guard lock(mutex_);
      ++stats_.applied;
      return true;
    }
  }
  // Invalid, or never done in time: park it, say so, and let everything else flow. A newer version
  // of the resource (or the next full sync) tries again.
  done_retrying();
  ledger_.park(r.type(), r.id(), c.version(), attempt, std::string(toStd(status.message())));
  report_(c, status, attempt);
  spdlog::error("agent: parked type={} id={} version={} after {} attempts: {}", r.type(), r.id(),
                c.version(), attempt, status.message());
  std::lock_guard lock(mutex_);
  ++stats_.parked;
  return true;
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
