// HTTP requests for tests that send traffic through a proxy or to instances: one GET, and a
// steady stream of GETs from a few client threads that counts what came back.
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/strings.h"

namespace krane::testing {

struct HttpAnswer {
  int status = -1;  // -1: no answer at all
  std::string body;
  std::string deployment;  // the X-Krane-Deployment header a sentinel adds
};

// GET http://<address><path>; address is "host:port".
inline HttpAnswer httpGet(const std::string& address, const std::string& path,
                          std::chrono::seconds timeout = std::chrono::seconds(5)) {
  const auto colon = address.rfind(':');
  httplib::Client client(address.substr(0, colon), std::stoi(address.substr(colon + 1)));
  client.set_connection_timeout(std::min(timeout, std::chrono::seconds(2)));
  client.set_read_timeout(timeout);
  auto res = client.Get(path.c_str());
  if (!res) return {};
  return {res->status, res->body, res->get_header_value("X-Krane-Deployment")};
}

// GET / from `clients` threads in a loop until stop() (or destruction): how many answered 200,
// how many did not (and the last such answer), and how many bodies contained `marker`.
class SteadyTraffic {
 public:
  SteadyTraffic(std::string address, int clients, std::string marker)
      : address_(std::move(address)), marker_(std::move(marker)) {
    for (int c = 0; c < clients; ++c) {
      threads_.emplace_back([this] {
        while (!stop_) {
          const HttpAnswer a = httpGet(address_, "/");
          if (a.status == 200) {
            ++ok_;
            if (a.body.find(marker_) != std::string::npos) ++marked_;
          } else {
            ++failed_;
            std::lock_guard lock(mutex_);
            last_failure_ = strCat(a.status, " ", a.body);
          }
        }
      });
    }
  }
  ~SteadyTraffic() { stop(); }
  SteadyTraffic(const SteadyTraffic&) = delete;
  SteadyTraffic& operator=(const SteadyTraffic&) = delete;

  void stop() {
    stop_ = true;
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
  }
  int ok() const { return ok_; }
  int failed() const { return failed_; }
  int marked() const { return marked_; }
  std::string lastFailure() {
    std::lock_guard lock(mutex_);
    return last_failure_;
  }

 private:
  const std::string address_;
  const std::string marker_;
  std::atomic<bool> stop_{false};
  std::atomic<int> ok_{0};
  std::atomic<int> failed_{0};
  std::atomic<int> marked_{0};
  std::mutex mutex_;
  std::string last_failure_;
  std::vector<std::thread> threads_;
};

}  // namespace krane::testing
