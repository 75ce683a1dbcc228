// The workflow engine benchmark: `./dev bench workflow [--json] [--quick]` (see bench/README.md).
//
// Starts its own scratch MariaDB (tests/support/mariadb.h), migrates a fresh database and runs the
// engine in this process. Figures: five-step workflows per second, the overhead of one step (time
// and database writes), the memory of 10,000 invocations suspended on awakeables and the time to
// resolve them all, and the raw single-row commit rate of the same server (the physical limit),
// with journaled steps and resumed invocations per second as ratios to it, and the same row
// changes issued without the engine (floor.h): what the schema allows at all.
#include <dirent.h>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "bench/support/commit_rate.h"
#include "bench/support/figures.h"
#include "bench/workflow/floor.h"
#include "common/strings.h"
#include "controlplane/db/migrate.h"
#include "controlplane/db/pool.h"
#include "controlplane/workflow/engine.h"
#include "tests/support/mariadb.h"

namespace krane::bench {
namespace {

using namespace std::chrono_literals;
using workflow::Context;
using workflow::Engine;
using workflow::ServiceDefinition;

constexpr const char* kUsage =
    R"(usage: workflow [--json] [--quick] [--threads N] [--small-server] [--help]

  --json       print one JSON object {"figures": [...]} on stdout; the table and progress go to
               stderr
  --quick      a smoke run: fewer workflows and 2,000 suspended invocations instead of 10,000
  --threads N  the engine's worker threads (EngineOptions::threads, workflow.threads; 1-1024;
               default 64; figures before the sixth pass in bench/README.md used 16)
  --small-server  the scratch MariaDB sized as for the tests (8 MiB redo log, 64 MiB buffer
               pool) instead of MariaDB's defaults (96 MiB, 128 MiB); figures before the eighth
               pass in bench/README.md used it
)";

// --threads: the engine's worker threads. 64: concurrent journal entries and claims share
// statements, and (since waiting threads are woken one by one) more threads cost no more CPU.
size_t g_threads = 64;

std::FILE* progress = stderr;

template <typename... Args>
void say(fmt::format_string<Args...> f, Args&&... args) {
  std::fprintf(progress, "%s\n", fmt::format(f, std::forward<Args>(args)...).c_str());
  std::fflush(progress);
}

int64_t rssKib() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  }
  return 0;
}

// User + system CPU of a process so far, in ms, from /proc/PID/stat (0 when unreadable).
double cpuMs(pid_t pid) {
  std::ifstream in(strCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = stat.rfind(')');  // the command name may hold spaces
  if (close == std::string::npos) return 0;
  std::vector<std::string> fields;
  size_t at = close + 2;
  while (at < stat.size() && fields.size() < 13) {
    const size_t end = stat.find(' ', at);
    fields.push_back(stat.substr(at, end - at));
    if (end == std::string::npos) break;
    at = end + 1;
  }
  if (fields.size() < 13) return 0;  // fields 14 and 15 of the file: utime, stime
  const double ticks = std::stod(fields[11]) + std::stod(fields[12]);
  return ticks * 1000.0 / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// The scratch server: the mariadbd this process started.
pid_t serverPid() {
  DIR* proc = opendir("/proc");
  pid_t found = 0;
  while (dirent* e = proc ? readdir(proc) : nullptr) {
    const pid_t pid = static_cast<pid_t>(std::atoi(e->d_name));
    if (pid <= 0) continue;
    std::ifstream in(strCat("/proc/", pid, "/stat"));
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t close = stat.rfind(')');
    if (close == std::string::npos || stat.find("(mariadbd)") == std::string::npos) continue;
    if (std::atoi(stat.c_str() + close + 4) == getpid()) found = pid;  // "<pid> (comm) S <ppid>"
  }
  if (proc) closedir(proc);
  return found;
}

// CPU of this process (the engine, its handlers and the benchmark's threads) plus the server's.
double cpuMsBoth(pid_t server) { return cpuMs(getpid()) + cpuMs(server); }

double seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

struct ServerCounters {
  int64_t commits = 0;  // transactions that wrote, explicit or autocommit
  int64_t rows_written = 0;
  int64_t statements = 0;  // every statement and round trip the server answered
  int64_t prepares = 0;    // statements prepared (a connection's cache of them missed)
};

// What the engine's own statements were, between two snapshots.
struct EngineWrites {
  uint64_t claims = 0, claimed = 0, sends = 0;
  Engine::GroupedWrites journal, finish;
};

EngineWrites engineWrites(const Engine& engine) {
  return {engine.stats().claims.load(), engine.stats().claimed.load(),
          engine.stats().send_statements.load(), engine.journalWrites(), engine.finishWrites()};
}

// "per <unit>: claims ..., journal ..., finishes ...": the engine's statements between two
// snapshots, per one of `n`.
std::string engineWritesPer(const EngineWrites& a, const EngineWrites& b, double n,
                            std::string_view unit) {
  const auto per = [&](uint64_t x, uint64_t y) { return static_cast<double>(y - x) / n; };
  const auto each = [](uint64_t x0, uint64_t x1, uint64_t y0, uint64_t y1) {
    return x1 == x0 ? 0.0 : static_cast<double>(y1 - y0) / static_cast<double>(x1 - x0);
  };
  return fmt::format(
      "per {}: {:.3f} claim transactions ({:.1f} invocations each), {:.3f} grouped sends,"
      " {:.3f} journal statements ({:.1f} entries each), {:.3f} finish statements ({:.1f}"
      " finishes each)",
      unit, per(a.claims, b.claims), each(a.claims, b.claims, a.claimed, b.claimed),
      per(a.sends, b.sends), per(a.journal.statements, b.journal.statements),
      each(a.journal.statements, b.journal.statements, a.journal.rows, b.journal.rows),
      per(a.finish.statements, b.finish.statements),
      each(a.finish.statements, b.finish.statements, a.finish.rows, b.finish.rows));
}

ServerCounters counters(db::Pool& pool) {
  ServerCounters c;
  auto conn = check(pool.acquire(), "connection");
  // Handler_* count row operations of every engine; the benchmark's statements use no temporary
  // tables, so their writes are the rows the engine wrote.
  auto rows = check(conn->query("SHOW GLOBAL STATUS WHERE Variable_name IN ('Handler_commit',"
                                " 'Handler_write', 'Handler_update', 'Handler_delete',"
                                " 'Questions', 'Com_stmt_prepare')"),
                    "status");
  for (const auto& r : rows.rows) {
    const int64_t v = std::stoll(r.str(1));
    if (r.str(0) == "Handler_commit") {
      c.commits = v;
    } else if (r.str(0) == "Questions") {
      c.statements = v;
    } else if (r.str(0) == "Com_stmt_prepare") {
      c.prepares = v;
    } else {
      c.rows_written += v;
    }
  }
  return c;
}

// Invocations this engine finished so far, whatever their outcome.
uint64_t finished(const Engine& engine) {
  return engine.stats().succeeded.load() + engine.stats().failed.load() +
         engine.stats().cancelled.load();
}

// Waits until the engine has finished `n` more invocations of `service` than `before` (its own
// counters, looked at every millisecond; nothing else runs meanwhile). Awaiting each invocation's
// result in turn would measure the benchmark too: one round trip per invocation, one after the
// other, and awaitResult's polling back-off.
void awaitFinished(const Engine& engine, const std::string& service, uint64_t before, size_t n) {
  const auto deadline = std::chrono::steady_clock::now() + 600s;
  while (finished(engine) < before + n) {
    if (std::chrono::steady_clock::now() > deadline) {
      check(absl::DeadlineExceededError(strCat(before + n - finished(engine), " invocations of ",
                                               service, " did not finish within 600 s")),
            "workflows");
    }
    std::this_thread::sleep_for(1ms);
  }
}

// Every invocation of `service` so far succeeded (one query, outside the measured time).
void checkSucceeded(db::Pool& pool, const std::string& service) {
  auto conn = check(pool.acquire(), "connection");
  auto rows = check(conn->query("SELECT COUNT(*) FROM workflow_invocations WHERE service = ?"
                                " AND status <> 'succeeded'",
                                {service}),
                    "count failed");
  if (rows.rows[0].i64(0) != 0) {
    check(absl::InternalError(
              strCat(rows.rows[0].i64(0), " invocations of ", service, " did not succeed")),
          "workflows");
  }
}

// Sends n invocations from several threads and waits for all of them; returns the seconds.
double runBatch(Engine& engine, db::Pool& pool, const std::string& service, int n) {
  const uint64_t before = finished(engine);
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> ts;
  const int senders = 8;
  for (int s = 0; s < senders; ++s) {
    ts.emplace_back([&, s] {
      for (int i = s; i < n; i += senders) check(engine.send({service, "run"}), "send");
    });
  }
  for (auto& t : ts) t.join();
  awaitFinished(engine, service, before, n);
  const double s = seconds(std::chrono::steady_clock::now() - start);
  checkSucceeded(pool, service);
  return s;
}

int run(bool json, bool quick) {
  if (json) progress = stderr;
  logsToStderr();
  auto& mariadb = testing::ScratchMariaDb::instance();
  const db::Dsn dsn = mariadb.freshDatabase();
  auto pool = check(db::Pool::create(dsn, {.max_connections = 64}), "pool");
  check(db::Migrator(pool, check(db::builtinMigrations(), "migrations")).migrate().status(),
        "migrating");
  std::string server_sizes;
  {
    auto conn = check(pool->acquire(), "connection");
    auto sizes = check(conn->query("SELECT @@innodb_log_file_size >> 20 AS redo,"
                                   " @@innodb_buffer_pool_size >> 20 AS pool"),
                       "server sizes");
    server_sizes = strCat("redo log ", sizes.rows[0].i64("redo"), " MiB, buffer pool ",
                          sizes.rows[0].i64("pool"), " MiB");
    say("  server: {}", server_sizes);
    check(conn->execText("CREATE TABLE bench_awakeables (invocation_id VARCHAR(64) PRIMARY KEY,"
                         " awakeable_id VARCHAR(128)) ENGINE=InnoDB"),
          "create bench_awakeables");
  }

  workflow::EngineOptions options;
  options.threads = g_threads;
  options.poll_interval = 50ms;
  Engine engine(pool, options);
  check(engine.registerService(ServiceDefinition::service("Five").handler(
            "run",
            [](Context& ctx, const std::string&) -> absl::StatusOr<std::string> {
              std::string last;
              for (int i = 0; i < 5; ++i) {
                auto r = ctx.run(strCat("step", i), [i]() -> absl::StatusOr<std::string> {
                  return std::to_string(i);
                });
                if (!r.ok()) return r.status();
                last = *r;
              }
              return last;
            })),
        "register Five");
  // Five steps run back to back, timed from before the first to after the last: what the engine
  // adds to a step (journaling it, one commit) when the step itself costs nothing. Timing outside
  // run() is not deterministic, which is harmless here: these handlers never replay.
  std::mutex timed_mutex;
  std::vector<double> timed_ms;
  check(engine.registerService(ServiceDefinition::service("Timed").handler(
            "run",
            [&](Context& ctx, const std::string&) -> absl::StatusOr<std::string> {
              const auto start = std::chrono::steady_clock::now();
              for (int i = 0; i < 5; ++i) {
                auto r = ctx.run(strCat("step", i), [i]() -> absl::StatusOr<std::string> {
                  return std::to_string(i);
                });
                if (!r.ok()) return r.status();
              }
              const double ms = seconds(std::chrono::steady_clock::now() - start) * 1000.0;
              std::lock_guard lock(timed_mutex);
              timed_ms.push_back(ms);
              return std::string();
            })),
        "register Timed");
  check(engine.registerService(ServiceDefinition::service("Zero").handler(
            "run",
            [](Context&, const std::string&) -> absl::StatusOr<std::string> {
              return std::string("0");
            })),
        "register Zero");
  check(engine.registerService(ServiceDefinition::service("Wait").handler(
            "run",
            [](Context& ctx, const std::string&) -> absl::StatusOr<std::string> {
              workflow::Awakeable a = ctx.awakeable();
              auto published =
                  ctx.runTx("publish", [&](db::Connection& conn) -> absl::StatusOr<std::string> {
                    auto r = conn.exec("INSERT INTO bench_awakeables VALUES (?, ?)",
                                       {ctx.invocationId(), a.id});
                    if (!r.ok()) return r.status();
                    return std::string();
                  });
              if (!published.ok()) return published.status();
              return ctx.await(a.future);
            })),
        "register Wait");
  // A fan-out of kFanOut calls to Wait (each waits on an awakeable, as a deploy waits on its
  // regions), collected with one awaitAll or awaited one by one.
  constexpr int kFanOut = 100;
  std::atomic<int> fan_runs{0};
  auto fanOut = [&](bool all) {
    return [&, all](Context& ctx, const std::string&) -> absl::StatusOr<std::string> {
      ++fan_runs;
      std::vector<workflow::Future> calls;
      for (int i = 0; i < kFanOut; ++i) {
        calls.push_back(ctx.call("Wait", "run", "", ""));
      }
      if (all) return ctx.awaitAll(calls).status().ok() ? "" : "cancelled";
      for (const auto& f : calls) {
        if (auto r = ctx.await(f); !r.ok()) return r.status();
      }
      return std::string();
    };
  };
  check(engine.registerService(ServiceDefinition::service("FanAll").handler("run", fanOut(true))),
        "register FanAll");
  check(engine.registerService(ServiceDefinition::service("FanEach").handler("run", fanOut(false))),
        "register FanEach");
  engine.start();

  // Suspends `n` Wait invocations from 8 sender threads and waits until all are suspended.
  auto suspend = [&](int n) {
    std::vector<std::thread> ts;
    for (int s = 0; s < 8; ++s) {
      ts.emplace_back([&, s] {
        for (int i = s; i < n; i += 8) check(engine.send({"Wait", "run"}), "send");
      });
    }
    for (auto& t : ts) t.join();
    for (;;) {
      auto conn = check(pool->acquire(), "connection");
      auto rows = check(conn->query("SELECT COUNT(*) FROM workflow_invocations WHERE service ="
                                    " 'Wait' AND status = 'suspended'"),
                        "count");
      if (rows.rows[0].i64(0) == n) break;
      std::this_thread::sleep_for(100ms);
    }
  };
  auto readAwakeables = [&] {
    std::vector<std::pair<std::string, std::string>> out;
    auto conn = check(pool->acquire(), "connection");
    auto rows = check(conn->query("SELECT b.invocation_id, b.awakeable_id FROM bench_awakeables b"
                                  " JOIN workflow_invocations i ON i.id = b.invocation_id"
                                  " WHERE i.status = 'suspended'"),
                      "ids");
    for (const auto& r : rows.rows) out.emplace_back(r.str(0), r.str(1));
    return out;
  };
  // Resolves every awakeable from 8 threads and waits for the invocations; returns the seconds.
  auto resolveAll = [&](const std::vector<std::pair<std::string, std::string>>& awakeables) {
    const uint64_t before = finished(engine);
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::thread> ts;
    for (int s = 0; s < 8; ++s) {
      ts.emplace_back([&, s] {
        for (size_t i = s; i < awakeables.size(); i += 8) {
          check(engine.resolveAwakeable(awakeables[i].second, "ok"), "resolve");
        }
      });
    }
    for (auto& t : ts) t.join();
    const double resolved_s = seconds(std::chrono::steady_clock::now() - start);
    awaitFinished(engine, "Wait", before, awakeables.size());
    const double all_s = seconds(std::chrono::steady_clock::now() - start);
    checkSucceeded(*pool, "Wait");
    say("  resolving {} awakeables took {:.2f} s, the last invocation finished {:.2f} s later",
        awakeables.size(), resolved_s, all_s - resolved_s);
    return all_s;
  };

  const int rounds = quick ? 1 : 3;
  const int batch = quick ? 300 : 2000;
  const int suspended_n = quick ? 2000 : 10000;
  const int sequential = quick ? 20 : 50;
  const auto raw_window = std::chrono::seconds(quick ? 2 : 3);

  say("warm-up: 100 five-step workflows, 500 invocations suspended and resumed (threads, arenas"
      " and caches exist before anything is measured)");
  runBatch(engine, *pool, "Five", 100);
  suspend(500);
  resolveAll(readAwakeables());

  std::vector<double> raw_r, wf_r, step_ms_r, writes_r, commits_r, kib_r, resolve_r, wf_commit_r;
  std::vector<double> fan_all_ms, fan_each_ms, fan_all_runs, fan_each_runs;
  // Per round, against the raw commit rate of the same round.
  std::vector<double> steps_ratio_r, resumes_ratio_r;
  std::vector<double> wf_statements_r, resume_statements_r, resume_commits_r;
  std::vector<double> wf_prepares_r, resume_prepares_r;
  // CPU (this process and the server) per five-step workflow and per resume: less sensitive
  // than the rates to whatever else runs on the machine.
  const pid_t server = serverPid();
  std::vector<double> wf_cpu_r, resume_cpu_r;
  std::vector<double> wf_engine_cpu_r, resume_engine_cpu_r;  // this process only
  // The floor: the same row changes without the engine, one by one and grouped (floor.h).
  std::vector<double> resume_floor_r, resume_floor_grouped_r, step_floor_r, step_floor_grouped_r;
  // What an engine could reach by grouping its own statements (callers' sends and settles stay
  // one by one, floor.h).
  std::vector<double> resume_floor_engine_grouped_r, step_floor_engine_grouped_r;
  for (int round = 1; round <= rounds; ++round) {
    say("round {}/{}", round, rounds);
    const double raw = check(
        bench::rawCommitRate(*pool, 8, raw_window, strCat("bench_raw_", round)), "raw commit rate");
    raw_r.push_back(raw);
    say("  raw commit rate: {:.0f} commits/s (single-row autocommit INSERTs, 8 connections, {} s)",
        raw, raw_window.count());
    const FloorOptions one_by_one{.group = 4, .grouped = false};
    const FloorOptions grouped{.group = 8, .grouped = true};
    const double resume_floor =
        check(resumeFloorRate(*pool, suspended_n, one_by_one, strCat(round, "a")), "floor");
    const double resume_floor_grouped =
        check(resumeFloorRate(*pool, suspended_n, grouped, strCat(round, "b")), "floor");
    const double step_floor =
        check(stepFloorRate(*pool, batch, one_by_one, strCat(round, "a")), "floor");
    const double step_floor_grouped =
        check(stepFloorRate(*pool, batch, grouped, strCat(round, "b")), "floor");
    const FloorOptions engine_grouped{.group = 8, .grouped = true, .callers_one_by_one = true};
    const double resume_floor_engine_grouped =
        check(resumeFloorRate(*pool, suspended_n, engine_grouped, strCat(round, "c")), "floor");
    const double step_floor_engine_grouped =
        check(stepFloorRate(*pool, batch, engine_grouped, strCat(round, "c")), "floor");
    resume_floor_engine_grouped_r.push_back(resume_floor_engine_grouped / raw);
    step_floor_engine_grouped_r.push_back(step_floor_engine_grouped / raw);
    resume_floor_r.push_back(resume_floor / raw);
    resume_floor_grouped_r.push_back(resume_floor_grouped / raw);
    step_floor_r.push_back(step_floor / raw);
    step_floor_grouped_r.push_back(step_floor_grouped / raw);
    say("  the floor, without the engine: {:.0f} resumes/s one by one, {:.0f}/s grouped by 8;"
        " {:.0f} steps/s one by one, {:.0f}/s grouped by 8",
        resume_floor, resume_floor_grouped, step_floor, step_floor_grouped);
    say("  grouping only the engine's own statements (the callers' sends and settles one by one):"
        " {:.0f} resumes/s, {:.0f} steps/s",
        resume_floor_engine_grouped, step_floor_engine_grouped);

    auto before0 = counters(*pool);
    const double zero_s = runBatch(engine, *pool, "Zero", batch);
    auto after0 = counters(*pool);
    auto before5 = counters(*pool);
    const double cpu_before5 = cpuMsBoth(server);
    const double engine_cpu_before5 = cpuMs(getpid());
    const EngineWrites writes_before5 = engineWrites(engine);
    const double five_s = runBatch(engine, *pool, "Five", batch);
    const EngineWrites writes_after5 = engineWrites(engine);
    wf_cpu_r.push_back((cpuMsBoth(server) - cpu_before5) / batch);
    wf_engine_cpu_r.push_back((cpuMs(getpid()) - engine_cpu_before5) / batch);
    auto after5 = counters(*pool);
    wf_r.push_back(batch / five_s);
    writes_r.push_back(static_cast<double>((after5.rows_written - before5.rows_written) -
                                           (after0.rows_written - before0.rows_written)) /
                       (5.0 * batch));
    commits_r.push_back(static_cast<double>((after5.commits - before5.commits) -
                                            (after0.commits - before0.commits)) /
                        (5.0 * batch));
    wf_commit_r.push_back(static_cast<double>(after5.commits - before5.commits) / five_s / raw);
    steps_ratio_r.push_back(5.0 * wf_r.back() / raw);
    wf_statements_r.push_back(static_cast<double>(after5.statements - before5.statements) / batch);
    wf_prepares_r.push_back(static_cast<double>(after5.prepares - before5.prepares) / batch);
    say("  {} five-step workflows: {:.1f}/s ({:.2f} s; {} zero-step: {:.2f} s)", batch, wf_r.back(),
        five_s, batch, zero_s);
    say("    {}", engineWritesPer(writes_before5, writes_after5, batch, "workflow"));

    {
      std::lock_guard lock(timed_mutex);
      timed_ms.clear();
    }
    for (int i = 0; i < sequential; ++i) check(engine.call({"Timed", "run"}), "timed");
    {
      std::lock_guard lock(timed_mutex);
      step_ms_r.push_back(median(timed_ms) / 5.0);
    }
    say("  step overhead: {:.3f} ms (median of {} sequential five-step calls, timed in the "
        "handler)",
        step_ms_r.back(), sequential);

    malloc_trim(0);
    const int64_t rss_before = rssKib();
    suspend(suspended_n);
    malloc_trim(0);
    const int64_t rss_after = rssKib();
    kib_r.push_back(static_cast<double>(rss_after - rss_before) / suspended_n);
    say("  {} invocations suspended: VmRSS {} KiB before, {} KiB after ({:.3f} KiB each)",
        suspended_n, rss_before, rss_after, kib_r.back());
    const auto awakeables = readAwakeables();
    const auto before_resume = counters(*pool);
    const double cpu_before_resume = cpuMsBoth(server);
    const double engine_cpu_before_resume = cpuMs(getpid());
    const EngineWrites writes_before_resume = engineWrites(engine);
    resolve_r.push_back(resolveAll(awakeables));
    say("    {}", engineWritesPer(writes_before_resume, engineWrites(engine),
                                  static_cast<double>(awakeables.size()), "resume"));
    resume_cpu_r.push_back((cpuMsBoth(server) - cpu_before_resume) /
                           static_cast<double>(awakeables.size()));
    resume_engine_cpu_r.push_back((cpuMs(getpid()) - engine_cpu_before_resume) /
                                  static_cast<double>(awakeables.size()));
    const auto after_resume = counters(*pool);
    resume_statements_r.push_back(
        static_cast<double>(after_resume.statements - before_resume.statements) /
        static_cast<double>(awakeables.size()));
    resume_prepares_r.push_back(
        static_cast<double>(after_resume.prepares - before_resume.prepares) /
        static_cast<double>(awakeables.size()));
    resume_commits_r.push_back(static_cast<double>(after_resume.commits - before_resume.commits) /
                               static_cast<double>(awakeables.size()));
    resumes_ratio_r.push_back(static_cast<double>(awakeables.size()) / resolve_r.back() / raw);
    say("  resolved {} awakeables, every invocation finished: {:.2f} s", awakeables.size(),
        resolve_r.back());

    for (const bool all : {true, false}) {
      fan_runs = 0;
      const std::string parent = check(engine.send({all ? "FanAll" : "FanEach", "run"}), "fan");
      std::vector<std::pair<std::string, std::string>> children;
      while ((children = readAwakeables()).size() < static_cast<size_t>(kFanOut)) {
        std::this_thread::sleep_for(20ms);
      }
      // The children's results arrive one by one, 2 ms apart, as regions report over time.
      const auto start = std::chrono::steady_clock::now();
      for (const auto& [id, awakeable] : children) {
        check(engine.resolveAwakeable(awakeable, "ok"), "resolve");
        std::this_thread::sleep_for(2ms);
      }
      check(engine.awaitResult(parent, 600s), "fan-out");
      const double ms = seconds(std::chrono::steady_clock::now() - start) * 1000.0;
      (all ? fan_all_ms : fan_each_ms).push_back(ms);
      (all ? fan_all_runs : fan_each_runs).push_back(fan_runs.load());
      say("  fan-out of {} calls, {}: {:.1f} ms from the first result to the parent's end; the"
          " parent ran {} times",
          kFanOut, all ? "awaitAll" : "awaited one by one", ms, fan_runs.load());
    }
  }
  engine.stop();

  std::vector<Figure> figures;
  const double wf = median(wf_r);
  const double kib = median(kib_r);
  figures.push_back({"workflows_per_s_5_steps", wf, "1/s", ">= 100", wf >= 100});
  figures.push_back({"step_overhead_ms", median(step_ms_r), "ms"});
  figures.push_back({"db_writes_per_step", median(writes_r), "rows"});
  figures.push_back({"suspended_memory_kib_per_invocation", kib, "KiB", "<= 2", kib <= 2.0});
  figures.push_back({"resolve_10k_awakeables_s", median(resolve_r), "s"});
  figures.push_back({"raw_commit_rate_per_s", median(raw_r), "1/s"});
  figures.push_back({"fanout_100_await_all_ms", median(fan_all_ms), "ms"});
  figures.push_back({"fanout_100_await_each_ms", median(fan_each_ms), "ms"});
  figures.push_back({"fanout_100_await_all_parent_runs", median(fan_all_runs), "runs"});
  figures.push_back({"fanout_100_await_each_parent_runs", median(fan_each_runs), "runs"});
  const double steps_ratio = median(steps_ratio_r);
  const double resumes_ratio = median(resumes_ratio_r);
  figures.push_back({"steps_vs_raw_commit_ratio", steps_ratio, "", ">= 0.3", steps_ratio >= 0.3});
  figures.push_back(
      {"resumes_vs_raw_commit_ratio", resumes_ratio, "", ">= 0.15", resumes_ratio >= 0.15});
  figures.push_back({"steps_floor_vs_raw_commit_ratio", median(step_floor_r), ""});
  figures.push_back({"steps_floor_grouped_vs_raw_commit_ratio", median(step_floor_grouped_r), ""});
  figures.push_back({"resumes_floor_vs_raw_commit_ratio", median(resume_floor_r), ""});
  figures.push_back(
      {"resumes_floor_grouped_vs_raw_commit_ratio", median(resume_floor_grouped_r), ""});
  figures.push_back(
      {"steps_floor_engine_grouped_vs_raw_commit_ratio", median(step_floor_engine_grouped_r), ""});
  figures.push_back({"resumes_floor_engine_grouped_vs_raw_commit_ratio",
                     median(resume_floor_engine_grouped_r), ""});
  // Shown in the table only: the JSON carries the figures above.
  std::vector<Figure> extra;
  extra.push_back({"db_commits_per_step", median(commits_r), "commits"});
  extra.push_back({"commit_rate_vs_raw_ratio", median(wf_commit_r), ""});
  extra.push_back({"db_statements_per_workflow_5_steps", median(wf_statements_r), "statements"});
  extra.push_back({"db_statements_per_resume", median(resume_statements_r), "statements"});
  extra.push_back({"db_commits_per_resume", median(resume_commits_r), "commits"});
  extra.push_back({"db_prepares_per_workflow_5_steps", median(wf_prepares_r), "statements"});
  extra.push_back({"db_prepares_per_resume", median(resume_prepares_r), "statements"});
  extra.push_back({"cpu_ms_per_workflow_5_steps", median(wf_cpu_r), "ms"});
  extra.push_back({"cpu_ms_per_resume", median(resume_cpu_r), "ms"});
  extra.push_back({"engine_cpu_ms_per_workflow_5_steps", median(wf_engine_cpu_r), "ms"});
  extra.push_back({"engine_cpu_ms_per_resume", median(resume_engine_cpu_r), "ms"});
  extra.push_back({"steps_share_of_floor", steps_ratio / median(step_floor_r), ""});
  extra.push_back({"resumes_share_of_floor", resumes_ratio / median(resume_floor_r), ""});

  report(json,
         strCat("workflow engine, ", g_threads, " worker threads, ",
                std::thread::hardware_concurrency(), " cores, MariaDB with ", server_sizes,
                ", median of ", rounds, rounds == 1 ? " round" : " rounds",
                quick ? strCat(" (--quick: ", suspended_n,
                               " suspended invocations, not 10,000; a smoke run)")
                      : ""),
         figures, extra,
         "commit_rate_vs_raw_ratio: commits per second during the five-step batch (claim, 5 steps,"
         " completion) over raw_commit_rate_per_s. steps_vs_raw_commit_ratio: journaled steps per"
         " second (5 x workflows_per_s_5_steps) over the raw commit rate of the same round;"
         " resumes_vs_raw_commit_ratio: invocations resumed per second while resolving the"
         " suspended ones, over the same; both medians of the rounds. *_floor_*: the same row"
         " changes issued without the engine from 8 connections (one statement per invocation"
         " and step, claims of 4), or grouped (one statement per step for 8 invocations);"
         " *_engine_grouped: grouped, except the callers' sends and settles, one by one;"
         " *_share_of_floor: the engine's ratio over the one-by-one floor's.");
  return 0;
}

}  // namespace
}  // namespace krane::bench

int main(int argc, char** argv) {
  // --threads and --small-server are this benchmark's own; the rest are every benchmark's
  // (benchMain).
  std::vector<char*> rest;
  bool small_server = false;
  for (int i = 0; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--threads") {
      const long n = i + 1 < argc ? std::strtol(argv[i + 1], nullptr, 10) : 0;
      if (n < 1 || n > 1024) {
        std::fprintf(stderr, "--threads: a number from 1 to 1024\n%s", krane::bench::kUsage);
        return 2;
      }
      krane::bench::g_threads = static_cast<size_t>(n);
      ++i;
      continue;
    }
    if (std::string_view(argv[i]) == "--small-server") {
      small_server = true;
      continue;
    }
    rest.push_back(argv[i]);
  }
  // Checkpoints of the tests' small redo log dominated the engine's writes (bench/README.md,
  // eighth pass): a server as installed, unless asked.
  krane::testing::ScratchMariaDb::setSizing(
      small_server ? krane::testing::ScratchMariaDb::Sizing::kTest
                   : krane::testing::ScratchMariaDb::Sizing::kServerDefaults);
  return krane::bench::benchMain(static_cast<int>(rest.size()), rest.data(), krane::bench::kUsage,
                                 krane::bench::run);
}
