#include "bench/feed/watch_clients.h"

#include <cstdio>

#include "common/strings.h"

namespace krane::bench {

using cluster::v1::WatchEvent;

std::shared_ptr<grpc::Channel> ownChannel(const std::string& target) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetMaxReceiveMessageSize(16 << 20);
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
}

class WatchStreams::Stream final : public grpc::ClientReadReactor<WatchEvent> {
 public:
  Stream(Shared& shared, std::shared_ptr<grpc::Channel> channel, const std::string& token,
         const cluster::v1::WatchRequest& request)
      : shared_(shared),
        channel_(std::move(channel)),
        stub_(cluster::v1::ClusterService::NewStub(channel_)),
        request_(request) {
    context_.AddMetadata("authorization", "Bearer " + token);
    stub_->async()->Watch(&context_, &request_, this);
    StartRead(&message_);
    StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows
    const int64_t received = nowNs();
    shared_.messages.fetch_add(1, std::memory_order_relaxed);
    if (message_.has_batch()) {
      for (const auto& event : message_.batch().events()) take(event, received);
    } else {
      take(message_, received);
    }
    StartRead(&message_);
  }

  void OnDone(const grpc::Status& status) override {
    std::lock_guard lock(shared_.mutex);
    done_ = true;
    ++shared_.done;
    if (!status.ok() && status.error_code() != grpc::StatusCode::CANCELLED &&
        shared_.first_error.empty()) {
      shared_.first_error = strCat("Watch ended: ", status.error_message());
    }
    shared_.changed.notify_all();
  }

  void cancel() { context_.TryCancel(); }

  std::vector<Sample> takeSamples() {
    std::lock_guard lock(samples_mutex_);
    return std::exchange(samples_, {});
  }

 private:
  void take(const WatchEvent& event, int64_t received) {
    switch (event.event_case()) {
      case WatchEvent::kChange: {
        shared_.changes.fetch_add(1, std::memory_order_relaxed);
        if (shared_.recording.load(std::memory_order_relaxed)) {
          const auto& change = event.change();
          const auto& resource = change.resource();
          Sample sample{change.version(), received, -1};
          if (resource.version() == change.version() && resource.has_generic()) {
            sample.send_ns = parseSendNs(resource.generic().spec());
          }
          std::lock_guard lock(samples_mutex_);
          samples_.push_back(sample);
        }
        break;
      }
      case WatchEvent::kBookmark:
        shared_.bookmarks.fetch_add(1, std::memory_order_relaxed);
        markLive();
        break;
      case WatchEvent::kSyncEnd:
        markLive();
        break;
      case WatchEvent::kCursorExpired:
        shared_.expired.fetch_add(1);
        break;
      default:
        break;
    }
  }

  void markLive() {
    if (live_) return;
    live_ = true;
    shared_.live.fetch_add(1);
    std::lock_guard lock(shared_.mutex);
    shared_.changed.notify_all();
  }

  Shared& shared_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<cluster::v1::ClusterService::Stub> stub_;
  grpc::ClientContext context_;
  cluster::v1::WatchRequest request_;
  WatchEvent message_;
  bool live_ = false;  // only touched by this stream's callbacks, which never overlap
  bool done_ = false;
  std::mutex samples_mutex_;
  std::vector<Sample> samples_;
};

WatchStreams::WatchStreams(const std::string& target, const std::string& token,
                           const std::string& region, uint64_t version, size_t count,
                           size_t per_connection, bool accept_batches) {
  streams_.reserve(count);
  std::shared_ptr<grpc::Channel> channel;
  for (size_t i = 0; i < count; ++i) {
    if (i % std::max<size_t>(per_connection, 1) == 0) channel = ownChannel(target);
    cluster::v1::WatchRequest request;
    request.set_region(region);
    request.set_version(version);
    request.set_agent_id(strCat("bench-agent-", i));
    request.set_accept_batches(accept_batches);
    streams_.push_back(std::make_unique<Stream>(shared_, channel, token, request));
  }
}

WatchStreams::~WatchStreams() { close(); }

bool WatchStreams::waitLive(std::chrono::milliseconds timeout) {
  std::unique_lock lock(shared_.mutex);
  return shared_.changed.wait_for(
             lock, timeout,
             [&] { return shared_.live.load() >= streams_.size() || shared_.done > 0; }) &&
         shared_.live.load() >= streams_.size() && shared_.done == 0;
}

size_t WatchStreams::ended() const {
  std::lock_guard lock(shared_.mutex);
  return shared_.done;
}

std::vector<std::vector<Sample>> WatchStreams::takeSamples() {
  std::vector<std::vector<Sample>> out;
  out.reserve(streams_.size());
  for (auto& s : streams_) out.push_back(s->takeSamples());
  return out;
}

void WatchStreams::close() {
  if (closed_) return;
  closed_ = true;
  for (auto& s : streams_) s->cancel();
  std::unique_lock lock(shared_.mutex);
  if (!shared_.changed.wait_for(lock, std::chrono::seconds(60),
                                [&] { return shared_.done >= streams_.size(); })) {
    // gRPC still owns reactors it has not finished: they must outlive it, so they are leaked.
    std::fprintf(stderr, "bench: %zu of %zu Watch streams did not end within 60 s of cancelling\n",
                 streams_.size() - shared_.done, streams_.size());
    for (auto& s : streams_) s.release();
  }
  lock.unlock();
  streams_.clear();
}

std::string WatchStreams::firstError() const {
  std::lock_guard lock(shared_.mutex);
  return shared_.first_error;
}

}  // namespace krane::bench
