#include "controlplane/workflow/finish_writer.h"

#include <algorithm>
#include <set>
#include <string_view>

#include "common/clock.h"
#include "common/status.h"
#include "common/strings.h"
#include "controlplane/db/errors.h"
#include "controlplane/workflow/statements.h"

namespace krane::workflow {

FinishWriter::FinishWriter(db::Pool& pool)
    : pool_(pool),
      group_(kWriters, kMaxBatchBytes, &FinishWriter::weight,
             [this](const std::vector<Request*>& batch) { write(batch); }) {}

size_t FinishWriter::weight(const Request& request) {
  size_t bytes = 256;
  if (const auto* blob = std::get_if<db::Blob>(&request.output.storage()))
    bytes += blob->bytes.size();
  if (const auto* text = std::get_if<std::string>(&request.error_message.storage())) {
    bytes += text->size();
  }
  return std::max(bytes, kMaxBatchBytes / kMaxFinishes);
}

void FinishWriter::finish(Request& request) { group_.submit(request); }

void FinishWriter::write(const std::vector<Request*>& batch) {
  const int64_t now = unixMillis();
  // One statement for distinct invocations: `CASE id` gives a row one request's values. The
  // same invocation twice (an execution and the one that took over from it, for a moment) goes
  // alone, after.
  std::vector<Request*> group;
  std::vector<Request*> alone;
  std::set<std::string_view> ids;
  for (Request* r : batch) {
    (ids.insert(r->invocation_id).second ? group : alone).push_back(r);
  }
  if (group.size() == 1) {
    writeOne(*group[0], now);
  } else {
    writeGroup(group, now);
  }
  for (Request* r : alone) writeOne(*r, now);
}

void FinishWriter::writeOne(Request& r, int64_t now) {
  static const std::string kFinish =
      strCat(statements::kFinishPrefix, "id = ? AND lease_token = ?");
  auto changed = pool_.execAlone(kFinish, {r.status, r.output, r.error_code, r.error_message,
                                           r.attempts, now, now, r.invocation_id, r.token});
  counts_.add(1, changed.ok() ? *changed : 0);
  if (!changed.ok()) {
    r.result = changed.status();
  } else {
    r.result = *changed != 0;
  }
}

void FinishWriter::writeGroup(const std::vector<Request*>& group, int64_t now) {
  // A power of two of rows: a few statement texts, each prepared once per connection. The
  // padding repeats the first request (the first WHEN that matches decides, and its fence pair
  // changes no other row).
  const size_t n = db::paddedListSize(group.size(), 2);
  auto at = [&](size_t i) -> const Request& { return *group[i < group.size() ? i : 0]; };
  db::Params params;
  params.reserve(n * 12 + 2);
  for (size_t i = 0; i < n; ++i) params.insert(params.end(), {at(i).invocation_id, at(i).status});
  for (size_t i = 0; i < n; ++i) params.insert(params.end(), {at(i).invocation_id, at(i).output});
  for (size_t i = 0; i < n; ++i) {
    params.insert(params.end(), {at(i).invocation_id, at(i).error_code});
  }
  for (size_t i = 0; i < n; ++i) {
    params.insert(params.end(), {at(i).invocation_id, at(i).error_message});
  }
  for (size_t i = 0; i < n; ++i) {
    params.insert(params.end(), {at(i).invocation_id, at(i).attempts});
  }
  params.insert(params.end(), {now, now});
  for (size_t i = 0; i < n; ++i) params.insert(params.end(), {at(i).invocation_id, at(i).token});
  std::string built;
  const std::string& sql =
      statements::groupText<statements::fencedFinishGroup, kMaxFinishes>(n, &built);
  auto changed = pool_.execAlone(sql, params);
  counts_.add(1, changed.ok() ? *changed : 0);
  if (!changed.ok()) {
    const int code = db::mysqlErrno(changed.status());
    if (code != 0 && !db::isConnectionLoss(code) && !db::isTransactionConflict(changed.status())) {
      // The server refused the statement, and with it every row (one request's value, say): each
      // goes alone, so that only the one at fault fails.
      for (Request* r : group) writeOne(*r, now);
      return;
    }
    // Not sent, or its answer lost: whether it was applied is unknown, for every request.
    for (Request* r : group) r->result = changed.status();
    return;
  }
  for (Request* r : group) r->result = true;
  if (*changed == group.size()) return;
  // Some were fenced. Both this finish and a takeover add one to the token: a row this
  // statement ended has the request's status, no lease owner and this finished_at; a takeover
  // leaves the row running with an owner, and its own end adds one more.
  db::Params group_ids;
  for (const Request* r : group) group_ids.emplace_back(r->invocation_id);
  db::Params id_params;
  const std::string in = db::appendInList(id_params, group_ids);
  auto rows = [&]() -> absl::StatusOr<db::ResultSet> {
    KRANE_ASSIGN_OR_RETURN(auto conn, pool_.acquire());
    return conn->query(strCat("SELECT id, lease_token, status, finished_at,"
                              " lease_owner IS NULL AS unowned FROM workflow_invocations"
                              " WHERE id IN (",
                              in, ")"),
                       id_params);
  }();
  if (!rows.ok()) {
    // Which ones ended is unknown: as after a lost answer to a single finish.
    for (Request* r : group) {
      r->result = absl::UnavailableError(
          strCat("invocation may or may not have been finished: ", rows.status().message()));
    }
    return;
  }
  for (Request* r : group) {
    bool ended = false;
    for (const db::Row& row : rows->rows) {
      ended = ended || (row.str("id") == r->invocation_id &&
                        row.i64("lease_token") == r->token + 1 && row.str("status") == r->status &&
                        row.optI64("finished_at") == now && row.i64("unowned") != 0);
    }
    r->result = ended;
  }
}

}  // namespace krane::workflow
