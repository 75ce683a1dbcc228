#include "agent/leader.h"

#include <signal.h>

#include <condition_variable>
#include <fstream>
#include <map>
#include <optional>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "common/strings.h"
#include "tests/support/fake_leases.h"
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
  REQUIRE(eventually([&] { return standby.isLeader(); }, std::chrono::seconds(10)));
  const auto takeover = std::chrono::steady_clock::now() - killed;
  {
    // The lock is polled every 20 ms: seconds would mean the standby waited for something else.
    INFO("takeover after " << std::chrono::duration<double>(takeover).count() << " s");
    CHECK(takeover < std::chrono::seconds(5));
  }
  // isLeader() turns true just before the callback runs: wait for the callback.
  CHECK(eventually([&] { return became_leader.load() == 1; }, std::chrono::seconds(10)));
  CHECK(became_leader.load() == 1);
  CHECK_THAT(FileLockElector::holder(dir), Catch::Contains("standby"));
  standby.stop();
  CHECK_FALSE(standby.isLeader());
}

using krane::testing::FakeLeases;

// A steady clock the test moves by hand.
struct FakeClock {
  std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now();
  LeaseElector::Clock clock() {
    return [this] { return now; };
  }
};

// The candidate's wall clock is an hour ahead of the holder's (or the holder's behind): the
// renewTime it reads looks an hour old although the holder renews on time.
TEST_CASE(
    "a candidate does not take a lease whose holder keeps renewing even if its renewTime "
    "looks expired",
    "[lease-elector]") {
  auto leases = std::make_shared<FakeLeases>();
  FakeClock time;
  LeaseElector a(leases, "a", std::chrono::seconds(2), time.clock());
  LeaseElector b(leases, "b", std::chrono::seconds(2), time.clock());
  a.tick();
  REQUIRE(a.isLeader());
  for (int round = 0; round < 10; ++round) {  // 7 s, several lease durations
    leases->lease->renewed = std::chrono::system_clock::now() - std::chrono::hours(1);
    b.tick();
    INFO("round " << round);
    REQUIRE_FALSE(b.isLeader());
    CHECK(leases->lease->holder == "a");
    time.now += std::chrono::milliseconds(700);
    a.tick();
    CHECK(a.isLeader());
  }
}

// The holder died, and its clock was an hour ahead: the renewTime it left looks an hour in the
// future. The candidate takes the lease once the record did not change for the record's own
// lease duration on the candidate's clock (2 s here, though the candidate's own is 60 s).
TEST_CASE(
    "a candidate takes a lease that stopped changing for its duration even if its "
    "renewTime looks far in the future",
    "[lease-elector]") {
  auto leases = std::make_shared<FakeLeases>();
  FakeClock time;
  LeaseElector a(leases, "a", std::chrono::seconds(2), time.clock());
  LeaseElector b(leases, "b", std::chrono::seconds(60), time.clock());
  a.tick();
  REQUIRE(a.isLeader());
  leases->lease->renewed = std::chrono::system_clock::now() + std::chrono::hours(1);
  b.tick();  // sees the record for the first time: counts from now
  CHECK_FALSE(b.isLeader());
  time.now += std::chrono::milliseconds(1900);
  b.tick();
  INFO("not before the lease duration passed on the candidate's clock");
  CHECK_FALSE(b.isLeader());
  CHECK(leases->lease->holder == "a");
  time.now += std::chrono::milliseconds(100);
  b.tick();
  CHECK(b.isLeader());
  CHECK(leases->lease->holder == "b");
  CHECK(leases->lease->duration == std::chrono::seconds(60));
}

TEST_CASE(
    "the holder gives leadership up at its renew deadline before a candidate may take the "
    "lease",
    "[lease-elector]") {
  auto leases = std::make_shared<FakeLeases>();
  FakeClock time;
  std::mutex mutex;
  std::vector<std::string> events;
  auto record = [&](std::string what) {
    std::lock_guard lock(mutex);
    events.push_back(std::move(what));
  };
  LeaseElector a(leases, "a", std::chrono::seconds(3), time.clock());
  LeaseElector b(leases, "b", std::chrono::seconds(3), time.clock());
  INFO("the renew deadline is shorter than the lease duration");
  CHECK(a.renewDeadline() == std::chrono::milliseconds(2000));
  a.tick();
  REQUIRE(a.isLeader());
  b.tick();
  const auto renewed = time.now;
  leases->setDown(true);  // a's renewals fail from now on
  time.now = renewed + a.renewDeadline() - std::chrono::milliseconds(1);
  a.tick();
  CHECK(a.isLeader());
  time.now = renewed + a.renewDeadline();
  a.tick();
  CHECK_FALSE(a.isLeader());
  record("a gave up");
  b.tick();
  CHECK_FALSE(b.isLeader());
  leases->setDown(false);
  time.now = renewed + std::chrono::seconds(3);
  b.tick();
  REQUIRE(b.isLeader());
  record("b took over");
  CHECK(events == std::vector<std::string>{"a gave up", "b took over"});
}

TEST_CASE("leadership lapses at the renew deadline while a renewal call hangs", "[lease-elector]") {
  auto leases = std::make_shared<FakeLeases>();
  LeaseElector a(leases, "a", std::chrono::seconds(1));
  std::atomic<int> losses{0};
  a.start([&](bool leader) { losses += leader ? 0 : 1; });
  REQUIRE(eventually([&] { return a.isLeader(); }, std::chrono::seconds(2)));
  const auto hung = std::chrono::steady_clock::now();
  leases->setHang(true);
  const bool lapsed = eventually([&] { return !a.isLeader(); }, std::chrono::seconds(3));
  const auto after = std::chrono::steady_clock::now() - hung;
  leases->setHang(false);  // before any REQUIRE: stopping joins the hanging thread
  REQUIRE(lapsed);
  INFO("given up within the renew deadline, before the 1 s lease could be taken");
  CHECK(after < std::chrono::milliseconds(900));
  CHECK(losses.load() == 1);
  a.stop();
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
  leases->setDown(true);
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  a.tick();
  INFO("stops applying before the lease could expire for others");
  CHECK_FALSE(a.isLeader());
}

}  // namespace
}  // namespace krane::agent
