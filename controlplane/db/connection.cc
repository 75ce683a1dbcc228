#include "controlplane/db/connection.h"

#include <cstring>

#include <mysql/mysql.h>

#include "common/strings.h"
#include "controlplane/db/errors.h"

namespace krane::db {
namespace {

// A bound result column: where the client library writes one cell of the current row.
struct ResultBuffer {
  enum class Kind { kSigned, kUnsigned, kDouble, kBytes } kind = Kind::kBytes;
  bool binary = false;
  int64_t integer = 0;
  double real = 0;
  std::string bytes;
  unsigned long length = 0;
  my_bool is_null = 0;
  my_bool error = 0;
};

bool isIntegerType(enum_field_types t) {
  switch (t) {
    case MYSQL_TYPE_TINY:
    case MYSQL_TYPE_SHORT:
    case MYSQL_TYPE_INT24:
    case MYSQL_TYPE_LONG:
    case MYSQL_TYPE_LONGLONG:
    case MYSQL_TYPE_YEAR:
    case MYSQL_TYPE_BIT:
      return true;
    default:
      return false;
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<Connection>> Connection::open(const Dsn& dsn) {
  MYSQL* handle = mysql_init(nullptr);
  if (handle == nullptr) return absl::ResourceExhaustedError("mysql_init: out of memory");
  const unsigned connect_timeout = static_cast<unsigned>(dsn.connect_timeout.count());
  const unsigned read_timeout = static_cast<unsigned>(dsn.read_timeout.count());
  const unsigned write_timeout = static_cast<unsigned>(dsn.write_timeout.count());
  my_bool reconnect = 0;
  mysql_options(handle, MYSQL_OPT_CONNECT_TIMEOUT, &connect_timeout);
  mysql_options(handle, MYSQL_OPT_READ_TIMEOUT, &read_timeout);
  mysql_options(handle, MYSQL_OPT_WRITE_TIMEOUT, &write_timeout);
  mysql_options(handle, MYSQL_OPT_RECONNECT, &reconnect);
  mysql_options(handle, MYSQL_SET_CHARSET_NAME, "utf8mb4");
  if (dsn.socket.empty()) {
    const unsigned protocol = MYSQL_PROTOCOL_TCP;
    mysql_options(handle, MYSQL_OPT_PROTOCOL, &protocol);
  }
  if (mysql_real_connect(
          handle, dsn.socket.empty() ? dsn.host.c_str() : nullptr, dsn.user.c_str(),
          dsn.password.c_str(), dsn.database.c_str(), dsn.socket.empty() ? dsn.port : 0,
          dsn.socket.empty() ? nullptr : dsn.socket.c_str(), CLIENT_FOUND_ROWS) == nullptr) {
    const int e = static_cast<int>(mysql_errno(handle));
    std::string message = strCat("cannot connect to MySQL at ", dsn.where(), " as ", dsn.user, ": ",
                                 mysql_error(handle), " (mysql error ", e, ")");
    mysql_close(handle);
    if (e == 1045) {
      return absl::PermissionDeniedError(
          strCat(message, ": check the user and password in the DSN"));
    }
    if (e == 1049) {
      return absl::NotFoundError(strCat(message, ": create the database first"));
    }
    return absl::UnavailableError(strCat(message, ": is the server running and reachable?"));
  }
  auto connection = std::unique_ptr<Connection>(new Connection(dsn, handle));
  // Strict mode everywhere so bad values fail instead of being truncated, and UTC timestamps.
  if (auto st = connection->execText(
          "SET SESSION sql_mode = 'STRICT_ALL_TABLES,NO_ZERO_DATE,NO_ZERO_IN_DATE,"
          "ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION', time_zone = '+00:00'");
      !st.ok()) {
    return st;
  }
  return connection;
}

Connection::Connection(Dsn dsn, MYSQL* handle) : dsn_(std::move(dsn)), handle_(handle) {}

Connection::~Connection() {
  for (auto& [sql, stmt] : statements_) mysql_stmt_close(stmt);
  mysql_close(handle_);
}

uint64_t Connection::threadId() const { return mysql_thread_id(handle_); }

bool Connection::inTransaction() const {
  unsigned int status = 0;
  if (mariadb_get_infov(handle_, MARIADB_CONNECTION_SERVER_STATUS, &status) != 0) return false;
  return (status & SERVER_STATUS_IN_TRANS) != 0;
}

absl::Status Connection::ping() {
  touch();
  if (broken_) return absl::UnavailableError("connection is broken");
  if (mysql_ping(handle_) != 0) {
    broken_ = true;
    return statementError(static_cast<int>(mysql_errno(handle_)), mysql_sqlstate(handle_),
                          mysql_error(handle_), "ping");
  }
  return absl::OkStatus();
}

absl::Status Connection::execText(std::string_view sql) {
  touch();
  last_sql_.assign(sql.substr(0, 200));
  if (broken_) return absl::UnavailableError("connection is broken");
  auto failed = [&] {
    const int e = static_cast<int>(mysql_errno(handle_));
    if (isConnectionLoss(e)) broken_ = true;
    return statementError(e, mysql_sqlstate(handle_), mysql_error(handle_), sql);
  };
  if (mysql_real_query(handle_, sql.data(), sql.size()) != 0) return failed();
  // Drain any result so the connection stays usable; an error may come in place of the rows.
  int more = 0;
  do {
    if (MYSQL_RES* result = mysql_store_result(handle_)) {
      mysql_free_result(result);
    } else if (mysql_errno(handle_) != 0) {
      return failed();
    }
  } while ((more = mysql_next_result(handle_)) == 0);
  if (more > 0) return failed();
  last_insert_id_ = mysql_insert_id(handle_);
  return absl::OkStatus();
}

absl::StatusOr<MYSQL_STMT*> Connection::prepared(std::string_view sql) {
  if (auto it = statement_index_.find(sql); it != statement_index_.end()) {
    statements_.splice(statements_.begin(), statements_, it->second);
    return it->second->second;
  }
  MYSQL_STMT* stmt = mysql_stmt_init(handle_);
  if (stmt == nullptr) return absl::ResourceExhaustedError("mysql_stmt_init: out of memory");
  if (mysql_stmt_prepare(stmt, sql.data(), sql.size()) != 0) {
    absl::Status status = fail(stmt, sql);
    mysql_stmt_close(stmt);
    return status;
  }
  statements_.emplace_front(std::string(sql), stmt);
  statement_index_.emplace(statements_.front().first, statements_.begin());
  if (statements_.size() > kMaxPreparedStatements) {
    // The least recently used. A statement whose rows are being handed out is the one used last
    // (or close to it), so never this one.
    auto& [old_sql, old_stmt] = statements_.back();
    statement_index_.erase(old_sql);
    mysql_stmt_close(old_stmt);
    statements_.pop_back();
  }
  return stmt;
}

absl::Status Connection::fail(MYSQL_STMT* stmt, std::string_view sql) {
  const int e = static_cast<int>(mysql_stmt_errno(stmt));
  if (isConnectionLoss(e)) broken_ = true;
  return statementError(e, mysql_stmt_sqlstate(stmt), mysql_stmt_error(stmt), sql);
}

void Connection::resetAfterFailure(MYSQL_STMT* stmt) {
  if (broken_) return;
  // A reset that fails (the session was killed in between) leaves the statement unusable: the
  // connection is given up rather than handed to its next user.
  if (mysql_stmt_reset(stmt) != 0) broken_ = true;
}

absl::StatusOr<uint64_t> Connection::exec(std::string_view sql, const Params& params) {
  uint64_t affected = 0;
  if (auto st = run(sql, params, nullptr, &affected); !st.ok()) return st;
  return affected;
}

absl::StatusOr<ResultSet> Connection::query(std::string_view sql, const Params& params) {
  ResultSet result;
  std::function<absl::Status(const Row&)> collect = [&](const Row& row) {
    result.rows.push_back(row);
    return absl::OkStatus();
  };
  uint64_t affected = 0;
  if (auto st = run(sql, params, &collect, &affected); !st.ok()) return st;
  return result;
}

absl::Status Connection::queryEach(std::string_view sql, const Params& params,
                                   const std::function<absl::Status(const Row&)>& on_row) {
  uint64_t affected = 0;
  return run(sql, params, &on_row, &affected);
}

absl::Status Connection::run(std::string_view sql, const Params& params,
                             const std::function<absl::Status(const Row&)>* on_row,
                             uint64_t* affected) {
  touch();
  last_sql_.assign(sql.substr(0, 200));
  if (broken_) return absl::UnavailableError("connection is broken");
  auto prepared_stmt = prepared(sql);
  if (!prepared_stmt.ok()) return prepared_stmt.status();
  MYSQL_STMT* stmt = *prepared_stmt;

  const unsigned long expected = mysql_stmt_param_count(stmt);
  if (expected != params.size()) {
    return absl::InvalidArgumentError(strCat("statement \"", sql, "\" takes ", expected,
                                             " parameters, ", params.size(), " given"));
  }
  std::vector<MYSQL_BIND> binds(params.size());
  std::vector<unsigned long> lengths(params.size());
  std::memset(binds.data(), 0, sizeof(MYSQL_BIND) * binds.size());
  for (size_t i = 0; i < params.size(); ++i) {
    MYSQL_BIND& b = binds[i];
    std::visit(
        [&](const auto& v) {
          using T = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<T, std::monostate>) {
            b.buffer_type = MYSQL_TYPE_NULL;
          } else if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, uint64_t>) {
            b.buffer_type = MYSQL_TYPE_LONGLONG;
            b.buffer = const_cast<T*>(&v);
            b.is_unsigned = std::is_same_v<T, uint64_t>;
          } else if constexpr (std::is_same_v<T, double>) {
            b.buffer_type = MYSQL_TYPE_DOUBLE;
            b.buffer = const_cast<double*>(&v);
          } else if constexpr (std::is_same_v<T, std::string>) {
            b.buffer_type = MYSQL_TYPE_STRING;
            b.buffer = const_cast<char*>(v.data());
            lengths[i] = v.size();
            b.buffer_length = v.size();
            b.length = &lengths[i];
          } else {
            b.buffer_type = MYSQL_TYPE_BLOB;
            b.buffer = const_cast<char*>(v.bytes.data());
            lengths[i] = v.bytes.size();
            b.buffer_length = v.bytes.size();
            b.length = &lengths[i];
          }
        },
        params[i].storage());
  }
  if (!binds.empty() && mysql_stmt_bind_param(stmt, binds.data()) != 0) return fail(stmt, sql);
  if (mysql_stmt_execute(stmt) != 0) {
    absl::Status status = fail(stmt, sql);
    resetAfterFailure(stmt);
    return status;
  }

  MYSQL_RES* meta = mysql_stmt_result_metadata(stmt);
  if (meta == nullptr) {
    *affected = mysql_stmt_affected_rows(stmt);
    last_insert_id_ = mysql_stmt_insert_id(stmt);
    if (on_row != nullptr && mysql_stmt_field_count(stmt) == 0) {
      // A query that returns no result set at all (not even an empty one) is a caller mistake.
      return absl::InvalidArgumentError(
          strCat("statement \"", sql, "\" returns no rows; use exec()"));
    }
    return absl::OkStatus();
  }
  struct MetaGuard {
    MYSQL_RES* meta;
    MYSQL_STMT* stmt;
    ~MetaGuard() {
      mysql_free_result(meta);
      mysql_stmt_free_result(stmt);
    }
  } guard{meta, stmt};

  my_bool update_max_length = 1;
  mysql_stmt_attr_set(stmt, STMT_ATTR_UPDATE_MAX_LENGTH, &update_max_length);
  if (mysql_stmt_store_result(stmt) != 0) {
    // An error in place of the rows (a lock wait timeout or deadlock of a locking read that
    // scans) leaves libmariadb's statement waiting for rows: its next execute would read until
    // the read timeout and then drop the connection. Reset, as after a failed execute.
    absl::Status status = fail(stmt, sql);
    resetAfterFailure(stmt);
    return status;
  }

  const unsigned columns = mysql_num_fields(meta);
  MYSQL_FIELD* fields = mysql_fetch_fields(meta);
  auto names = std::make_shared<Columns>();
  std::vector<ResultBuffer> buffers(columns);
  std::vector<MYSQL_BIND> out(columns);
  std::memset(out.data(), 0, sizeof(MYSQL_BIND) * out.size());
  for (unsigned c = 0; c < columns; ++c) {
    names->names.emplace_back(fields[c].name, fields[c].name_length);
    ResultBuffer& buf = buffers[c];
    MYSQL_BIND& b = out[c];
    if (isIntegerType(fields[c].type) && fields[c].type != MYSQL_TYPE_BIT) {
      buf.kind = (fields[c].flags & UNSIGNED_FLAG) ? ResultBuffer::Kind::kUnsigned
                                                   : ResultBuffer::Kind::kSigned;
      b.buffer_type = MYSQL_TYPE_LONGLONG;
      b.buffer = &buf.integer;
      b.is_unsigned = static_cast<my_bool>(buf.kind == ResultBuffer::Kind::kUnsigned);
    } else if (fields[c].type == MYSQL_TYPE_FLOAT || fields[c].type == MYSQL_TYPE_DOUBLE) {
      buf.kind = ResultBuffer::Kind::kDouble;
      b.buffer_type = MYSQL_TYPE_DOUBLE;
      b.buffer = &buf.real;
    } else {
      buf.kind = ResultBuffer::Kind::kBytes;
      buf.binary =
          fields[c].charsetnr == 63 &&
          (fields[c].type == MYSQL_TYPE_BLOB || fields[c].type == MYSQL_TYPE_TINY_BLOB ||
           fields[c].type == MYSQL_TYPE_MEDIUM_BLOB || fields[c].type == MYSQL_TYPE_LONG_BLOB ||
           fields[c].type == MYSQL_TYPE_STRING || fields[c].type == MYSQL_TYPE_VAR_STRING);
      buf.bytes.resize(std::max<unsigned long>(fields[c].max_length, 64) + 1);
      b.buffer_type = MYSQL_TYPE_STRING;
      b.buffer = buf.bytes.data();
      b.buffer_length = buf.bytes.size();
    }
    b.length = &buf.length;
    b.is_null = &buf.is_null;
    b.error = &buf.error;
  }
  if (mysql_stmt_bind_result(stmt, out.data()) != 0) return fail(stmt, sql);

  for (;;) {
    const int rc = mysql_stmt_fetch(stmt);
    if (rc == MYSQL_NO_DATA) break;
    if (rc == 1) return fail(stmt, sql);
    if (on_row == nullptr) continue;
    std::vector<Value> values;
    values.reserve(columns);
    for (unsigned c = 0; c < columns; ++c) {
      ResultBuffer& buf = buffers[c];
      if (buf.is_null) {
        values.emplace_back();
        continue;
      }
      switch (buf.kind) {
        case ResultBuffer::Kind::kSigned:
          values.emplace_back(buf.integer);
          break;
        case ResultBuffer::Kind::kUnsigned:
          values.emplace_back(static_cast<uint64_t>(buf.integer));
          break;
        case ResultBuffer::Kind::kDouble:
          values.emplace_back(buf.real);
          break;
        case ResultBuffer::Kind::kBytes: {
          std::string cell;
          if (buf.length > buf.bytes.size()) {
            // Longer than the stored maximum predicted: fetch this cell again in full.
            cell.resize(buf.length);
            MYSQL_BIND again;
            std::memset(&again, 0, sizeof(again));
            again.buffer_type = MYSQL_TYPE_STRING;
            again.buffer = cell.data();
            again.buffer_length = cell.size();
            if (mysql_stmt_fetch_column(stmt, &again, c, 0) != 0) return fail(stmt, sql);
          } else {
            cell.assign(buf.bytes.data(), buf.length);
          }
          if (buf.binary) {
            values.emplace_back(Blob{std::move(cell)});
          } else {
            values.emplace_back(std::move(cell));
          }
          break;
        }
      }
    }
    if (auto st = (*on_row)(Row(names, std::move(values))); !st.ok()) return st;
  }
  *affected = mysql_stmt_num_rows(stmt);
  return absl::OkStatus();
}

}  // namespace krane::db
