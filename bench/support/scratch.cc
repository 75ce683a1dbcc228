#include "bench/support/scratch.h"

#include <string>

#include "bench/support/figures.h"
#include "controlplane/db/migrate.h"
#include "tests/support/mariadb.h"

namespace krane::bench {

std::shared_ptr<db::Pool> seededScratchDatabase() {
  auto& mariadb = testing::ScratchMariaDb::instance();
  auto pool = check(db::Pool::create(mariadb.freshDatabase(), {.max_connections = 64}), "pool");
  check(db::Migrator(pool, check(db::builtinMigrations(), "migrations")).migrate().status(),
        "migrating");
  auto conn = check(pool->acquire(), "connection");
  for (const std::string sql :
       {"INSERT INTO workspaces (id, name, slug, created_at) VALUES ('ws', 'ws', 'ws', 1)",
        "INSERT INTO projects (id, workspace_id, name, slug, created_at)"
        " VALUES ('proj', 'ws', 'p', 'p', 1)",
        "INSERT INTO apps (id, workspace_id, project_id, name, slug, created_at)"
        " VALUES ('app', 'ws', 'proj', 'app', 'app', 1)",
        "INSERT INTO environments (id, workspace_id, project_id, app_id, slug, kind,"
        " created_at) VALUES ('prod', 'ws', 'proj', 'app', 'production', 'production', 1)"}) {
    check(conn->exec(sql).status(), sql.c_str());
  }
  return pool;
}

}  // namespace krane::bench
