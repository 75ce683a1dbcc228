#include "controlplane/db/pool.h"

#include <thread>

#include "common/status.h"
#include "common/strings.h"
#include "controlplane/db/errors.h"
#include "spdlog/spdlog.h"

namespace krane::db {

PooledConnection::PooledConnection(PooledConnection&& other) noexcept
    : pool_(std::move(other.pool_)), connection_(std::move(other.connection_)) {}

PooledConnection& PooledConnection::operator=(PooledConnection&& other) noexcept {
  if (this != &other) {
    release();
    pool_ = std::move(other.pool_);
    connection_ = std::move(other.connection_);
  }
  return *this;
}

PooledConnection::~PooledConnection() { release(); }

void PooledConnection::release() {
  if (pool_ && connection_) pool_->giveBack(std::move(connection_));
  pool_.reset();
}

absl::StatusOr<std::shared_ptr<Pool>> Pool::create(const Dsn& dsn, PoolOptions options) {
  if (options.max_connections == 0) {
    return absl::InvalidArgumentError("db.max_connections must be at least 1");
  }
  auto first = Connection::open(dsn);
  if (!first.ok()) return first.status();
  std::shared_ptr<Pool> pool(new Pool(dsn, options));
  pool->open_ = 1;
  pool->idle_.push_back(*std::move(first));
  return pool;
}

absl::StatusOr<PooledConnection> Pool::acquire() {
  const auto deadline = std::chrono::steady_clock::now() + options_.acquire_timeout;
  std::unique_lock lock(mutex_);
  for (;;) {
    if (!idle_.empty()) {
      std::unique_ptr<Connection> connection = std::move(idle_.back());
      idle_.pop_back();
      lock.unlock();
      const bool stale =
          std::chrono::steady_clock::now() - connection->lastUsed() > options_.ping_after_idle;
      if (!stale || connection->ping().ok()) {
        return PooledConnection(shared_from_this(), std::move(connection));
      }
      spdlog::info("db: dropping a dead pooled connection to {} (server restarted?)", dsn_.where());
      connection.reset();
      lock.lock();
      --open_;
      continue;  // the freed slot is ours to refill below
    }
    if (open_ < options_.max_connections) {
      ++open_;
      lock.unlock();
      auto connection = Connection::open(dsn_);
      if (!connection.ok()) {
        lock.lock();
        --open_;
        available_.notify_one();
        return connection.status();
      }
      return PooledConnection(shared_from_this(), *std::move(connection));
    }
    ++waiting_;
    const bool woke = available_.wait_until(
        lock, deadline, [&] { return !idle_.empty() || open_ < options_.max_connections; });
    --waiting_;
    if (!woke) {
      return absl::ResourceExhaustedError(strCat(
          "database connection pool exhausted: all ", options_.max_connections, " connections to ",
          dsn_.where(), " stayed in use for ", options_.acquire_timeout.count(),
          " ms (raise db.max_connections, or look for transactions held open too long)"));
    }
  }
}

void Pool::giveBack(std::unique_ptr<Connection> connection) {
  if (!connection->broken() && connection->inTransaction()) {
    // Whoever had it left a transaction open: its locks would be held until the next user
    // happened to end it, and that user's own statements would not commit by themselves.
    spdlog::error(
        "db: a connection came back to the pool with its transaction open (last "
        "statement: {}); rolled back",
        connection->lastStatement());
    if (!connection->execText("ROLLBACK").ok()) connection->discard();
  }
  std::lock_guard lock(mutex_);
  if (connection->broken()) {
    --open_;
    connection.reset();
  } else {
    idle_.push_back(std::move(connection));
  }
  available_.notify_one();
}

PoolStats Pool::stats() const {
  std::lock_guard lock(mutex_);
  return PoolStats{open_, idle_.size(), waiting_};
}

absl::StatusOr<uint64_t> Pool::execAlone(std::string_view sql, const Params& params) {
  return retryConflicts([&]() -> absl::StatusOr<uint64_t> {
    KRANE_ASSIGN_OR_RETURN(auto conn, acquire());
    return conn->exec(sql, params);
  });
}

absl::Status Pool::transact(std::string_view name,
                            const std::function<absl::Status(Connection&)>& body,
                            const TxOptions& options) {
  Backoff backoff(options.backoff);
  absl::Status last;
  for (int attempt = 1; attempt <= options.max_attempts; ++attempt) {
    if (attempt > 1) std::this_thread::sleep_for(backoff.next());
    auto connection = acquire();
    if (!connection.ok()) {
      last = connection.status();
      if (absl::IsUnavailable(last) && attempt < options.max_attempts) continue;
      return absl::Status(last.code(), strCat("transaction ", name, ": ", last.message()));
    }
    Connection& conn = **connection;
    absl::Status status;
    if (options.isolation != Isolation::kServerDefault) {
      status = conn.execText(options.isolation == Isolation::kReadCommitted
                                 ? "SET TRANSACTION ISOLATION LEVEL READ COMMITTED"
                                 : "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ");
    }
    if (status.ok()) status = conn.execText("START TRANSACTION");
    if (status.ok()) {
      try {
        status = body(conn);
      } catch (...) {
        // Nothing of a body that threw commits, and its connection does not go back to the pool
        // with the transaction open: its locks would be held until the connection's next user
        // happened to end it (a workflow step's signals are thrown through its transaction).
        if (conn.broken() || !conn.execText("ROLLBACK").ok()) conn.discard();
        throw;
      }
    }
    if (status.ok()) {
      status = conn.execText("COMMIT");
      if (status.ok()) return absl::OkStatus();
      if (isConnectionLoss(mysqlErrno(status))) {
        return absl::UnavailableError(
            strCat("transaction ", name,
                   ": connection lost during COMMIT, so it may or may not have "
                   "been applied: ",
                   status.message()));
      }
    }
    if (!conn.broken()) {
      if (!conn.execText("ROLLBACK").ok()) {
        spdlog::warn("db: rollback of transaction {} failed; discarding its connection", name);
        conn.discard();
      }
    }
    const bool retryable =
        isTransactionConflict(status) || (conn.broken() && isConnectionLoss(mysqlErrno(status)));
    if (!retryable) return status;
    last = status;
    spdlog::info("db: retrying transaction name={} attempt={} errno={} reason=\"{}\"", name,
                 attempt, mysqlErrno(status), status.message());
  }
  return absl::Status(last.code(), strCat("transaction ", name, " gave up after ",
                                          options.max_attempts, " attempts: ", last.message()));
}

}  // namespace krane::db
