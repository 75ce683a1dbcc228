#include "plugins/runtime/kubernetes/rate_limiter.h"

#include <algorithm>
#include <thread>

namespace krane::kube {

TokenBucket::TokenBucket(double qps, int burst, Clock clock, Sleep sleep)
    : qps_(qps),
      burst_(std::max(1, burst)),
      clock_(clock ? std::move(clock) : [] { return std::chrono::steady_clock::now(); }),
      sleep_(sleep ? std::move(sleep)
                   : [](std::chrono::nanoseconds d) { std::this_thread::sleep_for(d); }),
      tokens_(burst_),
      last_(clock_()) {}

std::chrono::nanoseconds TokenBucket::reserve(bool only_if_available, bool* got) {
  std::lock_guard lock(mutex_);
  const auto now = clock_();
  const double elapsed = std::chrono::duration<double>(now - last_).count();
  last_ = now;
  tokens_ = std::min(burst_, tokens_ + elapsed * qps_);
  if (only_if_available && tokens_ < 1.0) {
    *got = false;
    return std::chrono::nanoseconds(0);
  }
  *got = true;
  tokens_ -= 1.0;
  if (tokens_ >= 0) return std::chrono::nanoseconds(0);
  // Waiters queue up behind one another: each owes what the balance below zero says.
  return std::chrono::nanoseconds(static_cast<int64_t>(-tokens_ / qps_ * 1e9));
}

std::chrono::nanoseconds TokenBucket::acquire() {
  if (qps_ <= 0) return std::chrono::nanoseconds(0);
  bool got = false;
  const auto wait = reserve(false, &got);
  if (wait.count() > 0) sleep_(wait);
  return wait;
}

bool TokenBucket::tryAcquire() {
  if (qps_ <= 0) return true;
  bool got = false;
  reserve(true, &got);
  return got;
}

}  // namespace krane::kube
