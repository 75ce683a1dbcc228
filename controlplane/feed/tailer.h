// One tailer per krane-ctrl replica: reads each new change once and hands it to the hub.
//
// Every poll reads `region_versions` (one small query, whatever the number of streams). For a
// region that moved and has subscribers it reads the new changes and loads each changed
// resource once; a region nobody watches only has its position moved. A commit through this
// replica's Writer wakes the tailer at once; so does a commit of another replica when peer
// hints are on (peer_hints.h); otherwise those are seen within one poll interval.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "controlplane/db/pool.h"
#include "controlplane/feed/hub.h"
#include "controlplane/feed/resource_table.h"

namespace krane::feed {

struct TailerOptions {
  std::chrono::milliseconds poll_interval{50};
  // Changes read per region per query; a region with more waits for the next round.
  size_t batch_limit = 2000;
};

struct TailerStats {
  uint64_t polls = 0;
  uint64_t changes_read = 0;
  uint64_t errors = 0;
  // Commit-to-publish delay of the last batch is not known here (commit time is not read);
  // lag is measured as versions behind region_versions at the last poll.
  uint64_t versions_behind = 0;
};

class Tailer {
 public:
  Tailer(std::shared_ptr<db::Pool> pool, std::shared_ptr<const ResourceTables> tables,
         std::shared_ptr<Hub> hub, TailerOptions options = {});
  ~Tailer();

  void start();
  void stop();
  // Wakes the tailer now (called after a local commit).
  void notify();
  // Runs one poll on the calling thread (for tests).
  absl::Status pollOnce();

  TailerStats stats() const;
  // Called with each poll's error (logged by the default).
  void onError(std::function<void(const absl::Status&)> handler) { on_error_ = std::move(handler); }

 private:
  void run();

  std::shared_ptr<db::Pool> pool_;
  std::shared_ptr<const ResourceTables> tables_;
  std::shared_ptr<Hub> hub_;
  TailerOptions options_;
  std::function<void(const absl::Status&)> on_error_;

  std::mutex mutex_;
  std::condition_variable wake_;
  bool notified_ = false;
  bool stopping_ = false;
  std::thread thread_;

  std::atomic<uint64_t> polls_{0};
  std::atomic<uint64_t> changes_read_{0};
  std::atomic<uint64_t> errors_{0};
  std::atomic<uint64_t> behind_{0};
};

}  // namespace krane::feed
