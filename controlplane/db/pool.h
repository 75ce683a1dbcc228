// A bounded pool of MySQL connections and the transaction helper every writer uses.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string_view>
#include <thread>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/backoff.h"
#include "controlplane/db/connection.h"
#include "controlplane/db/dsn.h"
#include "controlplane/db/errors.h"

namespace krane::db {

struct PoolOptions {
  // At most this many sessions are open at once.
  size_t max_connections = 16;
  // How long acquire() waits for a free connection before failing with RESOURCE_EXHAUSTED.
  std::chrono::milliseconds acquire_timeout{5000};
  // A connection idle for longer than this is pinged before it is handed out; a dead one is
  // replaced (this is how the pool recovers after a server restart).
  std::chrono::milliseconds ping_after_idle{1000};
};

enum class Isolation { kServerDefault, kReadCommitted, kRepeatableRead };

struct TxOptions {
  // READ COMMITTED takes no gap locks: writers inserting different new rows do not block each
  // other. The server default (REPEATABLE READ) gives the body one snapshot for all its reads.
  Isolation isolation = Isolation::kServerDefault;
  // Attempts in all, including the first, for deadlocks (1213), lock wait timeouts (1205) and
  // connections lost before COMMIT was sent.
  int max_attempts = 6;
  BackoffPolicy backoff{std::chrono::milliseconds(10), 2.0, std::chrono::milliseconds(500), 0.5};
};

class Pool;

// Runs `statement` (one that commits by itself: its status or StatusOr) again after a deadlock
// or a lock wait timeout, as Pool::transact does for a transaction: the server rolled the
// statement back, so running it again cannot apply it twice.
template <typename F>
auto retryConflicts(F statement, const TxOptions& options = {}) -> decltype(statement()) {
  Backoff backoff(options.backoff);
  for (int attempt = 1;; ++attempt) {
    auto result = statement();
    const absl::Status& status = [&]() -> const absl::Status& {
      if constexpr (std::is_same_v<decltype(result), absl::Status>) {
        return result;
      } else {
        return result.status();
      }
    }();
    if (status.ok() || !isTransactionConflict(status) || attempt >= options.max_attempts) {
      return result;
    }
    std::this_thread::sleep_for(backoff.next());
  }
}

// A connection on loan from the pool; returned (or discarded if broken) when destroyed.
class PooledConnection {
 public:
  PooledConnection() = default;
  PooledConnection(PooledConnection&& other) noexcept;
  PooledConnection& operator=(PooledConnection&& other) noexcept;
  ~PooledConnection();

  Connection* operator->() const { return connection_.get(); }
  Connection& operator*() const { return *connection_; }

 private:
  friend class Pool;
  PooledConnection(std::shared_ptr<Pool> pool, std::unique_ptr<Connection> connection)
      : pool_(std::move(pool)), connection_(std::move(connection)) {}
  void release();

  std::shared_ptr<Pool> pool_;
  std::unique_ptr<Connection> connection_;
};

struct PoolStats {
  size_t open = 0;  // sessions that exist (idle + in use)
  size_t idle = 0;
  size_t waiting = 0;  // callers blocked in acquire()
};

// Thread-safe. Created through create(); shared by everything in one process.
class Pool : public std::enable_shared_from_this<Pool> {
 public:
  // Opens one connection to check the DSN, the credentials and the database right away.
  static absl::StatusOr<std::shared_ptr<Pool>> create(const Dsn& dsn, PoolOptions options = {});

  // Waits up to acquire_timeout for a healthy connection. UNAVAILABLE when the server cannot be
  // reached, RESOURCE_EXHAUSTED when every connection stayed in use.
  absl::StatusOr<PooledConnection> acquire();

  // Runs `body` inside START TRANSACTION ... COMMIT. When `body` returns an error the transaction
  // is rolled back and the error returned. Deadlocks, lock wait timeouts and connections lost
  // before COMMIT roll back and run `body` again (with jittered backoff), so `body` must only
  // reach outside the transaction through state it resets itself. A connection lost during
  // COMMIT is not retried: the outcome is unknown and the error says so.
  absl::Status transact(std::string_view name, const std::function<absl::Status(Connection&)>& body,
                        const TxOptions& options = {});

  // Runs one statement that commits by itself on a pooled connection, again after a deadlock
  // or a lock wait timeout (retryConflicts); returns its affected rows.
  absl::StatusOr<uint64_t> execAlone(std::string_view sql, const Params& params = {});

  PoolStats stats() const;
  const Dsn& dsn() const { return dsn_; }

 private:
  friend class PooledConnection;
  Pool(Dsn dsn, PoolOptions options) : dsn_(std::move(dsn)), options_(options) {}
  void giveBack(std::unique_ptr<Connection> connection);

  const Dsn dsn_;
  const PoolOptions options_;
  mutable std::mutex mutex_;
  std::condition_variable available_;
  std::vector<std::unique_ptr<Connection>> idle_;  // most recently used last
  size_t open_ = 0;
  size_t waiting_ = 0;
};

}  // namespace krane::db
