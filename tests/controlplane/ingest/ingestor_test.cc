// Status ingestion against a real MariaDB: reports replace what was stored, bad or foreign
// reports write nothing, and a sentinel flips to ready (and notifies) exactly once.
#include "controlplane/ingest/ingestor.h"

#include <atomic>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/strings.h"
#include "controlplane/db/migrate.h"
#include "tests/support/mariadb.h"

namespace krane::ingest {
namespace {

using cluster::v1::HeartbeatRequest;
using cluster::v1::ReportDeploymentStatusRequest;
using cluster::v1::ReportResourceStatusRequest;
using cluster::v1::ReportSentinelStatusRequest;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string messageOf(const absl::Status& s) { return std::string(toStd(s.message())); }

struct InstanceSpec {
  std::string id;
  std::string address;
  cluster::v1::InstanceStatus status;
  std::string failure_reason = {};
};

ReportDeploymentStatusRequest deploymentReport(const std::string& deployment,
                                               const std::vector<InstanceSpec>& instances,
                                               const std::string& region = "") {
  ReportDeploymentStatusRequest r;
  r.set_deployment_id(deployment);
  r.set_region(region);
  auto* set = r.mutable_instances();
  for (const auto& spec : instances) {
    auto* in = set->add_instances();
    in->set_id(spec.id);
    in->set_address(spec.address);
    in->set_status(spec.status);
    in->set_failure_reason(spec.failure_reason);
  }
  return r;
}

ReportSentinelStatusRequest sentinelReport(const std::string& id, const std::string& image,
                                           cluster::v1::SentinelHealth health, uint32_t available) {
  ReportSentinelStatusRequest r;
  r.set_sentinel_id(id);
  r.set_available_replicas(available);
  r.set_updated_replicas(available);
  r.set_ready_replicas(available);
  r.set_observed_generation(4);
  r.set_running_image(image);
  r.set_health(health);
  return r;
}

class CountingHooks : public SentinelReadyHook, public DeploymentInstancesHook {
 public:
  void onSentinelReady(const std::string& sentinel_id, const std::string& region) override {
    std::lock_guard lock(mutex);
    ready.emplace_back(sentinel_id, region);
  }
  void onInstancesReported(const std::string& deployment_id, const std::string& region,
                           uint32_t running, uint32_t pending, uint32_t failed) override {
    std::lock_guard lock(mutex);
    reported.emplace_back(deployment_id, region, running, pending, failed);
  }
  std::mutex mutex;
  std::vector<std::pair<std::string, std::string>> ready;
  std::vector<std::tuple<std::string, std::string, uint32_t, uint32_t, uint32_t>> reported;
};

struct StoredInstance {
  std::string address;
  std::string status;
  std::string failure_reason;  // empty for NULL
  int64_t created_at = 0;
  int64_t updated_at = 0;
};

class IngestorTest : public krane::testing::MariaDbTest {
 protected:
  void SetUp() override {
    MariaDbTest::SetUp();
    auto pool = db::Pool::create(dsn_, {.max_connections = 12});
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = *pool;
    auto migrated = db::Migrator(pool_, *db::builtinMigrations()).migrate();
    ASSERT_TRUE(migrated.ok()) << migrated.status();
    for (const char* region : {"eu-1", "us-1"}) {
      exec("INSERT INTO regions (id, display_name, created_at) VALUES (?, ?, 1)", {region, region});
    }
    ingestor_ = std::make_shared<Ingestor>(pool_);
    hooks_ = std::make_shared<CountingHooks>();
    ingestor_->addSentinelReadyHook(hooks_);
    ingestor_->addDeploymentInstancesHook(hooks_);
  }

  void exec(const std::string& sql, const db::Params& params = {}) {
    auto conn = pool_->acquire();
    ASSERT_TRUE(conn.ok()) << conn.status();
    auto done = (*conn)->exec(sql, params);
    ASSERT_TRUE(done.ok()) << done.status();
  }

  db::ResultSet query(const std::string& sql, const db::Params& params = {}) {
    auto conn = pool_->acquire();
    EXPECT_TRUE(conn.ok()) << conn.status();
    auto rows = (*conn)->query(sql, params);
    EXPECT_TRUE(rows.ok()) << rows.status();
    return *std::move(rows);
  }

  std::map<std::string, StoredInstance> instances(const std::string& deployment,
                                                  const std::string& region = "eu-1") {
    std::map<std::string, StoredInstance> out;
    for (const auto& row :
         query("SELECT id, address, status, failure_reason, created_at, updated_at"
               " FROM instances WHERE deployment_id = ? AND region_id = ?",
               {deployment, region})
             .rows) {
      out[row.str("id")] = StoredInstance{row.str("address"), row.str("status"),
                                          row.optStr("failure_reason").value_or(""),
                                          row.i64("created_at"), row.i64("updated_at")};
    }
    return out;
  }

  std::vector<std::string> instanceIds(const std::string& deployment,
                                       const std::string& region = "eu-1") {
    std::vector<std::string> ids;
    for (const auto& [id, _] : instances(deployment, region)) ids.push_back(id);
    return ids;
  }

  void addSentinel(const std::string& id, const std::string& region, const std::string& image,
                   uint32_t replicas, const std::string& deploy_status = "progressing") {
    exec(
        "INSERT INTO sentinels (id, workspace_id, project_id, app_id, environment_id, region_id,"
        " image, replicas, cpu_millicores, memory_mib, deploy_status, created_at)"
        " VALUES (?, 'ws', 'proj', 'app', 'env', ?, ?, ?, 250, 256, ?, 1)",
        {id, region, image, replicas, deploy_status});
  }

  std::string deployStatus(const std::string& id) {
    return query("SELECT deploy_status FROM sentinels WHERE id = ?", {id}).rows.at(0).str(0);
  }

  std::shared_ptr<db::Pool> pool_;
  std::shared_ptr<Ingestor> ingestor_;
  std::shared_ptr<CountingHooks> hooks_;
};

// ---------------------------------------------------------------------------------------------
// Deployment status

TEST_F(IngestorTest, ReportReplacesTheInstanceSet) {
  using cluster::v1::INSTANCE_STATUS_FAILED;
  using cluster::v1::INSTANCE_STATUS_PENDING;
  using cluster::v1::INSTANCE_STATUS_RUNNING;
  // Another deployment and another region of the same deployment are not touched.
  ASSERT_TRUE(
      ingestor_
          ->reportDeploymentStatus(
              "eu-1", deploymentReport("other", {{"x", "10.0.0.9:80", INSTANCE_STATUS_RUNNING}}))
          .ok());
  ASSERT_TRUE(
      ingestor_
          ->reportDeploymentStatus(
              "us-1", deploymentReport("dep", {{"a", "10.1.0.1:80", INSTANCE_STATUS_RUNNING}}))
          .ok());

  auto first = ingestor_->reportDeploymentStatus(
      "eu-1", deploymentReport("dep", {{"a", "10.0.0.1:8080", INSTANCE_STATUS_RUNNING},
                                       {"b", "", INSTANCE_STATUS_PENDING}}));
  ASSERT_TRUE(first.ok()) << first;
  const auto before = instances("dep");
  ASSERT_THAT(instanceIds("dep"), ElementsAre("a", "b"));
  EXPECT_EQ(before.at("b").status, "pending");
  EXPECT_EQ(before.at("b").address, "");

  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  auto second = ingestor_->reportDeploymentStatus(
      "eu-1", deploymentReport("dep",
                               {{"b", "10.0.0.2:8080", INSTANCE_STATUS_RUNNING},
                                {"c", "host-c.internal:9000", INSTANCE_STATUS_FAILED,
                                 "CrashLoopBackOff: exit code 1"}},
                               "eu-1"));
  ASSERT_TRUE(second.ok()) << second;
  const auto after = instances("dep");
  ASSERT_THAT(instanceIds("dep"), ElementsAre("b", "c"));
  EXPECT_EQ(after.at("b").status, "running");
  EXPECT_EQ(after.at("b").address, "10.0.0.2:8080");
  EXPECT_EQ(after.at("b").created_at, before.at("b").created_at);
  EXPECT_GT(after.at("b").updated_at, before.at("b").updated_at);
  EXPECT_EQ(after.at("c").status, "failed");
  EXPECT_EQ(after.at("c").failure_reason, "CrashLoopBackOff: exit code 1");

  EXPECT_THAT(instanceIds("other"), ElementsAre("x"));
  EXPECT_THAT(instanceIds("dep", "us-1"), ElementsAre("a"));

  std::lock_guard lock(hooks_->mutex);
  ASSERT_EQ(hooks_->reported.size(), 4u);
  EXPECT_EQ(hooks_->reported[2], std::make_tuple("dep", "eu-1", 1u, 1u, 0u));
  EXPECT_EQ(hooks_->reported[3], std::make_tuple("dep", "eu-1", 1u, 0u, 1u));
  EXPECT_EQ(ingestor_->counters().deployment_reports.load(), 4u);
  EXPECT_EQ(ingestor_->counters().rejected.load(), 0u);
}

TEST_F(IngestorTest, DeleteReportRemovesEveryInstance) {
  using cluster::v1::INSTANCE_STATUS_RUNNING;
  ASSERT_TRUE(
      ingestor_
          ->reportDeploymentStatus(
              "eu-1", deploymentReport("dep", {{"a", "10.0.0.1:80", INSTANCE_STATUS_RUNNING},
                                               {"b", "10.0.0.2:80", INSTANCE_STATUS_RUNNING}}))
          .ok());
  ReportDeploymentStatusRequest removed;
  removed.set_deployment_id("dep");
  removed.set_deleted(true);
  auto st = ingestor_->reportDeploymentStatus("eu-1", removed);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_TRUE(instanceIds("dep").empty());
  std::lock_guard lock(hooks_->mutex);
  EXPECT_EQ(hooks_->reported.back(), std::make_tuple("dep", "eu-1", 0u, 0u, 0u));
}

// What `kranectl status` reads: each deployment report leaves the phase, the applied version
// and the counts (running instances on the applied spec among them); a delete report clears it.
TEST_F(IngestorTest, DeploymentReportsKeepAPhaseAndTheAppliedVersion) {
  using cluster::v1::INSTANCE_STATUS_PENDING;
  using cluster::v1::INSTANCE_STATUS_RUNNING;
  const auto status = [&] {
    return query(
        "SELECT applied_version, phase, message FROM resource_status WHERE region_id = 'eu-1'"
        " AND resource_type = 'deployment_topology' AND resource_id = 'dep'");
  };
  auto rolling = deploymentReport("dep", {{"a", "10.0.0.1:80", INSTANCE_STATUS_RUNNING},
                                          {"b", "10.0.0.2:80", INSTANCE_STATUS_PENDING}});
  rolling.set_applied_version(7);
  rolling.mutable_instances()->mutable_instances(0)->set_current(false);
  rolling.mutable_instances()->mutable_instances(1)->set_current(true);
  ASSERT_TRUE(ingestor_->reportDeploymentStatus("eu-1", rolling).ok());
  auto row = status();
  ASSERT_EQ(row.rows.size(), 1u);
  EXPECT_EQ(row.rows[0].u64(0), 7u);
  EXPECT_EQ(row.rows[0].str(1), "progressing");
  EXPECT_EQ(row.rows[0].str(2), "1 running, 1 pending, 0 failed, 0 on the applied spec");

  auto done = deploymentReport("dep", {{"b", "10.0.0.2:80", INSTANCE_STATUS_RUNNING}});
  done.set_applied_version(7);
  done.mutable_instances()->mutable_instances(0)->set_current(true);
  ASSERT_TRUE(ingestor_->reportDeploymentStatus("eu-1", done).ok());
  row = status();
  EXPECT_EQ(row.rows[0].str(1), "ready");
  EXPECT_EQ(row.rows[0].str(2), "1 running, 0 pending, 0 failed, 1 on the applied spec");

  auto crashing = deploymentReport(
      "dep", {{"b", "10.0.0.2:80", cluster::v1::INSTANCE_STATUS_FAILED, "exited with code 3"}});
  crashing.set_applied_version(8);
  ASSERT_TRUE(ingestor_->reportDeploymentStatus("eu-1", crashing).ok());
  row = status();
  EXPECT_EQ(row.rows[0].u64(0), 8u);
  EXPECT_EQ(row.rows[0].str(1), "degraded");

  ReportDeploymentStatusRequest removed;
  removed.set_deployment_id("dep");
  removed.set_deleted(true);
  ASSERT_TRUE(ingestor_->reportDeploymentStatus("eu-1", removed).ok());
  EXPECT_TRUE(status().rows.empty());
}

TEST_F(IngestorTest, AnEmptyInstanceSetAlsoRemovesEverything) {
  using cluster::v1::INSTANCE_STATUS_RUNNING;
  ASSERT_TRUE(
      ingestor_
          ->reportDeploymentStatus(
              "eu-1", deploymentReport("dep", {{"a", "10.0.0.1:80", INSTANCE_STATUS_RUNNING}}))
          .ok());
  ASSERT_TRUE(ingestor_->reportDeploymentStatus("eu-1", deploymentReport("dep", {})).ok());
  EXPECT_TRUE(instanceIds("dep").empty());
}

TEST_F(IngestorTest, LargeReportsAreStoredAndReplaced) {
  std::vector<InstanceSpec> many;
  for (int i = 0; i < 1000; ++i) {
    many.push_back({strCat("pod-", i), strCat("10.0.", i / 250, ".", i % 250 + 1, ":8080"),
                    cluster::v1::INSTANCE_STATUS_RUNNING, ""});
  }
  auto st = ingestor_->reportDeploymentStatus("eu-1", deploymentReport("dep", many));
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(instances("dep").size(), 1000u);

  many.resize(537);
  many.push_back({"new-pod", "10.9.9.9:1", cluster::v1::INSTANCE_STATUS_PENDING, ""});
  st = ingestor_->reportDeploymentStatus("eu-1", deploymentReport("dep", many));
  ASSERT_TRUE(st.ok()) << st;
  const auto stored = instances("dep");
  EXPECT_EQ(stored.size(), 538u);
  EXPECT_TRUE(stored.count("pod-536"));
  EXPECT_FALSE(stored.count("pod-537"));
  EXPECT_EQ(stored.at("new-pod").status, "pending");

  many.resize(1001, InstanceSpec{"", "10.0.0.1:1", cluster::v1::INSTANCE_STATUS_RUNNING, ""});
  st = ingestor_->reportDeploymentStatus("eu-1", deploymentReport("dep", many));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(messageOf(st), HasSubstr("instances: at most 1000"));
}

TEST_F(IngestorTest, DuplicateInstanceIdsAreRefusedAndNothingIsWritten) {
  using cluster::v1::INSTANCE_STATUS_PENDING;
  using cluster::v1::INSTANCE_STATUS_RUNNING;
  ASSERT_TRUE(
      ingestor_
          ->reportDeploymentStatus(
              "eu-1", deploymentReport("dep", {{"a", "10.0.0.1:80", INSTANCE_STATUS_RUNNING}}))
          .ok());
  auto st = ingestor_->reportDeploymentStatus(
      "eu-1", deploymentReport("dep", {{"b", "10.0.0.2:80", INSTANCE_STATUS_RUNNING},
                                       {"c", "10.0.0.3:80", INSTANCE_STATUS_RUNNING},
                                       {"b", "10.0.0.4:80", INSTANCE_STATUS_PENDING}}));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(messageOf(st),
              HasSubstr("instances[2].id: \"b\" is listed twice (also instances[0])"));
  EXPECT_THAT(instanceIds("dep"), ElementsAre("a"));
  EXPECT_EQ(ingestor_->counters().rejected.load(), 1u);
  std::lock_guard lock(hooks_->mutex);
  EXPECT_EQ(hooks_->reported.size(), 1u);
}

TEST_F(IngestorTest, ReportForAnotherRegionIsDenied) {
  using cluster::v1::INSTANCE_STATUS_RUNNING;
  auto st = ingestor_->reportDeploymentStatus(
      "eu-1", deploymentReport("dep", {{"a", "10.0.0.1:80", INSTANCE_STATUS_RUNNING}}, "us-1"));
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(messageOf(st), HasSubstr("token for region eu-1 cannot report for region us-1"));
  EXPECT_TRUE(instanceIds("dep", "us-1").empty());
  EXPECT_TRUE(instanceIds("dep", "eu-1").empty());
  EXPECT_EQ(ingestor_->counters().rejected.load(), 1u);

  addSentinel("sen", "us-1", "sentinel:1", 1);
  auto sentinel = sentinelReport("sen", "sentinel:1", cluster::v1::SENTINEL_HEALTH_HEALTHY, 1);
  sentinel.set_region("us-1");
  EXPECT_EQ(ingestor_->reportSentinelStatus("eu-1", sentinel).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(deployStatus("sen"), "progressing");

  HeartbeatRequest beat;
  beat.set_agent_id("agent-1");
  beat.set_region("us-1");
  EXPECT_EQ(ingestor_->heartbeat("eu-1", beat).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(query("SELECT 1 FROM agents").empty());
}

TEST_F(IngestorTest, InvalidInstancesAreRefusedNamingTheField) {
  using cluster::v1::INSTANCE_STATUS_RUNNING;
  const auto refuse = [&](const ReportDeploymentStatusRequest& r, const std::string& message) {
    auto st = ingestor_->reportDeploymentStatus("eu-1", r);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_THAT(messageOf(st), HasSubstr(message));
  };
  refuse(deploymentReport("", {}), "deployment_id: required");
  refuse(deploymentReport("dep", {{"a", "10.0.0.1:80", INSTANCE_STATUS_RUNNING},
                                  {"b", "x", INSTANCE_STATUS_RUNNING}}),
         "instances[1].address: \"x\" is not host:port");
  for (const char* bad : {"10.0.0.1", "10.0.0.1:0", "10.0.0.1:65536", ":80", "a b:80", "::1:80",
                          "[::1]", "host:http"}) {
    refuse(deploymentReport("dep", {{"a", bad, INSTANCE_STATUS_RUNNING}}),
           strCat("instances[0].address: \"", bad, "\" is not host:port"));
  }
  refuse(deploymentReport("dep", {{"a", "", INSTANCE_STATUS_RUNNING}}),
         "instances[0].address: required for a running instance");

  auto unknown_status = deploymentReport("dep", {{"a", "10.0.0.1:80", INSTANCE_STATUS_RUNNING},
                                                 {"b", "10.0.0.2:80", INSTANCE_STATUS_RUNNING}});
  unknown_status.mutable_instances()->mutable_instances(1)->set_status(
      static_cast<cluster::v1::InstanceStatus>(7));
  refuse(unknown_status, "instances[1].status: unknown value 7");
  refuse(deploymentReport("dep", {{"a", "10.0.0.1:80", cluster::v1::INSTANCE_STATUS_UNSPECIFIED}}),
         "instances[0].status: required");
  refuse(deploymentReport("dep", {{"", "10.0.0.1:80", INSTANCE_STATUS_RUNNING}}),
         "instances[0].id: required");
  refuse(deploymentReport("dep", {{"a b", "10.0.0.1:80", INSTANCE_STATUS_RUNNING}}),
         "instances[0].id: must be printable ASCII without spaces");
  refuse(deploymentReport("dep", {{"a", "10.0.0.1:80", cluster::v1::INSTANCE_STATUS_FAILED,
                                   std::string(4097, 'x')}}),
         "instances[0].failure_reason: at most 4096 bytes");

  ReportDeploymentStatusRequest no_state;
  no_state.set_deployment_id("dep");
  refuse(no_state, "state: required");

  EXPECT_TRUE(query("SELECT 1 FROM instances").empty());

  // Addresses that are fine.
  for (const char* good : {"10.0.0.1:80", "[fd00::1]:8080", "pod.ns.svc.cluster.local:65535"}) {
    auto st = ingestor_->reportDeploymentStatus(
        "eu-1", deploymentReport("dep", {{"a", good, INSTANCE_STATUS_RUNNING}}));
    EXPECT_TRUE(st.ok()) << good << ": " << st;
  }
}

// ---------------------------------------------------------------------------------------------
// Sentinel status

TEST_F(IngestorTest, SentinelBecomesReadyOnlyWhenImageHealthAndReplicasMatch) {
  using cluster::v1::SENTINEL_HEALTH_HEALTHY;
  addSentinel("sen", "eu-1", "sentinel:2", 3);

  // Still on the old image.
  auto st = ingestor_->reportSentinelStatus(
      "eu-1", sentinelReport("sen", "sentinel:1", SENTINEL_HEALTH_HEALTHY, 3));
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(deployStatus("sen"), "progressing");
  auto row = query(
                 "SELECT available_replicas, updated_replicas, ready_replicas, observed_generation,"
                 " running_image, health, status_reported_at FROM sentinels WHERE id = 'sen'")
                 .rows.at(0);
  EXPECT_EQ(row.u64("available_replicas"), 3u);
  EXPECT_EQ(row.u64("updated_replicas"), 3u);
  EXPECT_EQ(row.u64("ready_replicas"), 3u);
  EXPECT_EQ(row.i64("observed_generation"), 4);
  EXPECT_EQ(row.str("running_image"), "sentinel:1");
  EXPECT_EQ(row.str("health"), "healthy");
  EXPECT_FALSE(row.isNull("status_reported_at"));

  // New image, but unhealthy, or paused, or not enough replicas yet.
  ASSERT_TRUE(
      ingestor_
          ->reportSentinelStatus("eu-1", sentinelReport("sen", "sentinel:2",
                                                        cluster::v1::SENTINEL_HEALTH_UNHEALTHY, 3))
          .ok());
  EXPECT_EQ(query("SELECT health FROM sentinels").rows.at(0).str(0), "unhealthy");
  ASSERT_TRUE(
      ingestor_
          ->reportSentinelStatus(
              "eu-1", sentinelReport("sen", "sentinel:2", cluster::v1::SENTINEL_HEALTH_PAUSED, 3))
          .ok());
  ASSERT_TRUE(ingestor_
                  ->reportSentinelStatus(
                      "eu-1", sentinelReport("sen", "sentinel:2", SENTINEL_HEALTH_HEALTHY, 2))
                  .ok());
  EXPECT_EQ(deployStatus("sen"), "progressing");
  {
    std::lock_guard lock(hooks_->mutex);
    EXPECT_TRUE(hooks_->ready.empty());
  }

  // Converged.
  ASSERT_TRUE(ingestor_
                  ->reportSentinelStatus(
                      "eu-1", sentinelReport("sen", "sentinel:2", SENTINEL_HEALTH_HEALTHY, 3))
                  .ok());
  EXPECT_EQ(deployStatus("sen"), "ready");
  // Later reports keep updating the observed columns but notify no more.
  ASSERT_TRUE(ingestor_
                  ->reportSentinelStatus(
                      "eu-1", sentinelReport("sen", "sentinel:2", SENTINEL_HEALTH_HEALTHY, 4))
                  .ok());
  EXPECT_EQ(query("SELECT available_replicas FROM sentinels").rows.at(0).u64(0), 4u);
  std::lock_guard lock(hooks_->mutex);
  EXPECT_THAT(hooks_->ready, ElementsAre(std::make_pair(std::string("sen"), std::string("eu-1"))));
  EXPECT_EQ(ingestor_->counters().sentinel_reports.load(), 6u);
}

TEST_F(IngestorTest, SentinelNotInProgressOrWithoutReplicasIsNotFlipped) {
  using cluster::v1::SENTINEL_HEALTH_HEALTHY;
  addSentinel("idle", "eu-1", "sentinel:2", 1, "idle");
  addSentinel("failed", "eu-1", "sentinel:2", 1, "failed");
  addSentinel("zero", "eu-1", "sentinel:2", 0);
  for (const char* id : {"idle", "failed", "zero"}) {
    auto st = ingestor_->reportSentinelStatus(
        "eu-1", sentinelReport(id, "sentinel:2", SENTINEL_HEALTH_HEALTHY, 1));
    ASSERT_TRUE(st.ok()) << st;
  }
  EXPECT_EQ(deployStatus("idle"), "idle");
  EXPECT_EQ(deployStatus("failed"), "failed");
  EXPECT_EQ(deployStatus("zero"), "progressing");
  std::lock_guard lock(hooks_->mutex);
  EXPECT_TRUE(hooks_->ready.empty());
}

TEST_F(IngestorTest, ConcurrentReadyReportsNotifyOnce) {
  addSentinel("sen", "eu-1", "sentinel:2", 2);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&] {
      auto st = ingestor_->reportSentinelStatus(
          "eu-1", sentinelReport("sen", "sentinel:2", cluster::v1::SENTINEL_HEALTH_HEALTHY, 2));
      if (!st.ok()) {
        ADD_FAILURE() << st;
        ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(deployStatus("sen"), "ready");
  std::lock_guard lock(hooks_->mutex);
  EXPECT_EQ(hooks_->ready.size(), 1u);
}

TEST_F(IngestorTest, UnknownSentinelIsNotFound) {
  addSentinel("elsewhere", "us-1", "sentinel:2", 1);
  auto st = ingestor_->reportSentinelStatus(
      "eu-1", sentinelReport("missing", "sentinel:2", cluster::v1::SENTINEL_HEALTH_HEALTHY, 1));
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(messageOf(st), HasSubstr("sentinel \"missing\" does not exist in region \"eu-1\""));
  // A sentinel of another region is not reachable with this region's token.
  st = ingestor_->reportSentinelStatus(
      "eu-1", sentinelReport("elsewhere", "sentinel:2", cluster::v1::SENTINEL_HEALTH_HEALTHY, 1));
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(deployStatus("elsewhere"), "progressing");
  EXPECT_TRUE(query("SELECT 1 FROM sentinels WHERE status_reported_at IS NOT NULL").empty());
  EXPECT_EQ(ingestor_->counters().rejected.load(), 2u);
  EXPECT_EQ(ingestor_->counters().errors.load(), 0u);
}

TEST_F(IngestorTest, InvalidSentinelReportsAreRefused) {
  addSentinel("sen", "eu-1", "sentinel:2", 1);
  auto r = sentinelReport("sen", "sentinel:2", cluster::v1::SENTINEL_HEALTH_HEALTHY, 1);
  r.set_available_replicas(1'000'000);
  auto st = ingestor_->reportSentinelStatus("eu-1", r);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(messageOf(st), HasSubstr("available_replicas: must be at most"));

  r = sentinelReport("sen", "sentinel:2", static_cast<cluster::v1::SentinelHealth>(9), 1);
  st = ingestor_->reportSentinelStatus("eu-1", r);
  EXPECT_THAT(messageOf(st), HasSubstr("health: unknown value 9"));

  r = sentinelReport("", "sentinel:2", cluster::v1::SENTINEL_HEALTH_HEALTHY, 1);
  EXPECT_THAT(messageOf(ingestor_->reportSentinelStatus("eu-1", r)),
              HasSubstr("sentinel_id: required"));
  EXPECT_EQ(deployStatus("sen"), "progressing");
  EXPECT_TRUE(query("SELECT 1 FROM sentinels WHERE status_reported_at IS NOT NULL").empty());
}

// ---------------------------------------------------------------------------------------------
// Resource status

TEST_F(IngestorTest, ResourceStatusIsUpserted) {
  ReportResourceStatusRequest r;
  r.set_type("example.krane.dev/bucket");
  r.set_id("photos");
  r.set_version(3);
  r.set_phase(cluster::v1::RESOURCE_PHASE_PROGRESSING);
  r.set_message("creating");
  r.set_detail(std::string("\x00\x01\x02", 3));
  auto st = ingestor_->reportResourceStatus("eu-1", r);
  ASSERT_TRUE(st.ok()) << st;
  auto rows = query("SELECT * FROM resource_status");
  ASSERT_EQ(rows.rows.size(), 1u);
  EXPECT_EQ(rows.rows[0].str("region_id"), "eu-1");
  EXPECT_EQ(rows.rows[0].str("resource_type"), "example.krane.dev/bucket");
  EXPECT_EQ(rows.rows[0].str("resource_id"), "photos");
  EXPECT_EQ(rows.rows[0].u64("applied_version"), 3u);
  EXPECT_EQ(rows.rows[0].str("phase"), "progressing");
  EXPECT_EQ(rows.rows[0].str("message"), "creating");
  EXPECT_EQ(rows.rows[0].str("detail"), std::string("\x00\x01\x02", 3));
  EXPECT_TRUE(rows.rows[0].isNull("apply_error"));
  EXPECT_EQ(rows.rows[0].u64("apply_attempts"), 0u);
  const int64_t first_update = rows.rows[0].i64("updated_at");

  r.set_version(4);
  r.set_phase(cluster::v1::RESOURCE_PHASE_FAILED);
  r.set_message("");
  r.clear_detail();
  r.mutable_apply_error()->set_code(3);
  r.mutable_apply_error()->set_message("bucket name taken");
  r.mutable_apply_error()->set_retryable(true);
  r.mutable_apply_error()->set_attempts(2);
  st = ingestor_->reportResourceStatus("eu-1", r);
  ASSERT_TRUE(st.ok()) << st;
  rows = query("SELECT * FROM resource_status");
  ASSERT_EQ(rows.rows.size(), 1u);
  EXPECT_EQ(rows.rows[0].u64("applied_version"), 4u);
  EXPECT_EQ(rows.rows[0].str("phase"), "failed");
  EXPECT_TRUE(rows.rows[0].isNull("message"));
  EXPECT_TRUE(rows.rows[0].isNull("detail"));
  EXPECT_THAT(rows.rows[0].str("apply_error"), HasSubstr("bucket name taken"));
  EXPECT_EQ(rows.rows[0].u64("apply_attempts"), 2u);
  EXPECT_GE(rows.rows[0].i64("updated_at"), first_update);

  // The same resource in another region is a row of its own.
  st = ingestor_->reportResourceStatus("us-1", r);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(query("SELECT 1 FROM resource_status").rows.size(), 2u);
  EXPECT_EQ(ingestor_->counters().resource_reports.load(), 3u);
}

TEST_F(IngestorTest, InvalidResourceStatusIsRefused) {
  ReportResourceStatusRequest r;
  r.set_type("example.krane.dev/bucket");
  r.set_id("photos");
  const auto refuse = [&](const std::string& message) {
    auto st = ingestor_->reportResourceStatus("eu-1", r);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_THAT(messageOf(st), HasSubstr(message));
  };
  refuse("phase: required");
  r.set_phase(static_cast<cluster::v1::ResourcePhase>(42));
  refuse("phase: unknown value 42");
  r.set_phase(cluster::v1::RESOURCE_PHASE_READY);
  r.set_message(std::string(4097, 'm'));
  refuse("message: at most 4096 bytes");
  r.clear_message();
  r.set_detail(std::string(64 * 1024 + 1, 'd'));
  refuse("detail: at most 65536 bytes");
  r.clear_detail();
  r.set_id("");
  refuse("id: required");
  r.set_id("photos");
  r.set_region("us-1");
  EXPECT_EQ(ingestor_->reportResourceStatus("eu-1", r).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(query("SELECT 1 FROM resource_status").empty());
  EXPECT_EQ(ingestor_->counters().rejected.load(), 6u);
}

// ---------------------------------------------------------------------------------------------
// Heartbeats and agents

TEST_F(IngestorTest, HeartbeatUpsertsTheAgentAndListShowsTheLag) {
  exec(
      "INSERT INTO region_versions (region_id, version) VALUES ('eu-1', 42)"
      " ON DUPLICATE KEY UPDATE version = 42");

  HeartbeatRequest beat;
  beat.set_agent_id("agent-a");
  beat.set_build_version("0.3.1+abc1234");
  beat.set_applied_version(30);
  beat.set_is_leader(true);
  auto* plugin = beat.add_plugins();
  plugin->set_name("kubernetes");
  plugin->set_version("1.2.0");
  plugin->set_abi_major(1);
  plugin->set_abi_minor(3);
  plugin->add_resource_types("deployment_topology");
  plugin->add_resource_types("sentinel");
  auto answer = ingestor_->heartbeat("eu-1", beat);
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(answer->latest_version(), 42u);
  EXPECT_EQ(answer->oldest_version(), 0u);
  EXPECT_GT(answer->server_time_unix_ms(), 0);

  auto agents = ingestor_->listAgents("");
  ASSERT_TRUE(agents.ok()) << agents.status();
  ASSERT_EQ(agents->size(), 1u);
  const AgentInfo first = agents->front();
  EXPECT_EQ(first.agent_id, "agent-a");
  EXPECT_EQ(first.region, "eu-1");
  EXPECT_EQ(first.build_version, "0.3.1+abc1234");
  EXPECT_EQ(first.applied_version, 30u);
  EXPECT_EQ(first.latest_version, 42u);
  EXPECT_EQ(first.lag, 12u);
  EXPECT_TRUE(first.is_leader);
  ASSERT_EQ(first.plugins.size(), 1u);
  EXPECT_EQ(first.plugins[0].name(), "kubernetes");
  EXPECT_EQ(first.plugins[0].version(), "1.2.0");
  EXPECT_EQ(first.plugins[0].abi_major(), 1u);
  EXPECT_EQ(first.plugins[0].abi_minor(), 3u);
  EXPECT_THAT(first.plugins[0].resource_types(), ElementsAre("deployment_topology", "sentinel"));
  EXPECT_EQ(first.first_seen_ms, first.last_seen_ms);

  // The same agent again: one row, first seen kept.
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  beat.set_applied_version(42);
  beat.set_is_leader(false);
  beat.clear_plugins();
  beat.set_region("eu-1");
  ASSERT_TRUE(ingestor_->heartbeat("eu-1", beat).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  // Another agent in a region without a version row; and one that is ahead of its region.
  HeartbeatRequest other;
  other.set_agent_id("agent-b");
  other.set_applied_version(5);
  ASSERT_TRUE(ingestor_->heartbeat("us-1", other).ok());

  agents = ingestor_->listAgents("eu-1");
  ASSERT_TRUE(agents.ok()) << agents.status();
  ASSERT_EQ(agents->size(), 1u);
  EXPECT_EQ(agents->front().applied_version, 42u);
  EXPECT_EQ(agents->front().lag, 0u);
  EXPECT_FALSE(agents->front().is_leader);
  EXPECT_TRUE(agents->front().plugins.empty());
  EXPECT_EQ(agents->front().first_seen_ms, first.first_seen_ms);
  EXPECT_GT(agents->front().last_seen_ms, first.last_seen_ms);

  agents = ingestor_->listAgents("");
  ASSERT_TRUE(agents.ok()) << agents.status();
  ASSERT_EQ(agents->size(), 2u);
  EXPECT_EQ(agents->at(0).agent_id, "agent-b");  // newest first
  EXPECT_EQ(agents->at(0).latest_version, 0u);
  EXPECT_EQ(agents->at(0).lag, 0u);
  EXPECT_EQ(agents->at(1).agent_id, "agent-a");
  EXPECT_EQ(ingestor_->counters().heartbeats.load(), 3u);

  exec("UPDATE region_versions SET version = 50 WHERE region_id = 'eu-1'");
  agents = ingestor_->listAgents("eu-1");
  ASSERT_TRUE(agents.ok());
  EXPECT_EQ(agents->front().lag, 8u);
}

TEST_F(IngestorTest, HeartbeatReportsTheOldestChangeStillHeld) {
  exec(
      "INSERT INTO region_versions (region_id, version) VALUES ('eu-1', 9)"
      " ON DUPLICATE KEY UPDATE version = 9");
  for (int v : {7, 8, 9}) {
    exec(
        "INSERT INTO resource_changes (region_id, resource_type, resource_id, op, version, "
        "created_at)"
        " VALUES ('eu-1', 'sentinel', 's', 'apply', ?, 1)",
        {v});
  }
  HeartbeatRequest beat;
  beat.set_agent_id("agent-a");
  auto answer = ingestor_->heartbeat("eu-1", beat);
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(answer->latest_version(), 9u);
  EXPECT_EQ(answer->oldest_version(), 7u);
}

TEST_F(IngestorTest, InvalidHeartbeatsAreRefused) {
  HeartbeatRequest beat;
  auto answer = ingestor_->heartbeat("eu-1", beat);
  EXPECT_EQ(answer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(messageOf(answer.status()), HasSubstr("agent_id: required"));
  beat.set_agent_id("agent-a");
  beat.add_plugins()->set_version("1");
  answer = ingestor_->heartbeat("eu-1", beat);
  EXPECT_THAT(messageOf(answer.status()), HasSubstr("plugins[0].name: required"));
  EXPECT_TRUE(query("SELECT 1 FROM agents").empty());
  EXPECT_EQ(ingestor_->counters().rejected.load(), 2u);
}

}  // namespace
}  // namespace krane::ingest
