// Status ingestion against a real MariaDB: reports replace what was stored, bad or foreign
// reports write nothing, and a sentinel flips to ready (and notifies) exactly once.
#include "controlplane/ingest/ingestor.h"

#include <atomic>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

#include <catch2/catch.hpp>

#include "common/strings.h"
#include "controlplane/db/migrate.h"
#include "controlplane/feed/tables.h"
#include "controlplane/feed/writer.h"
#include "tests/support/mariadb.h"
#include "tests/support/matchers.h"
#include "tests/support/resources.h"

namespace krane::ingest {
namespace {

using cluster::v1::HeartbeatRequest;
using cluster::v1::ReportDeploymentStatusRequest;
using cluster::v1::ReportResourceStatusRequest;
using cluster::v1::ReportSentinelStatusRequest;

std::string messageOf(const absl::Status& s) { return std::string(toStd(s.message())); }

struct InstanceSpec {
  std::string id;
  std::string address;
  cluster::v1::InstanceStatus status;
  std::string failure_reason = {};
};

ReportDeploymentStatusRequest deploymentReport(const std::string& deployment,
                                               const std::vector<InstanceSpec>& instances,
                                               const std::string& region = "eu-1") {
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
  r.set_region("eu-1");
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

class IngestorTest : public krane::testing::MigratedDbTest {
 protected:
  IngestorTest() : MigratedDbTest(12) {
    for (const char* region : {"eu-1", "us-1"}) {
      exec("INSERT INTO regions (id, display_name, created_at) VALUES (?, ?, 1)", {region, region});
    }
    // What the reports below are about: reports about resources the control plane does not
    // hold are dropped (tested on their own).
    writer_ = std::make_shared<feed::Writer>(pool_, std::make_shared<feed::ResourceTables>());
    for (const char* region : {"eu-1", "us-1"}) {
      for (const char* id : {"dep", "other"})
        REQUIRE_THAT(writer_->put(krane::testing::topologyResource(id, region)), IsOk());
      // A generic resource's id is unique across regions.
      REQUIRE_THAT(writer_->put(bucket(strCat("photos", region == std::string("eu-1") ? "" : "-us"),
                                       region)),
                   IsOk());
    }
    ingestor_ = std::make_shared<Ingestor>(pool_);
    hooks_ = std::make_shared<CountingHooks>();
    ingestor_->addSentinelReadyHook(hooks_);
    ingestor_->addDeploymentInstancesHook(hooks_);
  }

  static feed::Resource bucket(const std::string& id, const std::string& region) {
    feed::Resource r;
    r.set_type("example.krane.dev/bucket");
    r.set_id(id);
    r.set_region(region);
    r.mutable_generic()->set_spec("x");
    r.mutable_generic()->set_content_type("text/plain");
    return r;
  }

  void exec(const std::string& sql, const db::Params& params = {}) {
    auto conn = pool_->acquire();
    REQUIRE_THAT(conn, IsOk());
    auto done = (*conn)->exec(sql, params);
    REQUIRE_THAT(done, IsOk());
  }

  db::ResultSet query(const std::string& sql, const db::Params& params = {}) {
    auto conn = pool_->acquire();
    CHECK_THAT(conn, IsOk());
    auto rows = (*conn)->query(sql, params);
    CHECK_THAT(rows, IsOk());
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

  std::shared_ptr<feed::Writer> writer_;
  std::shared_ptr<Ingestor> ingestor_;
  std::shared_ptr<CountingHooks> hooks_;
};

// ---------------------------------------------------------------------------------------------
// Deployment status

TEST_CASE_METHOD(IngestorTest, "report replaces the instance set", "[ingestor]") {
  using cluster::v1::INSTANCE_STATUS_FAILED;
  using cluster::v1::INSTANCE_STATUS_PENDING;
  using cluster::v1::INSTANCE_STATUS_RUNNING;
  // Another deployment and another region of the same deployment are not touched.
  REQUIRE_THAT(
      ingestor_->reportDeploymentStatus(
          "eu-1",
          deploymentReport("other", {{"x", "10.0.0.9:80", cluster::v1::INSTANCE_STATUS_RUNNING}})),
      IsOk());
  REQUIRE_THAT(
      ingestor_->reportDeploymentStatus(
          "us-1", deploymentReport(
                      "dep", {{"a", "10.1.0.1:80", cluster::v1::INSTANCE_STATUS_RUNNING}}, "us-1")),
      IsOk());

  auto first = ingestor_->reportDeploymentStatus(
      "eu-1", deploymentReport("dep", {{"a", "10.0.0.1:8080", cluster::v1::INSTANCE_STATUS_RUNNING},
                                       {"b", "", INSTANCE_STATUS_PENDING}}));
  REQUIRE_THAT(first, IsOk());
  const auto before = instances("dep");
  REQUIRE(instanceIds("dep") == std::vector<std::string>{"a", "b"});
  CHECK(before.at("b").status == "pending");
  CHECK(before.at("b").address == "");

  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  auto second = ingestor_->reportDeploymentStatus(
      "eu-1", deploymentReport("dep",
                               {{"b", "10.0.0.2:8080", cluster::v1::INSTANCE_STATUS_RUNNING},
                                {"c", "host-c.internal:9000", INSTANCE_STATUS_FAILED,
                                 "CrashLoopBackOff: exit code 1"}},
                               "eu-1"));
  REQUIRE_THAT(second, IsOk());
  const auto after = instances("dep");
  REQUIRE(instanceIds("dep") == std::vector<std::string>{"b", "c"});
  CHECK(after.at("b").status == "running");
  CHECK(after.at("b").address == "10.0.0.2:8080");
  CHECK(after.at("b").created_at == before.at("b").created_at);
  CHECK(after.at("b").updated_at > before.at("b").updated_at);
  CHECK(after.at("c").status == "failed");
  CHECK(after.at("c").failure_reason == "CrashLoopBackOff: exit code 1");

  CHECK(instanceIds("other") == std::vector<std::string>{"x"});
  CHECK(instanceIds("dep", "us-1") == std::vector<std::string>{"a"});

  std::lock_guard lock(hooks_->mutex);
  REQUIRE(hooks_->reported.size() == 4u);
  CHECK(hooks_->reported[2] == std::make_tuple("dep", "eu-1", 1u, 1u, 0u));
  CHECK(hooks_->reported[3] == std::make_tuple("dep", "eu-1", 1u, 0u, 1u));
  CHECK(ingestor_->counters().deployment_reports.load() == 4u);
  CHECK(ingestor_->counters().rejected.load() == 0u);
}

TEST_CASE_METHOD(IngestorTest, "delete report removes every instance", "[ingestor]") {
  using cluster::v1::INSTANCE_STATUS_RUNNING;
  REQUIRE_THAT(
      ingestor_->reportDeploymentStatus(
          "eu-1",
          deploymentReport("dep", {{"a", "10.0.0.1:80", cluster::v1::INSTANCE_STATUS_RUNNING},
                                   {"b", "10.0.0.2:80", cluster::v1::INSTANCE_STATUS_RUNNING}})),
      IsOk());
  ReportDeploymentStatusRequest removed;
  removed.set_region("eu-1");
  removed.set_deployment_id("dep");
  removed.set_deleted(true);
  auto st = ingestor_->reportDeploymentStatus("eu-1", removed);
  REQUIRE_THAT(st, IsOk());
  CHECK(instanceIds("dep").empty());
  std::lock_guard lock(hooks_->mutex);
  CHECK(hooks_->reported.back() == std::make_tuple("dep", "eu-1", 0u, 0u, 0u));
}

// What `kranectl status` reads: each deployment report leaves the phase, the applied version
// and the counts (running instances on the applied spec among them); a delete report clears it.
TEST_CASE_METHOD(IngestorTest, "deployment reports keep a phase and the applied version",
                 "[ingestor]") {
  using cluster::v1::INSTANCE_STATUS_PENDING;
  using cluster::v1::INSTANCE_STATUS_RUNNING;
  const auto status = [&] {
    return query(
        "SELECT applied_version, phase, message FROM resource_status WHERE region_id = 'eu-1'"
        " AND resource_type = 'deployment_topology' AND resource_id = 'dep'");
  };
  auto rolling =
      deploymentReport("dep", {{"a", "10.0.0.1:80", cluster::v1::INSTANCE_STATUS_RUNNING},
                               {"b", "10.0.0.2:80", INSTANCE_STATUS_PENDING}});
  rolling.set_applied_version(7);
  rolling.mutable_instances()->mutable_instances(0)->set_current(false);
  rolling.mutable_instances()->mutable_instances(1)->set_current(true);
  REQUIRE_THAT(ingestor_->reportDeploymentStatus("eu-1", rolling), IsOk());
  auto row = status();
  REQUIRE(row.rows.size() == 1u);
  CHECK(row.rows[0].u64(0) == 7u);
  CHECK(row.rows[0].str(1) == "progressing");
  CHECK(row.rows[0].str(2) == "1 running, 1 pending, 0 failed, 0 on the applied spec");

  auto done = deploymentReport("dep", {{"b", "10.0.0.2:80", cluster::v1::INSTANCE_STATUS_RUNNING}});
  done.set_applied_version(7);
  done.mutable_instances()->mutable_instances(0)->set_current(true);
  REQUIRE_THAT(ingestor_->reportDeploymentStatus("eu-1", done), IsOk());
  row = status();
  CHECK(row.rows[0].str(1) == "ready");
  CHECK(row.rows[0].str(2) == "1 running, 0 pending, 0 failed, 1 on the applied spec");

  auto crashing = deploymentReport(
      "dep", {{"b", "10.0.0.2:80", cluster::v1::INSTANCE_STATUS_FAILED, "exited with code 3"}});
  crashing.set_applied_version(8);
  REQUIRE_THAT(ingestor_->reportDeploymentStatus("eu-1", crashing), IsOk());
  row = status();
  CHECK(row.rows[0].u64(0) == 8u);
  CHECK(row.rows[0].str(1) == "degraded");

  ReportDeploymentStatusRequest removed;
  removed.set_region("eu-1");
  removed.set_deployment_id("dep");
  removed.set_deleted(true);
  removed.set_applied_version(7);  // older than what is stored: a late one, it purges nothing
  REQUIRE_THAT(ingestor_->reportDeploymentStatus("eu-1", removed), IsOk());
  CHECK_FALSE(status().rows.empty());
  removed.set_applied_version(9);
  REQUIRE_THAT(ingestor_->reportDeploymentStatus("eu-1", removed), IsOk());
  CHECK(status().rows.empty());
}

TEST_CASE_METHOD(IngestorTest, "an empty instance set also removes everything", "[ingestor]") {
  using cluster::v1::INSTANCE_STATUS_RUNNING;
  REQUIRE_THAT(
      ingestor_->reportDeploymentStatus(
          "eu-1",
          deploymentReport("dep", {{"a", "10.0.0.1:80", cluster::v1::INSTANCE_STATUS_RUNNING}})),
      IsOk());
  REQUIRE_THAT(ingestor_->reportDeploymentStatus("eu-1", deploymentReport("dep", {})), IsOk());
  CHECK(instanceIds("dep").empty());
}

TEST_CASE_METHOD(IngestorTest, "large reports are stored and replaced", "[ingestor]") {
  std::vector<InstanceSpec> many;
  for (int i = 0; i < 1000; ++i) {
    many.push_back({strCat("pod-", i), strCat("10.0.", i / 250, ".", i % 250 + 1, ":8080"),
                    cluster::v1::INSTANCE_STATUS_RUNNING, ""});
  }
  auto st = ingestor_->reportDeploymentStatus("eu-1", deploymentReport("dep", many));
  REQUIRE_THAT(st, IsOk());
  CHECK(instances("dep").size() == 1000u);

  many.resize(537);
  many.push_back({"new-pod", "10.9.9.9:1", cluster::v1::INSTANCE_STATUS_PENDING, ""});
  st = ingestor_->reportDeploymentStatus("eu-1", deploymentReport("dep", many));
  REQUIRE_THAT(st, IsOk());
  const auto stored = instances("dep");
  CHECK(stored.size() == 538u);
  CHECK(stored.count("pod-536"));
  CHECK_FALSE(stored.count("pod-537"));
  CHECK(stored.at("new-pod").status == "pending");

  many.resize(1001, InstanceSpec{"", "10.0.0.1:1", cluster::v1::INSTANCE_STATUS_RUNNING, ""});
  st = ingestor_->reportDeploymentStatus("eu-1", deploymentReport("dep", many));
  CHECK(st.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(messageOf(st), Catch::Contains("instances: at most 1000"));
}

TEST_CASE_METHOD(IngestorTest, "duplicate instance ids are refused and nothing is written",
                 "[ingestor]") {
  using cluster::v1::INSTANCE_STATUS_PENDING;
  using cluster::v1::INSTANCE_STATUS_RUNNING;
  REQUIRE_THAT(
      ingestor_->reportDeploymentStatus(
          "eu-1",
          deploymentReport("dep", {{"a", "10.0.0.1:80", cluster::v1::INSTANCE_STATUS_RUNNING}})),
      IsOk());
  auto st = ingestor_->reportDeploymentStatus(
      "eu-1", deploymentReport("dep", {{"b", "10.0.0.2:80", cluster::v1::INSTANCE_STATUS_RUNNING},
                                       {"c", "10.0.0.3:80", cluster::v1::INSTANCE_STATUS_RUNNING},
                                       {"b", "10.0.0.4:80", INSTANCE_STATUS_PENDING}}));
  CHECK(st.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(messageOf(st),
             Catch::Contains("instances[2].id: \"b\" is listed twice (also instances[0])"));
  CHECK(instanceIds("dep") == std::vector<std::string>{"a"});
  CHECK(ingestor_->counters().rejected.load() == 1u);
  std::lock_guard lock(hooks_->mutex);
  CHECK(hooks_->reported.size() == 1u);
}

TEST_CASE_METHOD(IngestorTest, "report for another region is denied", "[ingestor]") {
  using cluster::v1::INSTANCE_STATUS_RUNNING;
  auto st = ingestor_->reportDeploymentStatus(
      "eu-1", deploymentReport("dep", {{"a", "10.0.0.1:80", cluster::v1::INSTANCE_STATUS_RUNNING}},
                               "us-1"));
  CHECK(st.code() == absl::StatusCode::kPermissionDenied);
  CHECK_THAT(messageOf(st), Catch::Contains("token for region eu-1 cannot report for region us-1"));
  CHECK(instanceIds("dep", "us-1").empty());
  CHECK(instanceIds("dep", "eu-1").empty());
  CHECK(ingestor_->counters().rejected.load() == 1u);

  addSentinel("sen", "us-1", "sentinel:1", 1);
  auto sentinel = sentinelReport("sen", "sentinel:1", cluster::v1::SENTINEL_HEALTH_HEALTHY, 1);
  sentinel.set_region("us-1");
  CHECK(ingestor_->reportSentinelStatus("eu-1", sentinel).code() ==
        absl::StatusCode::kPermissionDenied);
  CHECK(deployStatus("sen") == "progressing");

  HeartbeatRequest beat;
  beat.set_agent_id("agent-1");
  beat.set_region("us-1");
  CHECK(ingestor_->heartbeat("eu-1", beat).status().code() == absl::StatusCode::kPermissionDenied);
  CHECK(query("SELECT 1 FROM agents").empty());
}

TEST_CASE_METHOD(IngestorTest, "a report without a region is refused naming region", "[ingestor]") {
  using cluster::v1::INSTANCE_STATUS_RUNNING;
  auto st = ingestor_->reportDeploymentStatus(
      "eu-1",
      deploymentReport("dep", {{"a", "10.0.0.1:80", cluster::v1::INSTANCE_STATUS_RUNNING}}, ""));
  CHECK(st.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(messageOf(st), Catch::StartsWith("region: required"));
  CHECK(instanceIds("dep", "eu-1").empty());
  HeartbeatRequest beat;
  beat.set_agent_id("agent-1");
  CHECK(ingestor_->heartbeat("eu-1", beat).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(query("SELECT 1 FROM agents").empty());
}

TEST_CASE_METHOD(IngestorTest, "invalid instances are refused naming the field", "[ingestor]") {
  using cluster::v1::INSTANCE_STATUS_RUNNING;
  const auto refuse = [&](const ReportDeploymentStatusRequest& r, const std::string& message) {
    auto st = ingestor_->reportDeploymentStatus("eu-1", r);
    INFO(st);
    CHECK(st.code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(messageOf(st), Catch::Contains(message));
  };
  refuse(deploymentReport("", {}), "deployment_id: required");
  refuse(deploymentReport("dep", {{"a", "10.0.0.1:80", cluster::v1::INSTANCE_STATUS_RUNNING},
                                  {"b", "x", cluster::v1::INSTANCE_STATUS_RUNNING}}),
         "instances[1].address: \"x\" is not host:port");
  for (const char* bad : {"10.0.0.1", "10.0.0.1:0", "10.0.0.1:65536", ":80", "a b:80", "::1:80",
                          "[::1]", "host:http"}) {
    refuse(deploymentReport("dep", {{"a", bad, cluster::v1::INSTANCE_STATUS_RUNNING}}),
           strCat("instances[0].address: \"", bad, "\" is not host:port"));
  }
  refuse(deploymentReport("dep", {{"a", "", cluster::v1::INSTANCE_STATUS_RUNNING}}),
         "instances[0].address: required for a running instance");

  auto unknown_status =
      deploymentReport("dep", {{"a", "10.0.0.1:80", cluster::v1::INSTANCE_STATUS_RUNNING},
                               {"b", "10.0.0.2:80", cluster::v1::INSTANCE_STATUS_RUNNING}});
  unknown_status.mutable_instances()->mutable_instances(1)->set_status(
      static_cast<cluster::v1::InstanceStatus>(7));
  refuse(unknown_status, "instances[1].status: unknown value 7");
  refuse(deploymentReport("dep", {{"a", "10.0.0.1:80", cluster::v1::INSTANCE_STATUS_UNSPECIFIED}}),
         "instances[0].status: required");
  refuse(deploymentReport("dep", {{"", "10.0.0.1:80", cluster::v1::INSTANCE_STATUS_RUNNING}}),
         "instances[0].id: required");
  refuse(deploymentReport("dep", {{"a b", "10.0.0.1:80", cluster::v1::INSTANCE_STATUS_RUNNING}}),
         "instances[0].id: must be printable ASCII without spaces");
  refuse(deploymentReport("dep", {{"a", "10.0.0.1:80", cluster::v1::INSTANCE_STATUS_FAILED,
                                   std::string(4097, 'x')}}),
         "instances[0].failure_reason: at most 4096 bytes");

  ReportDeploymentStatusRequest no_state;
  no_state.set_region("eu-1");
  no_state.set_deployment_id("dep");
  refuse(no_state, "state: required");

  CHECK(query("SELECT 1 FROM instances").empty());

  // Addresses that are fine.
  for (const char* good : {"10.0.0.1:80", "[fd00::1]:8080", "pod.ns.svc.cluster.local:65535"}) {
    auto st = ingestor_->reportDeploymentStatus(
        "eu-1", deploymentReport("dep", {{"a", good, cluster::v1::INSTANCE_STATUS_RUNNING}}));
    INFO(good << ": " << st);
    CHECK_THAT(st, IsOk());
  }
}

// ---------------------------------------------------------------------------------------------
// Sentinel status

TEST_CASE_METHOD(IngestorTest, "sentinel becomes ready only when image health and replicas match",
                 "[ingestor]") {
  using cluster::v1::SENTINEL_HEALTH_HEALTHY;
  addSentinel("sen", "eu-1", "sentinel:2", 3);

  // Still on the old image.
  auto st = ingestor_->reportSentinelStatus(
      "eu-1", sentinelReport("sen", "sentinel:1", SENTINEL_HEALTH_HEALTHY, 3));
  REQUIRE_THAT(st, IsOk());
  CHECK(deployStatus("sen") == "progressing");
  auto row = query(
                 "SELECT available_replicas, updated_replicas, ready_replicas, observed_generation,"
                 " running_image, health, status_reported_at FROM sentinels WHERE id = 'sen'")
                 .rows.at(0);
  CHECK(row.u64("available_replicas") == 3u);
  CHECK(row.u64("updated_replicas") == 3u);
  CHECK(row.u64("ready_replicas") == 3u);
  CHECK(row.i64("observed_generation") == 4);
  CHECK(row.str("running_image") == "sentinel:1");
  CHECK(row.str("health") == "healthy");
  CHECK_FALSE(row.isNull("status_reported_at"));

  // New image, but unhealthy, or paused, or not enough replicas yet.
  REQUIRE_THAT(
      ingestor_->reportSentinelStatus(
          "eu-1", sentinelReport("sen", "sentinel:2", cluster::v1::SENTINEL_HEALTH_UNHEALTHY, 3)),
      IsOk());
  CHECK(query("SELECT health FROM sentinels").rows.at(0).str(0) == "unhealthy");
  REQUIRE_THAT(
      ingestor_->reportSentinelStatus(
          "eu-1", sentinelReport("sen", "sentinel:2", cluster::v1::SENTINEL_HEALTH_PAUSED, 3)),
      IsOk());
  REQUIRE_THAT(ingestor_->reportSentinelStatus(
                   "eu-1", sentinelReport("sen", "sentinel:2", SENTINEL_HEALTH_HEALTHY, 2)),
               IsOk());
  CHECK(deployStatus("sen") == "progressing");
  {
    std::lock_guard lock(hooks_->mutex);
    CHECK(hooks_->ready.empty());
  }

  // Converged.
  REQUIRE_THAT(ingestor_->reportSentinelStatus(
                   "eu-1", sentinelReport("sen", "sentinel:2", SENTINEL_HEALTH_HEALTHY, 3)),
               IsOk());
  CHECK(deployStatus("sen") == "ready");
  // Later reports keep updating the observed columns but notify no more.
  REQUIRE_THAT(ingestor_->reportSentinelStatus(
                   "eu-1", sentinelReport("sen", "sentinel:2", SENTINEL_HEALTH_HEALTHY, 4)),
               IsOk());
  CHECK(query("SELECT available_replicas FROM sentinels").rows.at(0).u64(0) == 4u);
  std::lock_guard lock(hooks_->mutex);
  CHECK(hooks_->ready == std::vector<std::pair<std::string, std::string>>{{"sen", "eu-1"}});
  CHECK(ingestor_->counters().sentinel_reports.load() == 6u);
}

// A report about an earlier change of the same image (the agent has not applied the latest
// config yet) is not convergence.
TEST_CASE_METHOD(IngestorTest, "sentinel is ready only once the agent applied its latest change",
                 "[ingestor]") {
  using cluster::v1::SENTINEL_HEALTH_HEALTHY;
  addSentinel("sen", "eu-1", "sentinel:2", 1);
  exec("UPDATE sentinels SET version = 7 WHERE id = 'sen'");
  auto report = sentinelReport("sen", "sentinel:2", SENTINEL_HEALTH_HEALTHY, 1);
  report.set_applied_version(6);
  REQUIRE_THAT(ingestor_->reportSentinelStatus("eu-1", report), IsOk());
  CHECK(deployStatus("sen") == "progressing");
  report.set_applied_version(7);
  report.set_observed_at_ms(report.observed_at_ms() + 1);
  REQUIRE_THAT(ingestor_->reportSentinelStatus("eu-1", report), IsOk());
  CHECK(deployStatus("sen") == "ready");
  std::lock_guard lock(hooks_->mutex);
  CHECK(hooks_->ready == std::vector<std::pair<std::string, std::string>>{{"sen", "eu-1"}});
}

TEST_CASE_METHOD(IngestorTest, "sentinel not in progress or without replicas is not flipped",
                 "[ingestor]") {
  using cluster::v1::SENTINEL_HEALTH_HEALTHY;
  addSentinel("idle", "eu-1", "sentinel:2", 1, "idle");
  addSentinel("failed", "eu-1", "sentinel:2", 1, "failed");
  addSentinel("zero", "eu-1", "sentinel:2", 0);
  for (const char* id : {"idle", "failed", "zero"}) {
    auto st = ingestor_->reportSentinelStatus(
        "eu-1", sentinelReport(id, "sentinel:2", SENTINEL_HEALTH_HEALTHY, 1));
    REQUIRE_THAT(st, IsOk());
  }
  CHECK(deployStatus("idle") == "idle");
  CHECK(deployStatus("failed") == "failed");
  CHECK(deployStatus("zero") == "progressing");
  std::lock_guard lock(hooks_->mutex);
  CHECK(hooks_->ready.empty());
}

TEST_CASE_METHOD(IngestorTest, "concurrent ready reports notify once", "[ingestor]") {
  addSentinel("sen", "eu-1", "sentinel:2", 2);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&] {
      auto st = ingestor_->reportSentinelStatus(
          "eu-1", sentinelReport("sen", "sentinel:2", cluster::v1::SENTINEL_HEALTH_HEALTHY, 2));
      if (!st.ok()) ++failures;
    });
  }
  for (auto& t : threads) t.join();
  CHECK(failures.load() == 0);
  CHECK(deployStatus("sen") == "ready");
  std::lock_guard lock(hooks_->mutex);
  CHECK(hooks_->ready.size() == 1u);
}

// One rule for every report RPC: a report about a resource the control plane does not hold
// (never written, deleted, or of another region) is accepted and dropped; nothing is stored.
TEST_CASE_METHOD(IngestorTest, "reports about resources not held are dropped by every rpc",
                 "[ingestor]") {
  addSentinel("elsewhere", "us-1", "sentinel:2", 1);
  CHECK_THAT(
      ingestor_->reportSentinelStatus(
          "eu-1", sentinelReport("missing", "sentinel:2", cluster::v1::SENTINEL_HEALTH_HEALTHY, 1)),
      IsOk());
  // A sentinel of another region is not reachable with this region's token.
  CHECK_THAT(ingestor_->reportSentinelStatus(
                 "eu-1", sentinelReport("elsewhere", "sentinel:2",
                                        cluster::v1::SENTINEL_HEALTH_HEALTHY, 1)),
             IsOk());
  CHECK(deployStatus("elsewhere") == "progressing");
  CHECK(query("SELECT 1 FROM sentinels WHERE status_reported_at IS NOT NULL").empty());
  CHECK_THAT(
      ingestor_->reportDeploymentStatus(
          "eu-1",
          deploymentReport("never", {{"a", "10.0.0.1:80", cluster::v1::INSTANCE_STATUS_RUNNING}})),
      IsOk());
  ReportResourceStatusRequest r;
  r.set_region("eu-1");
  r.set_type("example.krane.dev/bucket");
  r.set_id("never");
  r.set_version(3);
  r.set_phase(cluster::v1::RESOURCE_PHASE_READY);
  CHECK_THAT(ingestor_->reportResourceStatus("eu-1", r), IsOk());
  CHECK(query("SELECT 1 FROM instances").empty());
  CHECK(query("SELECT 1 FROM resource_status").empty());
  CHECK(ingestor_->counters().dropped.load() == 4u);
  CHECK(ingestor_->counters().rejected.load() == 0u);
  CHECK(ingestor_->counters().errors.load() == 0u);
  CHECK(hooks_->reported.empty());
}

// Deleting a resource purges what agents reported about it, in the delete's transaction; a late
// report about it is then dropped, and one saying it is gone purges whatever is left.
TEST_CASE_METHOD(IngestorTest,
                 "a deleted resource's status goes with it and late reports are dropped",
                 "[ingestor]") {
  REQUIRE_THAT(
      ingestor_->reportDeploymentStatus(
          "eu-1",
          deploymentReport("dep", {{"a", "10.0.0.1:80", cluster::v1::INSTANCE_STATUS_RUNNING}})),
      IsOk());
  ReportResourceStatusRequest r;
  r.set_region("eu-1");
  r.set_type("example.krane.dev/bucket");
  r.set_id("photos");
  r.set_version(3);
  r.set_phase(cluster::v1::RESOURCE_PHASE_READY);
  REQUIRE_THAT(ingestor_->reportResourceStatus("eu-1", r), IsOk());
  auto in_us = r;
  in_us.set_region("us-1");
  in_us.set_id("photos-us");
  REQUIRE_THAT(ingestor_->reportResourceStatus("us-1", in_us), IsOk());
  REQUIRE(query("SELECT 1 FROM instances WHERE deployment_id = 'dep'").rows.size() == 1u);
  REQUIRE(query("SELECT 1 FROM resource_status WHERE region_id = 'eu-1'").rows.size() == 2u);

  for (const char* type : {"deployment_topology", "example.krane.dev/bucket"}) {
    REQUIRE_THAT(writer_->remove(feed::ResourceKey{
                     type, type == std::string("deployment_topology") ? "dep" : "photos", "eu-1"}),
                 IsOk());
  }
  CHECK(
      query("SELECT 1 FROM instances WHERE deployment_id = 'dep' AND region_id = 'eu-1'").empty());
  CHECK(query("SELECT 1 FROM resource_status WHERE region_id = 'eu-1'").empty());
  INFO("the same resource in another region keeps its status");
  CHECK(query("SELECT 1 FROM resource_status WHERE region_id = 'us-1'").rows.size() == 1u);
  // A late report of the deleted deployment (sent before the agent applied the delete).
  REQUIRE_THAT(
      ingestor_->reportDeploymentStatus(
          "eu-1",
          deploymentReport("dep", {{"a", "10.0.0.1:80", cluster::v1::INSTANCE_STATUS_RUNNING}})),
      IsOk());
  REQUIRE_THAT(ingestor_->reportResourceStatus("eu-1", r), IsOk());
  CHECK(query("SELECT 1 FROM instances").empty());
  CHECK(query("SELECT 1 FROM resource_status WHERE region_id = 'eu-1'").empty());
}

// A retried report, or one from a replaced leader, arrives after a newer one: it must not
// overwrite it. Ordered by (applied version, observation time); sentinels by (observed
// generation, observation time). The reporting agent is stored.
TEST_CASE_METHOD(IngestorTest, "an older report does not overwrite a newer one", "[ingestor]") {
  auto newer =
      deploymentReport("dep", {{"b", "10.0.0.2:80", cluster::v1::INSTANCE_STATUS_RUNNING}});
  newer.set_applied_version(7);
  newer.set_observed_at_ms(2000);
  newer.set_agent_id("agent-2");
  REQUIRE_THAT(ingestor_->reportDeploymentStatus("eu-1", newer), IsOk());
  auto older_version =
      deploymentReport("dep", {{"a", "10.0.0.1:80", cluster::v1::INSTANCE_STATUS_RUNNING}});
  older_version.set_applied_version(6);
  older_version.set_observed_at_ms(9000);  // a later clock does not make an older version newer
  older_version.set_agent_id("agent-1");
  REQUIRE_THAT(ingestor_->reportDeploymentStatus("eu-1", older_version), IsOk());
  auto older_time = newer;
  older_time.mutable_instances()->mutable_instances(0)->set_id("c");
  older_time.set_observed_at_ms(1500);
  REQUIRE_THAT(ingestor_->reportDeploymentStatus("eu-1", older_time), IsOk());
  CHECK(instanceIds("dep") == std::vector<std::string>{"b"});
  auto stored = query(
      "SELECT applied_version, agent_id FROM resource_status WHERE"
      " resource_id = 'dep' AND region_id = 'eu-1'");
  REQUIRE(stored.rows.size() == 1u);
  CHECK(stored.rows[0].u64(0) == 7u);
  CHECK(stored.rows[0].str(1) == "agent-2");
  CHECK(ingestor_->counters().dropped.load() == 2u);

  addSentinel("sen", "eu-1", "sentinel:1", 1);
  auto gen5 = sentinelReport("sen", "sentinel:1", cluster::v1::SENTINEL_HEALTH_HEALTHY, 1);
  gen5.set_observed_generation(5);
  gen5.set_agent_id("agent-2");
  REQUIRE_THAT(ingestor_->reportSentinelStatus("eu-1", gen5), IsOk());
  auto gen4 = sentinelReport("sen", "sentinel:0", cluster::v1::SENTINEL_HEALTH_UNHEALTHY, 0);
  gen4.set_observed_generation(4);
  REQUIRE_THAT(ingestor_->reportSentinelStatus("eu-1", gen4), IsOk());
  auto row = query(
      "SELECT observed_generation, running_image, status_agent_id FROM sentinels"
      " WHERE id = 'sen'");
  CHECK(row.rows[0].i64(0) == 5);
  CHECK(row.rows[0].str(1) == "sentinel:1");
  CHECK(row.rows[0].str(2) == "agent-2");

  ReportResourceStatusRequest r;
  r.set_region("eu-1");
  r.set_type("example.krane.dev/bucket");
  r.set_id("photos");
  r.set_version(9);
  r.set_phase(cluster::v1::RESOURCE_PHASE_READY);
  REQUIRE_THAT(ingestor_->reportResourceStatus("eu-1", r), IsOk());
  r.set_version(8);
  r.set_phase(cluster::v1::RESOURCE_PHASE_FAILED);
  REQUIRE_THAT(ingestor_->reportResourceStatus("eu-1", r), IsOk());
  CHECK(query("SELECT phase FROM resource_status WHERE resource_id = 'photos'").rows[0].str(0) ==
        "ready");
}

// The agent parks a change it cannot apply and reports it FAILED; the resource goes on running
// the version applied before. Reports of that version must still be stored, or the control plane
// would keep its old instance set (addresses, a crash) until a newer version applies.
TEST_CASE_METHOD(IngestorTest, "a parked apply failure does not hide the version that still runs",
                 "[ingestor]") {
  auto v6 = deploymentReport("dep", {{"a", "10.0.0.1:80", cluster::v1::INSTANCE_STATUS_RUNNING},
                                     {"b", "10.0.0.2:80", cluster::v1::INSTANCE_STATUS_RUNNING}});
  v6.set_applied_version(6);
  v6.set_observed_at_ms(1000);
  REQUIRE_THAT(ingestor_->reportDeploymentStatus("eu-1", v6), IsOk());

  ReportResourceStatusRequest parked;
  parked.set_region("eu-1");
  parked.set_type("deployment_topology");
  parked.set_id("dep");
  parked.set_version(7);
  parked.set_phase(cluster::v1::RESOURCE_PHASE_FAILED);
  parked.set_observed_at_ms(2000);
  parked.mutable_apply_error()->set_code(3);
  parked.mutable_apply_error()->set_message("spec.template: invalid");
  parked.mutable_apply_error()->set_attempts(3);
  REQUIRE_THAT(ingestor_->reportResourceStatus("eu-1", parked), IsOk());

  // Version 6 still runs: one of its instances crashed, another comes up.
  auto later = deploymentReport(
      "dep", {{"a", "10.0.0.1:80", cluster::v1::INSTANCE_STATUS_RUNNING},
              {"b", "10.0.0.2:80", cluster::v1::INSTANCE_STATUS_FAILED, "OOMKilled"},
              {"c", "10.0.0.3:80", cluster::v1::INSTANCE_STATUS_PENDING}});
  later.set_applied_version(6);
  later.set_observed_at_ms(3000);
  REQUIRE_THAT(ingestor_->reportDeploymentStatus("eu-1", later), IsOk());
  CHECK(ingestor_->counters().dropped.load() == 0u);
  const auto now = instances("dep");
  REQUIRE(now.size() == 3u);
  CHECK(now.at("b").status == "failed");
  CHECK(now.at("b").failure_reason == "OOMKilled");
  CHECK(now.at("c").status == "pending");
  {
    std::lock_guard lock(hooks_->mutex);
    REQUIRE(hooks_->reported.size() == 2u);
    CHECK(hooks_->reported.back() ==
          std::make_tuple(std::string("dep"), std::string("eu-1"), 1u, 1u, 1u));
  }
  INFO("the failure stays shown, with the version that runs");
  auto row = query(
      "SELECT applied_version, failed_version, phase, apply_error, message FROM resource_status"
      " WHERE resource_id = 'dep' AND region_id = 'eu-1'");
  REQUIRE(row.rows.size() == 1u);
  CHECK(row.rows[0].u64(0) == 6u);
  CHECK(row.rows[0].u64(1) == 7u);
  CHECK(row.rows[0].str(2) == "failed");
  CHECK_THAT(row.rows[0].str(3), Catch::Contains("spec.template: invalid"));
  CHECK(row.rows[0].str(4) == "1 running, 1 pending, 1 failed, 1 on the applied spec");

  INFO("an older observation is still dropped, and so is an older failure");
  auto stale = v6;
  stale.set_observed_at_ms(500);
  REQUIRE_THAT(ingestor_->reportDeploymentStatus("eu-1", stale), IsOk());
  parked.set_version(5);
  REQUIRE_THAT(ingestor_->reportResourceStatus("eu-1", parked), IsOk());
  CHECK(ingestor_->counters().dropped.load() == 2u);
  CHECK(instances("dep").size() == 3u);

  INFO("version 7 applied at last ends the failure");
  auto v7 = deploymentReport("dep", {{"d", "10.0.0.4:80", cluster::v1::INSTANCE_STATUS_RUNNING}});
  v7.set_applied_version(7);
  v7.set_observed_at_ms(4000);
  REQUIRE_THAT(ingestor_->reportDeploymentStatus("eu-1", v7), IsOk());
  row = query(
      "SELECT applied_version, failed_version, phase, apply_error FROM resource_status"
      " WHERE resource_id = 'dep' AND region_id = 'eu-1'");
  CHECK(row.rows[0].u64(0) == 7u);
  CHECK(row.rows[0].u64(1) == 0u);
  CHECK(row.rows[0].str(2) == "ready");
  CHECK(row.rows[0].isNull(3));
}

TEST_CASE_METHOD(IngestorTest, "invalid sentinel reports are refused", "[ingestor]") {
  addSentinel("sen", "eu-1", "sentinel:2", 1);
  auto r = sentinelReport("sen", "sentinel:2", cluster::v1::SENTINEL_HEALTH_HEALTHY, 1);
  r.set_available_replicas(1'000'000);
  auto st = ingestor_->reportSentinelStatus("eu-1", r);
  CHECK(st.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(messageOf(st), Catch::Contains("available_replicas: must be at most"));

  r = sentinelReport("sen", "sentinel:2", static_cast<cluster::v1::SentinelHealth>(9), 1);
  st = ingestor_->reportSentinelStatus("eu-1", r);
  CHECK_THAT(messageOf(st), Catch::Contains("health: unknown value 9"));

  r = sentinelReport("", "sentinel:2", cluster::v1::SENTINEL_HEALTH_HEALTHY, 1);
  CHECK_THAT(messageOf(ingestor_->reportSentinelStatus("eu-1", r)),
             Catch::Contains("sentinel_id: required"));
  CHECK(deployStatus("sen") == "progressing");
  CHECK(query("SELECT 1 FROM sentinels WHERE status_reported_at IS NOT NULL").empty());
}

// ---------------------------------------------------------------------------------------------
// Resource status

TEST_CASE_METHOD(IngestorTest, "resource status is upserted", "[ingestor]") {
  ReportResourceStatusRequest r;
  r.set_region("eu-1");
  r.set_type("example.krane.dev/bucket");
  r.set_id("photos");
  r.set_version(3);
  r.set_phase(cluster::v1::RESOURCE_PHASE_PROGRESSING);
  r.set_message("creating");
  r.set_detail(std::string("\x00\x01\x02", 3));
  auto st = ingestor_->reportResourceStatus("eu-1", r);
  REQUIRE_THAT(st, IsOk());
  auto rows = query("SELECT * FROM resource_status");
  REQUIRE(rows.rows.size() == 1u);
  CHECK(rows.rows[0].str("region_id") == "eu-1");
  CHECK(rows.rows[0].str("resource_type") == "example.krane.dev/bucket");
  CHECK(rows.rows[0].str("resource_id") == "photos");
  CHECK(rows.rows[0].u64("applied_version") == 3u);
  CHECK(rows.rows[0].str("phase") == "progressing");
  CHECK(rows.rows[0].str("message") == "creating");
  CHECK(rows.rows[0].str("detail") == std::string("\x00\x01\x02", 3));
  CHECK(rows.rows[0].isNull("apply_error"));
  CHECK(rows.rows[0].u64("apply_attempts") == 0u);
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
  REQUIRE_THAT(st, IsOk());
  rows = query("SELECT * FROM resource_status");
  REQUIRE(rows.rows.size() == 1u);
  INFO("a failed apply of version 4 leaves 3 applied");
  CHECK(rows.rows[0].u64("applied_version") == 3u);
  CHECK(rows.rows[0].u64("failed_version") == 4u);
  CHECK(rows.rows[0].str("phase") == "failed");
  CHECK(rows.rows[0].isNull("message"));
  CHECK(rows.rows[0].isNull("detail"));
  CHECK_THAT(rows.rows[0].str("apply_error"), Catch::Contains("bucket name taken"));
  CHECK(rows.rows[0].u64("apply_attempts") == 2u);
  CHECK(rows.rows[0].i64("updated_at") >= first_update);

  // Another region's resource is a row of its own.
  r.set_region("us-1");
  r.set_id("photos-us");
  st = ingestor_->reportResourceStatus("us-1", r);
  REQUIRE_THAT(st, IsOk());
  CHECK(query("SELECT 1 FROM resource_status").rows.size() == 2u);
  CHECK(ingestor_->counters().resource_reports.load() == 3u);
}

TEST_CASE_METHOD(IngestorTest, "invalid resource status is refused", "[ingestor]") {
  ReportResourceStatusRequest r;
  r.set_region("eu-1");
  r.set_type("example.krane.dev/bucket");
  r.set_id("photos");
  const auto refuse = [&](const std::string& message) {
    auto st = ingestor_->reportResourceStatus("eu-1", r);
    INFO(st);
    CHECK(st.code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(messageOf(st), Catch::Contains(message));
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
  CHECK(ingestor_->reportResourceStatus("eu-1", r).code() == absl::StatusCode::kPermissionDenied);
  CHECK(query("SELECT 1 FROM resource_status").empty());
  CHECK(ingestor_->counters().rejected.load() == 6u);
}

// ---------------------------------------------------------------------------------------------
// Heartbeats and agents

TEST_CASE_METHOD(IngestorTest, "heartbeat upserts the agent and list shows the lag", "[ingestor]") {
  // Counts the region's changes from none (the fixture's resources made some).
  exec("DELETE FROM resource_changes");
  exec("DELETE FROM region_versions");
  exec(
      "INSERT INTO region_versions (region_id, version) VALUES ('eu-1', 42)"
      " ON DUPLICATE KEY UPDATE version = 42");

  HeartbeatRequest beat;
  beat.set_region("eu-1");
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
  REQUIRE_THAT(answer, IsOk());
  CHECK(answer->latest_version() == 42u);
  CHECK(answer->oldest_version() == 0u);
  CHECK(answer->server_time_unix_ms() > 0);

  auto agents = ingestor_->listAgents("");
  REQUIRE_THAT(agents, IsOk());
  REQUIRE(agents->size() == 1u);
  const AgentInfo first = agents->front();
  CHECK(first.agent_id == "agent-a");
  CHECK(first.region == "eu-1");
  CHECK(first.build_version == "0.3.1+abc1234");
  CHECK(first.applied_version == 30u);
  CHECK(first.latest_version == 42u);
  CHECK(first.lag == 12u);
  CHECK(first.is_leader);
  REQUIRE(first.plugins.size() == 1u);
  CHECK(first.plugins[0].name() == "kubernetes");
  CHECK(first.plugins[0].version() == "1.2.0");
  CHECK(first.plugins[0].abi_major() == 1u);
  CHECK(first.plugins[0].abi_minor() == 3u);
  const auto& types = first.plugins[0].resource_types();
  CHECK(std::vector<std::string>(types.begin(), types.end()) ==
        std::vector<std::string>{"deployment_topology", "sentinel"});
  CHECK(first.first_seen_ms == first.last_seen_ms);

  // The same agent again: one row, first seen kept.
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  beat.set_applied_version(42);
  beat.set_is_leader(false);
  beat.clear_plugins();
  beat.set_region("eu-1");
  REQUIRE_THAT(ingestor_->heartbeat("eu-1", beat), IsOk());
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  // Another agent in a region without a version row; and one that is ahead of its region.
  HeartbeatRequest other;
  other.set_region("us-1");
  other.set_agent_id("agent-b");
  other.set_applied_version(5);
  REQUIRE_THAT(ingestor_->heartbeat("us-1", other), IsOk());

  agents = ingestor_->listAgents("eu-1");
  REQUIRE_THAT(agents, IsOk());
  REQUIRE(agents->size() == 1u);
  CHECK(agents->front().applied_version == 42u);
  CHECK(agents->front().lag == 0u);
  CHECK_FALSE(agents->front().is_leader);
  CHECK(agents->front().plugins.empty());
  CHECK(agents->front().first_seen_ms == first.first_seen_ms);
  CHECK(agents->front().last_seen_ms > first.last_seen_ms);

  agents = ingestor_->listAgents("");
  REQUIRE_THAT(agents, IsOk());
  REQUIRE(agents->size() == 2u);
  CHECK(agents->at(0).agent_id == "agent-b");  // newest first
  CHECK(agents->at(0).latest_version == 0u);
  CHECK(agents->at(0).lag == 0u);
  CHECK(agents->at(1).agent_id == "agent-a");
  CHECK(ingestor_->counters().heartbeats.load() == 3u);

  exec("UPDATE region_versions SET version = 50 WHERE region_id = 'eu-1'");
  agents = ingestor_->listAgents("eu-1");
  REQUIRE_THAT(agents, IsOk());
  CHECK(agents->front().lag == 8u);
}

TEST_CASE_METHOD(IngestorTest, "heartbeat reports the oldest change still held", "[ingestor]") {
  // Counts the region's changes from none (the fixture's resources made some).
  exec("DELETE FROM resource_changes");
  exec("DELETE FROM region_versions");
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
  beat.set_region("eu-1");
  beat.set_agent_id("agent-a");
  auto answer = ingestor_->heartbeat("eu-1", beat);
  REQUIRE_THAT(answer, IsOk());
  CHECK(answer->latest_version() == 9u);
  CHECK(answer->oldest_version() == 7u);
}

TEST_CASE_METHOD(IngestorTest, "invalid heartbeats are refused", "[ingestor]") {
  HeartbeatRequest beat;
  beat.set_region("eu-1");
  auto answer = ingestor_->heartbeat("eu-1", beat);
  CHECK(answer.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(messageOf(answer.status()), Catch::Contains("agent_id: required"));
  beat.set_agent_id("agent-a");
  beat.add_plugins()->set_version("1");
  answer = ingestor_->heartbeat("eu-1", beat);
  CHECK_THAT(messageOf(answer.status()), Catch::Contains("plugins[0].name: required"));
  CHECK(query("SELECT 1 FROM agents").empty());
  CHECK(ingestor_->counters().rejected.load() == 2u);
}

}  // namespace
}  // namespace krane::ingest
