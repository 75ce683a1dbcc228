#include "common/backoff.h"

#include <algorithm>

namespace krane {

Backoff::Backoff(BackoffPolicy policy) : policy_(policy) {}

std::chrono::milliseconds Backoff::next() {
  // Seeded on first use: most loops never retry, and std::random_device costs a system call.
  if (!seeded_) {
    rng_.seed(std::random_device{}());
    seeded_ = true;
  }
  const double max_ms = static_cast<double>(policy_.max.count());
  current_ = current_ == 0 ? static_cast<double>(policy_.initial.count())
                           : std::min(current_ * policy_.factor, max_ms);
  const double jitter = std::clamp(policy_.jitter, 0.0, 1.0);
  std::uniform_real_distribution<double> draw(current_ * (1.0 - jitter), current_);
  return std::chrono::milliseconds(static_cast<int64_t>(draw(rng_)));
}

}  // namespace krane
