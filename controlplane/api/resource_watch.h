// ResourceService.Watch: committed changes of every region (or one), for operators. Served
// from this replica's hub like the agents' streams: no thread and no database poll per watcher;
// the tailer reads each change once whatever the number of watchers. gRPC's callback API owns
// the stream until OnDone.
//
// A watcher that falls more than `max_queued` changes behind is ended (RESOURCE_EXHAUSTED), and
// one that would miss changes (pruned before they were streamed, or a batch that does not start
// where it is) is ended with UNAVAILABLE: in both cases it reconnects. The first message is
// {op: "watching"}; changes of regions registered later follow from their first version.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include <grpcpp/grpcpp.h>

#include "controlplane/feed/hub.h"
#include "krane/api/v1/resources.pb.h"

namespace krane::api {

class ResourceWatchStream final : public grpc::ServerWriteReactor<v1::ResourceChange>,
                                  public feed::Subscriber,
                                  public std::enable_shared_from_this<ResourceWatchStream> {
 public:
  // Starts a stream of the changes `request` selects (validated by the caller).
  static grpc::ServerWriteReactor<v1::ResourceChange>* start(
      std::shared_ptr<feed::Hub> hub, const v1::WatchResourcesRequest& request,
      size_t max_queued = 10000);
  // A stream that ends at once with `status` (a refused request).
  static grpc::ServerWriteReactor<v1::ResourceChange>* refuse(const grpc::Status& status);

  ResourceWatchStream(std::shared_ptr<feed::Hub> hub, v1::WatchResourcesRequest request,
                      size_t max_queued);

  // feed::Subscriber
  void deliver(const std::shared_ptr<const feed::EventBatch>& batch) override;
  void expire(const std::string& reason) override;

  // grpc::ServerWriteReactor
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  void queueLocked(v1::ResourceChange change);
  void finishLocked(grpc::Status status);
  void kick();  // outside mutex_: starts what was decided under it

  const std::shared_ptr<feed::Hub> hub_;
  const v1::WatchResourcesRequest request_;
  const size_t max_queued_;

  std::mutex mutex_;
  std::map<std::string, uint64_t> positions_;  // by region: streamed through this version
  std::deque<v1::ResourceChange> queue_;
  bool writing_ = false;
  bool start_write_ = false;
  bool finish_pending_ = false;
  bool finished_ = false;
  bool done_ = false;
  grpc::Status final_status_;
  std::shared_ptr<ResourceWatchStream> self_;  // keeps the stream alive until OnDone
};

}  // namespace krane::api
