// Sentinels on a real MariaDB with SentinelService on the workflow engine, the real ingestor
// (what ReportSentinelStatus calls) and its ReadyNotifier, and a fake fleet: a thread that plays
// the agents, reporting each sentinel in `progressing` healthy on its desired image at the
// version it was written with, except those told to fail (reported unhealthy)
// (tests/support/sentinel_reports.h).
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
#include "tests/support/sentinel_reports.h"

namespace krane::services::sentinel::testing {

class SentinelFleetTest : public workflow::WorkflowTest {
 protected:
  SentinelFleetTest()
      : writer_(std::make_shared<feed::Writer>(pool_, std::make_shared<feed::ResourceTables>())),
        ingestor_(std::make_shared<ingest::Ingestor>(pool_)) {
    seedRegions();
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

  std::optional<cluster::v1::ReportSentinelStatusRequest> reportOf(const std::string& id,
                                                                   bool healthy) {
    return krane::testing::sentinelReport(*pool_, id, healthy);
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
        std::set<std::string> failing;
        {
          std::lock_guard lock(fleet_mutex_);
          failing = failing_;
        }
        krane::testing::settleSentinels(*pool_, *ingestor_, "", failing);
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
};

}  // namespace krane::services::sentinel::testing
