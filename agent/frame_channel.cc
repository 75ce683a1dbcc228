#include "agent/frame_channel.h"

#include <sys/eventfd.h>
#include <unistd.h>
#include <zmq.h>

#include "common/strings.h"
#include "spdlog/spdlog.h"

namespace krane::agent {

FrameChannel::FrameChannel(std::string endpoint, Mode mode,
                           std::function<void(plugin::v1::Frame&&)> on_frame)
    : endpoint_(std::move(endpoint)), mode_(mode), on_frame_(std::move(on_frame)) {}

FrameChannel::~FrameChannel() { stop(); }

absl::Status FrameChannel::start() {
  context_ = zmq_ctx_new();
  socket_ = zmq_socket(context_, ZMQ_PAIR);
  const int linger = 0;
  zmq_setsockopt(socket_, ZMQ_LINGER, &linger, sizeof(linger));
  const int rc = mode_ == Mode::kBind ? zmq_bind(socket_, endpoint_.c_str())
                                      : zmq_connect(socket_, endpoint_.c_str());
  if (rc != 0) {
    return absl::UnavailableError(strCat(mode_ == Mode::kBind ? "cannot bind " : "cannot connect ",
                                         endpoint_, ": ", zmq_strerror(zmq_errno())));
  }
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) return absl::InternalError("eventfd failed");
  thread_ = std::thread([this] { run(); });
  return absl::OkStatus();
}

void FrameChannel::stop() {
  if (stopping_.exchange(true)) return;
  if (wake_fd_ >= 0) {
    const uint64_t one = 1;
    (void)::write(wake_fd_, &one, sizeof(one));
  }
  if (thread_.joinable()) thread_.join();
  if (socket_ != nullptr) zmq_close(socket_);
  if (context_ != nullptr) zmq_ctx_term(context_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
  socket_ = nullptr;
  context_ = nullptr;
  wake_fd_ = -1;
}

void FrameChannel::send(const plugin::v1::Frame& frame) {
  std::string bytes = frame.SerializeAsString();
  {
    std::lock_guard lock(mutex_);
    outgoing_.push_back(std::move(bytes));
  }
  const uint64_t one = 1;
  (void)::write(wake_fd_, &one, sizeof(one));
}

void FrameChannel::sendMany(const std::vector<plugin::v1::Frame>& frames) {
  std::vector<std::string> bytes;
  bytes.reserve(frames.size());
  for (const auto& f : frames) bytes.push_back(f.SerializeAsString());
  {
    std::lock_guard lock(mutex_);
    for (auto& b : bytes) outgoing_.push_back(std::move(b));
  }
  const uint64_t one = 1;
  (void)::write(wake_fd_, &one, sizeof(one));
}

void FrameChannel::run() {
  zmq_pollitem_t items[2] = {{socket_, 0, ZMQ_POLLIN, 0}, {nullptr, wake_fd_, ZMQ_POLLIN, 0}};
  std::deque<std::string> unsent;  // never block on a send: a peer that died would hang us
  while (!stopping_) {
    items[0].events = static_cast<short>(ZMQ_POLLIN | (unsent.empty() ? 0 : ZMQ_POLLOUT));
    if (zmq_poll(items, 2, 200) < 0) {
      if (zmq_errno() == EINTR) continue;
      spdlog::error("plugin channel {}: poll failed: {}", endpoint_, zmq_strerror(zmq_errno()));
      return;
    }
    if (items[1].revents & ZMQ_POLLIN) {
      uint64_t count = 0;
      (void)::read(wake_fd_, &count, sizeof(count));
    }
    {
      std::lock_guard lock(mutex_);
      while (!outgoing_.empty()) {
        unsent.push_back(std::move(outgoing_.front()));
        outgoing_.pop_front();
      }
    }
    while (!unsent.empty()) {
      const std::string& bytes = unsent.front();
      if (zmq_send(socket_, bytes.data(), bytes.size(), ZMQ_DONTWAIT) < 0) {
        if (zmq_errno() != EAGAIN && !stopping_) {
          spdlog::warn("plugin channel {}: send failed: {}", endpoint_, zmq_strerror(zmq_errno()));
          unsent.pop_front();
          continue;
        }
        break;  // no peer, or its queue is full: try again when the socket is writable
      }
      unsent.pop_front();
    }
    // Drain everything that arrived.
    for (;;) {
      zmq_msg_t message;
      zmq_msg_init(&message);
      if (zmq_msg_recv(&message, socket_, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&message);
        break;
      }
      plugin::v1::Frame frame;
      const bool parsed =
          frame.ParseFromArray(zmq_msg_data(&message), static_cast<int>(zmq_msg_size(&message)));
      zmq_msg_close(&message);
      if (!parsed) {
        spdlog::error("plugin channel {}: dropped a frame that does not parse", endpoint_);
        continue;
      }
      on_frame_(std::move(frame));
    }
  }
}

}  // namespace krane::agent
