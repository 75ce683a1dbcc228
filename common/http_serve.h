// Serving a bound cpp-httplib server on a thread of its own.
#pragma once

#include <httplib.h>

#include <chrono>
#include <thread>

namespace krane {

// Runs `server` (bound already) on a new thread and returns once it accepts connections. A
// stop() before that would be lost: httplib's stop() does nothing until the server runs, and the
// thread would then wait in accept() for good (and a join of it with it). Gives up waiting after
// `patience` (the thread may have ended: a listen that failed).
inline std::thread serveInBackground(
    httplib::Server& server, std::chrono::milliseconds patience = std::chrono::seconds(10)) {
  std::thread serving([&server] { server.listen_after_bind(); });
  const auto until = std::chrono::steady_clock::now() + patience;
  while (!server.is_running() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return serving;
}

}  // namespace krane
