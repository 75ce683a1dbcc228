#include "controlplane/feed/hub.h"

#include <algorithm>

namespace krane::feed {

uint64_t Hub::subscribe(const std::string& region, const std::shared_ptr<Subscriber>& subscriber) {
  std::lock_guard lock(mutex_);
  Region& r = regions_[region];
  r.subscribers.push_back(subscriber);
  return r.published;
}

std::map<std::string, uint64_t> Hub::subscribeAll(const std::shared_ptr<Subscriber>& subscriber) {
  std::lock_guard lock(mutex_);
  everywhere_.push_back(subscriber);
  std::map<std::string, uint64_t> positions;
  for (const auto& [name, region] : regions_) positions[name] = region.published;
  return positions;
}

void Hub::unsubscribeAll(const Subscriber* subscriber) {
  std::lock_guard lock(mutex_);
  everywhere_.erase(std::remove_if(everywhere_.begin(), everywhere_.end(),
                                   [&](const auto& s) { return s.get() == subscriber; }),
                    everywhere_.end());
}

std::vector<std::shared_ptr<Subscriber>> Hub::audienceLocked(const Region& region) const {
  std::vector<std::shared_ptr<Subscriber>> audience = region.subscribers;
  audience.insert(audience.end(), everywhere_.begin(), everywhere_.end());
  return audience;
}

void Hub::unsubscribe(const std::string& region, const Subscriber* subscriber) {
  std::lock_guard lock(mutex_);
  auto it = regions_.find(region);
  if (it == regions_.end()) return;
  auto& subs = it->second.subscribers;
  subs.erase(std::remove_if(subs.begin(), subs.end(),
                            [&](const auto& s) { return s.get() == subscriber; }),
             subs.end());
}

uint64_t Hub::published(const std::string& region) const {
  std::lock_guard lock(mutex_);
  auto it = regions_.find(region);
  return it == regions_.end() ? 0 : it->second.published;
}

std::vector<std::string> Hub::watchedRegions() const {
  std::lock_guard lock(mutex_);
  std::vector<std::string> out;
  for (const auto& [name, region] : regions_) {
    if (!region.subscribers.empty() || !everywhere_.empty()) out.push_back(name);
  }
  return out;
}

size_t Hub::subscriberCount() const {
  std::lock_guard lock(mutex_);
  size_t n = 0;
  for (const auto& [name, region] : regions_) n += region.subscribers.size();
  return n + everywhere_.size();
}

void Hub::publish(const std::shared_ptr<const EventBatch>& batch) {
  // The position moves and the audience is fixed under the lock; delivery happens outside it, so
  // that subscribing and unsubscribing never wait for a fan-out. Only the tailer publishes, so
  // each subscriber still gets its region's batches in order. A subscriber that joins after the
  // copy reads this batch from the database (it is at or below the position it was given).
  std::vector<std::shared_ptr<Subscriber>> audience;
  {
    std::lock_guard lock(mutex_);
    Region& r = regions_[batch->region];
    r.published = std::max(r.published, batch->through);
    audience = audienceLocked(r);
  }
  for (const auto& s : audience) s->deliver(batch);
}

bool Hub::skipIfUnwatched(const std::string& region, uint64_t version) {
  std::lock_guard lock(mutex_);
  Region& r = regions_[region];
  if (!r.subscribers.empty() || !everywhere_.empty()) return false;
  r.published = std::max(r.published, version);
  return true;
}

void Hub::expireRegion(const std::string& region, uint64_t version, const std::string& reason) {
  std::vector<std::shared_ptr<Subscriber>> audience;
  {
    std::lock_guard lock(mutex_);
    Region& r = regions_[region];
    r.published = std::max(r.published, version);
    audience = audienceLocked(r);
  }
  for (const auto& s : audience) s->expire(reason);
}

}  // namespace krane::feed
