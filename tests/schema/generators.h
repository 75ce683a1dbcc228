// Every Kubernetes object Krane's plugins generate, over the field combinations that matter, for
// validation against the upstream schemas (schema_test.cc).
//
// A plugin's objects come from one Generator: a function rendering them for the variants of its
// resource that change what is generated (optional fields set or not, zero replicas, odd ids,
// ...). The list is in generators.cc; a plugin joins it with one entry there, plus its
// generator's source file in BUILD.bazel.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace krane::schema {

struct GeneratedObject {
  std::string origin;  // which variant made it, for messages: "sentinel standby: Deployment"
  nlohmann::json object;
};

struct Generator {
  std::string plugin;
  std::vector<GeneratedObject> (*render)();
};

const std::vector<Generator>& generators();

// The generators' functions, one per plugin (sentinel_objects.cc, cilium_objects.cc,
// deployment_objects.cc).
std::vector<GeneratedObject> sentinelObjects();
std::vector<GeneratedObject> ciliumObjects();
std::vector<GeneratedObject> deploymentObjects();

}  // namespace krane::schema
