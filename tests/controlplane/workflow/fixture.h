// A migrated scratch database and engines on it, for the workflow tests.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "common/strings.h"
#include "controlplane/db/migrate.h"
#include "controlplane/db/pool.h"
#include "controlplane/workflow/engine.h"
#include "tests/support/mariadb.h"
#include "tests/support/matchers.h"

namespace krane::workflow {

inline std::string messageOf(const absl::Status& s) { return std::string(toStd(s.message())); }

// Where a handler hands the id of its awakeable to the test, in a journaled step of its own (a
// replay does not hand it out again).
class Handout {
 public:
  void give(Context& ctx, const Awakeable& awakeable, std::string_view step = "publish") {
    ctx.runVoid(step,
                [&] {
                  std::lock_guard lock(mutex_);
                  id_ = awakeable.id;
                  return absl::OkStatus();
                })
        .IgnoreError();
  }
  // Empty until a handler gave one.
  std::string id() const {
    std::lock_guard lock(mutex_);
    return id_;
  }

 private:
  mutable std::mutex mutex_;
  std::string id_;
};

// Service "Wait", handler "go": makes an awakeable, hands its id to `handout` and returns what
// it is resolved with.
inline ServiceDefinition waitService(Handout& handout) {
  return ServiceDefinition::service("Wait").handler(
      "go", [&handout](Context& ctx, const std::string&) -> absl::StatusOr<std::string> {
        Awakeable w = ctx.awakeable();
        handout.give(ctx, w);
        return ctx.await(w.future);
      });
}

class WorkflowTest : public krane::testing::MigratedDbTest {
 protected:
  WorkflowTest() : MigratedDbTest(40) {}
  ~WorkflowTest() {
    for (auto& e : engines_) e->stop();
    engines_.clear();
    for (const std::string& user : users_) {
      if (auto conn = pool_->acquire(); conn.ok()) {
        (*conn)->exec(strCat("DROP USER ", user)).IgnoreError();
      }
    }
  }

  static EngineOptions fastOptions() {
    EngineOptions o;
    o.threads = 8;
    o.lease = std::chrono::milliseconds(3000);
    o.poll_interval = std::chrono::milliseconds(20);
    return o;
  }

  // An engine with `define` registering its services; started.
  Engine& engine(const std::function<void(Engine&)>& define,
                 EngineOptions options = fastOptions()) {
    engines_.push_back(std::make_unique<Engine>(pool_, options));
    Engine& e = *engines_.back();
    define(e);
    e.start();
    return e;
  }

  std::string statusOf(const std::string& id) {
    auto rows =
        (*pool_->acquire())->query("SELECT status FROM workflow_invocations WHERE id = ?", {id});
    if (!rows.ok() || rows->empty()) return "<none>";
    return rows->rows[0].str(0);
  }

  void exec(const std::string& sql, const db::Params& params = {}) {
    REQUIRE_THAT((*pool_->acquire())->exec(sql, params), IsOk());
  }

  // What a deployment belongs to: workspace 'ws', project 'proj', app 'app', and environments
  // (id, kind: production or preview) of the app.
  void seedTenancy(const std::vector<std::pair<std::string, std::string>>& environments = {
                       {"prod", "production"}}) {
    exec("INSERT INTO workspaces (id, name, slug, created_at) VALUES ('ws', 'ws', 'ws', 1)");
    exec(
        "INSERT INTO projects (id, workspace_id, name, slug, created_at)"
        " VALUES ('proj', 'ws', 'p', 'p', 1)");
    exec(
        "INSERT INTO apps (id, workspace_id, project_id, name, slug, created_at)"
        " VALUES ('app', 'ws', 'proj', 'app', 'app', 1)");
    for (const auto& [id, kind] : environments) {
      exec(
          "INSERT INTO environments (id, workspace_id, project_id, app_id, slug, kind,"
          " created_at) VALUES (?, 'ws', 'proj', 'app', ?, ?, 1)",
          {id, id, kind});
    }
  }

  // Region `region`, and with `replicas` > 0 the production environment 'prod' deploying
  // that many replicas there.
  void seedRegion(const std::string& region, uint32_t replicas = 0) {
    exec("INSERT INTO regions (id, display_name, created_at) VALUES (?, ?, 1)", {region, region});
    if (replicas == 0) return;
    exec(
        "INSERT INTO environment_regions (environment_id, region_id, replicas, created_at)"
        " VALUES ('prod', ?, ?, 1)",
        {region, replicas});
  }
  // Regions eu-1 and us-1 (see seedRegion).
  void seedRegions(uint32_t replicas = 0) {
    for (const char* region : {"eu-1", "us-1"}) seedRegion(region, replicas);
  }

  // Transactions waiting for a row lock. The server refreshes INNODB_TRX only when it was not
  // read in the last 100 ms: this waits that long first, so that polling it sees changes.
  int64_t lockWaits() {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    return scalar(
        "SELECT COUNT(*) FROM information_schema.INNODB_TRX WHERE trx_state = 'LOCK WAIT'");
  }

  // A pool of connections that log in as a database user of their own: every privilege on each
  // table of the test's database, except on the tables `restricted` names, which get only the
  // privileges given there (e.g. {"workflow_promises", "SELECT (id), UPDATE"}). `name` tells
  // the users of one test apart. The user is dropped when the test ends.
  std::shared_ptr<db::Pool> limitedPool(const std::string& name,
                                        const std::map<std::string, std::string>& restricted) {
    const std::string grantee = strCat("'", name, "_", dsn_.database, "'@'%'");
    exec(strCat("CREATE USER ", grantee));
    users_.push_back(grantee);
    auto tables = (*pool_->acquire())
                      ->query(
                          "SELECT table_name FROM information_schema.TABLES"
                          " WHERE table_schema = DATABASE()");
    REQUIRE_THAT(tables, IsOk());
    for (const auto& row : tables->rows) {
      const auto limited = restricted.find(row.str(0));
      exec(strCat("GRANT ", limited == restricted.end() ? "ALL" : limited->second, " ON `",
                  dsn_.database, "`.`", row.str(0), "` TO ", grantee));
    }
    db::Dsn dsn = dsn_;
    dsn.user = strCat(name, "_", dsn_.database);
    auto pool = db::Pool::create(dsn, {.max_connections = 20});
    REQUIRE_THAT(pool, IsOk());
    return *pool;
  }

  int64_t scalar(const std::string& sql, const db::Params& params = {}) {
    auto rows = (*pool_->acquire())->query(sql, params);
    CHECK_THAT(rows, IsOk());
    if (!rows.ok() || rows->empty()) return -1;
    return rows->rows[0].i64(0);
  }

  std::vector<std::unique_ptr<Engine>> engines_;
  std::vector<std::string> users_;  // made by limitedPool()
};

}  // namespace krane::workflow
