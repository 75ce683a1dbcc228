#include "agent/watermark.h"

#include <algorithm>

namespace krane::agent {

void WatermarkTracker::received(uint64_t version) {
  std::lock_guard lock(mutex_);
  pending_.insert(version);
  horizon_ = std::max(horizon_, version);
}

void WatermarkTracker::acknowledged(uint64_t version) {
  std::lock_guard lock(mutex_);
  if (auto it = pending_.find(version); it != pending_.end()) pending_.erase(it);
  advanceLocked();
}

void WatermarkTracker::bookmark(uint64_t version) {
  std::lock_guard lock(mutex_);
  horizon_ = std::max(horizon_, version);
  advanceLocked();
}

void WatermarkTracker::syncBegin() {
  std::lock_guard lock(mutex_);
  syncing_ = true;
  sync_outstanding_ = 0;
  sync_ended_ = false;
  sync_end_ = 0;
}

void WatermarkTracker::syncReceived() {
  std::lock_guard lock(mutex_);
  ++sync_outstanding_;
}

void WatermarkTracker::syncAcknowledged() {
  std::lock_guard lock(mutex_);
  if (sync_outstanding_ > 0) --sync_outstanding_;
  advanceLocked();
}

void WatermarkTracker::syncEnd(uint64_t version) {
  std::lock_guard lock(mutex_);
  sync_ended_ = true;
  sync_end_ = version;
  advanceLocked();
}

void WatermarkTracker::advanceLocked() {
  if (syncing_) {
    if (!sync_ended_ || sync_outstanding_ > 0) return;
    // The snapshot replaces whatever was known before, older or newer.
    syncing_ = false;
    watermark_ = sync_end_;
    horizon_ = sync_end_;
  }
  // Everything up to the first pending change (exclusive) is done, bounded by the horizon.
  const uint64_t limit = pending_.empty() ? horizon_ : std::min(horizon_, *pending_.begin() - 1);
  watermark_ = std::max(watermark_, limit);
}

void WatermarkTracker::forgetPending() {
  std::lock_guard lock(mutex_);
  pending_.clear();
  horizon_ = watermark_;
  syncing_ = false;
  sync_outstanding_ = 0;
  sync_ended_ = false;
  sync_end_ = 0;
}

uint64_t WatermarkTracker::watermark() const {
  std::lock_guard lock(mutex_);
  return watermark_;
}

size_t WatermarkTracker::pending() const {
  std::lock_guard lock(mutex_);
  return pending_.size();
}

}  // namespace krane::agent
