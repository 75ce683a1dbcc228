#include "controlplane/db/errors.h"

#include <charconv>
#include <string>

#include "absl/strings/cord.h"
#include "common/strings.h"

namespace krane::db {
namespace {

constexpr absl::string_view kErrnoPayload = "krane.dev/mysql-errno";

std::string abbreviate(std::string_view sql) {
  std::string out;
  bool space = false;
  for (char c : sql) {
    if (c == '\n' || c == '\t' || c == '\r' || c == ' ') {
      space = !out.empty();
      continue;
    }
    if (space) out.push_back(' ');
    space = false;
    out.push_back(c);
    if (out.size() > 120) {
      out += "...";
      break;
    }
  }
  return out;
}

}  // namespace

int mysqlErrno(const absl::Status& status) {
  auto payload = status.GetPayload(kErrnoPayload);
  if (!payload) return 0;
  const std::string text(*payload);
  int value = 0;
  std::from_chars(text.data(), text.data() + text.size(), value);
  return value;
}

bool isTransactionConflict(const absl::Status& status) {
  const int e = mysqlErrno(status);
  return e == 1213 || e == 1205;
}

bool isConnectionLoss(int e) {
  switch (e) {
    case 1053:  // ER_SERVER_SHUTDOWN
    case 1927:  // ER_CONNECTION_KILLED (MariaDB)
    case 2002:  // CR_CONNECTION_ERROR
    case 2003:  // CR_CONN_HOST_ERROR
    case 2006:  // CR_SERVER_GONE_ERROR
    case 2013:  // CR_SERVER_LOST
    case 2055:  // CR_SERVER_LOST_EXTENDED
    case 4031:  // ER_CLIENT_INTERACTION_TIMEOUT (MySQL 8)
      return true;
    default:
      return false;
  }
}

absl::Status statementError(int e, const char* sqlstate, const char* message,
                            std::string_view sql) {
  absl::StatusCode code = absl::StatusCode::kInternal;
  if (e == 1213 || e == 1205) {
    code = absl::StatusCode::kAborted;
  } else if (isConnectionLoss(e)) {
    code = absl::StatusCode::kUnavailable;
  } else if (e == 1062) {
    code = absl::StatusCode::kAlreadyExists;
  } else if (e == 1451 || e == 1452) {
    code = absl::StatusCode::kFailedPrecondition;
  }
  absl::Status status(code, strCat("mysql error ", e, " (", sqlstate ? sqlstate : "HY000",
                                   ") in \"", abbreviate(sql), "\": ", message ? message : ""));
  status.SetPayload(kErrnoPayload, absl::Cord(std::to_string(e)));
  return status;
}

}  // namespace krane::db
