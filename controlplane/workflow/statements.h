// The text of the engine's most frequent statements: the claim of due invocations, the fenced
// journal insert and the fenced finish, alone and for groups. The engine runs them (engine.cc,
// journal_writer.cc, finish_writer.cc); the workflow benchmark's floor (bench/workflow/floor.h)
// runs the single forms without the engine, so that it measures exactly those statements.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace krane::workflow::statements {

// The text of a grouped statement for `n` rows, `n` a power of two from 2: Build(n), built once
// per process for every such `n` up to kCachedUpTo (a few texts, each prepared once per
// connection), and into `*scratch` above it.
template <std::string (*Build)(size_t), size_t kCachedUpTo>
const std::string& groupText(size_t n, std::string* scratch) {
  static const std::vector<std::string> texts = [] {
    std::vector<std::string> out;
    for (size_t k = 2; k <= kCachedUpTo; k *= 2) out.push_back(Build(k));
    return out;
  }();
  size_t text = 0;
  while ((size_t{2} << text) < n) ++text;
  if (text < texts.size()) return texts[text];
  *scratch = Build(n);
  return *scratch;
}

// Claims the invocations whose ids follow as placeholders, then ")". Parameters: the worker, the
// lease's end (also the new due_at: when to look again if the worker dies), now (started_at on a
// first claim), now (updated_at); then the ids. The lease token goes up by one: whatever the
// previous holder still writes is fenced.
inline constexpr std::string_view kClaimPrefix =
    "UPDATE workflow_invocations SET status = 'running', lease_owner = ?,"
    " lease_token = lease_token + 1, lease_expires_at = ?, due_at = ?, claims = claims + 1,"
    " started_at = COALESCE(started_at, ?), updated_at = ? WHERE id IN (";

// workflow_journal.name is VARCHAR(255) in utf8mb4: characters, not bytes. Names are kept to
// this (clampUtf8) when an entry is made, so that what a replay compares is what was stored.
inline constexpr size_t kJournalNameChars = 255;

// The columns of a journal row, in the order the rows' values are given.
inline constexpr std::string_view kJournalColumns =
    "invocation_id, seq, kind, name, ok, payload, error_code, error_message, duration_ms,"
    " created_at";

// One journal row, inserted only while the lease token is still current: the locking read of
// the invocation row is the fence check, and a takeover waits for the insert to commit.
// Parameters: the row's ten values (kJournalColumns), then the invocation's id and token.
inline constexpr std::string_view kFencedJournalInsert =
    "INSERT INTO workflow_journal (invocation_id, seq, kind, name, ok, payload, error_code,"
    " error_message, duration_ms, created_at) SELECT ?,?,?,?,?,?,?,?,?,? FROM"
    " workflow_invocations WHERE id = ? AND lease_token = ? FOR UPDATE";
static_assert(kFencedJournalInsert.find(kJournalColumns) != std::string_view::npos,
              "the fenced insert names the journal's columns in kJournalColumns' order");

// The entries of `n` invocations, one each, in one statement: each row is inserted only while
// its own invocation's lease token is current, and the locking read holds every row it read
// until the insert commits, as kFencedJournalInsert does for one. Rows of invocations whose
// token moved on are left out (fewer rows inserted than `n`). Each column but the invocation's id
// and created_at is chosen by the row's id (`CASE id WHEN ? THEN ? ...`), so the statement
// costs the server one read and one insert per row, where a derived table of the values or a
// UNION of fenced SELECTs made it build a temporary table.
// Parameters: for each of seq, kind, name, ok, payload, error_code, error_message and
// duration_ms in turn, `n` pairs of (id, value); then created_at; then `n` pairs of (id, token).
inline std::string fencedJournalInsertGroup(size_t n) {
  std::string cases = " CASE id";
  for (size_t i = 0; i < n; ++i) cases += " WHEN ? THEN ?";
  cases += " END";
  std::string sql = "INSERT INTO workflow_journal (";
  sql += kJournalColumns;
  sql += ") SELECT id";
  for (int column = 0; column < 8; ++column) sql += "," + cases;
  sql += ", ? FROM workflow_invocations WHERE (id, lease_token) IN (";
  for (size_t i = 0; i < n; ++i) sql += i == 0 ? "(?,?)" : ",(?,?)";
  sql += ") FOR UPDATE";
  return sql;
}

// Ends an invocation, followed by the rows' condition (`id = ? AND lease_token = ?`: fenced on
// the token, no row changed when it moved on). Parameters: the final status, the output, the
// error code and message, the attempts, now (finished_at), now (updated_at); then the
// condition's.
inline constexpr std::string_view kFinishPrefix =
    "UPDATE workflow_invocations SET status = ?, output = ?, error_code = ?,"
    " error_message = ?, attempts = ?, due_at = NULL, lease_owner = NULL,"
    " lease_expires_at = NULL, lease_token = lease_token + 1, finished_at = ?,"
    " updated_at = ? WHERE ";

// Ends `n` invocations in one statement, each row only while its own lease token is current, with
// its own values (`CASE id WHEN ? THEN ? ...`), as kFinishPrefix does for one. Parameters: for
// each of status, output, error_code, error_message and attempts in turn, `n` pairs of (id,
// value); then now (finished_at), now (updated_at); then `n` pairs of (id, token).
inline std::string fencedFinishGroup(size_t n) {
  std::string cases = " CASE id";
  for (size_t i = 0; i < n; ++i) cases += " WHEN ? THEN ?";
  cases += " END";
  std::string sql = "UPDATE workflow_invocations SET";
  const char* columns[] = {"status", "output", "error_code", "error_message", "attempts"};
  for (const char* column : columns) {
    sql += sql.back() == 'T' ? " " : ", ";
    sql += column;
    sql += " =" + cases;
  }
  sql +=
      ", due_at = NULL, lease_owner = NULL, lease_expires_at = NULL,"
      " lease_token = lease_token + 1, finished_at = ?, updated_at = ?"
      " WHERE (id, lease_token) IN (";
  for (size_t i = 0; i < n; ++i) sql += i == 0 ? "(?,?)" : ",(?,?)";
  sql += ")";
  return sql;
}

}  // namespace krane::workflow::statements
