// The routes file: what a sentinel's routing proxy sends traffic to. The agent's sentinel plugin
// writes it (replacing it in one step, see common/files.h replaceFile) and the proxy watches it.
//
//   {"deployment_id": "dep_123",                     the live deployment these endpoints are of
//    "endpoints": ["127.0.0.1:20001", "10.0.3.7:8080"]}   host:port of its ready instances
//
// Unknown keys are ignored, so a newer writer can add some. Depends on nothing of Krane but
// common/ (the proxy is a small program of its own).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace krane::sentinel {

// The key of a routes ConfigMap (Kubernetes) that holds the document.
inline constexpr char kRoutesKey[] = "routes.json";

struct Endpoint {
  std::string host;
  int port = 0;
  std::string address() const;  // host:port
  bool operator==(const Endpoint& other) const = default;
};

struct Routes {
  std::string deployment_id;
  std::vector<Endpoint> endpoints;
  bool operator==(const Routes& other) const = default;
};

// INVALID_ARGUMENT naming the field ("routes.endpoints[1]: ...") for a document that is not a
// routes file.
absl::StatusOr<Routes> parseRoutes(std::string_view text);
std::string routesJson(const Routes& routes);

// The routes document a ConfigMap holds under kRoutesKey; INVALID_ARGUMENT naming the key when
// it has none.
absl::StatusOr<std::string> routesDocumentOf(const nlohmann::json& config_map);

// "host:port" (port 1-65535) as an endpoint; INVALID_ARGUMENT otherwise.
absl::StatusOr<Endpoint> parseEndpoint(std::string_view address);

}  // namespace krane::sentinel
