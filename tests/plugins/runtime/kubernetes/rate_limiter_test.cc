#include "plugins/runtime/kubernetes/rate_limiter.h"

#include <vector>

#include <catch2/catch.hpp>

namespace krane::kube {
namespace {

using std::chrono::milliseconds;

struct FakeTime {
  std::chrono::steady_clock::time_point now{};
  std::vector<std::chrono::nanoseconds> sleeps;
  TokenBucket bucket(double qps, int burst) {
    return TokenBucket(
        qps, burst, [this] { return now; },
        [this](std::chrono::nanoseconds d) {
          sleeps.push_back(d);
          now += d;
        });
  }
};

TEST_CASE("burst then refill at qps", "[token-bucket]") {
  FakeTime time;
  TokenBucket bucket = time.bucket(10, 3);
  CHECK(bucket.tryAcquire());
  CHECK(bucket.tryAcquire());
  CHECK(bucket.tryAcquire());
  INFO("the burst is spent");
  CHECK_FALSE(bucket.tryAcquire());
  time.now += milliseconds(100);
  INFO("one token per 1/qps");
  CHECK(bucket.tryAcquire());
  CHECK_FALSE(bucket.tryAcquire());
  time.now += std::chrono::seconds(60);
  for (int i = 0; i < 3; ++i) CHECK(bucket.tryAcquire());
  INFO("an idle bucket holds no more than the burst");
  CHECK_FALSE(bucket.tryAcquire());
}

TEST_CASE("acquire waits for the next token", "[token-bucket]") {
  FakeTime time;
  TokenBucket bucket = time.bucket(10, 2);
  CHECK(bucket.acquire().count() == 0);
  CHECK(bucket.acquire().count() == 0);
  CHECK(std::chrono::duration_cast<milliseconds>(bucket.acquire()) == milliseconds(100));
  CHECK(std::chrono::duration_cast<milliseconds>(bucket.acquire()) == milliseconds(100));
  REQUIRE(time.sleeps.size() == 2u);
}

TEST_CASE("concurrent waiters queue behind one another", "[token-bucket]") {
  // Without sleeping (the clock stands still), each reservation owes one more interval.
  std::chrono::steady_clock::time_point now{};
  std::vector<std::chrono::nanoseconds> waits;
  TokenBucket bucket(
      5, 1, [&] { return now; }, [&](std::chrono::nanoseconds d) { waits.push_back(d); });
  bucket.acquire();
  bucket.acquire();
  bucket.acquire();
  REQUIRE(waits.size() == 2u);
  CHECK(std::chrono::duration_cast<milliseconds>(waits[0]) == milliseconds(200));
  CHECK(std::chrono::duration_cast<milliseconds>(waits[1]) == milliseconds(400));
}

TEST_CASE("zero qps means no limit", "[token-bucket]") {
  TokenBucket bucket(0, 1);
  for (int i = 0; i < 1000; ++i) REQUIRE(bucket.acquire().count() == 0);
}

}  // namespace
}  // namespace krane::kube
