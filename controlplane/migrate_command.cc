#include "controlplane/migrate_command.h"

#include <cstdio>
#include <cstdlib>
#include <ctime>

#include "common/strings.h"
#include "controlplane/db/dsn.h"
#include "controlplane/db/migrate.h"
#include "controlplane/db/pool.h"

namespace krane::ctrl {
namespace {

int fail(const absl::Status& status) {
  std::fprintf(stderr, "krane-ctrl migrate: error: %s\n",
               std::string(toStd(status.message())).c_str());
  return 1;
}

std::string formatTime(int64_t ms) {
  if (ms == 0) return "-";
  const std::time_t seconds = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  gmtime_r(&seconds, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%SZ", &tm);
  return buf;
}

int run(const MigrateFlags& flags) {
  std::string dsn_text = flags.dsn;
  if (dsn_text.empty()) {
    if (const char* env = std::getenv("KRANE_DSN")) dsn_text = env;
  }
  if (dsn_text.empty()) {
    return fail(absl::InvalidArgumentError(
        "no database given: pass --dsn mysql://user:password@host:3306/krane or set KRANE_DSN"));
  }
  auto dsn = db::parseDsn(dsn_text);
  if (!dsn.ok()) return fail(dsn.status());

  auto known = flags.migrations_dir.empty() ? db::builtinMigrations()
                                            : db::loadMigrationsFromDir(flags.migrations_dir);
  if (!known.ok()) return fail(known.status());

  auto pool = db::Pool::create(*dsn, {.max_connections = 2});
  if (!pool.ok()) return fail(pool.status());

  db::MigrateOptions options;
  options.lock_timeout = std::chrono::seconds(flags.lock_timeout_s);
  options.progress = [](const std::string& line) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  };
  db::Migrator migrator(*pool, *known, options);

  if (flags.status || flags.check) {
    auto states = migrator.status();
    if (!states.ok()) return fail(states.status());
    if (flags.status) {
      std::printf("%-8s %-40s %-12s %s\n", "VERSION", "NAME", "STATE", "APPLIED AT");
      for (const auto& s : *states) {
        const char* state = s.interrupted ? "INTERRUPTED" : s.applied ? "applied" : "pending";
        if (s.version > static_cast<int>(known->size())) state = "UNKNOWN";
        std::printf("%04d     %-40s %-12s %s\n", s.version, s.name.c_str(), state,
                    formatTime(s.applied_at_ms).c_str());
      }
    }
    if (flags.check) {
      if (auto st = migrator.checkUpToDate(); !st.ok()) return fail(st);
      std::printf("schema is up to date (%zu migrations)\n", known->size());
    }
    return 0;
  }

  auto applied = migrator.migrate();
  if (!applied.ok()) return fail(applied.status());
  if (applied->empty()) {
    std::printf("schema of %s is up to date (%zu migrations)\n", dsn->where().c_str(),
                known->size());
  } else {
    std::printf("applied %zu migration(s) to %s; schema is at %s\n", applied->size(),
                dsn->where().c_str(), applied->back().c_str());
  }
  return 0;
}

}  // namespace

void addMigrateCommand(CLI::App& app, MigrateFlags& flags, int& exit_code) {
  CLI::App* cmd = app.add_subcommand(
      "migrate",
      "Apply pending schema migrations to the control plane database (safe to run "
      "twice, or from several processes at once).");
  cmd->add_option("--dsn", flags.dsn,
                  "Database, as mysql://user[:password]@host[:port]/database[?socket=PATH] "
                  "(default: $KRANE_DSN)");
  cmd->add_option("--migrations-dir", flags.migrations_dir,
                  "Read NNNN_name.sql files from this directory instead of the built-in set");
  cmd->add_flag("--status", flags.status,
                "List every migration and whether it is applied; change nothing");
  cmd->add_flag("--check", flags.check, "Exit 1 unless every migration is applied; change nothing");
  cmd->add_option("--lock-timeout", flags.lock_timeout_s,
                  "Seconds to wait for another process that is migrating the same database")
      ->default_val(60)
      ->check(CLI::Range(1, 3600));
  cmd->callback([&flags, &exit_code] { exit_code = run(flags); });
}

}  // namespace krane::ctrl
