#include <algorithm>
#include <exception>
#include <map>
#include <set>

#include "common/clock.h"
#include "common/status.h"
#include "common/strings.h"
#include "controlplane/db/errors.h"
#include "controlplane/workflow/context_impl.h"
#include "controlplane/workflow/engine.h"
#include "controlplane/workflow/finish_writer.h"
#include "controlplane/workflow/journal_writer.h"
#include "controlplane/workflow/statements.h"
#include "controlplane/workflow/store.h"
#include "spdlog/spdlog.h"

namespace krane::workflow {
namespace {

absl::Status cancelledError() { return absl::CancelledError("invocation cancelled"); }

bool isFenced(const absl::Status& s) { return absl::IsAborted(s) && s.message() == "fenced"; }

}  // namespace

ContextImpl::ContextImpl(Engine& engine, Claim& claim, bool keyed, HandlerKind kind,
                         std::vector<JournalEntry> journal)
    : engine_(engine), claim_(claim), keyed_(keyed), kind_(kind), journal_(std::move(journal)) {}

std::string ContextImpl::promiseId(int seq) const { return strCat("prm_", claim_.id, "_", seq); }

absl::StatusOr<std::string> ContextImpl::outcomeOf(const JournalEntry& e) const {
  if (!e.ok) return e.error;
  return e.payload.value_or(std::string());
}

const JournalEntry* ContextImpl::replay(std::string_view kind, std::string_view name,
                                        bool match_name) {
  if (next_seq_ >= static_cast<int>(journal_.size())) return nullptr;
  const JournalEntry& e = journal_[next_seq_];
  if (e.kind == "abort" && !compensating_) throw AbortSignal{};
  if (e.kind != kind || (match_name && e.name != clampUtf8(name, statements::kJournalNameChars))) {
    throw AttemptFailedSignal{
        absl::FailedPreconditionError(
            strCat("journal mismatch at entry ", e.seq, ": the journal has ", e.kind, " '", e.name,
                   "' but the handler asked for ", kind, " '", name,
                   "' (handler code changed, or it is not deterministic outside run())")),
        true};
  }
  ++next_seq_;
  return &e;
}

absl::Status ContextImpl::cancelledRun(std::string_view name) {
  append(JournalEntry{0, "run", std::string(name), false, std::nullopt, cancelledError()});
  return cancelledError();
}

void ContextImpl::append(JournalEntry entry, std::vector<Action> actions) {
  entry.seq = next_seq_++;
  entry.name = clampUtf8(entry.name, statements::kJournalNameChars);
  buffer_.push_back(Pending{std::move(entry), std::move(actions)});
}

void ContextImpl::checkPayload(std::string_view what, size_t bytes) {
  if (bytes > engine_.options_.max_payload_bytes) {
    throw TerminalSignal{terminalError(absl::StatusCode::kInvalidArgument,
                                       strCat(what, ": ", bytes, " bytes, more than the limit of ",
                                              engine_.options_.max_payload_bytes))};
  }
}

absl::Status ContextImpl::fenceCheck(db::Connection& conn, bool* woken) {
  KRANE_ASSIGN_OR_RETURN(auto rows, conn.query("SELECT lease_token, wake_seq, cancel_requested"
                                               " FROM workflow_invocations WHERE id = ?"
                                               " FOR UPDATE",
                                               {claim_.id}));
  if (rows.empty() || rows.rows[0].i64("lease_token") != claim_.token) {
    return absl::AbortedError("fenced");
  }
  // A cancel that came after the claim: what follows sees it (cancelPending()), here and now.
  if (rows.rows[0].i64("cancel_requested") != 0) claim_.cancel_requested = true;
  if (woken != nullptr) {
    *woken = rows.rows[0].i64("wake_seq") != claim_.wake_seq;
    if (*woken) {
      claim_.wake_seq = rows.rows[0].i64("wake_seq");
      claim_.cancel_requested = rows.rows[0].i64("cancel_requested") != 0;
    }
  }
  return absl::OkStatus();
}

absl::Status ContextImpl::writeBuffer(db::Connection& conn, int64_t now) {
  for (const Pending& p : buffer_) {
    const JournalEntry& e = p.entry;
    db::Value payload;
    if (e.payload) payload = db::Blob{*e.payload};
    KRANE_RETURN_IF_ERROR(
        conn.exec("INSERT INTO workflow_journal (invocation_id, seq, kind, name, ok, payload,"
                  " error_code, error_message, duration_ms, created_at)"
                  " VALUES (?,?,?,?,?,?,?,?,?,?)",
                  {claim_.id, e.seq, e.kind, e.name, e.ok, payload, store::errorCode(e.error),
                   store::errorMessage(e.error), e.duration_ms, now})
            .status());
    for (const Action& action : p.actions) KRANE_RETURN_IF_ERROR(action(conn, now));
  }
  return absl::OkStatus();
}

bool ContextImpl::bufferHasActions() const {
  for (const Pending& p : buffer_) {
    if (!p.actions.empty()) return true;
  }
  return false;
}

absl::Status ContextImpl::writeEntriesFenced() {
  std::vector<const JournalEntry*> entries;
  entries.reserve(buffer_.size());
  for (const Pending& p : buffer_) entries.push_back(&p.entry);
  KRANE_RETURN_IF_ERROR(engine_.journal_writer_->write(claim_.id, claim_.token, entries));
  for (Pending& p : buffer_) journal_.push_back(std::move(p.entry));
  buffer_.clear();
  return absl::OkStatus();
}

void ContextImpl::writeFailed(absl::Status status) {
  if (absl::IsUnavailable(status) || absl::IsAlreadyExists(status)) {
    // The retry's commit must not write these entries again: they may be there already. The
    // next execution reads what is.
    journal_unknown_ = true;
    buffer_.clear();
  }
  throw AttemptFailedSignal{std::move(status)};
}

void ContextImpl::flush() {
  if (buffer_.empty()) return;
  if (!bufferHasActions()) {
    absl::Status written = writeEntriesFenced();
    if (isFenced(written)) throw FencedSignal{};
    if (!written.ok()) writeFailed(std::move(written));
    return;
  }
  bool fenced = false;
  absl::Status status = engine_.pool_->transact(
      "workflow journal",
      [&](db::Connection& conn) -> absl::Status {
        absl::Status fence = fenceCheck(conn, nullptr);
        if (absl::IsAborted(fence) && fence.message() == "fenced") {
          fenced = true;
          return fence;
        }
        KRANE_RETURN_IF_ERROR(fence);
        return writeBuffer(conn, unixMillis());
      },
      db::TxOptions{db::Isolation::kReadCommitted});
  if (fenced) throw FencedSignal{};
  if (!status.ok()) writeFailed(std::move(status));
  notifyIfNeeded();
  for (Pending& p : buffer_) journal_.push_back(std::move(p.entry));
  buffer_.clear();
}

void ContextImpl::notifyIfNeeded() {
  for (const Pending& p : buffer_) {
    if (!p.actions.empty()) {
      engine_.notify();
      return;
    }
  }
}

void ContextImpl::settle(std::string_view id, absl::StatusOr<std::string> outcome) {
  const std::string kind = outcome.ok() ? "resolve" : "reject";
  if (replay(kind, id, true)) return;
  if (outcome.ok()) checkPayload(strCat(kind, " '", id, "'"), outcome->size());
  std::string promise(id);
  JournalEntry e{0, kind, promise, outcome.ok()};
  if (outcome.ok()) {
    e.payload = *outcome;
  } else {
    e.error = outcome.status();
  }
  append(
      std::move(e), {[this, promise, outcome](db::Connection& conn, int64_t now) -> absl::Status {
        auto settled = store::settlePromise(conn, promise, outcome, now);
        if (absl::IsNotFound(settled.status())) {
          spdlog::warn("workflow: invocation={} settles unknown awakeable {}", claim_.id, promise);
          return absl::OkStatus();
        }
        return settled.status();
      }});
}

void ContextImpl::resolveAwakeable(std::string_view id, std::string payload) {
  settle(id, std::move(payload));
}

void ContextImpl::rejectAwakeable(std::string_view id, std::string_view message) {
  settle(id, terminalError(absl::StatusCode::kAborted, message));
}

std::optional<absl::StatusOr<bool>> ContextImpl::commitWithoutTransaction(
    const CommitRequest& request) {
  const bool suspend = request.what == Commit::kSuspend;
  const bool finish = request.what == Commit::kFinish && !claim_.exclusive && !claim_.has_caller;
  if ((!suspend && !finish) || bufferHasActions()) return std::nullopt;
  // Journal entries before the status change: a crash in between leaves them journaled and the
  // invocation running, to be claimed again when its lease expires, as after a flush().
  absl::Status written = writeEntriesFenced();
  if (isFenced(written)) throw FencedSignal{};
  if (!written.ok()) return absl::StatusOr<bool>(written);
  if (finish) {
    // Grouped with the finishes of other executions at the same moment (FinishWriter).
    FinishWriter::Request finishing;
    finishing.invocation_id = claim_.id;
    finishing.token = claim_.token;
    finishing.status = request.final_status;
    if (request.outcome.ok()) finishing.output = db::Blob{*request.outcome};
    finishing.error_code = store::errorCode(request.outcome.status());
    finishing.error_message = store::errorMessage(request.outcome.status());
    finishing.attempts = std::max(request.attempts, claim_.attempts);
    engine_.finish_writer_->finish(finishing);
    if (!finishing.result.ok()) return absl::StatusOr<bool>(finishing.result.status());
    if (!*finishing.result) throw FencedSignal{};
    return absl::StatusOr<bool>(true);
  }
  const int64_t now = unixMillis();
  // Suspends only if nothing woke the invocation since the claim (wake_seq) and the lease is
  // still ours (lease_token).
  auto changed = engine_.pool_->execAlone(
      "UPDATE workflow_invocations SET status = 'suspended', due_at = ?,"
      " waiting_for = ?, lease_owner = NULL, lease_expires_at = NULL,"
      " updated_at = ? WHERE id = ? AND lease_token = ? AND wake_seq = ?",
      {request.wake_at, request.waiting_for, now, claim_.id, claim_.token, claim_.wake_seq});
  if (!changed.ok()) return absl::StatusOr<bool>(changed.status());
  if (*changed == 1) return absl::StatusOr<bool>(true);
  // Which of the two conditions failed, from the row: neither changes back.
  auto rows = [&]() -> absl::StatusOr<db::ResultSet> {
    KRANE_ASSIGN_OR_RETURN(auto conn, engine_.pool_->acquire());
    return conn->query(
        "SELECT lease_token, wake_seq, cancel_requested FROM workflow_invocations WHERE id = ?",
        {claim_.id});
  }();
  if (!rows.ok()) return absl::StatusOr<bool>(rows.status());
  if (rows->empty() || rows->rows[0].i64("lease_token") != claim_.token) throw FencedSignal{};
  claim_.wake_seq = rows->rows[0].i64("wake_seq");
  claim_.cancel_requested = rows->rows[0].i64("cancel_requested") != 0;
  return absl::StatusOr<bool>(false);
}

absl::StatusOr<bool> ContextImpl::commit(const CommitRequest& request) {
  if (auto done = commitWithoutTransaction(request)) return *std::move(done);
  bool fenced = false;
  bool woken = false;
  absl::Status status = engine_.pool_->transact(
      "workflow commit",
      [&](db::Connection& conn) -> absl::Status {
        fenced = false;
        woken = false;
        absl::Status fence = fenceCheck(conn, &woken);
        if (absl::IsAborted(fence) && fence.message() == "fenced") {
          fenced = true;
          return fence;
        }
        KRANE_RETURN_IF_ERROR(fence);
        const int64_t now = unixMillis();
        KRANE_RETURN_IF_ERROR(writeBuffer(conn, now));
        switch (request.what) {
          case Commit::kSuspend:
            if (woken) return absl::OkStatus();
            return conn
                .exec(
                    "UPDATE workflow_invocations SET status = 'suspended', due_at = ?,"
                    " waiting_for = ?, lease_owner = NULL, lease_expires_at = NULL,"
                    " updated_at = ? WHERE id = ?",
                    {request.wake_at, request.waiting_for, now, claim_.id})
                .status();
          case Commit::kRetry:
            return conn
                .exec(
                    // A cancel that arrived during the attempt is seen now, not after the
                    // retry delay.
                    "UPDATE workflow_invocations SET status = 'ready',"
                    " due_at = IF(cancel_requested, ?, ?), attempts = ?, last_error = ?,"
                    " lease_owner = NULL, lease_expires_at = NULL, updated_at = ? WHERE id = ?",
                    {now, request.retry_at, request.attempts,
                     std::string(toStd(request.last_error.message())), now, claim_.id})
                .status();
          case Commit::kPause:
            return conn
                .exec(
                    "UPDATE workflow_invocations SET status = 'paused', due_at = NULL,"
                    " attempts = ?, last_error = ?, lease_owner = NULL,"
                    " lease_expires_at = NULL, updated_at = ? WHERE id = ?",
                    {request.attempts, std::string(toStd(request.last_error.message())), now,
                     claim_.id})
                .status();
          case Commit::kFinish:
            KRANE_RETURN_IF_ERROR(
                conn.exec("UPDATE workflow_invocations SET attempts = ?"
                          " WHERE id = ?",
                          {std::max(request.attempts, claim_.attempts), claim_.id})
                    .status());
            return store::finish(conn, claim_.id, request.final_status, request.outcome, now);
        }
        return absl::InternalError("unknown commit");
      },
      db::TxOptions{db::Isolation::kReadCommitted});
  if (fenced) throw FencedSignal{};
  KRANE_RETURN_IF_ERROR(status);
  notifyIfNeeded();
  for (Pending& p : buffer_) journal_.push_back(std::move(p.entry));
  buffer_.clear();
  return !(request.what == Commit::kSuspend && woken);
}

absl::StatusOr<std::string> ContextImpl::run(
    std::string_view name, const std::function<absl::StatusOr<std::string>()>& fn) {
  if (const JournalEntry* e = replay("run", name, true)) return outcomeOf(*e);
  if (cancelPending()) return cancelledRun(name);
  flush();
  const auto started = std::chrono::steady_clock::now();
  absl::StatusOr<std::string> result;
  try {
    result = fn();
  } catch (const std::exception& ex) {
    result = absl::InternalError(strCat("run '", name, "' threw: ", ex.what()));
  }
  const int64_t ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                         std::chrono::steady_clock::now() - started)
                         .count();
  engine_.recordStep(ms);
  if (!result.ok() && !isTerminal(result.status())) {
    throw AttemptFailedSignal{absl::Status(
        result.status().code(), strCat("run '", name, "': ", result.status().message()))};
  }
  if (result.ok() && result->size() > engine_.options_.max_payload_bytes) {
    result = terminalError(
        absl::StatusCode::kInvalidArgument,
        strCat("run '", name, "' result: ", result->size(), " bytes, more than the limit of ",
               engine_.options_.max_payload_bytes));
  }
  JournalEntry e{0, "run", std::string(name), result.ok()};
  if (result.ok()) {
    e.payload = *result;
  } else {
    e.error = result.status();
  }
  e.duration_ms = ms;
  append(std::move(e));
  // The side effect happened: record it at once, so only a crash in this window repeats it.
  flush();
  return result;
}

absl::StatusOr<std::string> ContextImpl::runTx(
    std::string_view name,
    const std::function<absl::StatusOr<std::string>(db::Connection& conn)>& fn) {
  if (const JournalEntry* e = replay("run", name, true)) return outcomeOf(*e);
  if (cancelPending()) return cancelledRun(name);
  flush();
  const auto started = std::chrono::steady_clock::now();
  bool fenced = false;
  bool cancelled = false;
  absl::StatusOr<std::string> result;
  absl::Status status = engine_.pool_->transact(
      "workflow step",
      [&](db::Connection& conn) -> absl::Status {
        fenced = false;
        absl::Status fence = fenceCheck(conn, nullptr);
        if (absl::IsAborted(fence) && fence.message() == "fenced") {
          fenced = true;
          return fence;
        }
        KRANE_RETURN_IF_ERROR(fence);
        // Cancelled since the claim: the step's effects are not made.
        cancelled = cancelPending();
        if (cancelled) return absl::OkStatus();
        KRANE_RETURN_IF_ERROR(conn.execText("SAVEPOINT workflow_step"));
        try {
          result = fn(conn);
        } catch (const std::exception& ex) {
          result = absl::InternalError(strCat("run '", name, "' threw: ", ex.what()));
        }
        if (!result.ok() && !isTerminal(result.status())) return result.status();
        if (result.ok() && result->size() > engine_.options_.max_payload_bytes) {
          result = terminalError(
              absl::StatusCode::kInvalidArgument,
              strCat("run '", name, "' result: ", result->size(), " bytes, more than the limit of ",
                     engine_.options_.max_payload_bytes));
        }
        if (!result.ok()) {
          KRANE_RETURN_IF_ERROR(conn.execText("ROLLBACK TO SAVEPOINT workflow_step"));
        }
        const int64_t ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                               std::chrono::steady_clock::now() - started)
                               .count();
        JournalEntry e{next_seq_, "run", clampUtf8(name, statements::kJournalNameChars),
                       result.ok()};
        if (result.ok()) {
          e.payload = *result;
        } else {
          e.error = result.status();
        }
        e.duration_ms = ms;
        buffer_.clear();
        buffer_.push_back(Pending{std::move(e), {}});
        return writeBuffer(conn, unixMillis());
      },
      db::TxOptions{db::Isolation::kReadCommitted});
  engine_.recordStep(std::chrono::duration_cast<std::chrono::milliseconds>(
                         std::chrono::steady_clock::now() - started)
                         .count());
  if (fenced) throw FencedSignal{};
  if (!status.ok()) {
    buffer_.clear();
    writeFailed(absl::Status(status.code(), strCat("run '", name, "': ", status.message())));
  }
  if (cancelled) return cancelledRun(name);
  ++next_seq_;
  for (Pending& p : buffer_) journal_.push_back(std::move(p.entry));
  buffer_.clear();
  return result;
}

std::optional<std::string> ContextImpl::get(std::string_view name) {
  if (!keyed_) {
    throw TerminalSignal{terminalError(
        absl::StatusCode::kFailedPrecondition,
        strCat("state '", name, "': service ", claim_.service, " is not a virtual object"))};
  }
  if (const JournalEntry* e = replay("get", name, true)) return e->payload;
  std::optional<std::string> value;
  bool found_in_buffer = false;
  for (auto it = buffer_.rbegin(); it != buffer_.rend(); ++it) {
    if (it->entry.name == name &&
        (it->entry.kind == "set" || it->entry.kind == "clear" || it->entry.kind == "get")) {
      value = it->entry.payload;
      found_in_buffer = true;
      break;
    }
  }
  if (!found_in_buffer) {
    auto rows = [&]() {
      auto conn = engine_.pool_->acquire();
      if (!conn.ok()) return absl::StatusOr<db::ResultSet>(conn.status());
      return (*conn)->query(
          "SELECT value FROM workflow_state WHERE service = ? AND"
          " object_key = ? AND name = ?",
          {claim_.service, claim_.key, name});
    }();
    if (!rows.ok()) throw AttemptFailedSignal{rows.status()};
    if (!rows->empty()) value = rows->rows[0].str("value");
  }
  append(JournalEntry{0, "get", std::string(name), true, value});
  return value;
}

void ContextImpl::set(std::string_view name, std::string value) {
  if (kind_ != HandlerKind::kExclusive || !keyed_) {
    throw TerminalSignal{
        terminalError(absl::StatusCode::kFailedPrecondition,
                      strCat("state '", name, "' can only be written by an exclusive handler; ",
                             claim_.service, ".", claim_.handler, " is not one"))};
  }
  if (replay("set", name, true)) return;
  checkPayload(strCat("state '", name, "'"), value.size());
  std::string n(name);
  append(JournalEntry{0, "set", n, true, value},
         {[this, n, value](db::Connection& conn, int64_t now) {
           return conn
               .exec(
                   "INSERT INTO workflow_state (service, object_key, name, value, updated_at)"
                   " VALUES (?,?,?,?,?) ON DUPLICATE KEY UPDATE value = VALUES(value),"
                   " updated_at = VALUES(updated_at)",
                   {claim_.service, claim_.key, n, db::Blob{value}, now})
               .status();
         }});
}

void ContextImpl::clear(std::string_view name) {
  if (kind_ != HandlerKind::kExclusive || !keyed_) {
    throw TerminalSignal{
        terminalError(absl::StatusCode::kFailedPrecondition,
                      strCat("state '", name, "' can only be cleared by an exclusive handler; ",
                             claim_.service, ".", claim_.handler, " is not one"))};
  }
  if (replay("clear", name, true)) return;
  std::string n(name);
  append(JournalEntry{0, "clear", n, true, std::nullopt},
         {[this, n](db::Connection& conn, int64_t) {
           return conn
               .exec(
                   "DELETE FROM workflow_state WHERE service = ? AND object_key = ? AND"
                   " name = ?",
                   {claim_.service, claim_.key, n})
               .status();
         }});
}

Awakeable ContextImpl::awakeable() {
  if (const JournalEntry* e = replay("awakeable", "", false)) {
    return Awakeable{*e->payload, Future{*e->payload}};
  }
  const std::string id = promiseId(next_seq_);
  append(JournalEntry{0, "awakeable", "", true, id},
         {[this, id](db::Connection& conn, int64_t now) {
           return conn
               .exec(
                   "INSERT INTO workflow_promises (id, invocation_id, kind, created_at)"
                   " VALUES (?, ?, 'awakeable', ?)",
                   {id, claim_.id, now})
               .status();
         }});
  return Awakeable{id, Future{id}};
}

Future ContextImpl::timer(std::chrono::milliseconds delay) {
  if (const JournalEntry* e = replay("timer", "", false)) return Future{promiseId(e->seq)};
  const std::string id = promiseId(next_seq_);
  const int64_t fire_at = unixMillis() + delay.count();
  append(JournalEntry{0, "timer", "", true, std::to_string(fire_at)},
         {[this, id, fire_at](db::Connection& conn, int64_t now) {
           return conn
               .exec(
                   "INSERT INTO workflow_promises (id, invocation_id, kind, fire_at, created_at)"
                   " VALUES (?, ?, 'timer', ?, ?)",
                   {id, claim_.id, fire_at, now})
               .status();
         }});
  return Future{id};
}

Future ContextImpl::call(std::string_view service, std::string_view handler, std::string_view key,
                         std::string input) {
  const std::string target = strCat(service, ".", handler);
  if (const JournalEntry* e = replay("call", target, true)) return Future{promiseId(e->seq)};
  const int seq = next_seq_;
  const std::string promise = promiseId(seq);
  const std::string child =
      strCat("inv_", store::sha256Hex(strCat(claim_.id, "/", seq)).substr(0, 32));
  const ServiceDefinition::Entry* entry = nullptr;
  absl::Status valid = engine_.validate(service, handler, key, input.size(), &entry);
  std::vector<Action> actions;
  if (!valid.ok()) {
    absl::Status error =
        terminalError(valid.code(), strCat("call ", target, ": ", valid.message()));
    actions.push_back([this, promise, error](db::Connection& conn, int64_t now) {
      return conn
          .exec(
              "INSERT INTO workflow_promises (id, invocation_id, kind, state, error_code,"
              " error_message, created_at, settled_at) VALUES (?, ?, 'call', 'rejected', ?, ?,"
              " ?, ?)",
              {promise, claim_.id, store::errorCode(error), store::errorMessage(error), now, now})
          .status();
    });
  } else {
    store::NewInvocation inv;
    inv.id = child;
    inv.service = std::string(service);
    inv.handler = std::string(handler);
    inv.key = std::string(key);
    inv.exclusive = entry->kind == HandlerKind::kExclusive;
    inv.input = std::move(input);
    inv.parent_id = claim_.id;
    inv.completion_promise = promise;
    const bool compensation = compensating_;
    actions.push_back([this, promise, inv, compensation](db::Connection& conn, int64_t now) {
      KRANE_RETURN_IF_ERROR(conn.exec("INSERT INTO workflow_promises (id, invocation_id, kind,"
                                      " created_at) VALUES (?, ?, 'call', ?)",
                                      {promise, claim_.id, now})
                                .status());
      // The fence check of this transaction read the caller's cancel mark under its row lock:
      // called after a cancel went down the call tree, the child is cancelled too (not a call
      // of a compensation, which the cancel itself runs).
      store::NewInvocation row = inv;
      row.cancel_requested = claim_.cancel_requested && !compensation;
      return store::insertInvocation(conn, row, now);
    });
  }
  append(JournalEntry{0, "call", target, true, child}, std::move(actions));
  return Future{promise};
}

void ContextImpl::send(std::string_view service, std::string_view handler, std::string_view key,
                       std::string input, std::chrono::milliseconds delay) {
  const std::string target = strCat(service, ".", handler);
  if (replay("send", target, true)) return;
  const int seq = next_seq_;
  const ServiceDefinition::Entry* entry = nullptr;
  absl::Status valid = engine_.validate(service, handler, key, input.size(), &entry);
  if (!valid.ok()) {
    throw TerminalSignal{
        terminalError(valid.code(), strCat("send ", target, ": ", valid.message()))};
  }
  store::NewInvocation inv;
  inv.id = strCat("inv_", store::sha256Hex(strCat(claim_.id, "/", seq)).substr(0, 32));
  inv.service = std::string(service);
  inv.handler = std::string(handler);
  inv.key = std::string(key);
  inv.exclusive = entry->kind == HandlerKind::kExclusive;
  inv.input = std::move(input);
  inv.parent_id = claim_.id;
  inv.delay_ms = delay.count();
  const std::string child = inv.id;
  append(JournalEntry{0, "send", target, true, child}, {[inv](db::Connection& conn, int64_t now) {
           return store::insertInvocation(conn, inv, now);
         }});
}

PromiseState promiseStateOf(const db::Row& r, int64_t now) {
  PromiseState s;
  s.timer = r.str("kind") == "timer";
  s.fire_at = r.optI64("fire_at");
  const std::string& state = r.str("state");
  if (state == "resolved") {
    s.settled = true;
    s.outcome = r.isNull("payload") ? std::string() : r.str("payload");
  } else if (state == "rejected") {
    s.settled = true;
    s.outcome = store::statusFrom(r, "error_code", "error_message");
  } else if (s.fire_at && *s.fire_at <= now) {
    s.settled = true;
    s.outcome = std::string();
  }
  if (s.settled) {
    s.settled_at = r.isNull("settled_at") ? s.fire_at.value_or(now) : r.i64("settled_at");
  }
  return s;
}

namespace {

// The state of each future's promise, in the order of `futures`: those settled when the claim
// read them are taken from it, the others are read in one query.
absl::StatusOr<std::vector<PromiseState>> readPromises(db::Pool& pool,
                                                       const std::vector<Future>& futures,
                                                       const Claim& claim, int64_t now) {
  db::Params ids;
  for (const Future& f : futures) {
    if (claim.settled.count(f.promise_id) != 0) continue;
    ids.emplace_back(f.promise_id);
  }
  db::ResultSet rows;
  if (!ids.empty()) {
    db::Params params;
    const std::string in = db::appendInList(params, ids);
    KRANE_ASSIGN_OR_RETURN(auto conn, pool.acquire());
    KRANE_ASSIGN_OR_RETURN(
        rows, conn->query(strCat("SELECT id, kind, state, payload, error_code, error_message,"
                                 " fire_at, settled_at FROM workflow_promises WHERE id IN (",
                                 in, ")"),
                          params));
  }
  std::map<std::string, const db::Row*, std::less<>> by_id;
  for (const db::Row& r : rows.rows) by_id.emplace(r.str("id"), &r);
  std::vector<PromiseState> out;
  out.reserve(futures.size());
  for (const Future& f : futures) {
    if (auto known = claim.settled.find(f.promise_id); known != claim.settled.end()) {
      out.push_back(known->second);
      continue;
    }
    auto it = by_id.find(f.promise_id);
    if (it == by_id.end()) {
      return absl::InternalError(strCat("promise '", f.promise_id, "' does not exist"));
    }
    out.push_back(promiseStateOf(*it->second, now));
  }
  return out;
}

// The outcomes of an awaitAll, as one journal payload: per outcome "v<bytes>:<value>" or
// "e<code>,<bytes>:<message>" (readable in `krane-ctrl workflow show`, any bytes allowed).
std::string encodeOutcomes(const std::vector<absl::StatusOr<std::string>>& outcomes) {
  std::string out;
  for (const auto& o : outcomes) {
    if (o.ok()) {
      out += strCat("v", o->size(), ":", *o);
    } else {
      const std::string message(toStd(o.status().message()));
      out += strCat("e", static_cast<int>(o.status().code()), ",", message.size(), ":", message);
    }
  }
  return out;
}

absl::StatusOr<std::vector<absl::StatusOr<std::string>>> decodeOutcomes(std::string_view in) {
  std::vector<absl::StatusOr<std::string>> out;
  auto number = [&](char end) -> std::optional<size_t> {
    const size_t at = in.find(end);
    if (at == std::string_view::npos || at == 0) return std::nullopt;
    size_t n = 0;
    for (char c : in.substr(0, at)) {
      if (c < '0' || c > '9') return std::nullopt;
      n = n * 10 + static_cast<size_t>(c - '0');
    }
    in.remove_prefix(at + 1);
    return n;
  };
  while (!in.empty()) {
    const char tag = in.front();
    in.remove_prefix(1);
    std::optional<size_t> code;
    if (tag == 'e') code = number(',');
    std::optional<size_t> size = number(':');
    if ((tag != 'v' && tag != 'e') || (tag == 'e' && !code) || !size || *size > in.size()) {
      return absl::DataLossError("awaitAll journal entry does not decode");
    }
    std::string bytes(in.substr(0, *size));
    in.remove_prefix(*size);
    if (tag == 'v') {
      out.emplace_back(std::move(bytes));
    } else {
      out.emplace_back(absl::Status(static_cast<absl::StatusCode>(*code), bytes));
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<std::string> ContextImpl::await(const Future& future) {
  if (const JournalEntry* e = replay("await", future.promise_id, false)) return outcomeOf(*e);
  if (cancelPending()) {
    append(JournalEntry{0, "await", future.promise_id, false, std::nullopt, cancelledError()});
    return cancelledError();
  }
  flush();
  auto states = readPromises(*engine_.pool_, {future}, claim_, unixMillis());
  if (!states.ok()) throw AttemptFailedSignal{states.status()};
  const PromiseState& s = (*states)[0];
  if (!s.settled) throw SuspendSignal{s.fire_at};
  JournalEntry e{0, "await", future.promise_id, s.outcome.ok()};
  if (s.outcome.ok()) {
    e.payload = *s.outcome;
  } else {
    e.error = s.outcome.status();
  }
  append(std::move(e));
  return s.outcome;
}

absl::StatusOr<std::vector<absl::StatusOr<std::string>>> ContextImpl::awaitAll(
    const std::vector<Future>& futures) {
  if (const JournalEntry* e = replay("await_all", "", false)) {
    if (!e->ok) return e->error;
    auto outcomes = decodeOutcomes(e->payload.value_or(""));
    if (!outcomes.ok() || outcomes->size() != futures.size()) {
      throw AttemptFailedSignal{
          absl::FailedPreconditionError(
              strCat("journal mismatch at entry ", e->seq, ": awaitAll of ", futures.size(),
                     " futures, but the journal recorded ", e->name,
                     " (handler code changed, or it is not deterministic outside run())")),
          true};
    }
    return outcomes;
  }
  const std::string name = strCat("n=", futures.size());
  if (cancelPending()) {
    append(JournalEntry{0, "await_all", name, false, std::nullopt, cancelledError()});
    return cancelledError();
  }
  std::vector<absl::StatusOr<std::string>> outcomes;
  if (!futures.empty()) {
    flush();
    auto states = readPromises(*engine_.pool_, futures, claim_, unixMillis());
    if (!states.ok()) throw AttemptFailedSignal{states.status()};
    std::set<std::string_view> pending;  // promises settled by someone else (awakeables, calls)
    std::optional<int64_t> wake_at;      // the last pending timer
    for (size_t i = 0; i < states->size(); ++i) {
      const PromiseState& s = (*states)[i];
      if (s.settled) continue;
      if (s.timer) {
        wake_at = std::max(wake_at.value_or(0), s.fire_at.value_or(0));
      } else {
        pending.insert(futures[i].promise_id);
      }
    }
    if (!pending.empty()) {
      // Woken when the last of them settles: each settle before that only counts down. Timers
      // still pending then are waited for by the next execution.
      throw SuspendSignal{std::nullopt, static_cast<int>(pending.size())};
    }
    if (wake_at) throw SuspendSignal{wake_at};
    outcomes.reserve(states->size());
    for (PromiseState& s : *states) outcomes.push_back(std::move(s.outcome));
  }
  append(JournalEntry{0, "await_all", name, true, encodeOutcomes(outcomes)});
  return outcomes;
}

absl::StatusOr<Selected> ContextImpl::select(const std::vector<Future>& futures) {
  if (const JournalEntry* e = replay("select", "", false)) {
    // "winner=N"; a cancellation is journaled as "cancelled" (older journals: an N past the end).
    const size_t eq = e->name.find('=');
    const size_t index =
        eq == std::string::npos ? futures.size() : std::stoul(e->name.substr(eq + 1));
    if (index >= futures.size()) {
      return e->error.ok() ? cancelledError() : e->error;
    }
    return Selected{index, outcomeOf(*e)};
  }
  if (cancelPending()) {
    append(JournalEntry{0, "select", "cancelled", false, std::nullopt, cancelledError()});
    return cancelledError();
  }
  flush();
  auto states = readPromises(*engine_.pool_, futures, claim_, unixMillis());
  if (!states.ok()) throw AttemptFailedSignal{states.status()};
  std::optional<size_t> winner;
  std::optional<int64_t> wake_at;
  for (size_t i = 0; i < states->size(); ++i) {
    const PromiseState& s = (*states)[i];
    if (s.settled) {
      if (!winner || s.settled_at < (*states)[*winner].settled_at) winner = i;
    } else if (s.fire_at) {
      wake_at = wake_at ? std::min(*wake_at, *s.fire_at) : *s.fire_at;
    }
  }
  if (!winner) throw SuspendSignal{wake_at};
  const PromiseState& s = (*states)[*winner];
  JournalEntry e{0, "select", strCat("winner=", *winner), s.outcome.ok()};
  if (s.outcome.ok()) {
    e.payload = *s.outcome;
  } else {
    e.error = s.outcome.status();
  }
  append(std::move(e));
  return Selected{*winner, s.outcome};
}

void ContextImpl::compensate(std::string_view name, std::function<absl::Status(Context&)> fn) {
  if (compensating_) return;
  compensations_.emplace_back(std::string(name), std::move(fn));
}

std::optional<absl::Status> ContextImpl::recordedAbort() const {
  for (const JournalEntry& e : journal_) {
    if (e.kind == "abort") return e.error;
  }
  return std::nullopt;
}

absl::Status ContextImpl::beginCompensation(const absl::Status& error) {
  for (size_t i = 0; i < journal_.size(); ++i) {
    if (journal_[i].kind == "abort") {
      compensating_ = true;
      next_seq_ = static_cast<int>(i) + 1;
      return journal_[i].error;
    }
  }
  if (next_seq_ < static_cast<int>(journal_.size())) {
    throw AttemptFailedSignal{
        absl::FailedPreconditionError(strCat(
            "journal mismatch: the handler failed at entry ", next_seq_, " but the journal has ",
            journal_.size(), " entries (handler code changed, or it is not deterministic)")),
        true};
  }
  compensating_ = true;
  append(JournalEntry{0, "abort", std::string(toStd(error.message())), false, std::nullopt, error});
  return error;
}

absl::Status ContextImpl::runCompensations() {
  absl::Status first;
  for (auto it = compensations_.rbegin(); it != compensations_.rend(); ++it) {
    absl::Status s = it->second(*this);
    if (!s.ok()) {
      spdlog::warn("workflow: compensation failed invocation={} compensation=\"{}\" error=\"{}\"",
                   claim_.id, it->first, s.message());
      if (first.ok()) first = s;
    }
  }
  return first;
}

}  // namespace krane::workflow
