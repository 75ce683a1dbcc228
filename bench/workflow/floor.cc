#include "bench/workflow/floor.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "common/strings.h"
#include "controlplane/workflow/operations.h"
#include "controlplane/workflow/statements.h"

namespace krane::bench {
namespace {

namespace statements = workflow::statements;

constexpr int64_t kLeaseMs = 30000;

absl::Status expectChanged(absl::StatusOr<uint64_t> changed, uint64_t want, std::string_view what) {
  if (!changed.ok()) return changed.status();
  if (*changed != want) {
    return absl::InternalError(strCat(what, " changed ", *changed, " rows, not ", want));
  }
  return absl::OkStatus();
}

absl::Status claim(db::Connection& conn, const std::vector<std::string>& ids, int64_t now) {
  db::Params params = {"floor", now + kLeaseMs, now + kLeaseMs, now, now};
  params.insert(params.end(), ids.begin(), ids.end());
  return expectChanged(
      conn.exec(strCat(statements::kClaimPrefix, db::placeholders(ids.size()), ")"), params),
      ids.size(), "claim");
}

// Finishes the invocations `ids`, claimed with lease token `token`: one statement each, or one
// for all.
absl::Status finish(db::Connection& conn, const std::vector<std::string>& ids, int64_t token,
                    bool grouped, int64_t now) {
  const db::Params succeeded = {"succeeded", db::Blob{"ok"}, db::Value(), db::Value(), 0, now, now};
  if (grouped) {
    db::Params params = succeeded;
    params.insert(params.end(), ids.begin(), ids.end());
    params.emplace_back(token);
    return expectChanged(conn.exec(strCat(statements::kFinishPrefix, "id IN (",
                                          db::placeholders(ids.size()), ") AND lease_token = ?"),
                                   params),
                         ids.size(), "finish");
  }
  for (const std::string& id : ids) {
    db::Params params = succeeded;
    params.insert(params.end(), {id, token});
    KRANE_RETURN_IF_ERROR(expectChanged(
        conn.exec(strCat(statements::kFinishPrefix, "id = ? AND lease_token = ?"), params), 1,
        "finish"));
  }
  return absl::OkStatus();
}

// Journal entry `seq` of each of `ids`, fenced on the lease token as the engine's journal writer
// does (the insert reads the invocation row FOR UPDATE): one statement each, or one for all.
absl::Status journal(db::Connection& conn, const std::vector<std::string>& ids, int seq,
                     std::string_view kind, int64_t token, bool grouped, int64_t now) {
  const std::string name = strCat(kind, seq);
  if (grouped) {
    const std::string select =
        strCat("INSERT INTO workflow_journal (", statements::kJournalColumns,
               ") SELECT id, ?, ?, ?, 1, ?, NULL, NULL, 0, ? FROM workflow_invocations WHERE ");
    db::Params params = {seq, kind, name, db::Blob{"ok"}, now};
    params.insert(params.end(), ids.begin(), ids.end());
    params.emplace_back(token);
    return expectChanged(conn.exec(strCat(select, "id IN (", db::placeholders(ids.size()),
                                          ") AND lease_token = ? FOR UPDATE"),
                                   params),
                         ids.size(), "journal");
  }
  for (const std::string& id : ids) {
    KRANE_RETURN_IF_ERROR(expectChanged(
        conn.exec(statements::kFencedJournalInsert, {id, seq, kind, name, 1, db::Blob{"ok"},
                                                     db::Value(), db::Value(), 0, now, id, token}),
        1, "journal"));
  }
  return absl::OkStatus();
}

// Settles the awakeables `promises` and wakes their invocations: each with the engine's settle
// (controlplane/workflow/operations.h), or all in one statement of the same shape.
absl::Status settle(db::Pool& pool, db::Connection& conn, const std::vector<std::string>& promises,
                    bool grouped, int64_t now) {
  if (!grouped) {
    for (const std::string& p : promises) {
      KRANE_RETURN_IF_ERROR(workflow::settleAwakeable(pool, p, std::string("ok")));
    }
    return absl::OkStatus();
  }
  std::string rows;
  db::Params params;
  for (const std::string& p : promises) {
    strAppend(&rows, rows.empty() ? "" : " UNION ALL ", "SELECT ? AS id");
    params.emplace_back(p);
  }
  params.insert(params.end(), {db::Blob{"ok"}, now, now, now});
  // Every invocation here waits on this one promise, so the owner's update is the wake-up.
  return expectChanged(
      conn.exec(strCat("UPDATE workflow_promises p JOIN (", rows,
                       ") v ON p.id = v.id JOIN workflow_invocations i ON i.id = p.invocation_id"
                       " SET p.state = 'resolved', p.payload = ?, p.error_code = NULL,"
                       " p.error_message = NULL, p.settled_at = ?, i.wake_seq = i.wake_seq + 1,"
                       " i.due_at = IF(i.status = 'suspended', ?, i.due_at),"
                       " i.status = IF(i.status = 'suspended', 'ready', i.status),"
                       " i.waiting_for = NULL, i.updated_at = ? WHERE p.state = 'pending'"),
                params),
      2 * promises.size(), "settle");
}

// Runs `work` for the items [0, n) from `threads` threads, each taking groups of `group`
// consecutive items of its own stripe, on a connection of its own; returns the seconds.
absl::StatusOr<double> runGroups(
    db::Pool& pool, int n, const FloorOptions& options,
    const std::function<absl::Status(db::Connection&, int first, int count)>& work) {
  std::mutex mutex;
  absl::Status first_error;
  std::vector<std::thread> ts;
  const int stripe = (n + options.threads - 1) / options.threads;
  const auto start = std::chrono::steady_clock::now();
  for (int t = 0; t < options.threads; ++t) {
    ts.emplace_back([&, t] {
      absl::Status s = [&]() -> absl::Status {
        KRANE_ASSIGN_OR_RETURN(auto conn, pool.acquire());
        const int end = std::min(n, (t + 1) * stripe);
        for (int i = t * stripe; i < end; i += options.group) {
          KRANE_RETURN_IF_ERROR(work(*conn, i, std::min(options.group, end - i)));
        }
        return absl::OkStatus();
      }();
      std::lock_guard lock(mutex);
      if (!s.ok() && first_error.ok()) first_error = s;
    });
  }
  for (auto& t : ts) t.join();
  KRANE_RETURN_IF_ERROR(first_error);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

absl::Status checkDone(db::Pool& pool, const std::string& prefix, int invocations, int entries) {
  KRANE_ASSIGN_OR_RETURN(auto conn, pool.acquire());
  KRANE_ASSIGN_OR_RETURN(
      auto rows, conn->query("SELECT (SELECT COUNT(*) FROM workflow_invocations WHERE id LIKE ?"
                             " AND status = 'succeeded'), (SELECT COUNT(*) FROM workflow_journal"
                             " WHERE invocation_id LIKE ?)",
                             {strCat(prefix, "%"), strCat(prefix, "%")}));
  if (rows.rows[0].i64(0) != invocations || rows.rows[0].i64(1) != entries) {
    return absl::InternalError(strCat("floor ", prefix, ": ", rows.rows[0].i64(0), " of ",
                                      invocations, " invocations succeeded, ", rows.rows[0].i64(1),
                                      " of ", entries, " journal entries"));
  }
  return absl::OkStatus();
}

std::vector<std::string> idsOf(const std::string& prefix, int first, int count,
                               std::string_view suffix = "") {
  std::vector<std::string> ids;
  for (int i = first; i < first + count; ++i) ids.push_back(strCat(prefix, i, suffix));
  return ids;
}

}  // namespace

absl::StatusOr<double> resumeFloorRate(db::Pool& pool, int n, const FloorOptions& options,
                                       const std::string& tag) {
  const std::string prefix = strCat("floor-resume-", tag, "-");
  {
    // Suspended as the engine leaves them: lease token 1 from their first claim.
    KRANE_ASSIGN_OR_RETURN(auto conn, pool.acquire());
    const int64_t now = unixMillis();
    const std::string seq = strCat("seq_0_to_", n - 1);
    KRANE_RETURN_IF_ERROR(
        conn->exec(strCat("INSERT INTO workflow_invocations (id, service, handler, exclusive,"
                          " status, input, lease_token, claims, created_at, started_at,"
                          " updated_at) SELECT CONCAT(?, seq), 'Floor', 'wait', 0, 'suspended',"
                          " '', 1, 1, ?, ?, ? FROM ",
                          seq),
                   {prefix, now, now, now})
            .status());
    KRANE_RETURN_IF_ERROR(conn->exec(strCat("INSERT INTO workflow_promises (id, invocation_id,"
                                            " kind, created_at) SELECT CONCAT(?, seq, '-a'),"
                                            " CONCAT(?, seq), 'awakeable', ? FROM ",
                                            seq),
                                     {prefix, prefix, now})
                              .status());
  }
  KRANE_ASSIGN_OR_RETURN(
      double seconds, runGroups(pool, n, options, [&](db::Connection& conn, int first, int count) {
        const std::vector<std::string> ids = idsOf(prefix, first, count);
        KRANE_RETURN_IF_ERROR(settle(pool, conn, idsOf(prefix, first, count, "-a"),
                                     options.grouped && !options.callers_one_by_one, unixMillis()));
        KRANE_RETURN_IF_ERROR(claim(conn, ids, unixMillis()));
        KRANE_RETURN_IF_ERROR(journal(conn, ids, 2, "await", 2, options.grouped, unixMillis()));
        return finish(conn, ids, 2, options.grouped, unixMillis());
      }));
  KRANE_RETURN_IF_ERROR(checkDone(pool, prefix, n, n));
  KRANE_ASSIGN_OR_RETURN(auto conn, pool.acquire());
  KRANE_ASSIGN_OR_RETURN(auto rows, conn->query("SELECT COUNT(*) FROM workflow_promises WHERE id"
                                                " LIKE ? AND state = 'resolved' AND payload = 'ok'",
                                                {strCat(prefix, "%")}));
  if (rows.rows[0].i64(0) != n) {
    return absl::InternalError(
        strCat("floor ", prefix, ": ", rows.rows[0].i64(0), " of ", n, " promises resolved"));
  }
  return n / seconds;
}

absl::StatusOr<double> stepFloorRate(db::Pool& pool, int n, const FloorOptions& options,
                                     const std::string& tag) {
  const std::string prefix = strCat("floor-steps-", tag, "-");
  KRANE_ASSIGN_OR_RETURN(
      double seconds, runGroups(pool, n, options, [&](db::Connection& conn, int first, int count) {
        const std::vector<std::string> ids = idsOf(prefix, first, count);
        const int64_t now = unixMillis();
        const std::string insert =
            "INSERT INTO workflow_invocations (id, service, handler, exclusive, status, input,"
            " due_at, created_at, updated_at) VALUES ";
        if (options.grouped && !options.callers_one_by_one) {
          std::string values;
          db::Params params;
          for (const std::string& id : ids) {
            strAppend(&values, values.empty() ? "" : ",",
                      "(?, 'Floor', 'run', 0, 'ready', ?, ?, ?, ?)");
            params.insert(params.end(), {id, db::Blob{""}, now, now, now});
          }
          KRANE_RETURN_IF_ERROR(
              expectChanged(conn.exec(strCat(insert, values), params), ids.size(), "send"));
        } else {
          for (const std::string& id : ids) {
            KRANE_RETURN_IF_ERROR(expectChanged(
                conn.exec(strCat(insert, "(?, 'Floor', 'run', 0, 'ready', ?, ?, ?, ?)"),
                          {id, db::Blob{""}, now, now, now}),
                1, "send"));
          }
        }
        KRANE_RETURN_IF_ERROR(claim(conn, ids, unixMillis()));
        if (options.grouped) {
          for (int step = 0; step < 5; ++step) {
            KRANE_RETURN_IF_ERROR(journal(conn, ids, step, "step", 1, true, unixMillis()));
          }
        } else {
          for (const std::string& id : ids) {
            for (int step = 0; step < 5; ++step) {
              KRANE_RETURN_IF_ERROR(journal(conn, {id}, step, "step", 1, false, unixMillis()));
            }
          }
        }
        return finish(conn, ids, 1, options.grouped, unixMillis());
      }));
  KRANE_RETURN_IF_ERROR(checkDone(pool, prefix, n, 5 * n));
  return 5.0 * n / seconds;
}

}  // namespace krane::bench
