// Hands each change to the plugin that owns its resource type.
//
// - Changes of one resource are applied in order; different resources in parallel, with a fixed
//   number of workers per plugin.
// - A change older than what was already applied for its resource is skipped (the ledger keeps
//   the last applied version of every resource, durably). A full sync replaces the ledger: its
//   versions are recorded as they are, and resources it did not contain are forgotten.
// - A change that fails for a transient reason (unavailable, deadline, conflict, a plugin host
//   restarting: anything but INVALID_ARGUMENT) is retried with backoff until it is applied; it
//   is not acknowledged meanwhile, so the watermark (the cursor) never passes it. Only its own
//   resource waits: other resources flow. A newer change of the same resource replaces it (the
//   newer one carries the whole state), and so does stopping the dispatcher (then it is not
//   acknowledged, and is delivered again after a restart).
// - A change the plugin refuses as invalid (INVALID_ARGUMENT: a bad spec, KRANE_INVALID across
//   the ABI) is tried `max_attempts` times, then parked: recorded in the ledger, reported as a
//   failed apply, and acknowledged so that it does not hold back the watermark or other
//   resources. A newer version of the resource, or the next full sync, tries again. So is a
//   change whose call the endpoint gave up on as too slow (callTimedOut) `max_attempts` times.
// - A change of a type no plugin owns is an error, parked and reported, never skipped silently.
// - After a full sync, each plugin is told which of its resources the sync contained, so it can
//   delete what it manages and the sync did not mention.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "agent/watcher.h"
#include "agent/watermark.h"
#include "common/backoff.h"
#include "krane/cluster/v1/cluster.pb.h"

namespace krane::agent {

// A call the endpoint gave up on: it did not end within the endpoint's time limit (it never
// started, or its plugin host was restarted to end it). Parked after max_attempts like an
// invalid change: one resource whose apply never finishes must not restart a host for ever.
absl::Status callTimedOut(absl::Status status);
bool isCallTimeout(const absl::Status& status);

// A plugin as the dispatcher sees it: in process, or a host process over ZeroMQ. Calls for
// different resources may come from several threads at once.
class PluginEndpoint {
 public:
  virtual ~PluginEndpoint() = default;
  virtual std::string name() const = 0;
  virtual std::vector<std::string> resourceTypes() const = 0;
  // APPLY or DELETE; INVALID_ARGUMENT means the change itself is wrong (it is parked after
  // max_attempts), and so is callTimedOut(); any other error is retried until the change is
  // applied.
  virtual absl::Status handle(const cluster::v1::Change& change) = 0;
  // Several changes of different resources at once (the dispatcher hands a worker a batch of
  // ready resources); one status each, in order. The default calls handle() for each; a host
  // endpoint sends them together and waits once.
  virtual std::vector<absl::Status> handleBatch(
      const std::vector<const cluster::v1::Change*>& changes) {
    std::vector<absl::Status> out;
    out.reserve(changes.size());
    for (const auto* c : changes) out.push_back(handle(*c));
    return out;
  }
  virtual absl::Status syncBegin(uint64_t snapshot_version) = 0;
  // Ends the calls under way where that is possible, failing them: what they had not applied
  // yet is never applied (a plugin host is killed and restarted). An in-process plugin's call
  // cannot be ended; it runs to its end. Any thread.
  virtual void abandonCalls(const std::string& why) { (void)why; }
  // `ids` by type: every resource of this plugin's types that the sync contained. `region` is
  // the agent's: garbage collection only considers objects of that region.
  virtual absl::Status syncEnd(uint64_t version, const std::string& region,
                               const std::map<std::string, std::set<std::string>>& ids) = 0;
};

// The durable record of what was applied and what was parked (the cursor store).
class ResourceLedger {
 public:
  virtual ~ResourceLedger() = default;
  // False when `version` is not newer than what was applied for the resource.
  virtual bool shouldApply(const std::string& type, const std::string& id, uint64_t version) = 0;
  virtual void recordApplied(const std::string& type, const std::string& id, uint64_t version) = 0;
  // A full sync applied the resource at `version`: recorded even if a higher version was (after
  // a database restore the region's versions go backwards; the snapshot is the truth).
  virtual void recordSynced(const std::string& type, const std::string& id, uint64_t version) = 0;
  // After a full sync: forget every resource the sync did not contain (`ids` by type).
  virtual void retainOnly(const std::map<std::string, std::set<std::string>>& ids) = 0;
  virtual void forget(const std::string& type, const std::string& id) = 0;
  virtual void park(const std::string& type, const std::string& id, uint64_t version, int attempts,
                    const std::string& error) = 0;
  virtual void unpark(const std::string& type, const std::string& id) = 0;
};

// Where failed applies are reported (the reporter, towards krane-ctrl).
using FailureReporter =
    std::function<void(const cluster::v1::Change& change, const absl::Status& error, int attempts)>;

struct DispatcherOptions {
  size_t workers_per_plugin = 4;
  // Overrides workers_per_plugin for the plugins named here.
  std::map<std::string, size_t> workers_by_plugin;
  // Attempts at a change the plugin refuses as invalid before it is parked.
  int max_attempts = 3;
  BackoffPolicy retry{std::chrono::milliseconds(100), 2.0, std::chrono::milliseconds(30000), 0.5};
  // Changes queued per plugin before the watcher is made to wait.
  size_t max_queued = 10000;
  // Ready resources a worker takes at once (one change each); they go to the plugin together.
  size_t batch = 32;
  // Called after a full sync was applied and garbage collected, with its version.
  std::function<void(uint64_t version)> on_sync_end;
  // The agent's region, handed to the plugins' garbage collection.
  std::string region;
};

struct DispatcherStats {
  uint64_t applied = 0;
  uint64_t skipped_stale = 0;
  uint64_t retried = 0;
  uint64_t parked = 0;
  uint64_t unowned = 0;
  uint64_t retrying = 0;       // changes being retried now (a gauge)
  uint64_t superseded = 0;     // retried changes a newer change of their resource replaced
  uint64_t syncs_refused = 0;  // full syncs whose resource count did not match what arrived
};

class Dispatcher final : public ChangeSink {
 public:
  Dispatcher(std::vector<std::shared_ptr<PluginEndpoint>> plugins, ResourceLedger& ledger,
             WatermarkTracker& watermark, FailureReporter report, DispatcherOptions options = {});
  ~Dispatcher() override;

  // ChangeSink (called by the watcher's thread)
  void syncBegin(uint64_t snapshot_version) override;
  void change(const cluster::v1::Change& change, bool in_sync) override;
  bool syncEnd(uint64_t version, uint64_t resource_count) override;
  void bookmark(uint64_t version) override;

  // Waits until nothing is queued or being applied (tests, shutdown), or the dispatcher stopped.
  void drain();
  // Waits up to `grace` for what is queued to be applied, then stops: changes still queued or
  // being retried are left unacknowledged (the watermark stays below them, so they are delivered
  // again after a restart), and a full sync that had not been applied in full does not end.
  // Returns once no call to a plugin is under way, and none starts afterwards: a demoted leader
  // stops applying when this returns. Calls still under way after `calls_grace` are abandoned
  // (PluginEndpoint::abandonCalls). Further changes are ignored. Thread-safe; the destructor
  // calls it with no grace.
  void stop(std::chrono::milliseconds grace,
            std::chrono::milliseconds calls_grace = std::chrono::milliseconds::max());
  DispatcherStats stats() const;

 private:
  struct Work {
    cluster::v1::Change change;
    bool in_sync = false;
  };
  struct Lane;  // one plugin: its queue per resource and its workers

  void work(Lane& lane);
  // Applies a batch: stale changes skipped, the rest handed over together; a failed one is
  // retried alone with backoff (see retry()).
  // Returns the failures (index in `batch`, first error).
  std::vector<std::pair<size_t, absl::Status>> applyBatch(Lane& lane,
                                                          const std::vector<Work*>& batch);
  // Lets the resources `which` of a batch take their next change, and acknowledges them.
  void release(Lane& lane, const std::vector<std::string>& keys, const std::vector<Work>& items,
               const std::vector<size_t>& which);
  // Returns false when the dispatcher stopped before the change was applied, parked or replaced.
  bool retry(Lane& lane, const Work& work, absl::Status status);
  static bool isPermanent(const absl::Status& status);
  // A newer change of the resource, or its state in a full sync, is queued behind `work` (the
  // same change delivered again is not).
  bool supersededWhileRetrying(Lane& lane, const Work& work);
  void recordSuccess(const Work& work);
  static uint64_t orderingVersion(const cluster::v1::Change& change);
  void finish(const Work& work);
  // Every call into a plugin is bracketed by these: false when stopped (nothing is called).
  bool enterPlugin();
  void leavePlugin();

  std::vector<std::unique_ptr<Lane>> lanes_;
  std::map<std::string, Lane*> by_type_;
  ResourceLedger& ledger_;
  WatermarkTracker& watermark_;
  FailureReporter report_;
  DispatcherOptions options_;

  mutable std::mutex mutex_;
  std::condition_variable idle_;
  std::condition_variable stop_wake_;  // wakes retry backoffs when stopping
  size_t in_flight_ = 0;
  bool stopping_ = false;
  size_t plugin_calls_ = 0;  // calls into plugins under way
  std::condition_variable plugin_calls_done_;
  // Resources named by the running full sync, by type, for garbage collection, and how many
  // arrived (the server's count must match before anything is deleted).
  std::map<std::string, std::set<std::string>> sync_ids_;
  uint64_t sync_received_ = 0;
  DispatcherStats stats_;
};

}  // namespace krane::agent
