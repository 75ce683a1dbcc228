#include "plugins/runtime/kubernetes/resources.h"

#include <catch2/catch.hpp>

#include "tests/support/matchers.h"

namespace krane::kube {
namespace {

TEST_CASE("paths of core and group kinds namespaced and cluster scoped", "[resources]") {
  auto deployment = resourceFor("apps/v1", "Deployment");
  REQUIRE_THAT(deployment, IsOk());
  CHECK(deployment->objectPath("ns1", "web") == "/apis/apps/v1/namespaces/ns1/deployments/web");
  CHECK(deployment->collectionPath("") == "/apis/apps/v1/deployments");

  auto service = resourceFor("v1", "Service");
  REQUIRE_THAT(service, IsOk());
  CHECK(service->objectPath("ns1", "web") == "/api/v1/namespaces/ns1/services/web");

  auto ns = resourceFor("v1", "Namespace");
  REQUIRE_THAT(ns, IsOk());
  CHECK_FALSE(ns->namespaced);
  CHECK(ns->objectPath("ignored", "team-a") == "/api/v1/namespaces/team-a");

  auto cnp = resourceFor("cilium.io/v2", "CiliumNetworkPolicy");
  REQUIRE_THAT(cnp, IsOk());
  CHECK(cnp->collectionPath("s") == "/apis/cilium.io/v2/namespaces/s/ciliumnetworkpolicies");
  auto lease = resourceFor("coordination.k8s.io/v1", "Lease");
  REQUIRE_THAT(lease, IsOk());
  CHECK(lease->objectPath("kube-system", "krane") ==
        "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/krane");
}

TEST_CASE("every kind krane plugs in is known", "[resources]") {
  for (const auto& [api_version, kind] : std::vector<std::pair<std::string, std::string>>{
           {"v1", "Namespace"},
           {"v1", "Service"},
           {"v1", "Pod"},
           {"apps/v1", "Deployment"},
           {"apps/v1", "ReplicaSet"},
           {"autoscaling/v2", "HorizontalPodAutoscaler"},
           {"networking.k8s.io/v1", "NetworkPolicy"},
           {"policy/v1", "PodDisruptionBudget"},
           {"cilium.io/v2", "CiliumNetworkPolicy"},
           {"coordination.k8s.io/v1", "Lease"}}) {
    auto type = resourceFor(api_version, kind);
    INFO(kind << ": " << type.status());
    REQUIRE_THAT(type, IsOk());
    CHECK(type->apiVersion() == api_version);
    auto back = resourceForPlural(type->group, type->version, type->plural);
    REQUIRE_THAT(back, IsOk());
    CHECK(back->kind == kind);
  }
}

TEST_CASE("another version of a known group keeps that version", "[resources]") {
  auto hpa = resourceFor("autoscaling/v1", "HorizontalPodAutoscaler");
  REQUIRE_THAT(hpa, IsOk());
  CHECK(hpa->groupVersionPath() == "/apis/autoscaling/v1");
}

TEST_CASE("unknown kinds and malformed versions are refused by name", "[resources]") {
  auto unknown = resourceFor("apps/v1", "StatefulSet");
  CHECK(absl::IsInvalidArgument(unknown.status()));
  CHECK(std::string(unknown.status().message()).find("StatefulSet") != std::string::npos);
  CHECK(absl::IsInvalidArgument(resourceFor("", "Service").status()));
  CHECK(absl::IsInvalidArgument(resourceFor("apps/", "Deployment").status()));
  INFO("Deployment is not in the core group");
  CHECK(absl::IsInvalidArgument(resourceFor("v1", "Deployment").status()));
}

}  // namespace
}  // namespace krane::kube
