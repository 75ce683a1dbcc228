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
  for (const std::string& sql : testing::appTenancySql()) {
    check(conn->exec(sql).status(), sql.c_str());
  }
  return pool;
}

}  // namespace krane::bench
