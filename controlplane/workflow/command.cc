#include "controlplane/workflow/command.h"

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <memory>

#include "common/clock.h"
#include "common/strings.h"
#include "controlplane/db/dsn.h"
#include "controlplane/db/pool.h"
#include "controlplane/workflow/operations.h"
#include "controlplane/workflow/service.h"

namespace krane::workflow {
namespace {

int fail(const std::string& command, const absl::Status& status) {
  std::fprintf(stderr, "krane-ctrl workflow %s: error: %s\n", command.c_str(),
               std::string(toStd(status.message())).c_str());
  return 1;
}

absl::StatusOr<std::shared_ptr<db::Pool>> openDatabase(const std::string& flag) {
  std::string text = flag;
  if (text.empty()) {
    if (const char* env = std::getenv("KRANE_DSN")) text = env;
  }
  if (text.empty()) {
    return absl::InvalidArgumentError(
        "no database given: pass --dsn mysql://user:password@host:3306/krane or set KRANE_DSN");
  }
  auto dsn = db::parseDsn(text);
  if (!dsn.ok()) return dsn.status();
  return db::Pool::create(*dsn, {.max_connections = 2});
}

std::string timeText(int64_t unix_ms) {
  const std::time_t t = static_cast<std::time_t>(unix_ms / 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string durationText(int64_t ms) {
  if (ms < 1000) return strCat(ms, "ms");
  if (ms < 120000) return strCat(ms / 1000, "s");
  if (ms < 7200000) return strCat(ms / 60000, "m");
  return strCat(ms / 3600000, "h", (ms / 60000) % 60, "m");
}

// Adds `--dsn` and runs `fn(pool)` with the database open; failures exit 1 naming the command.
void withDatabase(CLI::App* cmd, const std::string& name, int& exit_code,
                  std::function<absl::Status(db::Pool&)> fn) {
  auto dsn = std::make_shared<std::string>();
  cmd->add_option("--dsn", *dsn, "Database (default: $KRANE_DSN)");
  cmd->callback([dsn, name, fn = std::move(fn), &exit_code] {
    auto pool = openDatabase(*dsn);
    if (!pool.ok()) {
      exit_code = fail(name, pool.status());
      return;
    }
    if (absl::Status st = fn(**pool); !st.ok()) exit_code = fail(name, st);
  });
}

}  // namespace

void addWorkflowCommands(CLI::App& app, int& exit_code) {
  CLI::App* wf = app.add_subcommand(
      "workflow",
      "Inspect and steer workflow invocations (list, show, cancel, kill, resume, ...).");
  wf->require_subcommand(1);

  auto filter = std::make_shared<InvocationFilter>();
  CLI::App* list = wf->add_subcommand("list", "List invocations, newest first.");
  list->add_option("--service", filter->service, "Only this service");
  list->add_option("--key", filter->key, "Only this object key (with --service)");
  list->add_option("--status", filter->status,
                   "Only this status: scheduled, queued, ready, running, suspended, paused,"
                   " succeeded, failed, cancelled, killed");
  list->add_option("--limit", filter->limit, "At most this many (default 100)");
  withDatabase(list, "list", exit_code, [filter](db::Pool& pool) -> absl::Status {
    if (!filter->key.empty() && filter->service.empty()) {
      return absl::InvalidArgumentError("key: --key needs --service");
    }
    auto all = listInvocations(pool, *filter);
    if (!all.ok()) return all.status();
    std::printf("%-36s %-20s %-16s %-20s %-10s %-8s %s\n", "ID", "SERVICE", "HANDLER", "KEY",
                "STATUS", "ATTEMPTS", "CREATED");
    for (const auto& s : *all) {
      std::printf("%-36s %-20s %-16s %-20s %-10s %-8d %s\n", s.id.c_str(), s.service.c_str(),
                  s.handler.c_str(), s.key.empty() ? "-" : s.key.c_str(), s.status.c_str(),
                  s.attempts, timeText(s.created_at).c_str());
    }
    return absl::OkStatus();
  });

  auto id = std::make_shared<std::string>();
  CLI::App* show = wf->add_subcommand("show", "Show one invocation with its journal.");
  show->add_option("id", *id, "Invocation id")->required();
  withDatabase(show, "show", exit_code, [id](db::Pool& pool) -> absl::Status {
    auto d = showInvocation(pool, *id);
    if (!d.ok()) return d.status();
    const InvocationSummary& s = d->summary;
    std::printf("id:          %s\n", s.id.c_str());
    std::printf("service:     %s.%s\n", s.service.c_str(), s.handler.c_str());
    std::printf("key:         %s\n", s.key.empty() ? "-" : s.key.c_str());
    std::printf("status:      %s%s\n", s.status.c_str(),
                d->cancel_requested ? " (cancel requested)" : "");
    std::printf("attempts:    %d (claimed %d times)\n", s.attempts, d->claims);
    std::printf("created:     %s\n", timeText(s.created_at).c_str());
    if (s.finished_at) std::printf("finished:    %s\n", timeText(*s.finished_at).c_str());
    if (d->parent_id) std::printf("parent:      %s\n", d->parent_id->c_str());
    if (d->idempotency_key) std::printf("idempotency: %s\n", d->idempotency_key->c_str());
    if (d->lease_owner) std::printf("lease owner: %s\n", d->lease_owner->c_str());
    std::printf("input:       %s\n", d->input.c_str());
    if (d->output) std::printf("output:      %s\n", d->output->c_str());
    if (!d->error.empty()) std::printf("error:       %s\n", d->error.c_str());
    if (!s.last_error.empty()) std::printf("last error:  %s\n", s.last_error.c_str());
    std::printf("journal:\n  %-4s %-10s %-24s %-6s %s\n", "SEQ", "KIND", "NAME", "MS", "RESULT");
    for (const auto& e : d->journal) {
      std::printf(
          "  %-4d %-10s %-24s %-6lld %s\n", e.seq, e.kind.c_str(),
          e.name.empty() ? "-" : e.name.c_str(), static_cast<long long>(e.duration_ms),
          e.ok ? (e.payload ? e.payload->c_str() : "") : strCat("error: ", e.error).c_str());
    }
    return absl::OkStatus();
  });

  struct Verb {
    const char* name;
    const char* help;
    absl::Status (*fn)(db::Pool&, const std::string&);
    const char* done;
  };
  for (const Verb& v : {
           Verb{"cancel",
                "Cancel an invocation: its handler sees CANCELLED at its next suspension point and"
                " its compensations run.",
                [](db::Pool&pool, const std::string&id) { return cancelInvocation(pool, id); },
                "cancel requested for"},
           Verb{"kill", "End an invocation at once, without compensations; its worker is fenced.",
                &killInvocation, "killed"},
           Verb{"resume", "Restart a paused invocation with a fresh count of attempts.",
                &resumeInvocation, "resumed"},
       }) {
    auto target = std::make_shared<std::string>();
    CLI::App* cmd = wf->add_subcommand(v.name, v.help);
    cmd->add_option("id", *target, "Invocation id")->required();
    withDatabase(cmd, v.name, exit_code, [v, target](db::Pool& pool) -> absl::Status {
      if (absl::Status st = v.fn(pool, *target); !st.ok()) return st;
      std::printf("%s %s\n", v.done, target->c_str());
      return absl::OkStatus();
    });
  }

  auto awakeable = std::make_shared<std::string>();
  auto payload = std::make_shared<std::string>();
  CLI::App* resolve =
      wf->add_subcommand("resolve", "Resolve an awakeable (the first settle wins).");
  resolve->add_option("awakeable", *awakeable, "Awakeable id")->required();
  resolve->add_option("--payload", *payload, "What the waiting handler receives");
  withDatabase(resolve, "resolve", exit_code, [awakeable, payload](db::Pool& pool) {
    absl::Status st = settleAwakeable(pool, *awakeable, *payload);
    if (st.ok()) std::printf("resolved %s\n", awakeable->c_str());
    return st;
  });
  auto message = std::make_shared<std::string>();
  CLI::App* reject = wf->add_subcommand(
      "reject", "Reject an awakeable: the waiting handler receives a terminal error.");
  reject->add_option("awakeable", *awakeable, "Awakeable id")->required();
  reject->add_option("--message", *message, "The error message")->required();
  withDatabase(reject, "reject", exit_code, [awakeable, message](db::Pool& pool) {
    absl::Status st =
        settleAwakeable(pool, *awakeable, terminalError(absl::StatusCode::kAborted, *message));
    if (st.ok()) std::printf("rejected %s\n", awakeable->c_str());
    return st;
  });

  auto older_than = std::make_shared<int64_t>(3600);
  CLI::App* keys = wf->add_subcommand(
      "keys", "The watchdog: keys held by one exclusive invocation for longer than a threshold.");
  keys->add_option("--older-than-s", *older_than, "Threshold in seconds (default 3600)")
      ->check(CLI::NonNegativeNumber);
  withDatabase(keys, "keys", exit_code, [older_than](db::Pool& pool) -> absl::Status {
    auto held = keysHeldLongerThan(pool, std::chrono::seconds(*older_than));
    if (!held.ok()) return held.status();
    std::printf("%-20s %-20s %-36s %-16s %-10s %-8s %s\n", "SERVICE", "KEY", "HOLDER", "HANDLER",
                "STATUS", "HELD", "QUEUED");
    for (const auto& k : *held) {
      std::printf("%-20s %-20s %-36s %-16s %-10s %-8s %lld\n", k.service.c_str(), k.key.c_str(),
                  k.holder.c_str(), k.holder_handler.c_str(), k.holder_status.c_str(),
                  durationText(k.held_ms).c_str(), static_cast<long long>(k.queued));
    }
    return absl::OkStatus();
  });

  auto retention = std::make_shared<int64_t>(7 * 24 * 3600);
  CLI::App* cleanup = wf->add_subcommand(
      "cleanup", "Delete invocations finished longer ago than the retention, with their journals.");
  cleanup->add_option("--retention-s", *retention, "Retention in seconds (default 7 days)")
      ->check(CLI::NonNegativeNumber);
  withDatabase(cleanup, "cleanup", exit_code, [retention](db::Pool& pool) -> absl::Status {
    auto r = cleanupFinished(pool, std::chrono::seconds(*retention));
    if (!r.ok()) return r.status();
    std::printf("deleted %llu invocations, %llu journal entries, %llu promises\n",
                static_cast<unsigned long long>(r->invocations),
                static_cast<unsigned long long>(r->journal_entries),
                static_cast<unsigned long long>(r->promises));
    return absl::OkStatus();
  });
}

}  // namespace krane::workflow
