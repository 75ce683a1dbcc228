// How far the agent's durable cursor may advance: past events that were applied, never further.
//
// Changes arrive in version order and are applied in parallel (different resources), so they
// are acknowledged out of order. The watermark is the highest version at or below which every
// received change has been acknowledged (applied, or parked after its retries), and no higher
// than the last version the stream vouched for (a change, a bookmark or a sync end). A full
// sync moves it to the sync's snapshot version only once every synced resource is acknowledged.
// Thread-safe.
#pragma once

#include <cstdint>
#include <mutex>
#include <set>

namespace krane::agent {

class WatermarkTracker {
 public:
  explicit WatermarkTracker(uint64_t start = 0) : watermark_(start), horizon_(start) {}

  // A change with this version was received and handed out for applying.
  void received(uint64_t version);
  // The change with this version was applied (or parked); it no longer holds the watermark.
  void acknowledged(uint64_t version);
  // The stream says nothing of interest is missing up to `version` (bookmark).
  void bookmark(uint64_t version);

  // A full sync starts: nothing moves until it ends.
  void syncBegin();
  // Resources of the sync are handed out; each is acknowledged with syncAcknowledged().
  void syncReceived();
  void syncAcknowledged();
  // The sync ended at `version`; the watermark jumps there once every synced resource is done.
  void syncEnd(uint64_t version);

  // The changes handed out and not acknowledged never will be (a demoted leader dropped them);
  // the stream delivers them again from the watermark. Forgets them and any sync in progress;
  // the watermark stays where it is.
  void forgetPending();

  uint64_t watermark() const;
  // Changes received and not yet acknowledged.
  size_t pending() const;

 private:
  void advanceLocked();

  mutable std::mutex mutex_;
  uint64_t watermark_;
  uint64_t horizon_;  // highest version vouched for by the stream
  // Received, not acknowledged; a version received twice (a stream resumed from the watermark
  // delivers again what is still being applied) is there twice and needs two acknowledgements.
  std::multiset<uint64_t> pending_;
  bool syncing_ = false;
  uint64_t sync_outstanding_ = 0;
  uint64_t sync_end_ = 0;
  bool sync_ended_ = false;
};

}  // namespace krane::agent
