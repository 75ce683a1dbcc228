// Sentinels on a real MariaDB with SentinelService on the workflow engine, the real ingestor
// (what ReportSentinelStatus calls) and its ReadyNotifier, and a fake fleet: a thread that plays
// the agents, reporting each sentinel in `progressing` healthy on its desired image at the
// version it was written with, except those told to fail (reported unhealthy).
#pragma once

#include <atomic>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "common/clock.h"
#include "common/strings.h"
#include "controlplane/feed/writer.h"
#include "controlplane/ingest/ingestor.h"
#include "controlplane/services/sentinel/sentinel.h"
#include "tests/controlplane/workflow/fixture.h"

namespace krane::services::sentinel::testing {

class SentinelFleetTest : public workflow::WorkflowTest {
 protected:
  SentinelFleetTest()
      : writer_(std::make_shared<feed::Writer>(pool_, std::make_shared<feed::ResourceTables>())),
        ingestor_(std::make_shared<ingest::Ingestor>(pool_)) {
    for (const char* region : {"eu-1", "us-1"}) {
      exec("INSERT INTO regions (id, display_name, created_at) VALUES (?, ?, 1)", {region, region});
    }
    seedTenancy();
  }
  ~SentinelFleetTest() { stopFleet(); }

  static feed::Resource sentinelResource(const std::string& id, const std::string& region,
                                         const std::string& image) {
    feed::Resource r;
    r.set_type("sentinel");
    r.set_id(id);
    r.set_region(region);
    auto* s = r.mutable_sentinel();
    s->set_sentinel_id(id);
    s->set_workspace_id("ws");
    s->set_project_id("proj");
    s->set_app_id("app");
    s->set_environment_id("prod");
    s->set_region(region);
    s->set_image(image);
    s->set_replicas(2);
    s->set_cpu_millicores(250);
    s->set_memory_mib(256);
    s->set_desired_state(cluster::v1::SENTINEL_DESIRED_STATE_RUNNING);
    return r;
  }

  // A sentinel written through the feed; `healthy`: already reported healthy on `image`.
  void addSentinel(const std::string& id, const std::string& image, bool healthy = true,
                   const std::string& region = "eu-1") {
    auto written = writer_->put(sentinelResource(id, region, image));
    REQUIRE_THAT(written, IsOk());
    if (healthy) {
      exec(
          "UPDATE sentinels SET health = 'healthy', running_image = image, available_replicas ="
          " replicas, deploy_status = 'ready' WHERE id = ?",
          {id});
    }
  }

  // Registers SentinelService (and `more`) on a started engine, with the notifier hooked in.
  workflow::Engine& startEngine(const std::function<void(workflow::Engine&)>& more = {},
                                SentinelOptions options = {}) {
    workflow::Engine& e = engine([&](workflow::Engine& e) {
      REQUIRE_THAT(e.registerService(sentinelService(pool_, writer_, options)), IsOk());
      if (more) more(e);
    });
    if (!notifier_added_) {
      ingestor_->addSentinelReadyHook(std::make_shared<ReadyNotifier>(pool_, e));
      notifier_added_ = true;
    }
    return e;
  }

  // What an agent sends for sentinel `id` as it stands in the database now (nullopt when it
  // cannot be read). No Catch2 macros: the fleet thread calls it too.
  std::optional<cluster::v1::ReportSentinelStatusRequest> reportOf(const std::string& id,
                                                                   bool healthy) {
    auto conn = pool_->acquire();
    if (!conn.ok()) return std::nullopt;
    auto rows = (*conn)->query(
        "SELECT region_id, image, replicas, version FROM sentinels WHERE id = ?", {id});
    if (!rows.ok() || rows->empty()) return std::nullopt;
    const db::Row& row = rows->rows[0];
    const auto replicas = static_cast<uint32_t>(row.u64("replicas"));
    cluster::v1::ReportSentinelStatusRequest r;
    r.set_sentinel_id(id);
    r.set_region(row.str("region_id"));
    r.set_running_image(row.str("image"));
    r.set_available_replicas(healthy ? replicas : 0);
    r.set_updated_replicas(replicas);
    r.set_ready_replicas(healthy ? replicas : 0);
    r.set_observed_generation(static_cast<int64_t>(row.u64("version")));
    r.set_applied_version(row.u64("version"));
    r.set_health(healthy ? cluster::v1::SENTINEL_HEALTH_HEALTHY
                         : cluster::v1::SENTINEL_HEALTH_UNHEALTHY);
    r.set_agent_id("agent-" + row.str("region_id"));
    r.set_observed_at_ms(unixMillis());
    return r;
  }

  void report(const std::string& id, bool healthy) {
    auto r = reportOf(id, healthy);
    REQUIRE(r.has_value());
    REQUIRE_THAT(ingestor_->reportSentinelStatus(r->region(), *r), IsOk());
  }

  // Starts the fake fleet: every sentinel in `progressing` is reported (healthy unless it is in
  // failing_) every few milliseconds.
  void startFleet() {
    fleet_ = std::thread([this] {
      while (!stop_fleet_) {
        auto conn = pool_->acquire();
        if (conn.ok()) {
          auto rows = (*conn)->query(
              "SELECT id FROM sentinels WHERE deploy_status = 'progressing' ORDER BY id LIMIT 500");
          if (rows.ok()) {
            for (const db::Row& row : rows->rows) {
              const std::string id = row.str(0);
              bool healthy;
              {
                std::lock_guard lock(fleet_mutex_);
                healthy = failing_.count(id) == 0;
                ++reports_[id];
              }
              if (auto r = reportOf(id, healthy)) {
                (void)ingestor_->reportSentinelStatus(r->region(), *r);
              }
            }
          }
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    });
  }
  void stopFleet() {
    stop_fleet_ = true;
    if (fleet_.joinable()) fleet_.join();
  }
  void failing(const std::set<std::string>& ids) {
    std::lock_guard lock(fleet_mutex_);
    failing_ = ids;
  }

  std::string column(const std::string& id, const std::string& name) {
    auto rows =
        (*pool_->acquire())
            ->query(strCat("SELECT CAST(", name, " AS CHAR) FROM sentinels WHERE id = ?"), {id});
    return rows.ok() && !rows->empty() ? rows->rows[0].str(0) : "<none>";
  }
  int64_t changesOf(const std::string& id) {
    return scalar("SELECT COUNT(*) FROM resource_changes WHERE resource_id = ?", {id});
  }

  std::shared_ptr<feed::Writer> writer_;
  std::shared_ptr<ingest::Ingestor> ingestor_;
  bool notifier_added_ = false;
  std::thread fleet_;
  std::atomic<bool> stop_fleet_{false};
  std::mutex fleet_mutex_;
  std::set<std::string> failing_;
  std::map<std::string, int> reports_;
};

}  // namespace krane::services::sentinel::testing
