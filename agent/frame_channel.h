// One ZeroMQ PAIR connection carrying krane.plugin.v1.Frame messages between the agent and one
// plugin host process, over ipc:// in the state directory.
//
// ZeroMQ sockets are not thread-safe, so the socket lives on the channel's own I/O thread.
// send() may be called from any thread: it queues the frame and, when the queue was empty, wakes
// the I/O thread through an inproc PAIR that zmq::poll watches next to the socket. Received
// frames are handed to `on_frame` on the I/O thread, in arrival order; it must not block for long.
//
// The context and sockets are cppzmq objects: stop() joins the thread and then closes them (so the
// ipc:// endpoint is released at once), and the destructor calls stop().
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <zmq.hpp>

#include "absl/status/status.h"
#include "krane/plugin/v1/plugin.pb.h"

namespace krane::agent {

class FrameChannel {
 public:
  enum class Mode { kBind, kConnect };

  FrameChannel(std::string endpoint, Mode mode, std::function<void(plugin::v1::Frame&&)> on_frame);
  ~FrameChannel();
  FrameChannel(const FrameChannel&) = delete;
  FrameChannel& operator=(const FrameChannel&) = delete;

  // Binds or connects and starts the I/O thread; an error names the endpoint.
  absl::Status start();
  // Idempotent; after it, send() drops frames.
  void stop();
  void send(const plugin::v1::Frame& frame);
  // Queues several frames with one wake-up of the I/O thread.
  void sendMany(const std::vector<plugin::v1::Frame>& frames);
  const std::string& endpoint() const { return endpoint_; }

 private:
  void run();
  // Appends to the outgoing queue under mutex_; wakes the I/O thread if the queue was empty
  // (otherwise a wake-up is already on its way, or the thread drains the queue anyway).
  void enqueue(std::vector<std::string> frames);
  // On the I/O thread: sends what it can without blocking, then hands over what arrived.
  void flush(std::deque<std::string>& unsent);
  void drainIncoming();

  std::string endpoint_;
  Mode mode_;
  std::function<void(plugin::v1::Frame&&)> on_frame_;

  // Declared before the sockets: the context outlives them.
  zmq::context_t context_;
  zmq::socket_t socket_;    // the I/O thread's, once started
  zmq::socket_t wake_in_;   // the I/O thread's
  zmq::socket_t wake_out_;  // any thread's, under mutex_
  std::mutex mutex_;
  std::deque<std::string> outgoing_;
  bool started_ = false;  // under mutex_
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace krane::agent
