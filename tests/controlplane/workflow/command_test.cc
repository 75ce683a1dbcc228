// `krane-ctrl workflow ...` (the real binary) against invocations of an engine in this process:
// list, show with the journal, the watchdog, resolve, cancel with compensation, kill, resume
// refused on a non-paused invocation, cleanup, and bad input naming the field.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/strings.h"
#include "tests/controlplane/workflow/fixture.h"
#include "tests/support/process.h"
#include "tests/support/wait.h"

namespace krane::workflow {
namespace {

using krane::testing::eventually;
using krane::testing::runCommand;
using krane::testing::runfile;
using ::testing::HasSubstr;
using ::testing::Not;

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
      ASSERT_TRUE(
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
                           }))
              .ok());
    });
  }

  std::atomic<int> compensations_{0};
};

TEST_F(WorkflowCommandTest, ListShowKeysResolveCancelKillCleanup) {
  Engine& e = start();
  auto first = e.send({"Gate", "wait", "g1"});
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(eventually([&] { return statusOf(*first) == "suspended"; }));

  auto list = ctrl({"workflow", "list", "--service", "Gate", "--status", "suspended"});
  ASSERT_EQ(list.exit_code, 0) << list.err;
  EXPECT_THAT(list.out, HasSubstr(*first));
  EXPECT_THAT(list.out, HasSubstr("g1"));
  auto none = ctrl({"workflow", "list", "--service", "Gate", "--status", "failed"});
  EXPECT_THAT(none.out, Not(HasSubstr(*first)));

  auto show = ctrl({"workflow", "show", *first});
  ASSERT_EQ(show.exit_code, 0) << show.err;
  EXPECT_THAT(show.out, HasSubstr("status:      suspended"));
  EXPECT_THAT(show.out, HasSubstr("awakeable"));
  EXPECT_THAT(show.out, HasSubstr("set "));

  auto keys = ctrl({"workflow", "keys", "--older-than-s", "0"});
  ASSERT_EQ(keys.exit_code, 0) << keys.err;
  EXPECT_THAT(keys.out, HasSubstr(*first));
  EXPECT_THAT(keys.out, HasSubstr("Gate"));
  auto quiet = ctrl({"workflow", "keys", "--older-than-s", "3600"});
  EXPECT_THAT(quiet.out, Not(HasSubstr(*first)));

  // A second invocation of the key queues behind the first.
  auto second = e.send({"Gate", "wait", "g1"});
  ASSERT_TRUE(second.ok());
  ASSERT_TRUE(eventually([&] { return statusOf(*second) == "queued"; }));

  auto awakeable = e.call({"Gate", "awakeable", "g1"});
  ASSERT_TRUE(awakeable.ok() && !awakeable->empty()) << awakeable.status();
  auto resolved = ctrl({"workflow", "resolve", *awakeable, "--payload", "go"});
  ASSERT_EQ(resolved.exit_code, 0) << resolved.err;
  auto result = e.awaitResult(*first, std::chrono::seconds(20));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(*result, "go");
  EXPECT_EQ(compensations_.load(), 0);

  // The second got the key and waits; cancelling it runs its compensation.
  ASSERT_TRUE(eventually([&] { return statusOf(*second) == "suspended"; }));
  auto cancelled = ctrl({"workflow", "cancel", *second});
  ASSERT_EQ(cancelled.exit_code, 0) << cancelled.err;
  ASSERT_TRUE(eventually([&] { return statusOf(*second) == "cancelled"; }));
  EXPECT_EQ(compensations_.load(), 1);

  // Kill skips compensations.
  auto third = e.send({"Gate", "wait", "g2"});
  ASSERT_TRUE(third.ok());
  ASSERT_TRUE(eventually([&] { return statusOf(*third) == "suspended"; }));
  auto resume = ctrl({"workflow", "resume", *third});
  EXPECT_EQ(resume.exit_code, 1);
  EXPECT_THAT(resume.err, HasSubstr("not paused"));
  auto killed = ctrl({"workflow", "kill", *third});
  ASSERT_EQ(killed.exit_code, 0) << killed.err;
  EXPECT_EQ(statusOf(*third), "killed");
  EXPECT_EQ(compensations_.load(), 1);
  auto again = ctrl({"workflow", "cancel", *third});
  EXPECT_EQ(again.exit_code, 1);
  EXPECT_THAT(again.err, HasSubstr("krane-ctrl workflow cancel: error:"));

  auto cleanup = ctrl({"workflow", "cleanup", "--retention-s", "0"});
  ASSERT_EQ(cleanup.exit_code, 0) << cleanup.err;
  EXPECT_THAT(cleanup.out, HasSubstr("deleted 4 invocations"));
  EXPECT_EQ(statusOf(*first), "<none>");
}

TEST_F(WorkflowCommandTest, BadInputIsRefusedNamingTheField) {
  auto status = ctrl({"workflow", "list", "--status", "sleeping"});
  EXPECT_EQ(status.exit_code, 1);
  EXPECT_THAT(status.err, HasSubstr("status: unknown invocation status 'sleeping'"));
  auto key = ctrl({"workflow", "list", "--key", "k"});
  EXPECT_EQ(key.exit_code, 1);
  EXPECT_THAT(key.err, HasSubstr("key: --key needs --service"));
  auto unknown = ctrl({"workflow", "show", "inv_nope"});
  EXPECT_EQ(unknown.exit_code, 1);
  EXPECT_THAT(unknown.err, HasSubstr("no invocation 'inv_nope'"));
  auto awakeable = ctrl({"workflow", "resolve", "prm_nope"});
  EXPECT_EQ(awakeable.exit_code, 1);
  EXPECT_THAT(awakeable.err, HasSubstr("prm_nope"));
  auto reject = ctrl({"workflow", "reject", "prm_nope"});
  EXPECT_EQ(reject.exit_code, 2);  // --message is required: a usage error
  auto threshold = ctrl({"workflow", "keys", "--older-than-s", "-5"});
  EXPECT_EQ(threshold.exit_code, 2);
  EXPECT_THAT(threshold.err, HasSubstr("--older-than-s"));
}

}  // namespace
}  // namespace krane::workflow
