#include "plugins/runtime/kubernetes/rate_limiter.h"

#include <vector>

#include <gtest/gtest.h>

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

TEST(TokenBucket, BurstThenRefillAtQps) {
  FakeTime time;
  TokenBucket bucket = time.bucket(10, 3);
  EXPECT_TRUE(bucket.tryAcquire());
  EXPECT_TRUE(bucket.tryAcquire());
  EXPECT_TRUE(bucket.tryAcquire());
  EXPECT_FALSE(bucket.tryAcquire()) << "the burst is spent";
  time.now += milliseconds(100);
  EXPECT_TRUE(bucket.tryAcquire()) << "one token per 1/qps";
  EXPECT_FALSE(bucket.tryAcquire());
  time.now += std::chrono::seconds(60);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(bucket.tryAcquire());
  EXPECT_FALSE(bucket.tryAcquire()) << "an idle bucket holds no more than the burst";
}

TEST(TokenBucket, AcquireWaitsForTheNextToken) {
  FakeTime time;
  TokenBucket bucket = time.bucket(10, 2);
  EXPECT_EQ(bucket.acquire().count(), 0);
  EXPECT_EQ(bucket.acquire().count(), 0);
  EXPECT_EQ(std::chrono::duration_cast<milliseconds>(bucket.acquire()), milliseconds(100));
  EXPECT_EQ(std::chrono::duration_cast<milliseconds>(bucket.acquire()), milliseconds(100));
  ASSERT_EQ(time.sleeps.size(), 2u);
}

TEST(TokenBucket, ConcurrentWaitersQueueBehindOneAnother) {
  // Without sleeping (the clock stands still), each reservation owes one more interval.
  std::chrono::steady_clock::time_point now{};
  std::vector<std::chrono::nanoseconds> waits;
  TokenBucket bucket(
      5, 1, [&] { return now; }, [&](std::chrono::nanoseconds d) { waits.push_back(d); });
  bucket.acquire();
  bucket.acquire();
  bucket.acquire();
  ASSERT_EQ(waits.size(), 2u);
  EXPECT_EQ(std::chrono::duration_cast<milliseconds>(waits[0]), milliseconds(200));
  EXPECT_EQ(std::chrono::duration_cast<milliseconds>(waits[1]), milliseconds(400));
}

TEST(TokenBucket, ZeroQpsMeansNoLimit) {
  TokenBucket bucket(0, 1);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(bucket.acquire().count(), 0);
}

}  // namespace
}  // namespace krane::kube
