// An engine in its own process, for the crash tests: it serves the "Crashy" workflow until it is
// killed. The workflow's steps record their side effects in the `effects` table (one row per
// execution of a step), and leave `markers` so the test knows where to kill the process.
//
//   crash_child --dsn mysql://root@127.0.0.1:PORT/db --worker NAME [--lease-ms N]
//
// Crashy.run (unkeyed): step1, a durable sleep, step2, step3 (slow before its effect), step4
// (its effect in the journal's transaction, slow after it), step5.
// Undo.run (unkeyed): does a, b, c, each with a compensation, then fails: the compensations run
// c (a run step captured by value), b (marks, then slow inside its transaction), a; b and a carry
// their data in a message (typed.h's compensate).
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <string>
#include <thread>

#include <CLI/CLI.hpp>
#include <google/protobuf/wrappers.pb.h>

#include "common/strings.h"
#include "controlplane/db/pool.h"
#include "controlplane/workflow/engine.h"
#include "controlplane/workflow/typed.h"
#include "tests/support/child_engine.h"

namespace krane::workflow {
namespace {

absl::Status mark(db::Connection& conn, const std::string& id, const std::string& what) {
  return conn
      .exec("INSERT INTO markers (invocation_id, what, pid) VALUES (?, ?, ?)",
            {id, what, static_cast<int64_t>(getpid())})
      .status();
}

absl::Status mark(db::Pool& pool, const std::string& id, const std::string& what) {
  auto conn = pool.acquire();
  if (!conn.ok()) return conn.status();
  return mark(**conn, id, what);
}

absl::Status effect(db::Connection& conn, const std::string& id, const std::string& step) {
  return conn
      .exec("INSERT INTO effects (invocation_id, step, pid) VALUES (?, ?, ?)",
            {id, step, static_cast<int64_t>(getpid())})
      .status();
}

absl::Status plainEffect(db::Pool& pool, const std::string& id, const std::string& step) {
  auto conn = pool.acquire();
  if (!conn.ok()) return conn.status();
  return effect(**conn, id, step);
}

int serve(const std::string& dsn_text, const std::string& worker, int lease_ms) {
  std::shared_ptr<db::Pool> p = testing::childPool(dsn_text);
  if (!p) return 2;
  EngineOptions options = testing::childEngineOptions(worker, lease_ms);
  options.threads = 2;
  Engine engine(p, options);
  auto step = [p](Context& ctx, const std::string& name) {
    return ctx.runVoid(name, [&] { return plainEffect(*p, ctx.invocationId(), name); });
  };
  absl::Status registered = engine.registerService(ServiceDefinition::service("Crashy").handler(
      "run", [&](Context& ctx, const std::string&) -> absl::StatusOr<std::string> {
        const std::string& id = ctx.invocationId();
        if (auto s = step(ctx, "step1"); !s.ok()) return s;
        if (auto s = ctx.sleep(std::chrono::milliseconds(800)); !s.ok()) return s;
        if (auto s = step(ctx, "step2"); !s.ok()) return s;
        auto s3 = ctx.runVoid("step3", [&] {
          if (auto m = mark(*p, id, "enter step3"); !m.ok()) return m;
          std::this_thread::sleep_for(std::chrono::milliseconds(1500));
          return plainEffect(*p, id, "step3");
        });
        if (!s3.ok()) return s3;
        auto s4 = ctx.runTx("step4", [&](db::Connection& conn) -> absl::StatusOr<std::string> {
          if (auto e = effect(conn, id, "step4"); !e.ok()) return e;
          if (auto m = mark(*p, id, "inside step4"); !m.ok()) return m;
          std::this_thread::sleep_for(std::chrono::milliseconds(1500));
          return std::string("four");
        });
        if (!s4.ok()) return s4.status();
        if (auto s = step(ctx, "step5"); !s.ok()) return s;
        return std::string("done");
      }));
  if (!registered.ok()) return 2;
  registered = engine.registerService(ServiceDefinition::service("Undo").handler(
      "run", [&](Context& ctx, const std::string&) -> absl::StatusOr<std::string> {
        const std::string id = ctx.invocationId();
        for (std::string name : {"a", "b", "c"}) {
          if (auto s = step(ctx, "do " + name); !s.ok()) return s;
          if (name == "c") {
            // A side effect outside the engine's database: captured by value.
            ctx.compensateRun(name, [p, id, name] { return plainEffect(*p, id, "undo " + name); });
            continue;
          }
          // The documented form: the data is copied, the function captures nothing, and its
          // steps are journaled (so the marker of b is written once, even across the kill).
          google::protobuf::StringValue undo;
          undo.set_value(name);
          compensate(
              ctx, name, undo,
              [](Context& ctx, const google::protobuf::StringValue& what) -> absl::Status {
                const std::string id = ctx.invocationId();
                if (what.value() == "b") {
                  auto marked =
                      ctx.runTx("mark b", [&](db::Connection& conn) -> absl::StatusOr<std::string> {
                        if (auto m = mark(conn, id, "undoing b"); !m.ok()) return m;
                        return std::string();
                      });
                  if (!marked.ok()) return marked.status();
                }
                return ctx
                    .runTx("undo " + what.value(),
                           [&](db::Connection& conn) -> absl::StatusOr<std::string> {
                             if (auto e = effect(conn, id, "undo " + what.value()); !e.ok()) {
                               return e;
                             }
                             // Killed here: the effect rolls back with the journal entry.
                             if (what.value() == "b") {
                               std::this_thread::sleep_for(std::chrono::milliseconds(1500));
                             }
                             return std::string();
                           })
                    .status();
              });
        }
        return workflow::terminalError(absl::StatusCode::kFailedPrecondition, "the deploy failed");
      }));
  if (!registered.ok()) return 2;
  engine.start();
  std::printf("serving %s\n", worker.c_str());
  std::fflush(stdout);
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

}  // namespace
}  // namespace krane::workflow

int main(int argc, char** argv) {
  CLI::App app("workflow crash child");
  std::string dsn, worker;
  int lease_ms = 1000;
  app.add_option("--dsn", dsn)->required();
  app.add_option("--worker", worker)->required();
  app.add_option("--lease-ms", lease_ms);
  CLI11_PARSE(app, argc, argv);
  return krane::workflow::serve(dsn, worker, lease_ms);
}
