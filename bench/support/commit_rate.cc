#include "bench/support/commit_rate.h"

#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include "common/status.h"
#include "common/strings.h"

namespace krane::bench {

absl::StatusOr<double> rawCommitRate(db::Pool& pool, int threads, std::chrono::seconds window,
                                     const std::string& table) {
  {
    KRANE_ASSIGN_OR_RETURN(auto conn, pool.acquire());
    KRANE_RETURN_IF_ERROR(conn->execText(strCat("CREATE TABLE ", table,
                                                " (id BIGINT AUTO_INCREMENT PRIMARY KEY,"
                                                " v VARCHAR(64)) ENGINE=InnoDB")));
  }
  std::atomic<int64_t> commits{0};
  std::atomic<bool> stop{false};
  std::mutex mutex;
  absl::Status first_error;
  std::vector<std::thread> ts;
  for (int i = 0; i < threads; ++i) {
    ts.emplace_back([&] {
      auto conn = pool.acquire();
      absl::Status s = conn.status();
      while (s.ok() && !stop) {
        s = (*conn)->exec(strCat("INSERT INTO ", table, " (v) VALUES (?)"), {"x"}).status();
        if (s.ok()) ++commits;
      }
      if (!s.ok()) {
        std::lock_guard lock(mutex);
        if (first_error.ok()) first_error = s;
        stop = true;
      }
    });
  }
  std::this_thread::sleep_for(window);
  stop = true;
  for (auto& t : ts) t.join();
  KRANE_RETURN_IF_ERROR(first_error);
  return static_cast<double>(commits.load()) / static_cast<double>(window.count());
}

}  // namespace krane::bench
