#include "bench/feed/watch_clients.h"

#include <cstdio>

#include "common/strings.h"

namespace krane::bench {

using cluster::v1::WatchEvent;

std::shared_ptr<grpc::Channel> ownChannel(const std::string& target,
                                          std::shared_ptr<grpc::ChannelCredentials> credentials) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetMaxReceiveMessageSize(16 << 20);
  return grpc::CreateCustomChannel(
      target, credentials ? credentials : grpc::InsecureChannelCredentials(), args);
}

cluster::v1::WatchRequest watchRequest(const std::string& region, uint64_t version, size_t index,
                                       bool accept_batches) {
  cluster::v1::WatchRequest request;
  request.set_region(region);
  request.set_version(version);
  request.set_agent_id(strCat("bench-agent-", index));
  request.set_accept_batches(accept_batches);
  return request;
}

void StreamTally::ended(const std::string& error) {
  std::lock_guard lock(mutex);
  ++done;
  if (!error.empty() && first_error.empty()) first_error = error;
  changed.notify_all();
}

void StreamRecorder::message(const WatchEvent& message, int64_t received) {
  tally_.messages.fetch_add(1, std::memory_order_relaxed);
  if (message.has_batch()) {
    for (const auto& event : message.batch().events()) take(event, received);
  } else {
    take(message, received);
  }
}

std::vector<Sample> StreamRecorder::takeSamples() {
  std::lock_guard lock(samples_mutex_);
  return std::exchange(samples_, {});
}

void StreamRecorder::take(const WatchEvent& event, int64_t received) {
  switch (event.event_case()) {
    case WatchEvent::kChange: {
      tally_.changes.fetch_add(1, std::memory_order_relaxed);
      if (tally_.recording.load(std::memory_order_relaxed)) {
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
      tally_.bookmarks.fetch_add(1, std::memory_order_relaxed);
      markLive();
      break;
    case WatchEvent::kSyncEnd:
      markLive();
      break;
    case WatchEvent::kCursorExpired:
      tally_.expired.fetch_add(1);
      break;
    default:
      break;
  }
}

void StreamRecorder::markLive() {
  if (live_) return;
  live_ = true;
  tally_.live.fetch_add(1);
  std::lock_guard lock(tally_.mutex);
  tally_.changed.notify_all();
}

bool WatchStreams::waitLive(std::chrono::milliseconds timeout) {
  std::unique_lock lock(tally_.mutex);
  return tally_.changed.wait_for(lock, timeout,
                                 [&] { return tally_.live.load() >= count_ || tally_.done > 0; }) &&
         tally_.live.load() >= count_ && tally_.done == 0;
}

size_t WatchStreams::ended() const {
  std::lock_guard lock(tally_.mutex);
  return tally_.done;
}

std::string WatchStreams::firstError() const {
  std::lock_guard lock(tally_.mutex);
  return tally_.first_error;
}

class GrpcWatchStreams::Stream final : public grpc::ClientReadReactor<WatchEvent> {
 public:
  Stream(StreamTally& tally, std::shared_ptr<grpc::Channel> channel, const std::string& token,
         const cluster::v1::WatchRequest& request)
      : tally_(tally),
        recorder_(tally),
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
    recorder_.message(message_, nowNs());
    StartRead(&message_);
  }

  void OnDone(const grpc::Status& status) override {
    tally_.ended(status.ok() || status.error_code() == grpc::StatusCode::CANCELLED
                     ? std::string()
                     : strCat("Watch ended: ", status.error_message()));
  }

  void cancel() { context_.TryCancel(); }
  std::vector<Sample> takeSamples() { return recorder_.takeSamples(); }

 private:
  StreamTally& tally_;
  StreamRecorder recorder_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<cluster::v1::ClusterService::Stub> stub_;
  grpc::ClientContext context_;
  cluster::v1::WatchRequest request_;
  WatchEvent message_;
};

GrpcWatchStreams::GrpcWatchStreams(const std::string& target, const std::string& token,
                                   const std::string& region, uint64_t version, size_t count,
                                   size_t per_connection, bool accept_batches,
                                   std::shared_ptr<grpc::ChannelCredentials> credentials)
    : WatchStreams(count) {
  streams_.reserve(count);
  std::shared_ptr<grpc::Channel> channel;
  for (size_t i = 0; i < count; ++i) {
    if (i % std::max<size_t>(per_connection, 1) == 0) channel = ownChannel(target, credentials);
    streams_.push_back(std::make_unique<Stream>(tally_, channel, token,
                                                watchRequest(region, version, i, accept_batches)));
  }
}

GrpcWatchStreams::~GrpcWatchStreams() { close(); }

std::vector<std::vector<Sample>> GrpcWatchStreams::takeSamples() {
  std::vector<std::vector<Sample>> out;
  out.reserve(streams_.size());
  for (auto& s : streams_) out.push_back(s->takeSamples());
  return out;
}

void GrpcWatchStreams::close() {
  if (closed_) return;
  closed_ = true;
  for (auto& s : streams_) s->cancel();
  std::unique_lock lock(tally_.mutex);
  if (!tally_.changed.wait_for(lock, std::chrono::seconds(60),
                               [&] { return tally_.done >= streams_.size(); })) {
    // gRPC still owns reactors it has not finished: they must outlive it, so they are leaked.
    std::fprintf(stderr, "bench: %zu of %zu Watch streams did not end within 60 s of cancelling\n",
                 streams_.size() - tally_.done, streams_.size());
    for (auto& s : streams_) s.release();
  }
  lock.unlock();
  streams_.clear();
}

}  // namespace krane::bench
