#include "controlplane/db/migrate.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <openssl/evp.h>

#include "common/clock.h"
#include "common/status.h"
#include "common/strings.h"
#include "controlplane/db/sql_script.h"
#include "sql/embedded_migrations.h"

namespace krane::db {
namespace {

constexpr std::string_view kTable = "krane_schema_migrations";

std::string sha256Hex(std::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_Digest(data.data(), data.size(), digest, &length, EVP_sha256(), nullptr);
  std::string hex;
  for (unsigned i = 0; i < length; ++i) {
    fmt::format_to(std::back_inserter(hex), "{:02x}", digest[i]);
  }
  return hex;
}

// Server-wide lock name for one database; GET_LOCK names are limited to 64 characters.
std::string lockName(const std::string& database) {
  std::string name = strCat("krane.migrate.", database);
  if (name.size() > 64) name = strCat("krane.migrate.", sha256Hex(database).substr(0, 40));
  return name;
}

bool validSlug(std::string_view slug) {
  return !slug.empty() && std::all_of(slug.begin(), slug.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  });
}

}  // namespace

absl::StatusOr<std::vector<Migration>> parseMigrations(
    const std::vector<std::pair<std::string, std::string>>& files) {
  std::map<int, Migration> by_version;
  for (const auto& [file, contents] : files) {
    const std::string_view name(file);
    const bool shaped =
        name.size() > 9 && name.substr(name.size() - 4) == ".sql" && name[4] == '_' &&
        std::all_of(name.begin(), name.begin() + 4, [](char c) { return c >= '0' && c <= '9'; }) &&
        validSlug(name.substr(5, name.size() - 9));
    if (!shaped) {
      return absl::InvalidArgumentError(
          strCat("migration file ", file,
                 ": bad name (expected NNNN_name.sql: four digits, an underscore, "
                 "then lower-case letters, digits and underscores)"));
    }
    int version = 0;
    std::from_chars(name.data(), name.data() + 4, version);
    if (version == 0) {
      return absl::InvalidArgumentError(
          strCat("migration file ", file, ": numbering starts at 0001"));
    }
    auto statements = splitSqlScript(contents);
    if (!statements.ok()) {
      return absl::InvalidArgumentError(
          strCat("migration file ", file, ": ", statements.status().message()));
    }
    if (statements->empty()) {
      return absl::InvalidArgumentError(
          strCat("migration file ", file, ": contains no SQL statement"));
    }
    Migration migration{version, std::string(name.substr(0, name.size() - 4)), contents,
                        sha256Hex(contents)};
    auto [it, inserted] = by_version.emplace(version, std::move(migration));
    if (!inserted) {
      return absl::InvalidArgumentError(strCat("migration files ", it->second.name, ".sql and ",
                                               file, " have the same number ", version));
    }
  }
  std::vector<Migration> out;
  int expected = 1;
  for (auto& [version, migration] : by_version) {
    if (version != expected) {
      return absl::InvalidArgumentError(fmt::format(
          "migration {:04d} is missing: found {}.sql after {} (numbers must have no gaps)",
          expected, migration.name,
          expected == 1 ? std::string("nothing") : out.back().name + ".sql"));
    }
    out.push_back(std::move(migration));
    ++expected;
  }
  return out;
}

absl::StatusOr<std::vector<Migration>> loadMigrationsFromDir(const std::string& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    return absl::NotFoundError(strCat("migrations directory ", dir, " does not exist"));
  }
  std::vector<std::pair<std::string, std::string>> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (!entry.is_regular_file() || entry.path().extension() != ".sql") continue;
    std::ifstream in(entry.path(), std::ios::binary);
    std::stringstream contents;
    contents << in.rdbuf();
    if (!in) return absl::UnavailableError(strCat("cannot read ", entry.path().string()));
    files.emplace_back(entry.path().filename().string(), contents.str());
  }
  if (ec) return absl::UnavailableError(strCat("cannot list ", dir, ": ", ec.message()));
  if (files.empty()) return absl::NotFoundError(strCat("no .sql files in ", dir));
  return parseMigrations(files);
}

absl::StatusOr<std::vector<Migration>> builtinMigrations() {
  std::vector<std::pair<std::string, std::string>> files;
  for (const auto& file : krane::sql::embeddedMigrationFiles()) {
    files.emplace_back(file.name, std::string(file.contents));
  }
  return parseMigrations(files);
}

Migrator::Migrator(std::shared_ptr<Pool> pool, std::vector<Migration> known, MigrateOptions options)
    : pool_(std::move(pool)), known_(std::move(known)), options_(std::move(options)) {}

absl::Status Migrator::ensureTable(Connection& conn) {
  return conn.execText(strCat("CREATE TABLE IF NOT EXISTS ", kTable,
                              " (version INT NOT NULL PRIMARY KEY,"
                              " name VARCHAR(255) NOT NULL,"
                              " checksum CHAR(64) NOT NULL,"
                              " state ENUM('applying','applied') NOT NULL,"
                              " started_at BIGINT NOT NULL,"
                              " finished_at BIGINT NULL"
                              ") ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"));
}

absl::StatusOr<std::vector<MigrationState>> Migrator::readApplied(Connection& conn) {
  std::vector<MigrationState> applied;
  KRANE_RETURN_IF_ERROR(conn.queryEach(
      strCat("SELECT version, name, checksum, state, COALESCE(finished_at, 0) AS finished_at FROM ",
             kTable, " ORDER BY version"),
      {}, [&](const Row& row) {
        MigrationState state;
        state.version = static_cast<int>(row.i64("version"));
        state.name = row.str("name");
        state.applied = row.str("state") == "applied";
        state.interrupted = !state.applied;
        state.applied_at_ms = row.i64("finished_at");
        state.checksum = row.str("checksum");
        applied.push_back(std::move(state));
        return absl::OkStatus();
      }));
  return applied;
}

absl::Status Migrator::checkApplied(const std::vector<MigrationState>& applied) {
  const int known_max = known_.empty() ? 0 : known_.back().version;
  for (size_t i = 0; i < applied.size(); ++i) {
    const MigrationState& state = applied[i];
    if (state.version > known_max) {
      return absl::FailedPreconditionError(fmt::format(
          "the database schema is at migration {}, newer than this binary knows (up to {}): "
          "upgrade krane-ctrl, or check that the DSN names the right database",
          applied.back().name, known_max == 0 ? std::string("none") : known_.back().name));
    }
    if (state.version != static_cast<int>(i) + 1) {
      return absl::FailedPreconditionError(
          fmt::format("{} is inconsistent: it records {} but not migration {:04d} before it",
                      kTable, state.name, i + 1));
    }
    const Migration& mine = known_[state.version - 1];
    if (state.interrupted) {
      return absl::FailedPreconditionError(fmt::format(
          "migration {} did not finish (recorded as 'applying' in {}); the schema may be "
          "half-applied: compare it with sql/{}.sql, complete or undo the statements by hand, "
          "then delete that row and run migrate again",
          state.name, kTable, state.name));
    }
    if (state.checksum != mine.checksum || state.name != mine.name) {
      return absl::FailedPreconditionError(fmt::format(
          "applied migration {} does not match this binary's {} (the file was edited or renamed "
          "after it was applied): applied migrations must never change; put changes in a new file",
          state.name, mine.name));
    }
  }
  return absl::OkStatus();
}

absl::Status Migrator::apply(Connection& conn, const Migration& migration) {
  auto statements = splitSqlScript(migration.sql);
  if (!statements.ok()) return statements.status();
  KRANE_RETURN_IF_ERROR(
      conn.exec(
              strCat(
                  "INSERT INTO ", kTable,
                  " (version, name, checksum, state, started_at) VALUES (?, ?, ?, 'applying', ?)"),
              {migration.version, migration.name, migration.checksum, unixMillis()})
          .status());
  for (size_t i = 0; i < statements->size(); ++i) {
    const SqlStatement& statement = (*statements)[i];
    absl::Status status = conn.execText(statement.text);
    if (!status.ok()) {
      std::string state_note;
      if (i == 0 && !conn.broken()) {
        // Nothing of this migration ran: forget the attempt so a fixed file can simply run again.
        (void)conn.exec(strCat("DELETE FROM ", kTable, " WHERE version = ?"), {migration.version});
        state_note = "nothing of it was applied";
      } else {
        state_note = strCat(i, " of its ", statements->size(),
                            " statements were applied and it is recorded as 'applying'");
      }
      return absl::Status(
          status.code(),
          fmt::format("migration {}.sql, statement {} (line {}) failed; {}: {}", migration.name,
                      i + 1, statement.line, state_note, status.message()));
    }
  }
  return conn
      .exec(strCat("UPDATE ", kTable, " SET state = 'applied', finished_at = ? WHERE version = ?"),
            {unixMillis(), migration.version})
      .status();
}

absl::StatusOr<std::vector<std::string>> Migrator::migrate() {
  auto lease = pool_->acquire();
  if (!lease.ok()) return lease.status();
  Connection& conn = **lease;
  const std::string lock = lockName(pool_->dsn().database);
  auto got = conn.query("SELECT GET_LOCK(?, ?) AS got",
                        {lock, static_cast<int64_t>(options_.lock_timeout.count())});
  if (!got.ok()) return got.status();
  if (got->rows.empty() || got->rows[0].isNull(0) || got->rows[0].i64(0) != 1) {
    return absl::DeadlineExceededError(
        strCat("another process has been migrating database ", pool_->dsn().database, " for over ",
               options_.lock_timeout.count(), " s (lock ", lock, "); wait for it or find it"));
  }
  struct Unlock {
    Connection& conn;
    const std::string& lock;
    ~Unlock() {
      if (!conn.broken()) (void)conn.query("SELECT RELEASE_LOCK(?)", {lock});
    }
  } unlock{conn, lock};

  KRANE_RETURN_IF_ERROR(ensureTable(conn));
  KRANE_ASSIGN_OR_RETURN(auto applied, readApplied(conn));
  KRANE_RETURN_IF_ERROR(checkApplied(applied));

  std::vector<std::string> done;
  for (size_t v = applied.size(); v < known_.size(); ++v) {
    const Migration& migration = known_[v];
    if (options_.progress) options_.progress(strCat("applying ", migration.name));
    const auto started = std::chrono::steady_clock::now();
    KRANE_RETURN_IF_ERROR(apply(conn, migration));
    if (options_.progress) {
      options_.progress(strCat("applied  ", migration.name, " in ",
                               std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::steady_clock::now() - started)
                                   .count(),
                               " ms"));
    }
    done.push_back(migration.name);
  }
  return done;
}

absl::StatusOr<std::vector<MigrationState>> Migrator::status() {
  auto lease = pool_->acquire();
  if (!lease.ok()) return lease.status();
  KRANE_RETURN_IF_ERROR(ensureTable(**lease));
  KRANE_ASSIGN_OR_RETURN(auto applied, readApplied(**lease));
  std::vector<MigrationState> out;
  for (const Migration& migration : known_) {
    MigrationState state;
    state.version = migration.version;
    state.name = migration.name;
    for (const auto& a : applied) {
      if (a.version == migration.version) state = a;
    }
    out.push_back(state);
  }
  for (const auto& a : applied) {
    if (a.version > static_cast<int>(known_.size())) out.push_back(a);
  }
  return out;
}

absl::StatusOr<int> Migrator::currentVersion() {
  KRANE_ASSIGN_OR_RETURN(auto states, status());
  int version = 0;
  for (const auto& s : states) {
    if (s.applied) version = std::max(version, s.version);
  }
  return version;
}

absl::Status Migrator::checkUpToDate() {
  KRANE_ASSIGN_OR_RETURN(auto states, status());
  for (const auto& s : states) {
    if (s.version > static_cast<int>(known_.size())) {
      return absl::FailedPreconditionError(
          strCat("the database schema has migration ", s.name,
                 " that this binary does not know: upgrade krane-ctrl"));
    }
    if (!s.applied) {
      return absl::FailedPreconditionError(strCat(
          "the database schema is not up to date (", s.name,
          s.interrupted ? " was interrupted" : " is pending", "): run `krane-ctrl migrate`"));
    }
  }
  return absl::OkStatus();
}

}  // namespace krane::db
