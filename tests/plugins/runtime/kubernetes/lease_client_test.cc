#include "plugins/runtime/kubernetes/lease_client.h"

#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "agent/leader.h"
#include "tests/support/fake_kube_api.h"
#include "tests/support/wait.h"

namespace krane::kube {
namespace {

using krane::testing::eventually;
using krane::testing::FakeKubeApi;
using Lease = agent::LeaseClient::Lease;

std::shared_ptr<Client> clientFor(const FakeKubeApi& api) {
  ClientOptions options;
  options.backoff = {std::chrono::milliseconds(1), 2.0, std::chrono::milliseconds(20), 0.5};
  auto client = Client::create(api.clusterConfig(), options);
  EXPECT_TRUE(client.ok()) << client.status();
  return std::shared_ptr<Client>(std::move(*client));
}

TEST(MicroTime, RoundTripsWithMicroseconds) {
  const auto t = std::chrono::system_clock::time_point(std::chrono::microseconds(1795851305123456));
  const std::string text = formatMicroTime(t);
  EXPECT_EQ(text, "2026-11-28T07:35:05.123456Z");
  auto back = parseMicroTime(text);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, t);
  auto offset = parseMicroTime("2026-11-28T09:35:05+02:00");
  ASSERT_TRUE(offset.ok());
  EXPECT_EQ(*offset, std::chrono::system_clock::time_point(std::chrono::seconds(1795851305)));
  EXPECT_FALSE(parseMicroTime("yesterday").ok());
}

TEST(KubernetesLeaseClient, CreateThenCompareAndSwap) {
  FakeKubeApi api;
  auto client = clientFor(api);
  KubernetesLeaseClient leases(client, "kube-system", "krane-eu-west");
  EXPECT_TRUE(absl::IsNotFound(leases.get().status()));

  const auto now = std::chrono::system_clock::now();
  ASSERT_TRUE(leases.write({"agent-a", now, std::chrono::seconds(15), ""}, "").ok());
  auto stored = api.object("coordination.k8s.io/v1", "Lease", "kube-system", "krane-eu-west");
  ASSERT_TRUE(stored.has_value());
  EXPECT_EQ((*stored)["spec"]["holderIdentity"], "agent-a");
  EXPECT_EQ((*stored)["spec"]["leaseDurationSeconds"], 15);

  auto lease = leases.get();
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_EQ(lease->holder, "agent-a");
  EXPECT_EQ(lease->duration, std::chrono::seconds(15));
  EXPECT_LT(std::chrono::abs(lease->renewed - now), std::chrono::milliseconds(1));
  EXPECT_FALSE(lease->resource_version.empty());

  // A second creator loses; so does a writer holding an old version.
  KubernetesLeaseClient other(client, "kube-system", "krane-eu-west");
  auto raced = other.write({"agent-b", now, std::chrono::seconds(15), ""}, "");
  EXPECT_TRUE(absl::IsAborted(raced)) << raced;
  ASSERT_TRUE(
      leases.write({"agent-a", now, std::chrono::seconds(15), ""}, lease->resource_version).ok());
  auto stale = other.write({"agent-b", now, std::chrono::seconds(15), ""}, lease->resource_version);
  EXPECT_TRUE(absl::IsAborted(stale)) << stale;
  EXPECT_EQ(api.object("coordination.k8s.io/v1", "Lease", "kube-system", "krane-eu-west")
                ->at("spec")
                .at("holderIdentity"),
            "agent-a");

  // A takeover from the current version counts a transition.
  auto current = other.get();
  ASSERT_TRUE(current.ok());
  ASSERT_TRUE(
      other.write({"agent-b", now, std::chrono::seconds(15), ""}, current->resource_version).ok());
  auto taken = api.object("coordination.k8s.io/v1", "Lease", "kube-system", "krane-eu-west");
  EXPECT_EQ((*taken)["spec"]["holderIdentity"], "agent-b");
  EXPECT_EQ((*taken)["spec"]["leaseTransitions"], 1);
}

TEST(KubernetesLeaseClient, TwoElectorsOneLeaderAndTakeoverWhenTheLeaderStops) {
  FakeKubeApi api;
  auto client = clientFor(api);
  auto leases_a = std::make_shared<KubernetesLeaseClient>(client, "kube-system", "krane");
  auto leases_b = std::make_shared<KubernetesLeaseClient>(client, "kube-system", "krane");
  agent::LeaseElector a(leases_a, "agent-a", std::chrono::seconds(2));
  agent::LeaseElector b(leases_b, "agent-b", std::chrono::seconds(2));
  std::atomic<int> a_gains{0};
  std::atomic<int> b_gains{0};
  a.start([&](bool leader) { a_gains += leader ? 1 : 0; });
  ASSERT_TRUE(eventually([&] { return a.isLeader(); }, std::chrono::seconds(5)));
  b.start([&](bool leader) { b_gains += leader ? 1 : 0; });

  // While a renews, b stays a standby (several renewal rounds).
  for (int i = 0; i < 30; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ASSERT_FALSE(a.isLeader() && b.isLeader()) << "never two leaders";
  }
  EXPECT_TRUE(a.isLeader());
  EXPECT_FALSE(b.isLeader());
  EXPECT_GE(api.countRequests("PUT", "/leases/krane"), 2u) << "a renews with compare-and-swap";

  a.stop();  // stops renewing
  EXPECT_FALSE(a.isLeader());
  ASSERT_TRUE(eventually([&] { return b.isLeader(); }, std::chrono::seconds(10)));
  EXPECT_EQ(b_gains.load(), 1);
  auto lease = api.object("coordination.k8s.io/v1", "Lease", "kube-system", "krane");
  ASSERT_TRUE(lease.has_value());
  EXPECT_EQ((*lease)["spec"]["holderIdentity"], "agent-b");
  EXPECT_EQ((*lease)["spec"]["leaseTransitions"], 1);
  b.stop();
  EXPECT_EQ(a_gains.load(), 1);
}

TEST(KubernetesLeaseClient, LeaderGivesUpWhenTheApiServerFailsAndRecovers) {
  FakeKubeApi api;
  auto client = clientFor(api);
  auto leases = std::make_shared<KubernetesLeaseClient>(client, "kube-system", "krane");
  agent::LeaseElector a(leases, "agent-a", std::chrono::seconds(2));
  std::atomic<int> changes{0};
  a.start([&](bool) { ++changes; });
  ASSERT_TRUE(eventually([&] { return a.isLeader(); }, std::chrono::seconds(5)));
  api.failNext(1000000, 500);
  ASSERT_TRUE(eventually([&] { return !a.isLeader(); }, std::chrono::seconds(10)))
      << "leadership is given up when renewals stop succeeding";
  api.failNext(0, 0);
  ASSERT_TRUE(eventually([&] { return a.isLeader(); }, std::chrono::seconds(10)));
  a.stop();
  EXPECT_EQ(changes.load(), 4);
}

}  // namespace
}  // namespace krane::kube
