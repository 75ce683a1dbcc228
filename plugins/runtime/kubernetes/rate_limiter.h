// Client-side rate limit for API requests: a token bucket of `burst` tokens refilled at `qps`
// tokens per second, as client-go does, so a busy agent cannot flood the API server. Thread-safe.
#pragma once

#include <chrono>
#include <functional>
#include <mutex>

namespace krane::kube {

class TokenBucket {
 public:
  using Clock = std::function<std::chrono::steady_clock::time_point()>;
  using Sleep = std::function<void(std::chrono::nanoseconds)>;

  // qps <= 0 disables the limit. `clock` and `sleep` are replaceable for tests.
  TokenBucket(double qps, int burst, Clock clock = nullptr, Sleep sleep = nullptr);

  // Takes one token, waiting for it when the bucket is empty; returns how long it waited.
  std::chrono::nanoseconds acquire();
  // Takes one token if one is available now.
  bool tryAcquire();

 private:
  // Reserves a token (the balance may go negative) and returns the wait until it is due.
  std::chrono::nanoseconds reserve(bool only_if_available, bool* got);

  double qps_;
  double burst_;
  Clock clock_;
  Sleep sleep_;
  std::mutex mutex_;
  double tokens_;
  std::chrono::steady_clock::time_point last_;
};

}  // namespace krane::kube
