// kill -9 of the process running a fleet rollout, in the middle of a wave: another process
// carries on from the rollout's state, the rollout completes, and no sentinel was deployed twice
// for its wave (one SentinelService.Deploy invocation and one change per sentinel).
#include <signal.h>

#include <filesystem>

#include <catch2/catch.hpp>

#include "common/strings.h"
#include "controlplane/services/sentinelrollout/rollout.h"
#include "controlplane/workflow/typed.h"
#include "tests/controlplane/services/sentinel/fleet.h"
#include "tests/support/child_engine.h"
#include "tests/support/process.h"
#include "tests/support/wait.h"

namespace krane::services::sentinelrollout {
namespace {

using krane::testing::ChildProcess;
using krane::testing::eventually;
using krane::testing::runfile;
using sentinel::testing::SentinelFleetTest;
using namespace std::chrono_literals;

class RolloutCrashTest : public SentinelFleetTest {
 protected:
  RolloutCrashTest() : submitter_(pool_) {
    // The test process sends the rollout and, through the ingestor's hook, the notifications;
    // it runs none of them.
    REQUIRE_THAT(submitter_.registerService(sentinel::sentinelService(pool_, writer_)), IsOk());
    REQUIRE_THAT(submitter_.registerService(sentinelRolloutService(pool_)), IsOk());
    ingestor_->addSentinelReadyHook(std::make_shared<sentinel::ReadyNotifier>(pool_, submitter_));
    const char* tmp = std::getenv("TEST_TMPDIR");
    dir_ = strCat(tmp != nullptr ? tmp : "/tmp", "/rollout-crash-", ::getpid());
    std::filesystem::create_directories(dir_);
    dsn_text_ = krane::testing::childDsn(dsn_);
  }

  std::unique_ptr<ChildProcess> child(const std::string& worker) {
    return std::make_unique<ChildProcess>(
        std::vector<std::string>{
            runfile("tests/controlplane/services/sentinelrollout/rollout_child"), "--dsn",
            dsn_text_, "--worker", worker, "--lease-ms", "1000"},
        strCat(dir_, "/", worker, ".log"));
  }
  int64_t onImage(const std::string& image) {
    return scalar("SELECT COUNT(*) FROM sentinels WHERE image = ?", {image});
  }

  workflow::Engine submitter_;
  std::string dir_;
  std::string dsn_text_;
};

TEST_CASE_METHOD(RolloutCrashTest, "a rollout killed mid-wave carries on with no sentinel twice",
                 "[rollout][crash]") {
  for (int i = 0; i < 60; ++i) {
    addSentinel(strCat("snt_", i < 10 ? "0" : "", i), "krane.dev/sentinel:v1", true,
                i % 2 ? "us-1" : "eu-1");
  }
  startFleet();
  RolloutStartRequest req;
  req.set_image("krane.dev/sentinel:v2");
  req.add_wave_percentages(50);
  req.add_wave_percentages(100);
  req.set_max_parallel(4);
  auto first = child("a");
  auto started = workflow::resultAs<RolloutResponse>(
      submitter_.call(workflow::invocation(kServiceName, "Rollout", kKey, req), 60s));
  REQUIRE_THAT(started, IsOk());
  // Killed in the middle of the first wave (30 sentinels, 4 at a time).
  REQUIRE(eventually([&] { return onImage("krane.dev/sentinel:v2") >= 10; }, 60s));
  first->signal(SIGKILL);
  first->wait();
  const int64_t at_kill = onImage("krane.dev/sentinel:v2");
  CHECK(at_kill < 30);
  auto second = child("b");
  SentinelRollout done;
  REQUIRE(eventually(
      [&] {
        auto r = workflow::resultAs<RolloutResponse>(submitter_.call(
            workflow::invocation(kServiceName, "Get", kKey, RolloutOperationRequest()), 10s));
        if (r.ok()) done = r->rollout();
        return r.ok() && r->rollout().state() == services::v1::ROLLOUT_STATE_COMPLETED;
      },
      120s));
  second->signal(SIGKILL);
  second->wait();
  CHECK(onImage("krane.dev/sentinel:v2") == 60);
  CHECK(done.failed_ids_size() == 0);
  CHECK(done.waves(0).ready() == 30u);
  CHECK(done.waves(1).ready() == 30u);
  INFO("one Deploy and one change per sentinel: none was deployed twice");
  CHECK(scalar("SELECT COUNT(*) FROM (SELECT object_key FROM workflow_invocations WHERE service ="
               " 'SentinelService' AND handler = 'Deploy' GROUP BY object_key"
               " HAVING COUNT(*) > 1) twice") == 0);
  CHECK(scalar("SELECT COUNT(*) FROM workflow_invocations WHERE service = 'SentinelService'"
               " AND handler = 'Deploy'") == 60);
  CHECK(scalar("SELECT COUNT(*) FROM resource_changes WHERE resource_type = 'sentinel'") ==
        60 + 60);
}

}  // namespace
}  // namespace krane::services::sentinelrollout
