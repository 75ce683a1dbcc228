#include "controlplane/workflow/engine.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <exception>

#include "common/backoff.h"
#include "common/clock.h"
#include "common/random_id.h"
#include "common/status.h"
#include "common/strings.h"
#include "controlplane/db/errors.h"
#include "controlplane/workflow/context_impl.h"
#include "controlplane/workflow/finish_writer.h"
#include "controlplane/workflow/journal_cache.h"
#include "controlplane/workflow/journal_writer.h"
#include "controlplane/workflow/operations.h"
#include "controlplane/workflow/statements.h"
#include "controlplane/workflow/store.h"
#include "spdlog/spdlog.h"

namespace krane::workflow {
namespace {

bool validName(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-') return false;
  }
  return true;
}

absl::StatusOr<std::vector<JournalEntry>> loadJournal(db::Pool& pool, const std::string& id) {
  KRANE_ASSIGN_OR_RETURN(auto conn, pool.acquire());
  KRANE_ASSIGN_OR_RETURN(auto rows, conn->query("SELECT seq, kind, name, ok, payload, error_code,"
                                                " error_message, duration_ms FROM workflow_journal"
                                                " WHERE invocation_id = ? ORDER BY seq",
                                                {id}));
  std::vector<JournalEntry> out;
  for (const db::Row& r : rows.rows) {
    JournalEntry e;
    e.seq = static_cast<int>(r.i64("seq"));
    if (e.seq != static_cast<int>(out.size())) {
      return absl::DataLossError(strCat("journal of ", id, " has a hole at entry ", out.size()));
    }
    e.kind = r.str("kind");
    e.name = r.str("name");
    e.ok = r.i64("ok") != 0;
    e.payload = r.optStr("payload");
    e.error = store::statusFrom(r, "error_code", "error_message");
    e.duration_ms = r.i64("duration_ms");
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace

Engine::Engine(std::shared_ptr<db::Pool> pool, EngineOptions options)
    : pool_(std::move(pool)),
      options_(std::move(options)),
      journal_cache_(std::make_unique<JournalCache>(options_.journal_cache_bytes)),
      journal_writer_(std::make_unique<JournalWriter>(*pool_)),
      finish_writer_(std::make_unique<FinishWriter>(*pool_)),
      sends_(kSendWriters, kMaxSendBytes, &Engine::sendWeight,
             [this](const std::vector<Send*>& batch) { insertSends(batch); }) {
  if (options_.worker_id.empty()) options_.worker_id = processInstanceId();
  if (options_.threads == 0) options_.threads = 1;
}

Engine::~Engine() { stop(); }

void Engine::insertSends(const std::vector<Send*>& batch) {
  auto conn = pool_->acquire();
  if (!conn.ok()) {
    for (Send* s : batch) s->result = conn.status();
    return;
  }
  // Fresh random ids, no idempotency key, values validated: nothing one row holds can fail the
  // statement, so its outcome is every send's (a lost connection leaves all of them unknown).
  // A deadlock or lock wait timeout rolled it back: it goes again.
  std::vector<const store::NewInvocation*> invs;
  for (const Send* s : batch) invs.push_back(s->inv);
  const absl::Status status = db::retryConflicts([&] {
    stats_.send_statements.fetch_add(1, std::memory_order_relaxed);
    return store::insertInvocations(**conn, invs, unixMillis());
  });
  for (Send* s : batch) s->result = status;
}

Engine::GroupedWrites Engine::journalWrites() const {
  return {journal_writer_->statements(), journal_writer_->entries()};
}

Engine::GroupedWrites Engine::finishWrites() const {
  return {finish_writer_->statements(), finish_writer_->finishes()};
}

size_t Engine::sendWeight(const Send& send) {
  return std::max(send.inv->input.size() + 256, kMaxSendBytes / kMaxSends);
}

absl::Status Engine::registerService(ServiceDefinition service) {
  if (!validName(service.name())) {
    return absl::InvalidArgumentError(
        strCat("service name '", service.name(), "': use 1-64 letters, digits, '_' or '-'"));
  }
  for (const auto& [name, entry] : service.handlers()) {
    if (!validName(name)) {
      return absl::InvalidArgumentError(strCat("handler name '", service.name(), ".", name,
                                               "': use 1-64 letters, digits, '_' or '-'"));
    }
  }
  std::lock_guard lock(mutex_);
  if (started_) return absl::FailedPreconditionError("register services before start()");
  if (services_.count(service.name()) != 0) {
    return absl::AlreadyExistsError(strCat("service '", service.name(), "' is already registered"));
  }
  std::string name = service.name();
  services_.emplace(std::move(name), std::move(service));
  return absl::OkStatus();
}

const ServiceDefinition* Engine::findService(std::string_view name) const {
  auto it = services_.find(name);
  return it == services_.end() ? nullptr : &it->second;
}

absl::Status Engine::validate(std::string_view service, std::string_view handler,
                              std::string_view key, size_t input_bytes,
                              const ServiceDefinition::Entry** entry) const {
  const ServiceDefinition* def = findService(service);
  if (def == nullptr) {
    return absl::NotFoundError(strCat("service: unknown service '", service, "'"));
  }
  *entry = def->find(handler);
  if (*entry == nullptr) {
    return absl::NotFoundError(
        strCat("handler: service '", service, "' has no handler '", handler, "'"));
  }
  if (def->keyed() && key.empty()) {
    return absl::InvalidArgumentError(
        strCat("key: ", service, " is a virtual object: its handlers need an object key"));
  }
  if (!def->keyed() && !key.empty()) {
    return absl::InvalidArgumentError(
        strCat("key: ", service, " is an unkeyed service: its handlers take no key"));
  }
  if (key.size() > 255) {
    return absl::InvalidArgumentError(strCat("key: ", key.size(), " bytes, at most 255"));
  }
  if (input_bytes > options_.max_payload_bytes) {
    return absl::InvalidArgumentError(strCat(
        "input: ", input_bytes, " bytes, more than the limit of ", options_.max_payload_bytes));
  }
  return absl::OkStatus();
}

void Engine::start() {
  std::lock_guard lock(mutex_);
  if (started_) return;
  started_ = true;
  // (service, handler) IN ((?,?), ...): what this replica can run. Services are fixed from here.
  claimable_sql_ = "(service, handler) IN (";
  claimable_params_.clear();
  for (const auto& [name, service] : services_) {
    for (const auto& [handler, entry] : service.handlers()) {
      claimable_sql_ += claimable_params_.empty() ? "(?,?)" : ",(?,?)";
      claimable_params_.push_back(name);
      claimable_params_.push_back(handler);
    }
  }
  if (claimable_params_.empty()) claimable_sql_ = "(FALSE";  // nothing registered, nothing to run
  claimable_sql_ += ")";
  stopping_ = false;
  threads_ = std::make_unique<ThreadPool>(options_.threads);
  claimer_ = std::thread([this] { claimLoop(); });
  renewer_ = std::thread([this] { renewLoop(); });
}

void Engine::stop() {
  {
    std::lock_guard lock(mutex_);
    if (!started_) return;
    stopping_ = true;
  }
  wake_.notify_all();
  renewer_wake_.notify_all();
  if (claimer_.joinable()) claimer_.join();
  threads_.reset();  // finishes the executions in flight
  if (renewer_.joinable()) renewer_.join();
  std::lock_guard lock(mutex_);
  started_ = false;
}

void Engine::notify() {
  bool claim = false;
  {
    std::lock_guard lock(mutex_);
    notified_ = true;  // and when no claim may start yet, the next execution's end wakes it
    claim = claimMayStart();
  }
  if (claim) wake_.notify_one();
}

absl::Status Engine::newInvocation(const InvokeRequest& request, store::NewInvocation* out) const {
  const ServiceDefinition::Entry* entry = nullptr;
  KRANE_RETURN_IF_ERROR(
      validate(request.service, request.handler, request.key, request.input.size(), &entry));
  if (request.idempotency_key.size() > 255) {
    return absl::InvalidArgumentError(
        strCat("idempotency_key: ", request.idempotency_key.size(), " bytes, at most 255"));
  }
  store::NewInvocation& inv = *out;
  inv.id = strCat("inv_", randomHex(16));
  inv.service = request.service;
  inv.handler = request.handler;
  inv.key = request.key;
  inv.exclusive = entry->kind == HandlerKind::kExclusive;
  inv.input = request.input;
  inv.delay_ms = request.delay.count();
  if (!request.idempotency_key.empty()) {
    inv.idempotency_key = request.idempotency_key;
    inv.idempotency_hash = store::sha256Hex(strCat(request.service, '\0', request.handler, '\0',
                                                   request.key, '\0', request.idempotency_key));
  }
  return absl::OkStatus();
}

namespace {

absl::StatusOr<std::optional<std::string>> invocationWithKey(db::Connection& conn,
                                                             const std::string& hash,
                                                             bool for_update) {
  KRANE_ASSIGN_OR_RETURN(auto rows, conn.query(strCat("SELECT id FROM workflow_invocations"
                                                      " WHERE idempotency_hash = ?",
                                                      for_update ? " FOR UPDATE" : ""),
                                               {hash}));
  if (rows.empty()) return std::optional<std::string>();
  return std::optional<std::string>(rows.rows[0].str("id"));
}

}  // namespace

absl::StatusOr<std::string> Engine::send(const InvokeRequest& request) {
  store::NewInvocation inv;
  KRANE_RETURN_IF_ERROR(newInvocation(request, &inv));
  absl::Status status;
  if (store::needsKey(inv)) {
    // Admission to the key takes the key's row first: a transaction.
    status = pool_->transact(
        "workflow invoke",
        [&](db::Connection& conn) { return store::insertInvocation(conn, inv, unixMillis()); },
        db::TxOptions{db::Isolation::kReadCommitted, 30});
  } else if (inv.idempotency_hash) {
    // One INSERT, which commits by itself, alone: it waits while another transaction holds an
    // uncommitted invocation of the same key, and must not hold up unrelated sends meanwhile.
    auto conn = pool_->acquire();
    status =
        conn.ok()
            ? db::retryConflicts([&] { return store::insertInvocation(**conn, inv, unixMillis()); })
            : conn.status();
  } else {
    // One INSERT, which commits by itself, shared with the sends of other threads at the moment.
    Send send{&inv};
    sends_.submit(send);
    status = send.result;
  }
  if (absl::IsAlreadyExists(status) && inv.idempotency_hash) {
    KRANE_ASSIGN_OR_RETURN(auto conn, pool_->acquire());
    KRANE_ASSIGN_OR_RETURN(auto existing,
                           invocationWithKey(*conn, *inv.idempotency_hash, /*for_update=*/false));
    if (existing) return *std::move(existing);
  }
  KRANE_RETURN_IF_ERROR(status);
  notify();
  return inv.id;
}

absl::StatusOr<std::string> Engine::sendIn(db::Connection& conn, const InvokeRequest& request) {
  if (!conn.inTransaction()) {
    return absl::FailedPreconditionError("sendIn needs a transaction on its connection");
  }
  store::NewInvocation inv;
  KRANE_RETURN_IF_ERROR(newInvocation(request, &inv));
  if (!inv.idempotency_hash) {
    KRANE_RETURN_IF_ERROR(store::insertInvocation(conn, inv, unixMillis()));
    return inv.id;
  }
  // A savepoint, so that a repeated key undoes the key row's admission in the caller's
  // transaction. The duplicate check has waited for a concurrent sender of the same key to
  // commit; the locking read then sees its row whatever the caller's isolation level.
  KRANE_RETURN_IF_ERROR(conn.execText("SAVEPOINT workflow_send"));
  absl::Status inserted = store::insertInvocation(conn, inv, unixMillis());
  if (!absl::IsAlreadyExists(inserted)) {
    KRANE_RETURN_IF_ERROR(inserted);
    return inv.id;
  }
  KRANE_RETURN_IF_ERROR(conn.execText("ROLLBACK TO SAVEPOINT workflow_send"));
  KRANE_ASSIGN_OR_RETURN(auto existing,
                         invocationWithKey(conn, *inv.idempotency_hash, /*for_update=*/true));
  if (existing) return *std::move(existing);
  return inserted;
}

absl::StatusOr<std::string> Engine::call(const InvokeRequest& request,
                                         std::chrono::milliseconds timeout) {
  KRANE_ASSIGN_OR_RETURN(std::string id, send(request));
  return awaitResult(id, timeout);
}

absl::StatusOr<std::string> Engine::awaitResult(const std::string& invocation_id,
                                                std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::chrono::milliseconds pause(2);
  for (;;) {
    {
      KRANE_ASSIGN_OR_RETURN(auto conn, pool_->acquire());
      KRANE_ASSIGN_OR_RETURN(auto rows,
                             conn->query("SELECT status, output, error_code, error_message"
                                         " FROM workflow_invocations WHERE id = ?",
                                         {invocation_id}));
      if (rows.empty()) return absl::NotFoundError(strCat("no invocation '", invocation_id, "'"));
      const db::Row& r = rows.rows[0];
      const std::string& status = r.str("status");
      if (status == "succeeded") return r.isNull("output") ? std::string() : r.str("output");
      if (status == "failed" || status == "cancelled" || status == "killed") {
        return store::statusFrom(r, "error_code", "error_message");
      }
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return absl::DeadlineExceededError(strCat(
          "invocation '", invocation_id, "' did not finish within ", timeout.count(), " ms"));
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
}

absl::Status Engine::resolveAwakeable(const std::string& id, const std::string& payload) {
  if (payload.size() > options_.max_payload_bytes) {
    return absl::InvalidArgumentError(strCat("payload: ", payload.size(),
                                             " bytes, more than the limit of ",
                                             options_.max_payload_bytes));
  }
  KRANE_RETURN_IF_ERROR(settleAwakeable(*pool_, id, payload));
  notify();
  return absl::OkStatus();
}

absl::Status Engine::rejectAwakeable(const std::string& id, const std::string& message) {
  KRANE_RETURN_IF_ERROR(
      settleAwakeable(*pool_, id, terminalError(absl::StatusCode::kAborted, message)));
  notify();
  return absl::OkStatus();
}

absl::Status Engine::cancel(const std::string& invocation_id) {
  std::vector<std::string> cancelled;
  KRANE_RETURN_IF_ERROR(cancelInvocation(*pool_, invocation_id, &cancelled));
  {
    // The invocation and the ones it called, executing here: their next step sees the cancel at
    // once (elsewhere, the renew loop finds it within a second).
    std::lock_guard lock(mutex_);
    for (const std::string& id : cancelled) {
      for (auto it = active_.lower_bound(std::pair(id, int64_t{0}));
           it != active_.end() && it->first.first == id; ++it) {
        it->second->store(true);
      }
    }
  }
  notify();
  return absl::OkStatus();
}

absl::Status Engine::kill(const std::string& invocation_id) {
  KRANE_RETURN_IF_ERROR(killInvocation(*pool_, invocation_id));
  notify();
  return absl::OkStatus();
}

absl::Status Engine::resume(const std::string& invocation_id) {
  KRANE_RETURN_IF_ERROR(resumeInvocation(*pool_, invocation_id));
  notify();
  return absl::OkStatus();
}

absl::Status Engine::readSettled(db::Connection& conn, std::vector<Claim>& claimed) {
  // An invocation claimed for the first time has no promises yet.
  db::Params ids;
  std::map<std::string_view, Claim*> by_id;
  for (Claim& c : claimed) {
    if (c.claims <= 1) continue;
    ids.emplace_back(c.id);
    by_id.emplace(c.id, &c);
  }
  if (ids.empty()) return absl::OkStatus();
  db::Params params;
  const std::string in = db::appendInList(params, ids);
  // Bounded: promises left out are read when awaited, as without this.
  params.emplace_back(static_cast<uint64_t>(kMaxSettledPerClaim));
  KRANE_ASSIGN_OR_RETURN(
      auto rows, conn.query(strCat("SELECT id, invocation_id, kind, state, payload, error_code,"
                                   " error_message, fire_at, settled_at FROM workflow_promises"
                                   " WHERE invocation_id IN (",
                                   in, ") AND state <> 'pending' ORDER BY settled_at DESC LIMIT ?"),
                            params));
  const int64_t now = unixMillis();
  for (const db::Row& r : rows.rows) {
    auto it = by_id.find(r.str("invocation_id"));
    if (it == by_id.end()) continue;
    it->second->settled.emplace(r.str("id"), promiseStateOf(r, now));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Claim>> Engine::claim(size_t max) {
  std::vector<Claim> claimed;
  absl::Status status = pool_->transact(
      "workflow claim",
      [&](db::Connection& conn) -> absl::Status {
        claimed.clear();
        const int64_t now = unixMillis();
        // Only handlers registered here: during a rolling upgrade an invocation of a handler
        // this replica does not know waits for a replica that does.
        db::Params due_params = {now};
        due_params.insert(due_params.end(), claimable_params_.begin(), claimable_params_.end());
        due_params.push_back(static_cast<uint64_t>(max));
        // Everything an execution needs is read here, under the lock: the UPDATE below adds one
        // to lease_token and claims, and changes nothing else an execution reads.
        KRANE_ASSIGN_OR_RETURN(
            auto due,
            conn.query(strCat("SELECT id, status, service, handler, object_key, exclusive, input,"
                              " lease_token, wake_seq, cancel_requested, attempts, claims,"
                              " completion_promise IS NOT NULL AS has_caller"
                              " FROM workflow_invocations WHERE due_at <= ? AND ",
                              claimable_sql_, " ORDER BY due_at LIMIT ? FOR UPDATE SKIP LOCKED"),
                       due_params));
        db::Params ids;
        for (const db::Row& c : due.rows) {
          const std::string& id = c.str("id");
          if (c.str("status") == "scheduled" && c.i64("exclusive") != 0) {
            KRANE_ASSIGN_OR_RETURN(bool admitted, store::admitToKey(conn, id, c.str("service"),
                                                                    c.str("object_key"), now));
            if (!admitted) continue;
          }
          ids.push_back(id);
          Claim claim;
          claim.id = id;
          claim.service = c.str("service");
          claim.handler = c.str("handler");
          claim.key = c.str("object_key");
          claim.exclusive = c.i64("exclusive") != 0;
          claim.input = c.str("input");
          claim.token = c.i64("lease_token") + 1;
          claim.wake_seq = c.i64("wake_seq");
          claim.cancel_requested = c.i64("cancel_requested") != 0;
          claim.attempts = static_cast<int>(c.i64("attempts"));
          claim.claims = static_cast<int>(c.i64("claims")) + 1;
          claim.has_caller = c.i64("has_caller") != 0;
          claimed.push_back(std::move(claim));
        }
        if (ids.empty()) return absl::OkStatus();
        db::Params params = {options_.worker_id, now + options_.lease.count(),
                             now + options_.lease.count(), now, now};
        const std::string in = db::appendInList(params, ids);
        KRANE_RETURN_IF_ERROR(
            conn.exec(strCat(statements::kClaimPrefix, in, ")"), params).status());
        // Only saves reads: the claims stand without it.
        if (absl::Status read = readSettled(conn, claimed); !read.ok()) {
          if (db::isTransactionConflict(read)) return read;
          spdlog::info(
              "workflow: reading settled promises with a claim failed worker={}"
              " error=\"{}\"",
              options_.worker_id, read.message());
          for (Claim& c : claimed) c.settled.clear();
        }
        return absl::OkStatus();
      },
      db::TxOptions{db::Isolation::kReadCommitted, 10});
  KRANE_RETURN_IF_ERROR(status);
  return claimed;
}

void Engine::claimLoop() {
  bool logged_error = false;
  for (;;) {
    size_t free = 0;
    {
      std::unique_lock lock(mutex_);
      if (stopping_) return;
      free = claimCapacity() > active_.size() ? claimCapacity() - active_.size() : 0;
    }
    size_t got = 0;
    if (free > 0) {
      auto claimed = claim(free);
      if (!claimed.ok()) {
        if (!logged_error) {
          spdlog::warn("workflow: claiming invocations failed worker={} error=\"{}\"",
                       options_.worker_id, claimed.status().message());
        }
        logged_error = true;
      } else {
        if (logged_error) {
          spdlog::info("workflow: claiming works again worker={}", options_.worker_id);
        }
        logged_error = false;
        got = claimed->size();
        if (got > 0) {
          stats_.claims.fetch_add(1, std::memory_order_relaxed);
          stats_.claimed.fetch_add(got, std::memory_order_relaxed);
        }
        std::lock_guard lock(mutex_);
        for (Claim& c : *claimed) {
          c.cancel_seen = std::make_shared<std::atomic<bool>>(c.cancel_requested);
          active_.emplace(std::pair(c.id, c.token), c.cancel_seen);
          threads_->post([this, c = std::move(c)]() mutable { execute(std::move(c)); });
        }
      }
    }
    std::unique_lock lock(mutex_);
    if (got > 0 && got == free) continue;  // there may be more
    // Claims wait until the invocations claimed ahead are down to what the workers run: one
    // claim then takes several, where claiming at every finish took one at a time.
    wake_.wait_for(lock, options_.poll_interval,
                   [&] { return stopping_ || (notified_ && claimMayStart()); });
    notified_ = false;
  }
}

void Engine::renewLoop() {
  using Clock = std::chrono::steady_clock;
  const auto renew_period = std::max(options_.lease / 3, std::chrono::milliseconds(10));
  const auto check_period = std::min(renew_period, kCancelCheckPeriod);
  auto next_renewal = Clock::now() + renew_period;
  auto next_check = Clock::now() + check_period;
  for (;;) {
    std::vector<std::pair<std::pair<std::string, int64_t>, std::shared_ptr<std::atomic<bool>>>>
        active;
    {
      std::unique_lock lock(mutex_);
      // While stopping, the executions in flight finish (stop() waits for them) and keep their
      // leases renewed at the usual pace.
      const auto until = options_.renew_leases ? std::min(next_renewal, next_check) : next_check;
      renewer_wake_.wait_until(lock, until, [&] { return stopping_ && active_.empty(); });
      if (stopping_ && active_.empty()) return;
      active.assign(active_.begin(), active_.end());
    }
    const auto now = Clock::now();
    const bool renew = options_.renew_leases && now >= next_renewal;
    const bool check = now >= next_check;
    if (!renew && !check) continue;
    // Both come again after a period whatever happens below (no database, a failed renewal):
    // a renewal that succeeds moves its own time further.
    if (check) next_check = now + check_period;
    if (renew) next_renewal = now + check_period;
    if (active.empty()) {
      if (renew) next_renewal = now + renew_period;
      continue;
    }
    // Leases first: a slow look for cancels must not make one expire.
    auto conn = pool_->acquire();
    if (!conn.ok()) continue;
    if (renew) {
      bool renewed = true;
      const int64_t until = unixMillis() + options_.lease.count();
      for (const auto& [execution, cancel_seen] : active) {
        auto r = (*conn)->exec(
            "UPDATE workflow_invocations SET lease_expires_at = ?, due_at = ?"
            " WHERE id = ? AND lease_token = ? AND status = 'running'",
            {until, until, execution.first, execution.second});
        if (!r.ok()) {
          renewed = false;
          break;
        }
      }
      // One that failed is tried again at the next check, not a whole period later.
      if (renewed) next_renewal = now + renew_period;
    }
    if (check) lookForCancels(**conn, active);
  }
}

void Engine::lookForCancels(
    db::Connection& conn,
    const std::vector<
        std::pair<std::pair<std::string, int64_t>, std::shared_ptr<std::atomic<bool>>>>& active) {
  // By id: the same invocation may execute twice here for a moment (a stale execution and
  // the claim that took over from it).
  std::map<std::string_view, std::vector<std::atomic<bool>*>> unseen;
  for (const auto& [execution, cancel_seen] : active) {
    if (!cancel_seen->load()) unseen[execution.first].push_back(cancel_seen.get());
  }
  if (unseen.empty()) return;
  db::Params ids;
  for (const auto& [id, flags] : unseen) ids.emplace_back(std::string(id));
  db::Params params;
  const std::string in = db::appendInList(params, ids);
  auto marked = conn.query(
      strCat("SELECT id FROM workflow_invocations WHERE id IN (", in, ") AND cancel_requested = 1"),
      params);
  if (!marked.ok()) return;  // looked for again at the next period
  for (const db::Row& row : marked->rows) {
    if (auto it = unseen.find(row.str("id")); it != unseen.end()) {
      for (std::atomic<bool>* flag : it->second) flag->store(true);
    }
  }
}

void Engine::recordStep(int64_t ms) {
  stats_.steps.fetch_add(1, std::memory_order_relaxed);
  stats_.step_ms_total.fetch_add(static_cast<uint64_t>(ms), std::memory_order_relaxed);
  size_t i = 0;
  while (i < 8 && static_cast<double>(ms) > EngineStats::kBucketsMs[i]) ++i;
  stats_.step_buckets[i].fetch_add(1, std::memory_order_relaxed);
}

void Engine::execute(Claim claim) {
  const std::pair<std::string, int64_t> me(claim.id, claim.token);
  struct Done {
    Engine* engine;
    std::pair<std::string, int64_t> me;
    ~Done() {
      bool claim = false;
      bool last = false;
      {
        std::lock_guard lock(engine->mutex_);
        engine->active_.erase(me);
        engine->notified_ = true;
        claim = engine->claimMayStart();
        last = engine->stopping_ && engine->active_.empty();
      }
      if (claim) engine->wake_.notify_one();
      if (last) engine->renewer_wake_.notify_one();
    }
  } done{this, me};

  const ServiceDefinition* service = findService(claim.service);
  const ServiceDefinition::Entry* entry = service ? service->find(claim.handler) : nullptr;
  // claim() takes only registered handlers, and registration ends at start().
  if (entry == nullptr) {
    spdlog::critical("workflow: claimed invocation={} of unregistered {}.{}", claim.id,
                     claim.service, claim.handler);
    std::abort();
  }
  const RetryPolicy& policy = service->retryPolicy();

  // The journal of the previous execution under this claim, when it executes again at once.
  std::optional<std::vector<JournalEntry>> carried;
  for (;;) {  // one iteration per execution of the handler
    std::vector<JournalEntry> journal;
    if (carried) {
      journal.swap(*carried);
      carried.reset();
    } else if (claim.claims == 1) {
      // Its first claim: nothing can be journaled yet.
    } else if (auto cached = journal_cache_->take(claim.id, claim.token)) {
      stats_.journal_cache_hits.fetch_add(1, std::memory_order_relaxed);
      journal = *std::move(cached);
    } else {
      auto loaded = loadJournal(*pool_, claim.id);
      if (!loaded.ok()) {
        spdlog::warn("workflow: loading journal failed invocation={} error=\"{}\"", claim.id,
                     loaded.status().message());
        return;  // the lease expires and the invocation is claimed again
      }
      stats_.journal_reads.fetch_add(1, std::memory_order_relaxed);
      journal = *std::move(loaded);
    }
    stats_.attempts.fetch_add(1, std::memory_order_relaxed);
    ContextImpl ctx(*this, claim, service->keyed(), entry->kind, std::move(journal));
    using Commit = ContextImpl::Commit;
    ContextImpl::CommitRequest req;

    // Records a failed attempt: a retry later, a pause, or (attempts exhausted) failure.
    auto attempt_failed = [&](const absl::Status& error, bool pause_now) -> bool {
      const int attempts = claim.attempts + 1;
      spdlog::info(
          "workflow: attempt failed invocation={} service={} handler={} attempt={} "
          "error=\"{}\"",
          claim.id, claim.service, claim.handler, attempts, error.message());
      stats_.retries.fetch_add(1, std::memory_order_relaxed);
      claim.attempts = attempts;
      req = {};
      req.attempts = attempts;
      req.last_error = error;
      if (!pause_now && attempts < policy.max_attempts) {
        req.what = Commit::kRetry;
        req.retry_at = unixMillis() + policy.delayAfter(attempts).count();
        return false;
      }
      if (pause_now || ctx.compensating() || policy.on_exhausted == OnExhausted::kPause) {
        req.what = Commit::kPause;
        stats_.paused.fetch_add(1, std::memory_order_relaxed);
        return false;
      }
      return true;  // fail with compensations
    };

    absl::Status failure;  // set: run the compensations, then finish with it
    bool compensate = false;
    try {
      try {
        absl::StatusOr<std::string> result = entry->fn(ctx, claim.input);
        if (auto recorded = ctx.recordedAbort()) {
          failure = *recorded;
          compensate = true;
        } else if (result.ok()) {
          if (result->size() > options_.max_payload_bytes) {
            failure =
                terminalError(absl::StatusCode::kInvalidArgument,
                              strCat("output: ", result->size(), " bytes, more than the limit of ",
                                     options_.max_payload_bytes));
            compensate = true;
          } else {
            req.what = Commit::kFinish;
            req.final_status = "succeeded";
            req.outcome = *std::move(result);
          }
        } else if (isTerminal(result.status())) {
          failure = result.status();
          compensate = true;
        } else {
          compensate = attempt_failed(result.status(), false);
          if (compensate) {
            failure = terminalError(
                result.status().code(),
                strCat("gave up after ", claim.attempts, " attempts: ", result.status().message()));
          }
        }
      } catch (const AttemptFailedSignal& f) {
        compensate = attempt_failed(f.error, f.pause_now);
        if (compensate) {
          failure = terminalError(f.error.code(), strCat("gave up after ", claim.attempts,
                                                         " attempts: ", f.error.message()));
        }
      } catch (const AbortSignal&) {
        failure = ctx.recordedAbort().value_or(absl::InternalError("abort without a record"));
        compensate = true;
      } catch (const TerminalSignal& t) {
        failure = t.error;
        compensate = true;
      } catch (const std::exception& ex) {
        absl::Status error = absl::InternalError(strCat("handler threw: ", ex.what()));
        compensate = attempt_failed(error, false);
        if (compensate) {
          failure = terminalError(error.code(), strCat("gave up after ", claim.attempts,
                                                       " attempts: ", error.message()));
        }
      }

      if (compensate) {
        try {
          failure = ctx.beginCompensation(failure);
          // Compensation errors are logged by runCompensations; the failure stays the original.
          ctx.runCompensations().IgnoreError();
          req = {};
          req.what = Commit::kFinish;
          req.final_status =
              failure.code() == absl::StatusCode::kCancelled ? "cancelled" : "failed";
          req.outcome = failure;
          req.attempts = claim.attempts;
        } catch (const AttemptFailedSignal& f) {
          attempt_failed(f.error, f.pause_now);
        } catch (const TerminalSignal& t) {
          attempt_failed(t.error, true);
        } catch (const AbortSignal&) {
          attempt_failed(absl::InternalError("abort entry reached while compensating"), true);
        } catch (const std::exception& ex) {
          attempt_failed(absl::InternalError(strCat("compensation threw: ", ex.what())), false);
        }
      }
    } catch (const SuspendSignal& s) {
      req = {};
      req.what = Commit::kSuspend;
      req.wake_at = s.wake_at;
      req.waiting_for = s.waiting_for;
    } catch (const FencedSignal&) {
      stats_.fenced.fetch_add(1, std::memory_order_relaxed);
      spdlog::info("workflow: fenced out invocation={} worker={}", claim.id, options_.worker_id);
      return;
    }

    absl::StatusOr<bool> committed = false;
    // Deadlocks are retried inside commit(); should they go on, the commit is tried again while
    // the lease lasts rather than left for the lease to expire.
    Backoff backoff(
        BackoffPolicy{std::chrono::milliseconds(20), 2.0, std::chrono::milliseconds(1000), 0.5});
    const auto give_up = std::chrono::steady_clock::now() + options_.lease / 2;
    for (;;) {
      try {
        committed = ctx.commit(req);
      } catch (const FencedSignal&) {
        stats_.fenced.fetch_add(1, std::memory_order_relaxed);
        spdlog::info("workflow: fenced out invocation={} worker={}", claim.id, options_.worker_id);
        return;
      }
      if (committed.ok() || !absl::IsAborted(committed.status()) ||
          std::chrono::steady_clock::now() >= give_up) {
        break;
      }
      spdlog::info("workflow: commit conflicted, trying again invocation={} error=\"{}\"", claim.id,
                   committed.status().message());
      std::this_thread::sleep_for(backoff.next());
    }
    if (!committed.ok()) {
      spdlog::warn(
          "workflow: commit failed invocation={} error=\"{}\" (claimed again after the "
          "lease expires)",
          claim.id, committed.status().message());
      return;
    }
    switch (req.what) {
      case Commit::kSuspend:
        if (!*committed) {  // woken since the claim: execute again at once
          carried = ctx.takeJournal();
          continue;
        }
        stats_.suspensions.fetch_add(1, std::memory_order_relaxed);
        journal_cache_->put(claim.id, claim.token, ctx.takeJournal());
        break;
      case Commit::kRetry:
        // After a write that may have landed, the next attempt reads the journal instead.
        if (ctx.journalKnown()) journal_cache_->put(claim.id, claim.token, ctx.takeJournal());
        break;
      case Commit::kFinish:
        if (req.final_status == "succeeded") {
          stats_.succeeded.fetch_add(1, std::memory_order_relaxed);
        } else if (req.final_status == "cancelled") {
          stats_.cancelled.fetch_add(1, std::memory_order_relaxed);
        } else {
          stats_.failed.fetch_add(1, std::memory_order_relaxed);
        }
        notify();
        break;
      default:
        break;
    }
    return;
  }
}

std::vector<prometheus::MetricFamily> Engine::metrics() const {
  using prometheus::MetricType;
  std::vector<prometheus::MetricFamily> out;
  auto counter = [&](const std::string& name, const std::string& help, uint64_t value) {
    prometheus::MetricFamily f;
    f.name = name;
    f.help = help;
    f.type = MetricType::Counter;
    prometheus::ClientMetric m;
    m.counter.value = static_cast<double>(value);
    f.metric.push_back(m);
    out.push_back(std::move(f));
  };
  counter("krane_workflow_attempts_total", "Handler executions started, replays included",
          stats_.attempts.load());
  counter("krane_workflow_suspensions_total", "Invocations suspended", stats_.suspensions.load());
  counter("krane_workflow_retries_total", "Attempts that failed with a retryable error",
          stats_.retries.load());
  counter("krane_workflow_fenced_total", "Commits refused because the lease was taken over",
          stats_.fenced.load());
  counter("krane_workflow_journal_reads_total",
          "Executions that read their invocation's journal from the database",
          stats_.journal_reads.load());
  counter("krane_workflow_journal_cache_hits_total",
          "Executions that took their invocation's journal from this replica's cache",
          stats_.journal_cache_hits.load());
  {
    prometheus::MetricFamily f;
    f.name = "krane_workflow_finished_total";
    f.help = "Invocations finished by this replica, by outcome";
    f.type = MetricType::Counter;
    for (const auto& [label, value] :
         std::vector<std::pair<std::string, uint64_t>>{{"succeeded", stats_.succeeded.load()},
                                                       {"failed", stats_.failed.load()},
                                                       {"cancelled", stats_.cancelled.load()},
                                                       {"paused", stats_.paused.load()}}) {
      prometheus::ClientMetric m;
      m.label.push_back({"outcome", label});
      m.counter.value = static_cast<double>(value);
      f.metric.push_back(m);
    }
    out.push_back(std::move(f));
  }
  {
    prometheus::MetricFamily f;
    f.name = "krane_workflow_step_duration_seconds";
    f.help = "Duration of run() side effects";
    f.type = MetricType::Histogram;
    prometheus::ClientMetric m;
    uint64_t cumulative = 0;
    for (size_t i = 0; i < 9; ++i) {
      cumulative += stats_.step_buckets[i].load();
      prometheus::ClientMetric::Bucket b;
      b.cumulative_count = cumulative;
      b.upper_bound =
          i < 8 ? EngineStats::kBucketsMs[i] / 1000.0 : std::numeric_limits<double>::infinity();
      m.histogram.bucket.push_back(b);
    }
    m.histogram.sample_count = cumulative;
    m.histogram.sample_sum = static_cast<double>(stats_.step_ms_total.load()) / 1000.0;
    f.metric.push_back(m);
    out.push_back(std::move(f));
  }
  // From the database: what every replica sees.
  auto conn = pool_->acquire();
  if (conn.ok()) {
    auto rows = (*conn)->query(
        "SELECT service, status, COUNT(*) AS n FROM workflow_invocations GROUP BY service, status");
    if (rows.ok()) {
      prometheus::MetricFamily f;
      f.name = "krane_workflow_invocations";
      f.help = "Invocations in the database by service and status";
      f.type = MetricType::Gauge;
      for (const db::Row& r : rows->rows) {
        prometheus::ClientMetric m;
        m.label.push_back({"service", r.str("service")});
        m.label.push_back({"status", r.str("status")});
        m.gauge.value = static_cast<double>(r.i64("n"));
        f.metric.push_back(m);
      }
      out.push_back(std::move(f));
    }
    auto held = (*conn)->query(
        "SELECT COUNT(*) AS n, COALESCE(MIN(held_since), 0) AS oldest FROM workflow_keys"
        " WHERE holder IS NOT NULL");
    if (held.ok() && !held->empty()) {
      prometheus::MetricFamily f;
      f.name = "krane_workflow_keys_held";
      f.help = "Virtual object keys held by an exclusive invocation";
      f.type = MetricType::Gauge;
      prometheus::ClientMetric m;
      m.gauge.value = static_cast<double>(held->rows[0].i64("n"));
      f.metric.push_back(m);
      out.push_back(std::move(f));
      prometheus::MetricFamily g;
      g.name = "krane_workflow_oldest_key_held_seconds";
      g.help = "How long the longest-held key has been held";
      g.type = MetricType::Gauge;
      prometheus::ClientMetric m2;
      const int64_t oldest = held->rows[0].i64("oldest");
      m2.gauge.value = oldest == 0 ? 0.0 : static_cast<double>(unixMillis() - oldest) / 1000.0;
      g.metric.push_back(m2);
      out.push_back(std::move(g));
    }
  }
  return out;
}

absl::StatusOr<std::string> sendOncePerWait(Engine& engine, std::string service,
                                            std::string handler, std::string key,
                                            std::string wait) {
  InvokeRequest request;
  request.service = std::move(service);
  request.handler = std::move(handler);
  request.key = std::move(key);
  request.idempotency_key = std::move(wait);
  return engine.send(request);
}

}  // namespace krane::workflow
