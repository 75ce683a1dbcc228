// Schema migrations: numbered SQL files applied in order, recorded in krane_schema_migrations.
//
// Files are named NNNN_slug.sql (NNNN from 0001, no gaps). An applied migration is never edited:
// its SHA-256 is recorded and a changed file is refused. Migrating takes a server-side named lock
// (GET_LOCK) per database, so two processes migrating at once apply each file exactly once.
// MySQL cannot roll back DDL, so a migration that fails after its first statement leaves the
// schema half-applied; it is recorded as `applying` and later runs refuse to continue until an
// operator has repaired it (see docs/operations.md).
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "controlplane/db/pool.h"

namespace krane::db {

struct Migration {
  int version = 0;
  std::string name;  // file name without .sql, e.g. "0001_tenancy"
  std::string sql;
  std::string checksum;  // hex SHA-256 of the file's bytes
};

// Validates names, numbering and SQL syntax of (file name, contents) pairs; errors name the file.
absl::StatusOr<std::vector<Migration>> parseMigrations(
    const std::vector<std::pair<std::string, std::string>>& files);
// Reads every *.sql file of a directory (other files are ignored).
absl::StatusOr<std::vector<Migration>> loadMigrationsFromDir(const std::string& dir);
// The migrations built into this binary from sql/.
absl::StatusOr<std::vector<Migration>> builtinMigrations();

struct MigrationState {
  int version = 0;
  std::string name;
  bool applied = false;
  bool interrupted = false;  // recorded as `applying`: a previous run died or failed midway
  int64_t applied_at_ms = 0;
  std::string checksum;  // as recorded when applied
};

struct MigrateOptions {
  // How long to wait for another process that is migrating the same database.
  std::chrono::seconds lock_timeout{60};
  // Called before and after each migration with a line of progress.
  std::function<void(const std::string&)> progress;
};

class Migrator {
 public:
  Migrator(std::shared_ptr<Pool> pool, std::vector<Migration> known, MigrateOptions options = {});

  // Applies every pending migration; returns the names applied (empty when up to date).
  absl::StatusOr<std::vector<std::string>> migrate();
  // Every known migration with whether it is applied, plus applied ones this binary does not know.
  absl::StatusOr<std::vector<MigrationState>> status();
  // Highest applied version, 0 for an empty database.
  absl::StatusOr<int> currentVersion();
  // OK when the database has exactly the known migrations applied; FAILED_PRECONDITION naming
  // what is pending or unknown otherwise. Servers call this at start-up.
  absl::Status checkUpToDate();

 private:
  absl::Status ensureTable(Connection& conn);
  absl::StatusOr<std::vector<MigrationState>> readApplied(Connection& conn);
  absl::Status checkApplied(const std::vector<MigrationState>& applied);
  absl::Status apply(Connection& conn, const Migration& migration);

  std::shared_ptr<Pool> pool_;
  std::vector<Migration> known_;
  MigrateOptions options_;
};

}  // namespace krane::db
