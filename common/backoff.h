// Exponential backoff with jitter, for retries of transactions, reconnects and reports.
// Not thread-safe: each retry loop owns its own Backoff.
#pragma once

#include <chrono>
#include <cstdint>
#include <random>

namespace krane {

struct BackoffPolicy {
  std::chrono::milliseconds initial{20};
  double factor = 2.0;
  std::chrono::milliseconds max{1000};
  // Fraction of each delay that is randomised: a delay d is drawn from [d * (1 - jitter), d].
  double jitter = 0.5;
};

class Backoff {
 public:
  explicit Backoff(BackoffPolicy policy);

  // The delay before the next attempt; grows by `factor` each call up to `max`.
  std::chrono::milliseconds next();
  void reset() { current_ = 0; }

 private:
  BackoffPolicy policy_;
  double current_ = 0;  // undrawn delay in ms; 0 before the first call
  std::minstd_rand rng_;
  bool seeded_ = false;
};

}  // namespace krane
