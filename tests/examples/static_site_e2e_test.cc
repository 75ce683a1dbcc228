// The example plugin end to end, all real: krane-ctrl on MariaDB, the `krane` binary with
// libstatic_site.so (in its own krane-plugin-host, or in process), resources put and deleted
// through the public ResourceService with an operator token. Checks the files on disk, the
// status that reaches krane-ctrl's `resource_status` table, a refused spec reported as a failed
// apply (and parked), and garbage collection after the documented cursor-store reset.
#include <signal.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <optional>

#include <catch2/catch.hpp>

#include "common/strings.h"
#include "nlohmann/json.hpp"
#include "tests/support/control_plane.h"
#include "tests/support/matchers.h"
#include "tests/support/process.h"
#include "tests/support/wait.h"

namespace krane {
namespace {

using krane::testing::ChildProcess;
using krane::testing::eventually;
using krane::testing::kOperatorToken;
using krane::testing::runCommand;
using krane::testing::runfile;
using krane::testing::slurp;
using krane::testing::TestControlPlane;
namespace fs = std::filesystem;

constexpr char kType[] = "example.krane.dev/static-site";

// One row of krane-ctrl's resource_status table.
struct Status {
  std::string phase;
  std::string message;
  std::string apply_error;
  uint64_t version = 0;         // applied
  uint64_t failed_version = 0;  // parked
};

class StaticSiteE2eTest {
 protected:
  StaticSiteE2eTest() {
    char pattern[] = "/tmp/krane-sitee2e-XXXXXX";
    dir_ = ::mkdtemp(pattern);
    root_ = dir_ + "/sites";
    cp_.startReplica();
    resources_ = cp_.resources();
  }

  // Writes the agent's YAML, as an operator writes it (docs/configuration.md), with the plugin
  // in `isolation` ("process" or "in_process"); each test case runs once with each.
  void useIsolation(const std::string& isolation) {
    isolation_ = isolation;
    std::ofstream(dir_ + "/agent.yaml") << strCat(
        "region: local-1\n"
        "state_dir: ",
        dir_,
        "/state\n"
        "reconnect_min_ms: 50\n"
        "reconnect_max_ms: 200\n"
        "control_plane:\n"
        "  address: 127.0.0.1:",
        cp_.replica(0).grpcPort(),
        "\n"
        "reporter:\n"
        "  heartbeat_interval_ms: 200\n"
        "dispatch:\n"
        "  max_attempts: 2\n"
        "plugins:\n"
        "  - name: static-site\n"
        "    path: ",
        runfile("examples/plugins/static_site/libstatic_site.so"),
        "\n"
        "    isolation: ",
        isolation,
        "\n"
        "    config:\n"
        "      root: ",
        root_, "\n");
  }

  ~StaticSiteE2eTest() {
    agent_.reset();
    fs::remove_all(dir_);
  }

  void startAgent(const std::string& log_name) {
    agent_ = std::make_unique<ChildProcess>(
        std::vector<std::string>{runfile("agent/krane"), "run", "--config", dir_ + "/agent.yaml",
                                 "--plugin-host", runfile("agent/krane-plugin-host")},
        dir_ + "/" + log_name,
        std::map<std::string, std::string>{{"KRANE_AGENT_TOKEN", cp_.agentToken("local-1")}});
  }

  void stopAgent() {
    agent_->signal(SIGTERM);
    CHECK(agent_->wait() == 0);
    agent_.reset();
  }

  // ResourceService.Put of a site; the version of its change.
  absl::StatusOr<uint64_t> put(const std::string& id, const std::string& spec) {
    krane::api::v1::PutResourceRequest request;
    auto* r = request.mutable_resource();
    r->set_type(kType);
    r->set_id(id);
    r->set_region("local-1");
    r->mutable_generic()->set_spec(spec);
    r->mutable_generic()->set_content_type("application/json");
    krane::api::v1::PutResourceResponse response;
    const grpc::Status st =
        resources_->Put(TestControlPlane::withToken(kOperatorToken).get(), request, &response);
    if (!st.ok()) return absl::UnknownError(st.error_message());
    return response.version();
  }

  absl::StatusOr<uint64_t> remove(const std::string& id) {
    krane::api::v1::DeleteResourceRequest request;
    request.set_type(kType);
    request.set_id(id);
    request.set_region("local-1");
    krane::api::v1::DeleteResourceResponse response;
    const grpc::Status st =
        resources_->Delete(TestControlPlane::withToken(kOperatorToken).get(), request, &response);
    if (!st.ok()) return absl::UnknownError(st.error_message());
    return response.version();
  }

  std::optional<Status> status(const std::string& id) {
    auto conn = cp_.pool()->acquire();
    if (!conn.ok()) return std::nullopt;
    auto rows = (*conn)->query(
        "SELECT phase, message, apply_error, applied_version, failed_version FROM resource_status"
        " WHERE region_id = 'local-1' AND resource_type = ? AND resource_id = ?",
        {kType, id});
    if (!rows.ok() || rows->empty()) return std::nullopt;
    const auto& row = rows->rows[0];
    return Status{row.str("phase"), row.isNull("message") ? "" : row.str("message"),
                  row.isNull("apply_error") ? "" : row.str("apply_error"),
                  row.u64("applied_version"), row.u64("failed_version")};
  }

  // Waits until the site's status row is in `phase` at `version`.
  bool statusReaches(const std::string& id, const std::string& phase, uint64_t version) {
    return eventually([&] {
      auto s = status(id);
      return s && s->phase == phase && s->version == version;
    });
  }

  std::string agentLog(const std::string& name) { return slurp(dir_ + "/" + name); }

  TestControlPlane cp_{{"local-1"}};
  std::unique_ptr<krane::api::v1::ResourceService::Stub> resources_;
  std::string dir_;
  std::string isolation_;
  std::string root_;
  std::unique_ptr<ChildProcess> agent_;
};

TEST_CASE_METHOD(StaticSiteE2eTest, "a put site is written reported replaced and deleted",
                 "[static-site][slow]") {
  useIsolation(GENERATE(as<std::string>{}, "process", "in_process"));
  INFO("isolation " << isolation_);
  startAgent("agent.log");
  auto v1 = put("home", R"({"files": {"index.html": "<h1>Hello</h1>", "css/site.css": "h1{}"}})");
  REQUIRE_THAT(v1, IsOk());
  INFO(agentLog("agent.log"));
  REQUIRE(eventually([&] { return slurp(root_ + "/home/index.html") == "<h1>Hello</h1>"; }));
  CHECK(slurp(root_ + "/home/css/site.css") == "h1{}");
  INFO(agentLog("agent.log"));
  REQUIRE(statusReaches("home", "ready", *v1));
  CHECK(status("home")->message == strCat("2 files, 18 bytes in ", root_, "/home"));
  // The public API answers the same.
  krane::api::v1::GetResourceStatusRequest get;
  get.set_type(kType);
  get.set_id("home");
  get.set_region("local-1");
  krane::api::v1::GetResourceStatusResponse got;
  REQUIRE_THAT(resources_->GetStatus(TestControlPlane::withToken(kOperatorToken).get(), get, &got),
               IsOk());
  CHECK(got.phase() == "ready");
  CHECK(got.applied_version() == *v1);
  CHECK(got.version() == *v1);

  // A new version replaces the whole site.
  auto v2 = put("home", R"({"files": {"index.html": "<h1>Hello again</h1>"}})");
  REQUIRE_THAT(v2, IsOk());
  INFO(agentLog("agent.log"));
  REQUIRE(statusReaches("home", "ready", *v2));
  CHECK(slurp(root_ + "/home/index.html") == "<h1>Hello again</h1>");
  CHECK_FALSE(fs::exists(root_ + "/home/css"));

  auto deleted = remove("home");
  REQUIRE_THAT(deleted, IsOk());
  INFO(agentLog("agent.log"));
  REQUIRE(eventually([&] { return !fs::exists(root_ + "/home"); }));
  INFO(
      "the status of a deleted resource goes with it, and the agent's report of the delete"
      " does not bring it back");
  CHECK_FALSE(status("home").has_value());
  stopAgent();
}

TEST_CASE_METHOD(StaticSiteE2eTest,
                 "a bad spec is reported as a failed apply and parked while others flow",
                 "[static-site][slow]") {
  useIsolation(GENERATE(as<std::string>{}, "process", "in_process"));
  INFO("isolation " << isolation_);
  startAgent("agent.log");
  auto good = put("docs", R"({"files": {"index.html": "v1"}})");
  REQUIRE_THAT(good, IsOk());
  INFO(agentLog("agent.log"));
  REQUIRE(statusReaches("docs", "ready", *good));
  // The control plane stores any bytes; only the plugin knows the spec is wrong.
  auto bad = put("docs", R"({"files": {"../../etc/passwd": "x"}})");
  REQUIRE_THAT(bad, IsOk());
  auto other = put("blog", R"({"files": {"index.html": "fine"}})");
  REQUIRE_THAT(other, IsOk());

  // The agent reports the parked change as failed, at the version that failed; the applied
  // version stays the one that still runs.
  INFO(agentLog("agent.log"));
  REQUIRE(eventually([&] {
    auto s = status("docs");
    return s && s->phase == "failed" && s->failed_version == *bad;
  }));
  const Status failed = *status("docs");
  CHECK(failed.version == *good);
  CHECK_THAT(
      failed.message,
      Catch::Contains("INVALID_ARGUMENT: spec.files[\"../../etc/passwd\"]: empty, '.' and '..' "
                      "path components are not allowed"));
  const auto error = nlohmann::json::parse(failed.apply_error);
  CHECK_THAT(
      error["message"].get<std::string>(),
      Catch::Contains("spec.files[\"../../etc/passwd\"]: empty, '.' and '..' path components "
                      "are not allowed"));
  INFO("dispatch.max_attempts");
  CHECK(error["attempts"] == 2);
  // The last good version stays in place, nothing escaped the root, and other sites flow.
  CHECK(slurp(root_ + "/docs/index.html") == "v1");
  CHECK_FALSE(fs::exists(dir_ + "/etc"));
  INFO(agentLog("agent.log"));
  REQUIRE(statusReaches("blog", "ready", *other));

  // `krane inspect` lists the parked change with the plugin's error.
  nlohmann::json state;
  INFO(state.dump());
  REQUIRE(eventually([&] {
    auto r =
        runCommand({runfile("agent/krane"), "inspect", "--json", "--state-dir", dir_ + "/state"});
    if (r.exit_code != 0) return false;
    state = nlohmann::json::parse(r.out);
    return state["parked"].size() == 1;
  }));
  CHECK(state["parked"][0]["id"] == "docs");
  CHECK(state["parked"][0]["version"] == *bad);
  CHECK_THAT(state["parked"][0]["last_error"].get<std::string>(), Catch::Contains("spec.files"));

  // A fixed version un-parks it.
  auto fixed = put("docs", R"({"files": {"index.html": "v3"}})");
  REQUIRE_THAT(fixed, IsOk());
  INFO(agentLog("agent.log"));
  REQUIRE(statusReaches("docs", "ready", *fixed));
  CHECK(slurp(root_ + "/docs/index.html") == "v3");
  stopAgent();
}

TEST_CASE_METHOD(StaticSiteE2eTest,
                 "a full sync garbage collects sites the desired state no longer has",
                 "[static-site][slow]") {
  useIsolation(GENERATE(as<std::string>{}, "process", "in_process"));
  INFO("isolation " << isolation_);
  startAgent("agent1.log");
  auto keep = put("keep", R"({"files": {"index.html": "k"}})");
  auto gone = put("gone", R"({"files": {"index.html": "g"}})");
  REQUIRE((keep.ok() && gone.ok()));
  INFO(agentLog("agent1.log"));
  REQUIRE(statusReaches("gone", "ready", *gone));
  fs::create_directories(root_ + "/not-ours");
  std::ofstream(root_ + "/not-ours/file") << "left alone";
  stopAgent();

  // While the agent is down, the site is deleted; then the cursor store is reset as
  // docs/agent.md describes, so the agent starts with a full sync instead of the delete change.
  auto deleted = remove("gone");
  REQUIRE_THAT(deleted, IsOk());
  fs::remove(dir_ + "/state/cursor.store");
  startAgent("agent2.log");
  INFO(agentLog("agent2.log"));
  REQUIRE(eventually([&] { return !fs::exists(root_ + "/gone"); }));
  CHECK_THAT(agentLog("agent2.log"), Catch::Contains("full sync"));
  CHECK(slurp(root_ + "/keep/index.html") == "k");
  CHECK(slurp(root_ + "/not-ours/file") == "left alone");
  INFO(agentLog("agent2.log"));
  REQUIRE(eventually([&] { return !status("gone").has_value(); }));
  stopAgent();
}

// The example file with kranectl, as docs/plugin-guide.md shows it.
TEST_CASE_METHOD(StaticSiteE2eTest, "kranectl applies the example file and waits until it is ready",
                 "[static-site][slow]") {
  useIsolation(GENERATE(as<std::string>{}, "process", "in_process"));
  INFO("isolation " << isolation_);
  startAgent("agent.log");
  const std::string file = runfile("examples/plugins/static_site/site.yaml");
  const std::map<std::string, std::string> env = {
      {"KRANE_SERVER", strCat("127.0.0.1:", cp_.replica(0).grpcPort())},
      {"KRANE_TOKEN", kOperatorToken}};
  auto kranectl = [&](std::vector<std::string> args) {
    args.insert(args.begin(), runfile("cli/kranectl"));
    return runCommand(args, env);
  };
  auto applied = kranectl({"apply", "-f", file});
  INFO(applied.out << applied.err);
  REQUIRE(applied.exit_code == 0);
  auto ready =
      kranectl({"status", kType, "hello", "--region", "local-1", "--wait", "--timeout", "30"});
  INFO(ready.out << ready.err << agentLog("agent.log"));
  CHECK(ready.exit_code == 0);
  CHECK(slurp(root_ + "/hello/index.html") == "<h1>Hello from Krane</h1>\n");
  CHECK(slurp(root_ + "/hello/css/site.css") == "h1 { color: teal }\n");
  auto deleted = kranectl({"delete", "-f", file});
  INFO(deleted.out << deleted.err);
  CHECK(deleted.exit_code == 0);
  INFO(agentLog("agent.log"));
  CHECK(eventually([&] { return !fs::exists(root_ + "/hello"); }));
  stopAgent();
}

}  // namespace
}  // namespace krane
