// SentinelService on the workflow engine, the feed writer, the real ingestor and a real MariaDB:
// the no-op fast path, a merge of partial fields, convergence through an agent's report (only
// once the agent applied the change), the timeout that marks the sentinel failed without rolling
// anything back, and bad requests refused naming the field with nothing written.
#include "controlplane/services/sentinel/sentinel.h"

#include <catch2/catch.hpp>

#include "controlplane/workflow/typed.h"
#include "tests/controlplane/services/sentinel/fleet.h"
#include "tests/support/matchers.h"
#include "tests/support/wait.h"

namespace krane::services::sentinel {
namespace {

using krane::testing::eventually;
using services::v1::SENTINEL_DEPLOY_OUTCOME_FAILED;
using services::v1::SENTINEL_DEPLOY_OUTCOME_READY;
using testing::SentinelFleetTest;
using workflow::Engine;
using workflow::invocation;
using workflow::resultAs;
using namespace std::chrono_literals;

absl::StatusOr<SentinelDeployResponse> deploy(Engine& e, const std::string& id,
                                              const SentinelDeployRequest& req) {
  return resultAs<SentinelDeployResponse>(e.call(invocation(kServiceName, "Deploy", id, req), 30s));
}

TEST_CASE_METHOD(SentinelFleetTest, "a deploy that changes nothing of a healthy sentinel is ready",
                 "[sentinel-service]") {
  Engine& e = startEngine();
  addSentinel("snt_a", "krane.dev/sentinel:v1");
  const int64_t before = changesOf("snt_a");
  SentinelDeployRequest req;
  req.set_image("krane.dev/sentinel:v1");
  req.set_replicas(2);
  auto result = deploy(e, "snt_a", req);
  REQUIRE_THAT(result, IsOk());
  CHECK(result->outcome() == SENTINEL_DEPLOY_OUTCOME_READY);
  CHECK(result->unchanged());
  CHECK(result->region() == "eu-1");
  CHECK(changesOf("snt_a") == before);
  CHECK(column("snt_a", "deploy_status") == "ready");
}

TEST_CASE_METHOD(SentinelFleetTest,
                 "a partial deploy keeps the other fields and waits for the agent's report",
                 "[sentinel-service]") {
  Engine& e = startEngine();
  addSentinel("snt_a", "krane.dev/sentinel:v1");
  const int64_t before = changesOf("snt_a");
  SentinelDeployRequest req;
  req.set_replicas(3);
  auto id = e.send(invocation(kServiceName, "Deploy", "snt_a", req));
  REQUIRE_THAT(id, IsOk());
  REQUIRE(eventually([&] { return column("snt_a", "deploy_status") == "progressing"; }));
  INFO("one change, with the merged fields");
  CHECK(changesOf("snt_a") == before + 1);
  CHECK(column("snt_a", "replicas") == "3");
  CHECK(column("snt_a", "image") == "krane.dev/sentinel:v1");
  CHECK(column("snt_a", "cpu_millicores") == "250");
  CHECK(column("snt_a", "memory_mib") == "256");

  // A report from before the agent applied the change (same image, healthy) is not convergence.
  auto early = reportOf("snt_a", true);
  REQUIRE(early.has_value());
  early->set_applied_version(early->applied_version() - 1);
  REQUIRE_THAT(ingestor_->reportSentinelStatus("eu-1", *early), IsOk());
  std::this_thread::sleep_for(300ms);
  CHECK(statusOf(*id) != "completed");
  CHECK(column("snt_a", "deploy_status") == "progressing");

  report("snt_a", true);
  auto result = resultAs<SentinelDeployResponse>(e.awaitResult(*id, 30s));
  REQUIRE_THAT(result, IsOk());
  CHECK(result->outcome() == SENTINEL_DEPLOY_OUTCOME_READY);
  CHECK_FALSE(result->unchanged());
  CHECK(result->previous_image() == "krane.dev/sentinel:v1");
  CHECK(column("snt_a", "deploy_status") == "ready");
  CHECK(column("snt_a", "available_replicas") == "3");
}

TEST_CASE_METHOD(SentinelFleetTest, "a sentinel that never converges fails at the timeout",
                 "[sentinel-service]") {
  Engine& e = startEngine();
  addSentinel("snt_a", "krane.dev/sentinel:v1");
  SentinelDeployRequest req;
  req.set_image("krane.dev/sentinel:v2");
  req.set_timeout_ms(500);
  auto id = e.send(invocation(kServiceName, "Deploy", "snt_a", req));
  REQUIRE_THAT(id, IsOk());
  REQUIRE(eventually([&] { return column("snt_a", "deploy_status") == "progressing"; }));
  report("snt_a", false);  // on the new image, unhealthy
  auto result = resultAs<SentinelDeployResponse>(e.awaitResult(*id, 30s));
  REQUIRE_THAT(result, IsOk());
  CHECK(result->outcome() == SENTINEL_DEPLOY_OUTCOME_FAILED);
  CHECK_THAT(result->message(), ContainsRegex("did not report healthy on krane.dev/sentinel:v2"));
  CHECK(column("snt_a", "deploy_status") == "failed");
  INFO("no self-rollback: the desired image stays");
  CHECK(column("snt_a", "image") == "krane.dev/sentinel:v2");
  // A late healthy report updates what is observed but does not undo the failure.
  report("snt_a", true);
  CHECK(column("snt_a", "deploy_status") == "failed");
  CHECK(column("snt_a", "health") == "healthy");
}

TEST_CASE_METHOD(SentinelFleetTest, "bad deploys are refused naming the field, nothing written",
                 "[sentinel-service]") {
  Engine& e = startEngine();
  addSentinel("snt_a", "krane.dev/sentinel:v1");
  const int64_t before = changesOf("snt_a");
  SentinelDeployRequest too_many;
  too_many.set_replicas(1001);
  auto refused = deploy(e, "snt_a", too_many);
  CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(toStd(refused.status().message())), ContainsRegex("sentinel.replicas"));
  SentinelDeployRequest negative;
  negative.set_timeout_ms(-1);
  auto refused_timeout = deploy(e, "snt_a", negative);
  CHECK_THAT(std::string(toStd(refused_timeout.status().message())), ContainsRegex("timeout_ms"));
  auto missing = deploy(e, "snt_missing", SentinelDeployRequest());
  CHECK(missing.status().code() == absl::StatusCode::kNotFound);
  CHECK(changesOf("snt_a") == before);
  CHECK(column("snt_a", "replicas") == "2");
  CHECK(column("snt_a", "deploy_status") == "ready");
}

}  // namespace
}  // namespace krane::services::sentinel
