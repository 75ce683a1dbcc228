// `krane-ctrl workflow ...` (the real binary) against invocations of an engine in this process:
// list, show with the journal, the watchdog, resolve, cancel with compensation, kill, resume
// refused on a non-paused invocation, cleanup, and bad input naming the field.
#include <catch2/catch.hpp>

#include "common/strings.h"
#include "tests/controlplane/workflow/fixture.h"
#include "tests/support/matchers.h"
#include "tests/support/process.h"
#include "tests/support/wait.h"

namespace krane::workflow {
namespace {

using krane::testing::eventually;
using krane::testing::runCommand;
using krane::testing::runfile;

class WorkflowCommandTest : public WorkflowTest {
 protected:
  krane::testing::CommandResult ctrl(std::vector<std::string> args) {
    args.insert(args.begin(), runfile("controlplane/krane-ctrl"));
    args.push_back("--dsn");
    args.push_back(strCat("mysql://root@127.0.0.1:", dsn_.port, "/", dsn_.database));
    return runCommand(args);
  }

  // A virtual object whose exclusive handler registers a compensation, publishes an awakeable in
  // its state and waits on it.
  Engine& start() {
    return engine([&](Engine& e) {
      REQUIRE_THAT(
          e.registerService(
              ServiceDefinition::virtualObject("Gate")
                  .exclusive("wait",
                             [&](Context& ctx, const std::string&) -> absl::StatusOr<std::string> {
                               ctx.compensateRun("undo", [&] {
                                 ++compensations_;
                                 return absl::OkStatus();
                               });
                               Awakeable a = ctx.awakeable();
                               ctx.set("awakeable", a.id);
                               return ctx.await(a.future);
                             })
                  .shared("awakeable",
                          [](Context& ctx, const std::string&) -> absl::StatusOr<std::string> {
                            return ctx.get("awakeable").value_or("");
                          })),
          IsOk());
    });
  }

  std::atomic<int> compensations_{0};
};

TEST_CASE_METHOD(WorkflowCommandTest, "list show keys resolve cancel kill cleanup",
                 "[workflow-command]") {
  Engine& e = start();
  auto first = e.send({"Gate", "wait", "g1"});
  REQUIRE_THAT(first, IsOk());
  REQUIRE(eventually([&] { return statusOf(*first) == "suspended"; }));

  auto list = ctrl({"workflow", "list", "--service", "Gate", "--status", "suspended"});
  INFO(list.err);
  REQUIRE(list.exit_code == 0);
  CHECK_THAT(list.out, Catch::Contains(*first));
  CHECK_THAT(list.out, Catch::Contains("g1"));
  auto none = ctrl({"workflow", "list", "--service", "Gate", "--status", "failed"});
  CHECK_THAT(none.out, !Catch::Contains(*first));

  auto show = ctrl({"workflow", "show", *first});
  INFO(show.err);
  REQUIRE(show.exit_code == 0);
  CHECK_THAT(show.out, Catch::Contains("status:      suspended"));
  CHECK_THAT(show.out, Catch::Contains("awakeable"));
  CHECK_THAT(show.out, Catch::Contains("set "));

  auto keys = ctrl({"workflow", "keys", "--older-than-s", "0"});
  INFO(keys.err);
  REQUIRE(keys.exit_code == 0);
  CHECK_THAT(keys.out, Catch::Contains(*first));
  CHECK_THAT(keys.out, Catch::Contains("Gate"));
  auto quiet = ctrl({"workflow", "keys", "--older-than-s", "3600"});
  CHECK_THAT(quiet.out, !Catch::Contains(*first));

  // A second invocation of the key queues behind the first.
  auto second = e.send({"Gate", "wait", "g1"});
  REQUIRE_THAT(second, IsOk());
  REQUIRE(eventually([&] { return statusOf(*second) == "queued"; }));

  auto awakeable = e.call({"Gate", "awakeable", "g1"});
  INFO(awakeable.status());
  REQUIRE((awakeable.ok() && !awakeable->empty()));
  auto resolved = ctrl({"workflow", "resolve", *awakeable, "--payload", "go"});
  INFO(resolved.err);
  REQUIRE(resolved.exit_code == 0);
  auto result = e.awaitResult(*first, std::chrono::seconds(20));
  REQUIRE_THAT(result, IsOk());
  CHECK(*result == "go");
  CHECK(compensations_.load() == 0);

  // The second got the key and waits; cancelling it runs its compensation.
  REQUIRE(eventually([&] { return statusOf(*second) == "suspended"; }));
  auto cancelled = ctrl({"workflow", "cancel", *second});
  INFO(cancelled.err);
  REQUIRE(cancelled.exit_code == 0);
  REQUIRE(eventually([&] { return statusOf(*second) == "cancelled"; }));
  CHECK(compensations_.load() == 1);

  // Kill skips compensations.
  auto third = e.send({"Gate", "wait", "g2"});
  REQUIRE_THAT(third, IsOk());
  REQUIRE(eventually([&] { return statusOf(*third) == "suspended"; }));
  auto resume = ctrl({"workflow", "resume", *third});
  CHECK(resume.exit_code == 1);
  CHECK_THAT(resume.err, Catch::Contains("not paused"));
  auto killed = ctrl({"workflow", "kill", *third});
  INFO(killed.err);
  REQUIRE(killed.exit_code == 0);
  CHECK(statusOf(*third) == "killed");
  CHECK(compensations_.load() == 1);
  auto again = ctrl({"workflow", "cancel", *third});
  CHECK(again.exit_code == 1);
  CHECK_THAT(again.err, Catch::Contains("krane-ctrl workflow cancel: error:"));

  auto cleanup = ctrl({"workflow", "cleanup", "--retention-s", "0"});
  INFO(cleanup.err);
  REQUIRE(cleanup.exit_code == 0);
  CHECK_THAT(cleanup.out, Catch::Contains("deleted 4 invocations"));
  CHECK(statusOf(*first) == "<none>");
}

TEST_CASE_METHOD(WorkflowCommandTest, "show redacts secrets", "[workflow-command]") {
  Engine& e = start();
  // Secrets in an input are not shown: a Slack webhook URL carries its credential.
  auto secret = e.send({"Gate", "wait", "g9",
                        R"({"image":"reg/sentinel:2","slack_webhook_url":"https://hooks.slack.)"
                        R"(com/services/T0/B0/XyZsecret","nested":[{"api_token":"tok-123"}]})"});
  REQUIRE_THAT(secret, IsOk());
  auto shown = ctrl({"workflow", "show", *secret});
  REQUIRE(shown.exit_code == 0);
  CHECK_THAT(shown.out, !Catch::Contains("XyZsecret"));
  CHECK_THAT(shown.out, !Catch::Contains("tok-123"));
  CHECK_THAT(shown.out, Catch::Contains("\"slack_webhook_url\":\"[redacted]\""));
  CHECK_THAT(shown.out, Catch::Contains("reg/sentinel:2"));
  REQUIRE_THAT(e.cancel(*secret), IsOk());
}

TEST_CASE_METHOD(WorkflowCommandTest, "bad input is refused naming the field",
                 "[workflow-command]") {
  auto status = ctrl({"workflow", "list", "--status", "sleeping"});
  CHECK(status.exit_code == 1);
  CHECK_THAT(status.err, Catch::Contains("status: unknown invocation status 'sleeping'"));
  auto key = ctrl({"workflow", "list", "--key", "k"});
  CHECK(key.exit_code == 1);
  CHECK_THAT(key.err, Catch::Contains("key: --key needs --service"));
  auto unknown = ctrl({"workflow", "show", "inv_nope"});
  CHECK(unknown.exit_code == 1);
  CHECK_THAT(unknown.err, Catch::Contains("no invocation 'inv_nope'"));
  auto awakeable = ctrl({"workflow", "resolve", "prm_nope"});
  CHECK(awakeable.exit_code == 1);
  CHECK_THAT(awakeable.err, Catch::Contains("prm_nope"));
  auto reject = ctrl({"workflow", "reject", "prm_nope"});
  CHECK(reject.exit_code == 2);  // --message is required: a usage error
  auto threshold = ctrl({"workflow", "keys", "--older-than-s", "-5"});
  CHECK(threshold.exit_code == 2);
  CHECK_THAT(threshold.err, Catch::Contains("--older-than-s"));
}

}  // namespace
}  // namespace krane::workflow
