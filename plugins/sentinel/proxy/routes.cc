#include "plugins/sentinel/proxy/routes.h"

#include <charconv>

#include "common/strings.h"
#include "nlohmann/json.hpp"

namespace krane::sentinel {

using nlohmann::json;

std::string Endpoint::address() const { return strCat(host, ":", port); }

absl::StatusOr<Endpoint> parseEndpoint(std::string_view address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string_view::npos || colon == 0) {
    return absl::InvalidArgumentError(strCat("\"", address, "\" is not host:port"));
  }
  Endpoint e;
  e.host = std::string(address.substr(0, colon));
  const std::string_view port = address.substr(colon + 1);
  const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), e.port);
  if (ec != std::errc() || end != port.data() + port.size() || e.port < 1 || e.port > 65535) {
    return absl::InvalidArgumentError(strCat("\"", address, "\": port must be 1-65535"));
  }
  return e;
}

absl::StatusOr<Routes> parseRoutes(std::string_view text) {
  const json doc = json::parse(text, nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) {
    return absl::InvalidArgumentError("routes: not a JSON object");
  }
  Routes routes;
  if (doc.contains("deployment_id")) {
    if (!doc["deployment_id"].is_string()) {
      return absl::InvalidArgumentError("routes.deployment_id: must be a string");
    }
    routes.deployment_id = doc["deployment_id"].get<std::string>();
  }
  const json endpoints = doc.value("endpoints", json::array());
  if (!endpoints.is_array()) {
    return absl::InvalidArgumentError("routes.endpoints: must be a list of \"host:port\"");
  }
  for (size_t i = 0; i < endpoints.size(); ++i) {
    const std::string at = strCat("routes.endpoints[", i, "]: ");
    if (!endpoints[i].is_string()) {
      return absl::InvalidArgumentError(strCat(at, "must be a string \"host:port\""));
    }
    auto e = parseEndpoint(endpoints[i].get<std::string>());
    if (!e.ok()) return absl::InvalidArgumentError(strCat(at, e.status().message()));
    routes.endpoints.push_back(*std::move(e));
  }
  return routes;
}

std::string routesJson(const Routes& routes) {
  json endpoints = json::array();
  for (const auto& e : routes.endpoints) endpoints.push_back(e.address());
  return json{{"deployment_id", routes.deployment_id}, {"endpoints", endpoints}}.dump();
}

absl::StatusOr<std::string> routesDocumentOf(const nlohmann::json& config_map) {
  const nlohmann::json data = config_map.value("data", nlohmann::json::object());
  if (!data.is_object() || !data.contains(kRoutesKey) || !data[kRoutesKey].is_string()) {
    return absl::InvalidArgumentError(strCat("data.", kRoutesKey, ": missing"));
  }
  return data[kRoutesKey].get<std::string>();
}

}  // namespace krane::sentinel
