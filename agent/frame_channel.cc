#include "agent/frame_channel.h"

#include <array>
#include <chrono>
#include <utility>

#include "common/strings.h"
#include "spdlog/spdlog.h"

namespace krane::agent {
namespace {

constexpr const char* kWakeEndpoint = "inproc://frame-channel-wake";
// How often the I/O thread looks at `stopping_` when nothing happens.
constexpr std::chrono::milliseconds kPollInterval{200};

}  // namespace

FrameChannel::FrameChannel(std::string endpoint, Mode mode,
                           std::function<void(plugin::v1::Frame&&)> on_frame)
    : endpoint_(std::move(endpoint)), mode_(mode), on_frame_(std::move(on_frame)) {}

FrameChannel::~FrameChannel() { stop(); }

absl::Status FrameChannel::start() {
  try {
    socket_ = zmq::socket_t(context_, zmq::socket_type::pair);
    socket_.set(zmq::sockopt::linger, 0);
    if (mode_ == Mode::kBind) {
      socket_.bind(endpoint_);
    } else {
      socket_.connect(endpoint_);
    }
    wake_in_ = zmq::socket_t(context_, zmq::socket_type::pair);
    wake_in_.bind(kWakeEndpoint);
    wake_out_ = zmq::socket_t(context_, zmq::socket_type::pair);
    wake_out_.set(zmq::sockopt::linger, 0);
    wake_out_.connect(kWakeEndpoint);
  } catch (const zmq::error_t& e) {
    return absl::UnavailableError(strCat(mode_ == Mode::kBind ? "cannot bind " : "cannot connect ",
                                         endpoint_, ": ", e.what()));
  }
  {
    std::lock_guard lock(mutex_);
    started_ = true;
  }
  thread_ = std::thread([this] { run(); });
  return absl::OkStatus();
}

void FrameChannel::stop() {
  if (stopping_.exchange(true)) return;
  {
    std::lock_guard lock(mutex_);
    if (started_) (void)wake_out_.send(zmq::const_buffer(), zmq::send_flags::dontwait);
    started_ = false;
  }
  if (thread_.joinable()) thread_.join();
  socket_.close();
  wake_in_.close();
  wake_out_.close();
  context_.close();
}

void FrameChannel::send(const plugin::v1::Frame& frame) {
  std::vector<std::string> one;
  one.push_back(frame.SerializeAsString());
  enqueue(std::move(one));
}

void FrameChannel::sendMany(const std::vector<plugin::v1::Frame>& frames) {
  std::vector<std::string> bytes;
  bytes.reserve(frames.size());
  for (const auto& f : frames) bytes.push_back(f.SerializeAsString());
  enqueue(std::move(bytes));
}

void FrameChannel::enqueue(std::vector<std::string> frames) {
  if (frames.empty()) return;
  std::lock_guard lock(mutex_);
  if (!started_) return;
  const bool was_empty = outgoing_.empty();
  for (auto& f : frames) outgoing_.push_back(std::move(f));
  // A full wake pipe means wake-ups are pending already; nothing is lost by dropping this one.
  if (was_empty) (void)wake_out_.send(zmq::const_buffer(), zmq::send_flags::dontwait);
}

void FrameChannel::run() {
  std::array<zmq::pollitem_t, 2> items{
      {{socket_.handle(), 0, ZMQ_POLLIN, 0}, {wake_in_.handle(), 0, ZMQ_POLLIN, 0}}};
  std::deque<std::string> unsent;  // never block on a send: a peer that died would hang us
  try {
    while (!stopping_) {
      items[0].events = static_cast<short>(ZMQ_POLLIN | (unsent.empty() ? 0 : ZMQ_POLLOUT));
      try {
        zmq::poll(items.data(), items.size(), kPollInterval);
      } catch (const zmq::error_t& e) {
        if (e.num() == EINTR) continue;
        throw;
      }
      if (items[1].revents & ZMQ_POLLIN) {
        zmq::message_t wake;
        while (wake_in_.recv(wake, zmq::recv_flags::dontwait)) {
        }
      }
      {
        std::lock_guard lock(mutex_);
        while (!outgoing_.empty()) {
          unsent.push_back(std::move(outgoing_.front()));
          outgoing_.pop_front();
        }
      }
      flush(unsent);
      drainIncoming();
    }
  } catch (const zmq::error_t& e) {
    // A closed context (ETERM) is how a stop can surface; anything else is a real failure.
    if (!stopping_) spdlog::error("plugin channel {}: {}", endpoint_, e.what());
  }
}

void FrameChannel::flush(std::deque<std::string>& unsent) {
  while (!unsent.empty()) {
    const std::string& bytes = unsent.front();
    try {
      // No peer, or its queue is full: try again when the socket is writable.
      if (!socket_.send(zmq::buffer(bytes), zmq::send_flags::dontwait)) return;
    } catch (const zmq::error_t& e) {
      if (stopping_) return;
      spdlog::warn("plugin channel {}: send failed: {}", endpoint_, e.what());
    }
    unsent.pop_front();
  }
}

void FrameChannel::drainIncoming() {
  zmq::message_t message;
  while (socket_.recv(message, zmq::recv_flags::dontwait)) {
    plugin::v1::Frame frame;
    if (!frame.ParseFromArray(message.data(), static_cast<int>(message.size()))) {
      spdlog::error("plugin channel {}: dropped a frame that does not parse", endpoint_);
      continue;
    }
    on_frame_(std::move(frame));
  }
}

}  // namespace krane::agent
