// The reporter against a real krane-ctrl: delivery, coalescing during an outage, the memory
// bound, the circuit breaker, heartbeats.
#include "agent/reporter.h"

#include <catch2/catch.hpp>

#include "common/strings.h"
#include "tests/support/control_plane.h"
#include "tests/support/matchers.h"
#include "tests/support/wait.h"

namespace krane::agent {
namespace {

using krane::testing::eventually;

using krane::testing::TestControlPlane;

cluster::v1::ReportResourceStatusRequest status(const std::string& id, const std::string& message) {
  cluster::v1::ReportResourceStatusRequest r;
  r.set_type("example.krane.dev/bucket");
  r.set_id(id);
  r.set_region("eu-1");
  r.set_phase(cluster::v1::RESOURCE_PHASE_READY);
  r.set_message(message);
  return r;
}

// The control plane stores reports only about resources it holds.
void hold(TestControlPlane& cp, const std::string& id) {
  cluster::v1::Resource r;
  r.set_type("example.krane.dev/bucket");
  r.set_id(id);
  r.set_region("eu-1");
  r.mutable_generic()->set_spec("{}");
  REQUIRE_THAT(cp.replica(0).writer().put(r), IsOk());
}

std::string storedMessage(TestControlPlane& cp, const std::string& id) {
  auto rows = (*cp.pool()->acquire())
                  ->query("SELECT message FROM resource_status WHERE resource_id = ?", {id});
  return rows->empty() ? "" : rows->rows[0].str(0);
}

ReporterOptions options(TestControlPlane& cp) {
  ReporterOptions o;
  o.region = "eu-1";
  o.agent_id = "agent-1";
  o.token = cp.agentToken("eu-1");
  o.build_version = "test";
  o.retry = {std::chrono::milliseconds(20), 2.0, std::chrono::milliseconds(100), 0.5};
  o.rpc_timeout = std::chrono::milliseconds(500);
  return o;
}

TEST_CASE("coalesces during an outage and delivers the latest after it", "[reporter]") {
  TestControlPlane cp;
  cp.startReplica();
  const int port = cp.replica(0).grpcPort();
  auto o = options(cp);
  o.breaker_failures = 3;
  o.breaker_cooldown = std::chrono::milliseconds(300);
  Reporter reporter(cp.channel(0), o, [](cluster::v1::HeartbeatRequest&) {});
  hold(cp, "a");
  reporter.start();
  reporter.report(status("a", "first"));
  REQUIRE(eventually([&] { return storedMessage(cp, "a") == "first"; }));

  cp.stopReplica(0);
  for (int i = 0; i < 100; ++i) reporter.report(status("a", strCat("update ", i)));
  INFO("the breaker opens while it is down");
  REQUIRE(eventually([&] { return reporter.stats().breaker_opened > 0; }));
  CHECK(reporter.stats().pending == 1u);  // one report per resource, however many updates
  CHECK(reporter.stats().coalesced >= 99u);

  cp.startReplica([&](ctrl::CtrlConfig& c) { c.listen = strCat("127.0.0.1:", port); });
  REQUIRE(eventually([&] { return storedMessage(cp, "a") == "update 99"; }));
  // The row is committed before the answer reaches the reporter, which then drops the report.
  CHECK(eventually([&] { return reporter.stats().pending == 0; }));
  reporter.stop();
}

TEST_CASE("memory is bounded by max pending", "[reporter]") {
  TestControlPlane cp;  // no server: nothing can be sent
  ReporterOptions o;
  o.max_pending = 10;
  o.token = "x";
  o.rpc_timeout = std::chrono::milliseconds(100);
  Reporter reporter(grpc::CreateChannel("127.0.0.1:1", grpc::InsecureChannelCredentials()), o,
                    [](cluster::v1::HeartbeatRequest&) {});
  for (int i = 0; i < 15; ++i) reporter.report(status(strCat("r", i), "x"));
  CHECK(reporter.stats().pending == 10u);
  CHECK(reporter.stats().dropped == 5u);
}

TEST_CASE("invalid reports are not retried forever", "[reporter]") {
  TestControlPlane cp;
  cp.startReplica();
  Reporter reporter(cp.channel(), options(cp), [](cluster::v1::HeartbeatRequest&) {});
  reporter.start();
  auto wrong = status("a", "x");
  wrong.set_region("us-1");  // this token is for eu-1
  reporter.report(wrong);
  hold(cp, "b");
  reporter.report(status("b", "fine"));
  REQUIRE(eventually([&] { return storedMessage(cp, "b") == "fine"; }));
  REQUIRE(eventually([&] { return reporter.stats().rejected == 1; }));
  // The stored report leaves the queue once its answer is handled, just after the row is visible.
  CHECK(eventually([&] { return reporter.stats().pending == 0u; }));
  reporter.stop();
}

TEST_CASE("heartbeats carry the watermark", "[reporter]") {
  TestControlPlane cp;
  auto& server = cp.startReplica();
  for (int i = 0; i < 6; ++i) {
    cluster::v1::Resource r;
    r.set_type("example.krane.dev/bucket");
    r.set_id(strCat("b", i));
    r.set_region("eu-1");
    r.mutable_generic();
    REQUIRE_THAT(server.writer().put(r), IsOk());
  }
  std::atomic<uint64_t> applied{2};
  Reporter reporter(cp.channel(), options(cp), [&](cluster::v1::HeartbeatRequest& beat) {
    beat.set_applied_version(applied);
    beat.set_is_leader(true);
  });
  reporter.start();
  reporter.beatNow();
  auto lag = [&]() -> int64_t {
    auto rows = (*cp.pool()->acquire())
                    ->query("SELECT applied_version FROM agents WHERE agent_id = 'agent-1'", {});
    return rows->empty() ? -1 : static_cast<int64_t>(rows->rows[0].u64(0));
  };
  REQUIRE(eventually([&] { return lag() == 2; }));
  applied = 6;
  reporter.beatNow();
  REQUIRE(eventually([&] { return lag() == 6; }));
  reporter.stop();
}

}  // namespace
}  // namespace krane::agent
