// What a service author writes against: service definitions, handler signatures, retry
// policies, terminal errors, and the Context a handler receives.
//
// Execution model (docs/workflow.md): a handler is re-executed from the start after every
// suspension, crash or retry. Every Context operation is journaled; on re-execution the
// operations are matched in order against the journal and answered from it. Handler code outside
// Context operations must therefore be deterministic: anything that reads the outside world
// (clock, database, network, randomness) goes through run().
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace krane::db {
class Connection;
}

namespace krane::workflow {

class Context;

using Handler = std::function<absl::StatusOr<std::string>(Context& ctx, const std::string& input)>;

enum class HandlerKind {
  // One at a time per key, in arrival order; may write state. A suspended exclusive invocation
  // keeps its key.
  kExclusive,
  // Runs concurrently with everything; may read state, never write it.
  kShared,
};

// What happens to an invocation whose attempts ran out.
enum class OnExhausted {
  kFail,   // run the compensations, finish as failed
  kPause,  // keep everything (including the key) and wait for an operator to resume or kill
};

struct RetryPolicy {
  std::chrono::milliseconds initial_interval{1000};
  double factor = 2.0;
  std::chrono::milliseconds max_interval{60000};
  // Attempts in all, including the first.
  int max_attempts = 10;
  OnExhausted on_exhausted = OnExhausted::kFail;

  // 30 s, 1 m, 2 m, 4 m, then 5 m between attempts, 10 attempts in all (about 30 minutes).
  static RetryPolicy deployPreset();
  // The delay after the `failed_attempts`-th failed attempt (1-based).
  std::chrono::milliseconds delayAfter(int failed_attempts) const;
};

// A service: an unkeyed service (handlers run concurrently, no state) or a virtual object
// (handlers keyed by an object key, with per-key state and exclusive/shared handlers).
class ServiceDefinition {
 public:
  static ServiceDefinition service(std::string name);
  static ServiceDefinition virtualObject(std::string name);

  ServiceDefinition& exclusive(std::string handler, Handler fn);
  ServiceDefinition& shared(std::string handler, Handler fn);
  // Unkeyed services use this (their handlers are all concurrent).
  ServiceDefinition& handler(std::string handler, Handler fn);
  ServiceDefinition& retry(RetryPolicy policy);

  struct Entry {
    HandlerKind kind;
    Handler fn;
  };
  const std::string& name() const { return name_; }
  bool keyed() const { return keyed_; }
  const RetryPolicy& retryPolicy() const { return retry_; }
  const Entry* find(std::string_view handler) const;
  const std::map<std::string, Entry, std::less<>>& handlers() const { return handlers_; }

 private:
  ServiceDefinition(std::string name, bool keyed) : name_(std::move(name)), keyed_(keyed) {}
  std::string name_;
  bool keyed_;
  RetryPolicy retry_;
  std::map<std::string, Entry, std::less<>> handlers_;
};

// A terminal error is never retried: it is journaled where it happens (a run step, a call) and
// ends the invocation when the handler returns it, after the compensations. CANCELLED is always
// terminal. Every other error is retryable.
absl::Status terminalError(absl::StatusCode code, std::string_view message);
bool isTerminal(const absl::Status& status);

// A durable promise a handler can wait on: an awakeable, a timer or the result of a call.
struct Future {
  std::string promise_id;
};

struct Awakeable {
  // Give this to whoever resolves it (Engine::resolveAwakeable / rejectAwakeable).
  std::string id;
  Future future;
};

// The outcome of waiting on several futures: which one settled first, and how.
struct Selected {
  size_t index = 0;
  absl::StatusOr<std::string> result;
};

// The handle a handler works through. Used only by the thread running the handler; it lives for
// one execution attempt. Operations that must wait (await, select, sleep) unwind the handler
// when the result is not there yet; the invocation suspends (no thread held) and the handler runs
// again from the start when something it waits on settles. Do not catch (...) in handlers: that
// would swallow the unwinding.
class Context {
 public:
  virtual ~Context() = default;

  virtual const std::string& invocationId() const = 0;
  virtual const std::string& service() const = 0;
  virtual const std::string& handler() const = 0;
  // The object key of a virtual object ('' for unkeyed services).
  virtual const std::string& key() const = 0;
  // 1 for the first attempt; re-executions after a suspension keep the number.
  virtual int attempt() const = 0;

  // A journaled side effect: `fn` runs until it returns a value or a terminal error, which is
  // recorded; replays return the record without running `fn`. A retryable error fails the
  // attempt (retried by the service's policy), so the handler only ever sees terminal errors.
  virtual absl::StatusOr<std::string> run(
      std::string_view name, const std::function<absl::StatusOr<std::string>()>& fn) = 0;
  absl::Status runVoid(std::string_view name, const std::function<absl::Status()>& fn);
  // A side effect on the engine's own database, done in the transaction that journals its
  // result: exactly once, even across crashes. `fn` must only use `conn` (no other connection,
  // nothing outside the database). A terminal error rolls back what `fn` wrote and is journaled;
  // a retryable one rolls back and fails the attempt.
  virtual absl::StatusOr<std::string> runTx(
      std::string_view name,
      const std::function<absl::StatusOr<std::string>(db::Connection& conn)>& fn) = 0;

  // Per-object state of a virtual object. set/clear in a shared handler end the invocation with
  // a terminal FAILED_PRECONDITION.
  virtual std::optional<std::string> get(std::string_view name) = 0;
  virtual void set(std::string_view name, std::string value) = 0;
  virtual void clear(std::string_view name) = 0;

  virtual Awakeable awakeable() = 0;
  virtual Future timer(std::chrono::milliseconds delay) = 0;
  // Starts `handler` of `service` (keyed by `key` for virtual objects) and returns its result
  // as a future. An unknown service or handler gives a future rejected with a terminal error.
  virtual Future call(std::string_view service, std::string_view handler, std::string_view key,
                      std::string input) = 0;
  // Starts it without waiting for its result, after `delay` if given.
  virtual void send(std::string_view service, std::string_view handler, std::string_view key,
                    std::string input,
                    std::chrono::milliseconds delay = std::chrono::milliseconds(0)) = 0;

  // Settles someone's awakeable, journaled (committed with this handler's next commit). An
  // unknown id is logged and ignored; the first settle of an awakeable wins.
  virtual void resolveAwakeable(std::string_view id, std::string payload) = 0;
  virtual void rejectAwakeable(std::string_view id, std::string_view message) = 0;

  // Waits for one future. Returns CANCELLED when the invocation is cancelled.
  virtual absl::StatusOr<std::string> await(const Future& future) = 0;
  // Waits until every future has settled, in one suspension and one journal entry: their
  // outcomes, in the order of `futures` (each a value or that future's error). The invocation is
  // woken once, when the last of them settles, so collecting a fan-out of N calls costs O(N);
  // awaiting them one by one costs a suspension and a replay each. CANCELLED when the invocation
  // is cancelled first.
  virtual absl::StatusOr<std::vector<absl::StatusOr<std::string>>> awaitAll(
      const std::vector<Future>& futures) = 0;
  // Waits for the first of several futures to settle: which one, and its outcome (which may be
  // an error, such as a rejected awakeable). CANCELLED, instead of any index, when the invocation
  // is cancelled, so a cancel can never be taken for one of the futures settling.
  virtual absl::StatusOr<Selected> select(const std::vector<Future>& futures) = 0;
  absl::Status sleep(std::chrono::milliseconds delay);

  // Registers a compensation, run last-in-first-out if the invocation fails or is cancelled.
  // It is given this Context, so its operations are journaled like any other: a compensation
  // interrupted by a crash resumes where it stopped. A compensation returning an error is
  // recorded and the next one still runs.
  //
  // Compensations run after the handler has returned (or unwound), when its locals are gone: a
  // compensation must own what it uses. Prefer workflow::compensate(ctx, name, data, fn) from
  // typed.h, whose `fn` cannot capture anything; otherwise capture by value (values, or
  // shared_ptrs to what outlives the engine), never by reference.
  virtual void compensate(std::string_view name, std::function<absl::Status(Context&)> fn) = 0;
  // A compensation that is a single journaled side effect (run("compensate " + name, fn)). The
  // same rule holds: `fn` captures by value.
  void compensateRun(std::string_view name, std::function<absl::Status()> fn);
};

}  // namespace krane::workflow
