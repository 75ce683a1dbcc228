// The Context of one execution attempt: replays the journal, buffers new entries and commits
// them (fenced by the lease token) before every side effect, suspension and completion.
// Internal to the engine.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "controlplane/db/connection.h"
#include "controlplane/workflow/service.h"

namespace krane::workflow {

class Engine;

// Unwinding signals thrown through handler code and caught by the engine. They deliberately do
// not derive from std::exception.
struct SuspendSignal {
  std::optional<int64_t> wake_at;  // earliest timer waited on
  // awaitAll: how many promises must settle before a wake-up (each settle counts down).
  std::optional<int> waiting_for = std::nullopt;
};
struct FencedSignal {};
struct AttemptFailedSignal {
  absl::Status error;
  bool pause_now = false;  // not worth retrying (the journal does not match the code)
};
struct AbortSignal {};  // replay reached the recorded failure
struct TerminalSignal {
  absl::Status error;
};

struct JournalEntry {
  int seq = 0;
  std::string kind;
  std::string name;
  bool ok = true;
  std::optional<std::string> payload = std::nullopt;
  absl::Status error = absl::OkStatus();
  int64_t duration_ms = 0;
};

// A promise as an await sees it.
struct PromiseState {
  bool settled = false;
  bool timer = false;
  int64_t settled_at = 0;
  absl::StatusOr<std::string> outcome = std::string();
  std::optional<int64_t> fire_at;
};

// The state of a workflow_promises row (columns kind, state, payload, error_code,
// error_message, fire_at, settled_at); a timer whose time has come by `now` counts as settled.
PromiseState promiseStateOf(const db::Row& row, int64_t now);

// What a claim hands to an execution.
struct Claim {
  std::string id;
  std::string service;
  std::string handler;
  std::string key;
  bool exclusive = false;
  std::string input;
  int64_t token = 0;
  int64_t wake_seq = 0;
  bool cancel_requested = false;
  // Set when this replica learns of a cancel that came after the claim, while the execution
  // runs (Engine::cancel here, or the renew loop finding the invocation marked): a new step
  // sees it without a read of its own.
  std::shared_ptr<std::atomic<bool>> cancel_seen = nullptr;
  int attempts = 0;
  // Claims of this invocation so far, this one included: 1 means nothing is journaled yet.
  int claims = 0;
  // Another invocation awaits this one's result (its completion promise).
  bool has_caller = false;
  // Promises of this invocation already resolved or rejected when it was claimed, read with the
  // claim: a settled promise never changes, so awaiting one of them reads nothing more.
  std::map<std::string, PromiseState, std::less<>> settled = {};
};

class ContextImpl : public Context {
 public:
  ContextImpl(Engine& engine, Claim& claim, bool keyed, HandlerKind kind,
              std::vector<JournalEntry> journal);

  const std::string& invocationId() const override { return claim_.id; }
  const std::string& service() const override { return claim_.service; }
  const std::string& handler() const override { return claim_.handler; }
  const std::string& key() const override { return claim_.key; }
  int attempt() const override { return claim_.attempts + 1; }

  absl::StatusOr<std::string> run(std::string_view name,
                                  const std::function<absl::StatusOr<std::string>()>& fn) override;
  absl::StatusOr<std::string> runTx(
      std::string_view name,
      const std::function<absl::StatusOr<std::string>(db::Connection& conn)>& fn) override;
  std::optional<std::string> get(std::string_view name) override;
  void set(std::string_view name, std::string value) override;
  void clear(std::string_view name) override;
  Awakeable awakeable() override;
  Future timer(std::chrono::milliseconds delay) override;
  Future call(std::string_view service, std::string_view handler, std::string_view key,
              std::string input) override;
  void send(std::string_view service, std::string_view handler, std::string_view key,
            std::string input, std::chrono::milliseconds delay) override;
  void resolveAwakeable(std::string_view id, std::string payload) override;
  void rejectAwakeable(std::string_view id, std::string_view message) override;
  absl::StatusOr<std::string> await(const Future& future) override;
  absl::StatusOr<std::vector<absl::StatusOr<std::string>>> awaitAll(
      const std::vector<Future>& futures) override;
  absl::StatusOr<Selected> select(const std::vector<Future>& futures) override;
  void compensate(std::string_view name, std::function<absl::Status(Context&)> fn) override;

  // --- for the engine ---
  // The error recorded by an earlier attempt that started compensating, if any.
  std::optional<absl::Status> recordedAbort() const;
  // Switches to compensation: positions after the recorded abort entry or journals a new one.
  // Returns the error the invocation fails with.
  absl::Status beginCompensation(const absl::Status& error);
  // Runs the compensations registered so far, newest first. Returns the first error any of
  // them returned (each error is logged; the others still run).
  absl::Status runCompensations();
  bool compensating() const { return compensating_; }
  // The committed journal (what the database holds for this invocation), for the next
  // execution. The context is not used afterwards.
  std::vector<JournalEntry> takeJournal() { return std::move(journal_); }
  // False once a journal write failed in a way that may have written it after all (a connection
  // lost during its COMMIT or statement) or found it already written: what this context holds
  // may then lack entries the database has, and the next execution reads the database.
  bool journalKnown() const { return !journal_unknown_; }

  enum class Commit { kSuspend, kRetry, kPause, kFinish };
  struct CommitRequest {
    Commit what = Commit::kFinish;
    std::optional<int64_t> wake_at;                       // kSuspend
    std::optional<int> waiting_for;                       // kSuspend
    int64_t retry_at = 0;                                 // kRetry
    int attempts = 0;                                     // kRetry, kPause
    absl::Status last_error;                              // kRetry, kPause
    std::string final_status;                             // kFinish
    absl::StatusOr<std::string> outcome = std::string();  // kFinish
  };
  // Commits the buffered entries together with a status change. Throws FencedSignal when the
  // lease was taken over. For kSuspend returns false (and does not suspend) when a wake-up
  // arrived since the claim; the claim then carries the new wake_seq and cancel flag.
  absl::StatusOr<bool> commit(const CommitRequest& request);

 private:
  using Action = std::function<absl::Status(db::Connection&, int64_t now)>;
  struct Pending {
    JournalEntry entry;
    std::vector<Action> actions;
  };

  // The journaled entry at the current position if this is a replay (and advances), nullptr
  // when the operation is new. Throws on a mismatch, or AbortSignal at the recorded failure.
  const JournalEntry* replay(std::string_view kind, std::string_view name, bool match_name);
  // A run step that the cancel stops before its effects: journaled as cancelled.
  absl::Status cancelledRun(std::string_view name);
  void append(JournalEntry entry, std::vector<Action> actions = {});
  // Commits the buffer (if not empty). Throws FencedSignal / AttemptFailedSignal.
  void flush();
  bool bufferHasActions() const;
  // Writes a buffer without actions through the engine's JournalWriter (one fenced statement,
  // no transaction, shared with other invocations' writes). ABORTED "fenced" when the lease was
  // taken over.
  absl::Status writeEntriesFenced();
  // kSuspend, and kFinish of an invocation without a key or a caller: the buffer (if it has no
  // actions) and then the status change, each one statement. nullopt when the request needs the
  // transaction of commit().
  std::optional<absl::StatusOr<bool>> commitWithoutTransaction(const CommitRequest& request);
  void settle(std::string_view id, absl::StatusOr<std::string> outcome);
  // After a commit that may have made other invocations runnable.
  void notifyIfNeeded();
  absl::Status fenceCheck(db::Connection& conn, bool* woken);
  absl::Status writeBuffer(db::Connection& conn, int64_t now);
  // A failed journal write: throws AttemptFailedSignal, after noting whether the journal in
  // memory may now differ from the database's.
  [[noreturn]] void writeFailed(absl::Status status);
  bool cancelPending() const {
    return (claim_.cancel_requested || (claim_.cancel_seen && claim_.cancel_seen->load())) &&
           !compensating_;
  }
  std::string promiseId(int seq) const;
  absl::StatusOr<std::string> outcomeOf(const JournalEntry& e) const;
  void checkPayload(std::string_view what, size_t bytes);

  Engine& engine_;
  Claim& claim_;
  bool keyed_;
  HandlerKind kind_;
  std::vector<JournalEntry> journal_;
  int next_seq_ = 0;
  std::vector<Pending> buffer_;
  std::vector<std::pair<std::string, std::function<absl::Status(Context&)>>> compensations_;
  bool compensating_ = false;
  bool journal_unknown_ = false;
};

}  // namespace krane::workflow
