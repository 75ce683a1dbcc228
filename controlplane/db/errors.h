// How MySQL failures are classified, so callers can decide to retry without parsing text.
#pragma once

#include "absl/status/status.h"

namespace krane::db {

// The server's or client library's error number carried by a status from this module, 0 if none.
int mysqlErrno(const absl::Status& status);

// Deadlock (1213) or lock wait timeout (1205): the transaction was rolled back and may be retried.
bool isTransactionConflict(const absl::Status& status);

// The connection is gone (server restarted, network cut, killed): the connection is unusable and
// whatever transaction it held was rolled back by the server.
bool isConnectionLoss(int mysql_errno);

// Builds the status for a failed statement: code from the error number, message naming the
// statement (abbreviated) and the server's own words.
absl::Status statementError(int mysql_errno, const char* sqlstate, const char* message,
                            std::string_view sql);

}  // namespace krane::db
