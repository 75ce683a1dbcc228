#include "agent/watermark.h"

#include <algorithm>
#include <atomic>
#include <random>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

namespace krane::agent {
namespace {

TEST_CASE("only advances past acknowledged changes", "[watermark]") {
  WatermarkTracker w(10);
  for (uint64_t v = 11; v <= 15; ++v) w.received(v);
  CHECK(w.watermark() == 10u);
  w.acknowledged(12);
  w.acknowledged(13);
  CHECK(w.watermark() == 10u);  // 11 still pending
  w.acknowledged(11);
  CHECK(w.watermark() == 13u);
  w.acknowledged(15);
  CHECK(w.watermark() == 13u);  // 14 pending
  w.acknowledged(14);
  CHECK(w.watermark() == 15u);
  CHECK(w.pending() == 0u);
}

TEST_CASE("a change delivered again holds the watermark until both copies are done",
          "[watermark]") {
  WatermarkTracker w(10);
  w.received(11);
  w.received(12);
  w.received(11);  // a resumed stream delivers it again while the first copy is being applied
  w.acknowledged(12);
  w.acknowledged(11);
  CHECK(w.watermark() == 10u);  // the other copy of 11 is still pending
  CHECK(w.pending() == 1u);
  w.acknowledged(11);
  CHECK(w.watermark() == 12u);
  CHECK(w.pending() == 0u);
}

TEST_CASE("bookmarks advance an idle or filtered stream", "[watermark]") {
  WatermarkTracker w(3);
  w.bookmark(9);
  CHECK(w.watermark() == 9u);
  w.received(10);
  w.bookmark(20);  // vouches for 11..20, but 10 is still being applied
  CHECK(w.watermark() == 9u);
  w.acknowledged(10);
  CHECK(w.watermark() == 20u);
}

TEST_CASE("never beyond what the stream vouched for", "[watermark]") {
  WatermarkTracker w(0);
  w.received(1);
  w.received(2);
  w.acknowledged(1);
  w.acknowledged(2);
  CHECK(w.watermark() == 2u);  // not beyond the last received version
}

TEST_CASE("a full sync counts only when every resource is applied", "[watermark]") {
  WatermarkTracker w(50);
  w.syncBegin();
  for (int i = 0; i < 3; ++i) w.syncReceived();
  w.syncAcknowledged();
  w.syncEnd(40);  // a snapshot older than the old cursor (e.g. after a restore) still wins
  CHECK(w.watermark() == 50u);
  w.syncAcknowledged();
  w.syncAcknowledged();
  CHECK(w.watermark() == 40u);
  w.received(41);
  w.acknowledged(41);
  CHECK(w.watermark() == 41u);
}

TEST_CASE("concurrent acknowledgements end at the last version", "[watermark]") {
  WatermarkTracker w(0);
  constexpr uint64_t kCount = 20000;
  std::vector<uint64_t> order;
  for (uint64_t v = 1; v <= kCount; ++v) {
    w.received(v);
    order.push_back(v);
  }
  std::shuffle(order.begin(), order.end(), std::mt19937(7));
  std::vector<std::thread> threads;
  std::atomic<int> went_back{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      uint64_t last = 0;
      for (size_t i = t; i < order.size(); i += 4) {
        w.acknowledged(order[i]);
        const uint64_t now = w.watermark();
        if (now < last) ++went_back;  // it must never go back
        last = now;
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(went_back.load() == 0);
  CHECK(w.watermark() == kCount);
}

}  // namespace
}  // namespace krane::agent
