// Waiting in tests for something that happens on another thread or in another process.
#pragma once

#include <chrono>
#include <functional>
#include <thread>

namespace krane::testing {

// Polls `pred` until it holds (true) or `timeout` passes (false).
inline bool eventually(const std::function<bool()>& pred,
                       std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

}  // namespace krane::testing
