// One ZeroMQ PAIR connection carrying krane.plugin.v1.Frame messages between the agent and one
// plugin host process, over ipc:// in the state directory.
//
// ZeroMQ sockets are not thread-safe, so the socket lives on the channel's own I/O thread.
// send() may be called from any thread: it queues the frame and wakes the I/O thread through an
// eventfd that zmq_poll watches next to the socket. Received frames are handed to `on_frame` on
// the I/O thread, in arrival order; it must not block for long.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "krane/plugin/v1/plugin.pb.h"

namespace krane::agent {

class FrameChannel {
 public:
  enum class Mode { kBind, kConnect };

  FrameChannel(std::string endpoint, Mode mode, std::function<void(plugin::v1::Frame&&)> on_frame);
  ~FrameChannel();

  absl::Status start();
  void stop();
  void send(const plugin::v1::Frame& frame);
  // Queues several frames with one wake-up of the I/O thread.
  void sendMany(const std::vector<plugin::v1::Frame>& frames);
  const std::string& endpoint() const { return endpoint_; }

 private:
  void run();

  std::string endpoint_;
  Mode mode_;
  std::function<void(plugin::v1::Frame&&)> on_frame_;
  void* context_ = nullptr;
  void* socket_ = nullptr;
  int wake_fd_ = -1;
  std::mutex mutex_;
  std::deque<std::string> outgoing_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace krane::agent
