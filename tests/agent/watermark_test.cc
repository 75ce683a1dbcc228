#include "agent/watermark.h"

#include <algorithm>
#include <random>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace krane::agent {
namespace {

TEST(Watermark, OnlyAdvancesPastAcknowledgedChanges) {
  WatermarkTracker w(10);
  for (uint64_t v = 11; v <= 15; ++v) w.received(v);
  EXPECT_EQ(w.watermark(), 10u);
  w.acknowledged(12);
  w.acknowledged(13);
  EXPECT_EQ(w.watermark(), 10u);  // 11 still pending
  w.acknowledged(11);
  EXPECT_EQ(w.watermark(), 13u);
  w.acknowledged(15);
  EXPECT_EQ(w.watermark(), 13u);  // 14 pending
  w.acknowledged(14);
  EXPECT_EQ(w.watermark(), 15u);
  EXPECT_EQ(w.pending(), 0u);
}

TEST(Watermark, BookmarksAdvanceAnIdleOrFilteredStream) {
  WatermarkTracker w(3);
  w.bookmark(9);
  EXPECT_EQ(w.watermark(), 9u);
  w.received(10);
  w.bookmark(20);  // vouches for 11..20, but 10 is still being applied
  EXPECT_EQ(w.watermark(), 9u);
  w.acknowledged(10);
  EXPECT_EQ(w.watermark(), 20u);
}

TEST(Watermark, NeverBeyondWhatTheStreamVouchedFor) {
  WatermarkTracker w(0);
  w.received(1);
  w.received(2);
  w.acknowledged(1);
  w.acknowledged(2);
  EXPECT_EQ(w.watermark(), 2u);  // not beyond the last received version
}

TEST(Watermark, AFullSyncCountsOnlyWhenEveryResourceIsApplied) {
  WatermarkTracker w(50);
  w.syncBegin();
  for (int i = 0; i < 3; ++i) w.syncReceived();
  w.syncAcknowledged();
  w.syncEnd(40);  // a snapshot older than the old cursor (e.g. after a restore) still wins
  EXPECT_EQ(w.watermark(), 50u);
  w.syncAcknowledged();
  w.syncAcknowledged();
  EXPECT_EQ(w.watermark(), 40u);
  w.received(41);
  w.acknowledged(41);
  EXPECT_EQ(w.watermark(), 41u);
}

TEST(Watermark, ConcurrentAcknowledgementsEndAtTheLastVersion) {
  WatermarkTracker w(0);
  constexpr uint64_t kCount = 20000;
  std::vector<uint64_t> order;
  for (uint64_t v = 1; v <= kCount; ++v) {
    w.received(v);
    order.push_back(v);
  }
  std::shuffle(order.begin(), order.end(), std::mt19937(7));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      uint64_t last = 0;
      for (size_t i = t; i < order.size(); i += 4) {
        w.acknowledged(order[i]);
        const uint64_t now = w.watermark();
        EXPECT_GE(now, last);  // never goes back
        last = now;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(w.watermark(), kCount);
}

}  // namespace
}  // namespace krane::agent
