#include "agent/leader.h"

#include <signal.h>

#include <fstream>
#include <map>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

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

TEST(FileLockElector, AStandbyTakesOverWhenTheLeaderIsKilled) {
  const std::string dir = std::getenv("TEST_TMPDIR");
  const std::string log = dir + "/holder.log";
  krane::testing::ChildProcess holder({krane::testing::runfile("tests/agent/leader_holder"), dir},
                                      log);
  ASSERT_TRUE(eventually([&] { return fileText(log).find("leader") != std::string::npos; },
                         std::chrono::seconds(10)));
  EXPECT_THAT(FileLockElector::holder(dir), ::testing::HasSubstr(strCat("holder ", holder.pid())));

  FileLockElector standby(dir, "standby", std::chrono::milliseconds(20));
  std::atomic<int> became_leader{0};
  standby.start([&](bool leader) { became_leader += leader ? 1 : 0; });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(standby.isLeader()) << "only one leader while the holder lives";

  const auto killed = std::chrono::steady_clock::now();
  holder.signal(SIGKILL);
  holder.wait();
  ASSERT_TRUE(eventually([&] { return standby.isLeader(); }, std::chrono::seconds(2)));
  const auto takeover = std::chrono::steady_clock::now() - killed;
  EXPECT_LT(takeover, std::chrono::seconds(1)) << "bounded by the poll interval";
  EXPECT_EQ(became_leader.load(), 1);
  EXPECT_THAT(FileLockElector::holder(dir), ::testing::HasSubstr("standby"));
  standby.stop();
  EXPECT_FALSE(standby.isLeader());
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

TEST(LeaseElector, OneHolderAtATimeAndTakeoverAfterExpiry) {
  auto leases = std::make_shared<FakeLeases>();
  LeaseElector a(leases, "a", std::chrono::seconds(3));
  LeaseElector b(leases, "b", std::chrono::seconds(3));
  a.tick();
  b.tick();
  EXPECT_TRUE(a.isLeader());
  EXPECT_FALSE(b.isLeader());
  // a stops renewing (it died): b must wait for the lease to expire, then takes it.
  leases->lease->renewed -= std::chrono::seconds(4);
  b.tick();
  EXPECT_TRUE(b.isLeader());
  EXPECT_EQ(leases->lease->holder, "b");
}

TEST(LeaseElector, StoppingReleasesTheLeaseSoAStandbyTakesOverAtOnce) {
  auto leases = std::make_shared<FakeLeases>();
  LeaseElector a(leases, "a", std::chrono::seconds(60));
  LeaseElector b(leases, "b", std::chrono::seconds(60));
  a.tick();
  b.tick();
  ASSERT_TRUE(a.isLeader());
  a.stop();
  EXPECT_FALSE(a.isLeader());
  b.tick();  // no waiting out the 60 s
  EXPECT_TRUE(b.isLeader());
  EXPECT_EQ(leases->lease->holder, "b");
}

TEST(LeaseElector, GivesLeadershipUpWhenRenewalsFail) {
  auto leases = std::make_shared<FakeLeases>();
  LeaseElector a(leases, "a", std::chrono::seconds(1));
  a.tick();
  ASSERT_TRUE(a.isLeader());
  leases->down = true;
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  a.tick();
  EXPECT_FALSE(a.isLeader()) << "stops applying before the lease could expire for others";
}

}  // namespace
}  // namespace krane::agent
