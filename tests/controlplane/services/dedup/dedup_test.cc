// Commit dedup against a real MariaDB: queued older siblings are superseded in one SELECT and two
// batched UPDATEs, their open steps stamped (first write wins) and their deploy workflows
// cancelled; committed, newer, other-branch and other-environment deployments are left alone;
// and the self-skip check sees only newer siblings that still matter.
#include "controlplane/services/dedup/dedup.h"

#include <map>

#include <catch2/catch.hpp>

#include "controlplane/workflow/engine.h"
#include "tests/controlplane/workflow/fixture.h"
#include "tests/support/matchers.h"
#include "tests/support/wait.h"

namespace krane::services::dedup {
namespace {

using krane::testing::eventually;
using workflow::Context;
using workflow::Engine;
using workflow::ServiceDefinition;
using namespace std::chrono_literals;

class DedupTest : public workflow::WorkflowTest {
 protected:
  DedupTest() { seedTenancy({{"prod", "production"}, {"preview", "production"}}); }

  // A deployment row with one open step, created at `at` (ms).
  void deployment(const std::string& id, int64_t at, const std::string& status,
                  std::optional<std::string> branch = std::string("main"),
                  const std::string& env = "prod", const std::string& invocation = "") {
    exec(
        "INSERT INTO deployments (id, workspace_id, project_id, app_id, environment_id, status,"
        " git_branch, invocation_id, created_at) VALUES (?, 'ws', 'proj', 'app', ?, ?, ?, ?, ?)",
        {id, env, status, branch, invocation.empty() ? db::Value() : db::Value(invocation), at});
    exec("INSERT INTO deployment_steps (deployment_id, step, started_at) VALUES (?, 'queued', ?)",
         {id, at});
  }

  std::string statusOfDeployment(const std::string& id) {
    auto rows = (*pool_->acquire())->query("SELECT status FROM deployments WHERE id = ?", {id});
    return rows.ok() && !rows->empty() ? rows->rows[0].str(0) : "<none>";
  }
  std::string stepError(const std::string& id) {
    auto rows = (*pool_->acquire())
                    ->query(
                        "SELECT COALESCE(error, '') FROM deployment_steps"
                        " WHERE deployment_id = ?",
                        {id});
    return rows.ok() && !rows->empty() ? rows->rows[0].str(0) : "<none>";
  }
  std::map<std::string, int64_t> statementCounts() {
    auto rows = (*pool_->acquire())
                    ->query(
                        "SHOW GLOBAL STATUS WHERE Variable_name IN"
                        " ('Com_select', 'Com_update', 'Com_insert', 'Com_delete')");
    std::map<std::string, int64_t> out;
    if (rows.ok()) {
      for (const auto& r : rows->rows) out[r.str(0)] = std::stoll(r.str(1));
    }
    return out;
  }
};

TEST_CASE_METHOD(DedupTest, "queued older siblings are superseded and nothing else", "[dedup]") {
  deployment("d1", 100, "pending");
  deployment("d2", 200, "awaiting_approval");
  deployment("d3", 300, "starting");  // holds a build slot: committed
  deployment("other-branch", 150, "pending", std::string("feature"));
  deployment("no-branch", 160, "pending", std::nullopt);
  deployment("other-env", 170, "pending", std::string("main"), "preview");
  deployment("d4", 400, "pending");
  deployment("d5", 500, "pending");  // newer than d4
  // d1's step already ended: first write wins.
  exec("UPDATE deployment_steps SET ended_at = 150, error = 'earlier' WHERE deployment_id = 'd1'");

  auto before = statementCounts();
  auto superseded = cancelOlderSiblings(*pool_, "d4");
  auto after = statementCounts();
  REQUIRE_THAT(superseded, IsOk());
  std::vector<std::string> ids;
  for (const auto& s : *superseded) ids.push_back(s.deployment_id);
  CHECK_THAT(ids, Catch::UnorderedEquals(std::vector<std::string>{"d1", "d2"}));
  INFO("one SELECT for the deployment, one for its siblings, two batched UPDATEs; no per-row work");
  CHECK(after["Com_select"] - before["Com_select"] == 2);
  CHECK(after["Com_update"] - before["Com_update"] == 2);
  CHECK(after["Com_insert"] - before["Com_insert"] == 0);

  CHECK(statusOfDeployment("d1") == "superseded");
  CHECK(statusOfDeployment("d2") == "superseded");
  CHECK(stepError("d1") == "earlier");
  CHECK(stepError("d2") == kSupersededMessage);
  for (const char* untouched : {"d3", "d4", "d5", "other-branch", "no-branch", "other-env"}) {
    INFO(untouched);
    CHECK(statusOfDeployment(untouched) != "superseded");
    CHECK(stepError(untouched).empty());
  }

  // A second run finds nothing left to supersede.
  auto again = cancelOlderSiblings(*pool_, "d4");
  REQUIRE_THAT(again, IsOk());
  CHECK(again->empty());
  CHECK_THAT(cancelOlderSiblings(*pool_, "nope"), IsError(absl::StatusCode::kNotFound));
}

// The superseded sibling's deploy workflow is cancelled and runs its compensations; one whose
// workflow already finished is left as it is.
TEST_CASE_METHOD(DedupTest, "the superseded siblings workflows are cancelled", "[dedup]") {
  std::atomic<int> released{0};
  Engine& e = engine([&](Engine& e) {
    REQUIRE_THAT(e.registerService(ServiceDefinition::virtualObject("Deploy").exclusive(
                     "run",
                     [&](Context& ctx, const std::string&) -> absl::StatusOr<std::string> {
                       ctx.compensateRun("release slot", [&released] {
                         ++released;
                         return absl::OkStatus();
                       });
                       workflow::Awakeable slot = ctx.awakeable();
                       return ctx.await(slot.future);
                     })),
                 IsOk());
    REQUIRE_THAT(
        e.registerService(ServiceDefinition::virtualObject("Quick").exclusive(
            "run",
            [](Context&, const std::string&) { return absl::StatusOr<std::string>("done"); })),
        IsOk());
  });
  auto waiting = e.send({"Deploy", "run", "d1", ""});
  auto finished = e.call({"Quick", "run", "d2", ""}, 20s);
  REQUIRE_THAT(waiting, IsOk());
  REQUIRE_THAT(finished, IsOk());
  auto quick_id =
      (*pool_->acquire())->query("SELECT id FROM workflow_invocations WHERE service = 'Quick'");
  REQUIRE_THAT(quick_id, IsOk());
  REQUIRE(eventually([&] { return statusOf(*waiting) == "suspended"; }));
  deployment("d1", 100, "pending", std::string("main"), "prod", *waiting);
  deployment("d2", 200, "pending", std::string("main"), "prod", quick_id->rows[0].str(0));
  deployment("d3", 300, "pending");

  auto superseded = cancelOlderSiblings(*pool_, "d3");
  REQUIRE_THAT(superseded, IsOk());
  REQUIRE(superseded->size() == 2u);
  for (const auto& s : *superseded) {
    INFO(s.deployment_id);
    CHECK(s.cancel_error.empty());
  }
  CHECK_THAT(e.awaitResult(*waiting, 20s), IsError(absl::StatusCode::kCancelled));
  CHECK(released.load() == 1);
  CHECK(statusOf(quick_id->rows[0].str(0)) == "succeeded");
}

TEST_CASE_METHOD(DedupTest, "self-skip sees newer siblings that still matter", "[dedup]") {
  deployment("d1", 100, "starting");
  deployment("d2", 200, "failed");
  deployment("d3", 300, "superseded");
  deployment("d4", 400, "cancelled");
  deployment("feature", 500, "pending", std::string("feature"));
  deployment("preview", 600, "pending", std::string("main"), "preview");
  auto skip = [&](const std::string& id) {
    auto conn = pool_->acquire();
    REQUIRE_THAT(conn, IsOk());
    auto r = hasNewerActiveDeployment(**conn, id);
    REQUIRE_THAT(r, IsOk());
    return *r;
  };
  INFO("newer siblings that failed, were superseded or were cancelled do not count");
  CHECK_FALSE(skip("d1"));
  for (const char* status : {"pending", "awaiting_approval", "building", "ready"}) {
    INFO(status);
    exec("DELETE FROM deployment_steps WHERE deployment_id = 'd5'");
    exec("DELETE FROM deployments WHERE id = 'd5'");
    deployment("d5", 700, status);
    CHECK(skip("d1"));
    CHECK_FALSE(skip("d5"));
  }
  // Same creation time: the id decides, so exactly one of two twins skips.
  deployment("twin-a", 800, "pending");
  deployment("twin-b", 800, "pending");
  CHECK(skip("twin-a"));
  CHECK_FALSE(skip("twin-b"));
  deployment("lone", 900, "pending", std::nullopt);
  CHECK_FALSE(skip("lone"));
  auto conn = pool_->acquire();
  CHECK_THAT(hasNewerActiveDeployment(**conn, "nope"), IsError(absl::StatusCode::kNotFound));
}

}  // namespace
}  // namespace krane::services::dedup
