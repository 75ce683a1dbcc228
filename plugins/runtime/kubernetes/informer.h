// A local copy of the objects of one kind matching a selector, kept current from the API server:
// list, then watch from the list's resourceVersion. A watch the server ended is resumed from the
// last version seen (bookmarks included); a version the server no longer keeps (410), or any
// other failure, leads to a fresh list (after a jittered backoff for failures), and the
// difference to the copy is delivered as changes and deletions, so the handler never misses the
// end state of an object.
//
// The handler runs on the informer's own thread, one call at a time; it must not call stop().
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "plugins/runtime/kubernetes/client.h"

namespace krane::kube {

struct InformerOptions {
  std::string api_version;
  std::string kind;
  std::string ns;  // empty: every namespace
  std::string label_selector;
  std::string field_selector;  // "metadata.name=x"
  int watch_timeout_seconds = 300;
  BackoffPolicy retry{std::chrono::milliseconds(200), 2.0, std::chrono::seconds(10), 0.5};
  // Called with each failed list or watch (for logs); on the informer's thread.
  std::function<void(const absl::Status&)> on_error;
};

class Informer {
 public:
  // `object` as stored; `deleted` when it is gone (or no longer matches the selector).
  using Handler = std::function<void(const Json& object, bool deleted)>;

  // `client` must outlive the informer.
  Informer(Client& client, InformerOptions options, Handler handler);
  ~Informer();  // stop()
  Informer(const Informer&) = delete;
  Informer& operator=(const Informer&) = delete;

  void start();
  // Ends the watch (within about a second) and joins the thread. Idempotent.
  void stop();
  // Waits until the first list has been delivered to the handler.
  bool waitSynced(std::chrono::milliseconds timeout);
  // The objects as last seen, ordered by namespace and name. Thread-safe.
  std::vector<Json> snapshot() const;
  // How many lists were made (the first one included): a figure for tests.
  uint64_t lists() const { return lists_.load(); }

 private:
  void run();
  // Lists and delivers the difference; the list's resourceVersion.
  absl::StatusOr<std::string> relist();
  void deliver(const Json& object, bool deleted);

  Client& client_;
  const InformerOptions options_;
  const Handler handler_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> lists_{0};
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  bool synced_ = false;
  std::map<std::string, Json> objects_;  // "<ns>/<name>"
};

}  // namespace krane::kube
