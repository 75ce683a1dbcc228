// In-memory fan-out of committed changes to the watch streams of this replica.
//
// The tailer publishes each region's changes once, in version order, as shared immutable
// events; every subscriber of that region gets the same objects. Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <grpcpp/support/slice.h>

#include "krane/cluster/v1/cluster.pb.h"

namespace krane::feed {

using cluster::v1::WatchEvent;

struct FeedEvent {
  uint64_t version = 0;
  std::string type;  // resource type, for stream filters
  std::shared_ptr<const WatchEvent> event;
  // As the change row says: "apply" or "delete", and when it was committed (Unix ms).
  std::string op;
  int64_t committed_ms = 0;
  // `event` serialized once (encoded_event.h): the bytes every Watch stream writes.
  grpc::Slice wire;
};

// Consecutive changes of one region: every version in (after, through] is in `events`.
struct EventBatch {
  std::string region;
  uint64_t after = 0;
  uint64_t through = 0;
  std::vector<FeedEvent> events;
};

class Subscriber {
 public:
  virtual ~Subscriber() = default;
  // A batch of the subscribed region, called in version order from the tailer's thread (not
  // under the hub's lock): it must only queue and return, since every stream waits behind it.
  virtual void deliver(const std::shared_ptr<const EventBatch>& batch) = 0;
  // The hub can no longer serve this subscriber incrementally (changes it needed are gone);
  // it must tell its client to resync. Same rules as deliver().
  virtual void expire(const std::string& reason) = 0;
};

class Hub {
 public:
  // Adds a subscriber and returns the version through which its region has been published: it
  // will receive every batch after that version, and must read anything before from the database.
  uint64_t subscribe(const std::string& region, const std::shared_ptr<Subscriber>& subscriber);
  void unsubscribe(const std::string& region, const Subscriber* subscriber);
  // Adds a subscriber of every region, including regions that appear later; returns where each
  // region known now has been published (a region not in it starts with its first batch).
  std::map<std::string, uint64_t> subscribeAll(const std::shared_ptr<Subscriber>& subscriber);
  void unsubscribeAll(const Subscriber* subscriber);

  // Highest version published (or skipped, with nobody subscribed) for the region; 0 if none.
  uint64_t published(const std::string& region) const;
  // Regions with at least one subscriber.
  std::vector<std::string> watchedRegions() const;
  size_t subscriberCount() const;

  // The tailer: hands a batch to the region's subscribers and advances its position.
  void publish(const std::shared_ptr<const EventBatch>& batch);
  // The tailer: moves the position of a region to `version` without events, if and only if
  // nobody watches it; true if it did. One step under the hub's lock, so a subscriber either
  // joins before (and the tailer reads the changes for it) or after (and is given `version`).
  bool skipIfUnwatched(const std::string& region, uint64_t version);
  // The tailer: changes after `after` are gone; every subscriber of the region must resync.
  void expireRegion(const std::string& region, uint64_t version, const std::string& reason);

 private:
  struct Region {
    uint64_t published = 0;
    std::vector<std::shared_ptr<Subscriber>> subscribers;
  };
  // The audience of a region's batch: its own subscribers and those of every region.
  std::vector<std::shared_ptr<Subscriber>> audienceLocked(const Region& region) const;

  mutable std::mutex mutex_;
  std::map<std::string, Region> regions_;
  std::vector<std::shared_ptr<Subscriber>> everywhere_;  // subscribers of every region
};

}  // namespace krane::feed
