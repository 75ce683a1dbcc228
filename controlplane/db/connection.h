// One MySQL / MariaDB session over the C client library (MariaDB Connector/C or libmysqlclient).
#pragma once

#include <chrono>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "controlplane/db/dsn.h"
#include "controlplane/db/value.h"

struct st_mysql;
struct st_mysql_stmt;

namespace krane::db {

// A session. Every statement with values goes through a prepared statement with typed binding
// (prepared once per connection and cached: the kMaxPreparedStatements used last). Not thread-safe:
// one thread uses a connection at a time, which the Pool guarantees. After a connection-loss error
// the connection is `broken()` and must be discarded; it never reconnects by itself (that would
// silently drop session state).
class Connection {
 public:
  static absl::StatusOr<std::unique_ptr<Connection>> open(const Dsn& dsn);
  // Prepared statements kept per connection. Statements whose text varies (an IN list of n
  // placeholders) would otherwise pile up without end, and the server refuses to prepare any
  // more past max_prepared_stmt_count (16,382 by default) for all its clients together.
  static constexpr size_t kMaxPreparedStatements = 128;
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Runs a statement that returns no rows; returns the number of affected rows.
  absl::StatusOr<uint64_t> exec(std::string_view sql, const Params& params = {});
  // Runs a query and collects all rows.
  absl::StatusOr<ResultSet> query(std::string_view sql, const Params& params = {});
  // Runs a query, handing rows to `on_row` one at a time; stops at the first error it returns.
  absl::Status queryEach(std::string_view sql, const Params& params,
                         const std::function<absl::Status(const Row&)>& on_row);
  // Runs SQL text that takes no values (DDL, session settings, transaction control).
  absl::Status execText(std::string_view sql);

  uint64_t lastInsertId() const { return last_insert_id_; }
  absl::Status ping();
  bool broken() const { return broken_; }
  // Marks the session unusable (its state is unknown); the pool closes it instead of reusing it.
  void discard() { broken_ = true; }
  const Dsn& dsn() const { return dsn_; }
  // Server-side id of this session (CONNECTION_ID()), for tests and diagnostics.
  uint64_t threadId() const;
  // Whether a transaction is open, as the server said in its last answer (no round trip).
  bool inTransaction() const;
  // The last statement run, for diagnostics.
  const std::string& lastStatement() const { return last_sql_; }

  std::chrono::steady_clock::time_point lastUsed() const { return last_used_; }
  void touch() { last_used_ = std::chrono::steady_clock::now(); }

 private:
  explicit Connection(Dsn dsn, st_mysql* handle);
  absl::StatusOr<st_mysql_stmt*> prepared(std::string_view sql);
  absl::Status fail(st_mysql_stmt* stmt, std::string_view sql);
  // After an execute or a read of rows failed: the statement ready for its next run (libmariadb
  // would otherwise wait for rows of the failed one), or the connection marked broken.
  void resetAfterFailure(st_mysql_stmt* stmt);
  absl::Status run(std::string_view sql, const Params& params,
                   const std::function<absl::Status(const Row&)>* on_row, uint64_t* affected);

  Dsn dsn_;
  st_mysql* handle_;
  // Most recently used first.
  std::list<std::pair<std::string, st_mysql_stmt*>> statements_;
  std::unordered_map<std::string_view, std::list<std::pair<std::string, st_mysql_stmt*>>::iterator>
      statement_index_;
  uint64_t last_insert_id_ = 0;
  std::string last_sql_;
  bool broken_ = false;
  std::chrono::steady_clock::time_point last_used_ = std::chrono::steady_clock::now();
};

}  // namespace krane::db
