// A scratch MariaDB server for tests: one server per test process, a fresh database per test.
//
// The server is started on first use (mariadb-install-db + mariadbd, no systemd), listens on
// 127.0.0.1 on a free port, keeps its data under TEST_TMPDIR (or a temporary directory), and is
// stopped when the process exits. It is started with PR_SET_PDEATHSIG so that it dies with the
// test even when the test crashes: no test leaves a server behind.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <catch2/catch.hpp>

#include "controlplane/db/dsn.h"
#include "controlplane/db/migrate.h"
#include "controlplane/db/pool.h"
#include "tests/support/matchers.h"
#include "tests/support/process.h"

namespace krane::testing {

// The tenancy a deployment needs, as statements for a migrated database: workspace 'ws', its
// project 'proj', app 'app' and the app's production environment 'prod' (no regions).
inline const std::vector<std::string>& appTenancySql() {
  static const std::vector<std::string> statements = {
      "INSERT INTO workspaces (id, name, slug, created_at) VALUES ('ws', 'ws', 'ws', 1)",
      "INSERT INTO projects (id, workspace_id, name, slug, created_at)"
      " VALUES ('proj', 'ws', 'p', 'p', 1)",
      "INSERT INTO apps (id, workspace_id, project_id, name, slug, created_at)"
      " VALUES ('app', 'ws', 'proj', 'app', 'app', 1)",
      "INSERT INTO environments (id, workspace_id, project_id, app_id, slug, kind, created_at)"
      " VALUES ('prod', 'ws', 'proj', 'app', 'production', 'production', 1)"};
  return statements;
}

class ScratchMariaDb {
 public:
  // How big the server's InnoDB redo log and buffer pool are.
  enum class Sizing {
    // 8 MiB and 64 MiB: quick to create, and enough for tests.
    kTest,
    // MariaDB's own defaults (96 MiB and 128 MiB), as a server is installed: for benchmarks that
    // write at volume. With the tests' 8 MiB redo log, InnoDB checkpoints every few MiB written
    // and flushes pages to make room, which a server as installed does far less often.
    kServerDefaults,
  };
  // The sizing of the server this process starts; call before the first instance().
  static void setSizing(Sizing sizing);

  // The server of this process, started (once) if needed. Aborts with the server's log when it
  // cannot start: nothing in a test can work without it.
  static ScratchMariaDb& instance();

  // Creates an empty database with a unique name and returns a DSN for it (user root, TCP).
  db::Dsn freshDatabase();
  // DSN of the server-wide `mysql` database, for administrative statements.
  db::Dsn adminDsn() const;
  // Copies every table of database `from` (structure and rows) into database `to`, replacing
  // what `to` held: a backup, or the restore of one. Aborts on error.
  void copyDatabase(const std::string& from, const std::string& to);

  unsigned port() const { return port_; }
  bool running() const { return server_ != nullptr; }

  // SIGTERM and wait for a clean shutdown.
  void stop();
  // SIGKILL, as a crash would.
  void kill();
  // Starts the server again on the same port and data (after stop() or kill()).
  void start();
  void restart() {
    stop();
    start();
  }

  ~ScratchMariaDb();

 private:
  ScratchMariaDb();
  void waitReady();

  std::string data_root_;   // holds data/ and the error log
  std::string socket_dir_;  // short path for the Unix socket (108-byte limit)
  unsigned port_ = 0;
  std::unique_ptr<ChildProcess> server_;
  int next_database_ = 0;
};

// Base fixture: each test gets its own empty database in `dsn_`.
class MariaDbTest {
 protected:
  MariaDbTest() { dsn_ = ScratchMariaDb::instance().freshDatabase(); }
  db::Dsn dsn_;
};

// The same with Krane's schema applied, and `pool_` (of `max_connections`) on the database.
class MigratedDbTest : public MariaDbTest {
 protected:
  explicit MigratedDbTest(size_t max_connections) {
    auto pool = db::Pool::create(dsn_, {.max_connections = max_connections});
    REQUIRE_THAT(pool, IsOk());
    pool_ = *pool;
    REQUIRE_THAT(db::Migrator(pool_, *db::builtinMigrations()).migrate(), IsOk());
  }
  std::shared_ptr<db::Pool> pool_;
};

}  // namespace krane::testing
