#include "tests/schema/generators.h"

namespace krane::schema {

const std::vector<Generator>& generators() {
  static const std::vector<Generator> list = {
      {"sentinel", &sentinelObjects}, {"cilium", &ciliumObjects},
      // The deployment plugin's objects (Deployment, Service, HorizontalPodAutoscaler,
      // NetworkPolicy, Namespace from //plugins/deployment) join as {"deployment",
      // &deploymentObjects}, with deploymentObjects() in deployment_objects.cc.
  };
  return list;
}

}  // namespace krane::schema
