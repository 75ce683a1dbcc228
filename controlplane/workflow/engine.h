// The durable execution engine: registered services, a worker pool that claims runnable
// invocations from MySQL under a lease with a fencing token, and the ingress (call, send,
// resolve awakeables, cancel, kill, resume). Several engines (replicas) may share one database.
//
// Thread-safety: every public method may be called from any thread. register() must happen
// before start().
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <prometheus/metric_family.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/thread_pool.h"
#include "controlplane/db/pool.h"
#include "controlplane/workflow/group_commit.h"
#include "controlplane/workflow/service.h"

namespace krane::workflow {

struct EngineOptions {
  // Names this replica in leases and logs; defaults to host-pid-random.
  std::string worker_id;
  // Invocations executing at once (threads). Suspended invocations take none. The claim loop
  // keeps up to half as many again claimed ahead, queued for the next free thread, so that it
  // claims in batches rather than one invocation each time a thread becomes free (with one
  // thread, none).
  size_t threads = 4;
  // A worker renews the lease of what it runs every lease/3; an invocation whose lease expired
  // (its worker died or stalled) is claimed again by any replica.
  std::chrono::milliseconds lease{30000};
  // How often the database is polled for due work when nothing wakes the engine sooner.
  std::chrono::milliseconds poll_interval{200};
  // Inputs, outputs, run results and promise payloads larger than this are refused.
  size_t max_payload_bytes = 1 << 20;
  // Journals of invocations this replica suspended, kept (up to this many bytes) so that their
  // next execution here does not read them from the database again; 0 keeps none.
  size_t journal_cache_bytes = 64 << 20;
  // Tests only: stop renewing leases, as a stalled process would.
  bool renew_leases = true;
};

struct InvokeRequest {
  std::string service = {};
  std::string handler = {};
  // Required for virtual objects, empty for unkeyed services.
  std::string key = {};
  std::string input = {};
  // Invocations with the same service, handler, key and idempotency key are one invocation.
  std::string idempotency_key = {};
  std::chrono::milliseconds delay{0};
};

struct EngineStats {
  std::atomic<uint64_t> attempts{0};  // handler executions started (incl. replays)
  std::atomic<uint64_t> suspensions{0};
  std::atomic<uint64_t> retries{0};  // attempts that failed with a retryable error
  std::atomic<uint64_t> succeeded{0};
  std::atomic<uint64_t> failed{0};
  std::atomic<uint64_t> cancelled{0};
  std::atomic<uint64_t> paused{0};
  std::atomic<uint64_t> fenced{0};              // commits refused because the lease was taken over
  std::atomic<uint64_t> steps{0};               // run() side effects executed
  std::atomic<uint64_t> journal_reads{0};       // executions that read their journal from MySQL
  std::atomic<uint64_t> journal_cache_hits{0};  // executions that took it from the cache
  // INSERTs send() ran for invocations that need no key (several sends share one; a statement
  // run again after a deadlock or lock wait timeout counts again).
  std::atomic<uint64_t> send_statements{0};
  // Claim transactions that claimed something, and the invocations they claimed.
  std::atomic<uint64_t> claims{0};
  std::atomic<uint64_t> claimed{0};
  std::atomic<uint64_t> step_ms_total{0};
  // Step latency histogram, upper bounds in ms: 1, 5, 10, 50, 100, 500, 1000, 5000, +inf.
  static constexpr double kBucketsMs[] = {1, 5, 10, 50, 100, 500, 1000, 5000};
  std::atomic<uint64_t> step_buckets[9] = {};
};

namespace store {
struct NewInvocation;
}
class ContextImpl;
class JournalCache;
class FinishWriter;
class JournalWriter;
struct Claim;

class Engine {
 public:
  Engine(std::shared_ptr<db::Pool> pool, EngineOptions options = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Registers a service. INVALID_ARGUMENT for a bad or duplicate name.
  absl::Status registerService(ServiceDefinition service);

  void start();
  // Stops claiming, waits for the executions in flight to reach their next commit, and joins.
  void stop();

  // Starts an invocation and returns its id (the existing one for a repeated idempotency key).
  // NOT_FOUND: unknown service or handler; INVALID_ARGUMENT: key missing or not allowed, payload
  // too large.
  absl::StatusOr<std::string> send(const InvokeRequest& request);
  // send() as part of the caller's transaction on `conn`, so that the invocation exists exactly
  // when the caller's own writes do (a row and the workflow that acts on it: no crash or error
  // in between leaves one without the other). The caller calls notify() once it committed; until
  // then no replica sees the invocation. FAILED_PRECONDITION when `conn` is not in a
  // transaction; a repeated idempotency key returns the existing invocation's id.
  absl::StatusOr<std::string> sendIn(db::Connection& conn, const InvokeRequest& request);
  // send() and wait for the result: the handler's output, or its terminal error.
  absl::StatusOr<std::string> call(const InvokeRequest& request,
                                   std::chrono::milliseconds timeout = std::chrono::minutes(5));
  // Waits for an invocation to finish. DEADLINE_EXCEEDED when it does not within `timeout`.
  absl::StatusOr<std::string> awaitResult(const std::string& invocation_id,
                                          std::chrono::milliseconds timeout);

  // Settles an awakeable (also before its handler waits on it). NOT_FOUND for an unknown id,
  // OK when it was already settled (the first settle wins).
  absl::Status resolveAwakeable(const std::string& id, const std::string& payload);
  absl::Status rejectAwakeable(const std::string& id, const std::string& message);

  // Operations (docs/workflow.md): cancel runs the compensations, kill does not, resume restarts
  // a paused invocation with fresh attempts.
  absl::Status cancel(const std::string& invocation_id);
  absl::Status kill(const std::string& invocation_id);
  absl::Status resume(const std::string& invocation_id);

  const EngineStats& stats() const { return stats_; }
  // Statements the journal writer and the finish writer ran, and the journal entries and
  // finishes they wrote with them.
  struct GroupedWrites {
    uint64_t statements = 0;
    uint64_t rows = 0;
  };
  GroupedWrites journalWrites() const;
  GroupedWrites finishWrites() const;

  // send() inserts invocations without an idempotency key that need no key's row in batches, at
  // most this many at once: a send waits while they are all written (few, so that sends at the
  // same moment share a batch; more than one, so that a slow insert does not hold up every
  // other).
  static constexpr size_t kSendWriters = 2;
  const std::string& workerId() const { return options_.worker_id; }
  // Counters of this replica plus invocations by status and keys held (from the database).
  std::vector<prometheus::MetricFamily> metrics() const;

  // Wakes the claim loop (after something became runnable).
  void notify();

 private:
  friend class ContextImpl;
  const ServiceDefinition* findService(std::string_view name) const;
  // Validates a request against the registry; `field` prefixes errors.
  absl::Status validate(std::string_view service, std::string_view handler, std::string_view key,
                        size_t input_bytes, const ServiceDefinition::Entry** entry) const;
  // The row send() and sendIn() insert, validated.
  absl::Status newInvocation(const InvokeRequest& request, store::NewInvocation* inv) const;
  // Invocations claimed and not yet finished (executing or queued) at most.
  size_t claimCapacity() const { return options_.threads + options_.threads / 2; }
  // With mutex_ held: the invocations claimed ahead are down to what the workers run, so a
  // claim would take several (claiming at every finish took one at a time).
  bool claimMayStart() const {
    return active_.size() < claimCapacity() && active_.size() <= options_.threads;
  }
  void claimLoop();
  // Renews the leases of what executes here, and looks for cancels of it made elsewhere.
  void renewLoop();
  // How often renewLoop() looks for cancels, when the lease is renewed less often.
  static constexpr std::chrono::milliseconds kCancelCheckPeriod{1000};
  // Sets the cancel flag of the executions in `active` whose invocations are marked cancelled.
  void lookForCancels(db::Connection& conn,
                      const std::vector<std::pair<std::pair<std::string, int64_t>,
                                                  std::shared_ptr<std::atomic<bool>>>>& active);
  absl::StatusOr<std::vector<Claim>> claim(size_t max);
  // Reads the promises already settled of the claimed invocations that ran before (one query).
  absl::Status readSettled(db::Connection& conn, std::vector<Claim>& claimed);
  static constexpr size_t kMaxSettledPerClaim = 1000;
  void execute(Claim claim);
  void recordStep(int64_t ms);

  std::shared_ptr<db::Pool> pool_;
  EngineOptions options_;
  std::map<std::string, ServiceDefinition, std::less<>> services_;
  // The claim query's filter on what this replica can run, built by start().
  std::string claimable_sql_;
  db::Params claimable_params_;
  EngineStats stats_;
  std::unique_ptr<JournalCache> journal_cache_;
  std::unique_ptr<JournalWriter> journal_writer_;
  std::unique_ptr<FinishWriter> finish_writer_;
  // send()'s inserts of invocations without an idempotency key that do not need their key's
  // row, grouped (GroupCommit): at most kMaxSends in one INSERT, and about kMaxSendBytes (a
  // statement over the server's max_allowed_packet is refused).
  struct Send {
    const store::NewInvocation* inv;
    absl::Status result = absl::InternalError("invocation not inserted");
  };
  static constexpr size_t kMaxSends = 64;
  static constexpr size_t kMaxSendBytes = size_t{4} << 20;
  static size_t sendWeight(const Send& send);
  void insertSends(const std::vector<Send*>& batch);
  GroupCommit<Send> sends_;

  std::mutex mutex_;
  // The claim loop waits on wake_, the renew loop on renewer_wake_ (only stop() and the last
  // execution of a stopping engine wake it): an execution's end wakes the claim loop, and only
  // when a claim could then start.
  std::condition_variable wake_;
  std::condition_variable renewer_wake_;
  bool stopping_ = false;
  bool started_ = false;
  bool notified_ = false;
  // Executions in flight here: invocation id and lease token.
  // Each with the flag its context reads to learn of a cancel that came after the claim
  // (Claim::cancel_seen).
  std::map<std::pair<std::string, int64_t>, std::shared_ptr<std::atomic<bool>>> active_;
  std::unique_ptr<ThreadPool> threads_;
  std::thread claimer_;
  std::thread renewer_;
  std::condition_variable idle_;
};

// Sends `handler` of the virtual object `key` once per wait: `wait` (the awakeable a handler
// waits on) is the idempotency key, so every replica that sees what the wait is for sends the
// same invocation, and a later wait gets a new one. Returns the invocation's id.
absl::StatusOr<std::string> sendOncePerWait(Engine& engine, std::string service,
                                            std::string handler, std::string key, std::string wait);

}  // namespace krane::workflow
