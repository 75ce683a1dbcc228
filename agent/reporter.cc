#include "agent/reporter.h"

#include "common/clock.h"
#include "common/strings.h"
#include "spdlog/spdlog.h"

namespace krane::agent {

Reporter::Reporter(std::shared_ptr<grpc::Channel> channel, ReporterOptions options,
                   std::function<void(cluster::v1::HeartbeatRequest&)> heartbeat)
    : stub_(cluster::v1::ClusterService::NewStub(std::move(channel))),
      options_(std::move(options)),
      heartbeat_(std::move(heartbeat)) {}

Reporter::~Reporter() { stop(); }

void Reporter::start() {
  thread_ = std::thread([this] { run(); });
}

void Reporter::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::string Reporter::keyOf(const Report& report) {
  return std::visit(
      [](const auto& r) -> std::string {
        using T = std::decay_t<decltype(r)>;
        if constexpr (std::is_same_v<T, cluster::v1::ReportDeploymentStatusRequest>) {
          return strCat("deployment/", r.deployment_id(), "/", r.region());
        } else if constexpr (std::is_same_v<T, cluster::v1::ReportSentinelStatusRequest>) {
          return strCat("sentinel/", r.sentinel_id(), "/", r.region());
        } else {
          return strCat("resource/", r.type(), "/", r.id(), "/", r.region());
        }
      },
      report);
}

void Reporter::report(Report report) {
  const int64_t now = unixMillis();
  std::visit(
      [&](auto& r) {
        r.set_agent_id(options_.agent_id);
        if (r.observed_at_ms() == 0) r.set_observed_at_ms(now);
      },
      report);
  const std::string key = keyOf(report);
  {
    std::lock_guard lock(mutex_);
    auto it = pending_.find(key);
    if (it != pending_.end()) {
      it->second.first = std::move(report);  // latest wins, keeps its place in line
      ++stats_.coalesced;
    } else {
      if (pending_.size() >= options_.max_pending) {
        pending_.erase(order_.front());
        order_.pop_front();
        ++stats_.dropped;
      }
      order_.push_back(key);
      pending_.emplace(key, std::make_pair(std::move(report), std::prev(order_.end())));
    }
  }
  wake_.notify_one();
}

void Reporter::beatNow() {
  {
    std::lock_guard lock(mutex_);
    beat_now_ = true;
  }
  wake_.notify_one();
}

ReporterStats Reporter::stats() const {
  std::lock_guard lock(mutex_);
  ReporterStats s = stats_;
  s.pending = pending_.size();
  s.breaker_open = std::chrono::steady_clock::now() < open_until_;
  return s;
}

grpc::Status Reporter::send(const Report& report) {
  grpc::ClientContext context;
  context.AddMetadata("authorization", "Bearer " + options_.token);
  context.set_deadline(std::chrono::system_clock::now() + options_.rpc_timeout);
  return std::visit(
      [&](const auto& r) -> grpc::Status {
        using T = std::decay_t<decltype(r)>;
        if constexpr (std::is_same_v<T, cluster::v1::ReportDeploymentStatusRequest>) {
          cluster::v1::ReportDeploymentStatusResponse response;
          return stub_->ReportDeploymentStatus(&context, r, &response);
        } else if constexpr (std::is_same_v<T, cluster::v1::ReportSentinelStatusRequest>) {
          cluster::v1::ReportSentinelStatusResponse response;
          return stub_->ReportSentinelStatus(&context, r, &response);
        } else {
          cluster::v1::ReportResourceStatusResponse response;
          return stub_->ReportResourceStatus(&context, r, &response);
        }
      },
      report);
}

bool Reporter::breakerAllows() { return std::chrono::steady_clock::now() >= open_until_; }

void Reporter::recordResult(bool ok) {
  if (ok) {
    consecutive_failures_ = 0;
    return;
  }
  ++stats_.failures;
  if (++consecutive_failures_ >= options_.breaker_failures) {
    // Open (or re-open after a failed half-open attempt): stop hammering a control plane that is
    // down.
    open_until_ = std::chrono::steady_clock::now() + options_.breaker_cooldown;
    ++stats_.breaker_opened;
    consecutive_failures_ = options_.breaker_failures - 1;  // one more failure re-opens at once
    spdlog::warn("agent: reporter circuit open for {} ms after repeated failures",
                 options_.breaker_cooldown.count());
  }
}

void Reporter::run() {
  Backoff backoff(options_.retry);
  auto next_beat = std::chrono::steady_clock::now();
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    const auto now = std::chrono::steady_clock::now();
    if (!breakerAllows()) {
      wake_.wait_until(lock, open_until_, [&] { return stopping_; });
      continue;
    }
    if (beat_now_ || now >= next_beat) {
      beat_now_ = false;
      next_beat = now + options_.heartbeat_interval;
      cluster::v1::HeartbeatRequest beat;
      beat.set_agent_id(options_.agent_id);
      beat.set_region(options_.region);
      beat.set_build_version(options_.build_version);
      lock.unlock();
      heartbeat_(beat);
      grpc::ClientContext context;
      context.AddMetadata("authorization", "Bearer " + options_.token);
      context.set_deadline(std::chrono::system_clock::now() + options_.rpc_timeout);
      cluster::v1::HeartbeatResponse response;
      const grpc::Status status = stub_->Heartbeat(&context, beat, &response);
      if (status.ok() && options_.on_heartbeat) options_.on_heartbeat(response);
      lock.lock();
      recordResult(status.ok());
      if (status.ok()) ++stats_.heartbeats;
      continue;
    }
    if (order_.empty()) {
      wake_.wait_until(lock, next_beat, [&] { return stopping_ || beat_now_ || !order_.empty(); });
      continue;
    }
    const std::string key = order_.front();
    Report report = pending_.at(key).first;
    lock.unlock();
    const grpc::Status status = send(report);
    lock.lock();
    const bool invalid = status.error_code() == grpc::StatusCode::INVALID_ARGUMENT ||
                         status.error_code() == grpc::StatusCode::PERMISSION_DENIED ||
                         status.error_code() == grpc::StatusCode::NOT_FOUND;
    if (status.ok() || invalid) {
      // Remove it unless a newer report for the same resource arrived while sending.
      auto it = pending_.find(key);
      if (it != pending_.end() &&
          std::visit([](const auto& a,
                        const auto& b) { return a.SerializeAsString() == b.SerializeAsString(); },
                     it->second.first, report)) {
        order_.erase(it->second.second);
        pending_.erase(it);
      }
      if (invalid) {
        ++stats_.rejected;
        spdlog::warn("agent: report {} refused by krane-ctrl: {}", key, status.error_message());
      } else {
        ++stats_.sent;
      }
      recordResult(true);
      backoff.reset();
      continue;
    }
    recordResult(false);
    const auto delay = backoff.next();
    wake_.wait_for(lock, delay, [&] { return stopping_; });
  }
}

}  // namespace krane::agent
