#include "plugins/runtime/kubernetes/resources.h"

#include <gtest/gtest.h>

namespace krane::kube {
namespace {

TEST(Resources, PathsOfCoreAndGroupKindsNamespacedAndClusterScoped) {
  auto deployment = resourceFor("apps/v1", "Deployment");
  ASSERT_TRUE(deployment.ok()) << deployment.status();
  EXPECT_EQ(deployment->objectPath("ns1", "web"), "/apis/apps/v1/namespaces/ns1/deployments/web");
  EXPECT_EQ(deployment->collectionPath(""), "/apis/apps/v1/deployments");

  auto service = resourceFor("v1", "Service");
  ASSERT_TRUE(service.ok());
  EXPECT_EQ(service->objectPath("ns1", "web"), "/api/v1/namespaces/ns1/services/web");

  auto ns = resourceFor("v1", "Namespace");
  ASSERT_TRUE(ns.ok());
  EXPECT_FALSE(ns->namespaced);
  EXPECT_EQ(ns->objectPath("ignored", "team-a"), "/api/v1/namespaces/team-a");

  auto cnp = resourceFor("cilium.io/v2", "CiliumNetworkPolicy");
  ASSERT_TRUE(cnp.ok());
  EXPECT_EQ(cnp->collectionPath("s"), "/apis/cilium.io/v2/namespaces/s/ciliumnetworkpolicies");
  auto lease = resourceFor("coordination.k8s.io/v1", "Lease");
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(lease->objectPath("kube-system", "krane"),
            "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/krane");
}

TEST(Resources, EveryKindKranePlugsInIsKnown) {
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
    ASSERT_TRUE(type.ok()) << kind << ": " << type.status();
    EXPECT_EQ(type->apiVersion(), api_version);
    auto back = resourceForPlural(type->group, type->version, type->plural);
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(back->kind, kind);
  }
}

TEST(Resources, AnotherVersionOfAKnownGroupKeepsThatVersion) {
  auto hpa = resourceFor("autoscaling/v1", "HorizontalPodAutoscaler");
  ASSERT_TRUE(hpa.ok());
  EXPECT_EQ(hpa->groupVersionPath(), "/apis/autoscaling/v1");
}

TEST(Resources, UnknownKindsAndMalformedVersionsAreRefusedByName) {
  auto unknown = resourceFor("apps/v1", "StatefulSet");
  EXPECT_TRUE(absl::IsInvalidArgument(unknown.status()));
  EXPECT_NE(std::string(unknown.status().message()).find("StatefulSet"), std::string::npos);
  EXPECT_TRUE(absl::IsInvalidArgument(resourceFor("", "Service").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(resourceFor("apps/", "Deployment").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(resourceFor("v1", "Deployment").status()))
      << "Deployment is not in the core group";
}

}  // namespace
}  // namespace krane::kube
