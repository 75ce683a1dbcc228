#include "plugins/runtime/kubernetes/lease_client.h"

#include <thread>

#include <catch2/catch.hpp>

#include "agent/leader.h"
#include "tests/support/fake_kube_api.h"
#include "tests/support/matchers.h"
#include "tests/support/wait.h"

namespace krane::kube {
namespace {

using krane::testing::eventually;
using krane::testing::FakeKubeApi;
using Lease = runtime::LeaseClient::Lease;

std::shared_ptr<Client> clientFor(const FakeKubeApi& api) {
  ClientOptions options;
  options.backoff = {std::chrono::milliseconds(1), 2.0, std::chrono::milliseconds(20), 0.5};
  auto client = Client::create(api.clusterConfig(), options);
  CHECK_THAT(client, IsOk());
  return std::shared_ptr<Client>(std::move(*client));
}

TEST_CASE("round trips with microseconds", "[micro-time]") {
  const auto t = std::chrono::system_clock::time_point(std::chrono::microseconds(1795851305123456));
  const std::string text = formatMicroTime(t);
  CHECK(text == "2026-11-28T07:35:05.123456Z");
  auto back = parseMicroTime(text);
  REQUIRE_THAT(back, IsOk());
  CHECK(*back == t);
  auto offset = parseMicroTime("2026-11-28T09:35:05+02:00");
  REQUIRE_THAT(offset, IsOk());
  CHECK(*offset == std::chrono::system_clock::time_point(std::chrono::seconds(1795851305)));
  CHECK_FALSE(parseMicroTime("yesterday").ok());
}

TEST_CASE("create then compare and swap", "[kubernetes-lease-client]") {
  FakeKubeApi api;
  auto client = clientFor(api);
  KubernetesLeaseClient leases(client, "kube-system", "krane-eu-west");
  CHECK(absl::IsNotFound(leases.get().status()));

  const auto now = std::chrono::system_clock::now();
  REQUIRE_THAT(leases.write({"agent-a", now, std::chrono::seconds(15), ""}, ""), IsOk());
  auto stored = api.object("coordination.k8s.io/v1", "Lease", "kube-system", "krane-eu-west");
  REQUIRE(stored.has_value());
  CHECK((*stored)["spec"]["holderIdentity"] == "agent-a");
  CHECK((*stored)["spec"]["leaseDurationSeconds"] == 15);

  auto lease = leases.get();
  REQUIRE_THAT(lease, IsOk());
  CHECK(lease->holder == "agent-a");
  CHECK(lease->duration == std::chrono::seconds(15));
  CHECK(std::chrono::abs(lease->renewed - now) < std::chrono::milliseconds(1));
  CHECK_FALSE(lease->resource_version.empty());

  // A second creator loses; so does a writer holding an old version.
  KubernetesLeaseClient other(client, "kube-system", "krane-eu-west");
  auto raced = other.write({"agent-b", now, std::chrono::seconds(15), ""}, "");
  INFO(raced);
  CHECK(absl::IsAborted(raced));
  REQUIRE_THAT(
      leases.write({"agent-a", now, std::chrono::seconds(15), ""}, lease->resource_version),
      IsOk());
  auto stale = other.write({"agent-b", now, std::chrono::seconds(15), ""}, lease->resource_version);
  INFO(stale);
  CHECK(absl::IsAborted(stale));
  CHECK(api.object("coordination.k8s.io/v1", "Lease", "kube-system", "krane-eu-west")
            ->at("spec")
            .at("holderIdentity") == "agent-a");

  // A takeover from the current version counts a transition.
  auto current = other.get();
  REQUIRE_THAT(current, IsOk());
  REQUIRE_THAT(
      other.write({"agent-b", now, std::chrono::seconds(15), ""}, current->resource_version),
      IsOk());
  auto taken = api.object("coordination.k8s.io/v1", "Lease", "kube-system", "krane-eu-west");
  CHECK((*taken)["spec"]["holderIdentity"] == "agent-b");
  CHECK((*taken)["spec"]["leaseTransitions"] == 1);
}

TEST_CASE("two electors one leader and takeover when the leader stops",
          "[kubernetes-lease-client]") {
  FakeKubeApi api;
  auto client = clientFor(api);
  auto leases_a = std::make_shared<KubernetesLeaseClient>(client, "kube-system", "krane");
  auto leases_b = std::make_shared<KubernetesLeaseClient>(client, "kube-system", "krane");
  agent::LeaseElector a(leases_a, "agent-a", std::chrono::seconds(2));
  agent::LeaseElector b(leases_b, "agent-b", std::chrono::seconds(2));
  std::atomic<int> a_gains{0};
  std::atomic<int> b_gains{0};
  a.start([&](bool leader) { a_gains += leader ? 1 : 0; });
  REQUIRE(eventually([&] { return a.isLeader(); }, std::chrono::seconds(5)));
  b.start([&](bool leader) { b_gains += leader ? 1 : 0; });

  // While a renews, b stays a standby (several renewal rounds).
  for (int i = 0; i < 30; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    INFO("never two leaders");
    REQUIRE_FALSE((a.isLeader() && b.isLeader()));
  }
  CHECK(a.isLeader());
  CHECK_FALSE(b.isLeader());
  INFO("a renews with compare-and-swap");
  CHECK(api.countRequests("PUT", "/leases/krane") >= 2u);

  a.stop();  // stops renewing
  CHECK_FALSE(a.isLeader());
  REQUIRE(eventually([&] { return b.isLeader(); }, std::chrono::seconds(10)));
  CHECK(b_gains.load() == 1);
  auto lease = api.object("coordination.k8s.io/v1", "Lease", "kube-system", "krane");
  REQUIRE(lease.has_value());
  CHECK((*lease)["spec"]["holderIdentity"] == "agent-b");
  CHECK((*lease)["spec"]["leaseTransitions"] == 1);
  b.stop();
  CHECK(a_gains.load() == 1);
}

TEST_CASE("leader gives up when the api server fails and recovers", "[kubernetes-lease-client]") {
  FakeKubeApi api;
  auto client = clientFor(api);
  auto leases = std::make_shared<KubernetesLeaseClient>(client, "kube-system", "krane");
  agent::LeaseElector a(leases, "agent-a", std::chrono::seconds(2));
  std::atomic<int> changes{0};
  a.start([&](bool) { ++changes; });
  REQUIRE(eventually([&] { return a.isLeader(); }, std::chrono::seconds(5)));
  api.failNext(1000000, 500);
  INFO("leadership is given up when renewals stop succeeding");
  REQUIRE(eventually([&] { return !a.isLeader(); }, std::chrono::seconds(10)));
  api.failNext(0, 0);
  REQUIRE(eventually([&] { return a.isLeader(); }, std::chrono::seconds(10)));
  a.stop();
  CHECK(changes.load() == 4);
}

}  // namespace
}  // namespace krane::kube
