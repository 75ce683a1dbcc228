#include "agent/leader.h"

#include <signal.h>

#include <fstream>
#include <map>
#include <optional>
#include <thread>

#include <catch2/catch.hpp>

#include "common/strings.h"
#include "tests/support/process.h"
#include "tests/support/wait.h"

namespace krane::agent {
namespace {

using krane::testing::eventually;

std::string fileText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST_CASE("a standby takes over when the leader is killed", "[file-lock-elector]") {
  const std::string dir = std::getenv("TEST_TMPDIR");
  const std::string log = dir + "/holder.log";
  krane::testing::ChildProcess holder({krane::testing::runfile("tests/agent/leader_holder"), dir},
                                      log);
  REQUIRE(eventually([&] { return fileText(log).find("leader") != std::string::npos; },
                     std::chrono::seconds(10)));
  CHECK_THAT(FileLockElector::holder(dir), Catch::Contains(strCat("holder ", holder.pid())));

  FileLockElector standby(dir, "standby", std::chrono::milliseconds(20));
  std::atomic<int> became_leader{0};
  standby.start([&](bool leader) { became_leader += leader ? 1 : 0; });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  INFO("only one leader while the holder lives");
  CHECK_FALSE(standby.isLeader());

  const auto killed = std::chrono::steady_clock::now();
  holder.signal(SIGKILL);
  holder.wait();
  REQUIRE(eventually([&] { return standby.isLeader(); }, std::chrono::seconds(2)));
  const auto takeover = std::chrono::steady_clock::now() - killed;
  INFO("bounded by the poll interval");
  CHECK(takeover < std::chrono::seconds(1));
  CHECK(became_leader.load() == 1);
  CHECK_THAT(FileLockElector::holder(dir), Catch::Contains("standby"));
  standby.stop();
  CHECK_FALSE(standby.isLeader());
}

// A lease store with compare-and-swap, as the Kubernetes API server behaves.
class FakeLeases : public LeaseClient {
 public:
  absl::StatusOr<Lease> get() override {
    std::lock_guard lock(mutex);
    if (!lease) return absl::NotFoundError("no lease");
    return *lease;
  }
  absl::Status write(const Lease& next, const std::string& expected) override {
    std::lock_guard lock(mutex);
    if (down) return absl::UnavailableError("api server down");
    if (lease && lease->resource_version != expected) return absl::AbortedError("conflict");
    lease = next;
    lease->resource_version = strCat(++version);
    return absl::OkStatus();
  }
  std::mutex mutex;
  std::optional<Lease> lease;
  int version = 0;
  bool down = false;
};

TEST_CASE("one holder at a time and takeover after expiry", "[lease-elector]") {
  auto leases = std::make_shared<FakeLeases>();
  LeaseElector a(leases, "a", std::chrono::seconds(3));
  LeaseElector b(leases, "b", std::chrono::seconds(3));
  a.tick();
  b.tick();
  CHECK(a.isLeader());
  CHECK_FALSE(b.isLeader());
  // a stops renewing (it died): b must wait for the lease to expire, then takes it.
  leases->lease->renewed -= std::chrono::seconds(4);
  b.tick();
  CHECK(b.isLeader());
  CHECK(leases->lease->holder == "b");
}

TEST_CASE("stopping releases the lease so a standby takes over at once", "[lease-elector]") {
  auto leases = std::make_shared<FakeLeases>();
  LeaseElector a(leases, "a", std::chrono::seconds(60));
  LeaseElector b(leases, "b", std::chrono::seconds(60));
  a.tick();
  b.tick();
  REQUIRE(a.isLeader());
  a.stop();
  CHECK_FALSE(a.isLeader());
  b.tick();  // no waiting out the 60 s
  CHECK(b.isLeader());
  CHECK(leases->lease->holder == "b");
}

TEST_CASE("gives leadership up when renewals fail", "[lease-elector]") {
  auto leases = std::make_shared<FakeLeases>();
  LeaseElector a(leases, "a", std::chrono::seconds(1));
  a.tick();
  REQUIRE(a.isLeader());
  leases->down = true;
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  a.tick();
  INFO("stops applying before the lease could expire for others");
  CHECK_FALSE(a.isLeader());
}

}  // namespace
}  // namespace krane::agent
