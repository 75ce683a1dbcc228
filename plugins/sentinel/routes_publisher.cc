#include "plugins/sentinel/routes_publisher.h"

#include <algorithm>
#include <filesystem>

#include "common/files.h"
#include "common/strings.h"
#include "nlohmann/json.hpp"
#include "plugins/runtime/process/process_runtime.h"
#include "spdlog/spdlog.h"

namespace krane::sentinel {

namespace fs = std::filesystem;
using nlohmann::json;

Routes nextRoutes(const Routes& published, const std::string& live, const std::string& rolling,
                  const EndpointsOf& endpoints_of) {
  Routes next;
  next.deployment_id = live;
  if (!live.empty()) next.endpoints = endpoints_of(live);
  if (!live.empty() && next.endpoints.empty() && !published.deployment_id.empty() &&
      published.deployment_id != live) {
    // Switching to a deployment with no ready instance yet: keep the previous one meanwhile.
    auto previous = endpoints_of(published.deployment_id);
    if (!previous.empty()) {
      next.deployment_id = published.deployment_id;
      next.endpoints = std::move(previous);
    }
  }
  // A rolling deploy: the new deployment's ready instances take traffic as they come up.
  if (!rolling.empty() && rolling != next.deployment_id) {
    for (auto& e : endpoints_of(rolling)) {
      if (std::find(next.endpoints.begin(), next.endpoints.end(), e) == next.endpoints.end()) {
        next.endpoints.push_back(std::move(e));
      }
    }
  }
  return next;
}

RoutesPublisher::RoutesPublisher(RoutesPublisherOptions options) : options_(std::move(options)) {
  std::error_code ec;
  fs::create_directories(options_.routes_dir, ec);
  if (ec) spdlog::error("sentinel plugin: cannot create {}: {}", options_.routes_dir, ec.message());
  // What an earlier host published stays current until the sentinels are applied again.
  for (const auto& entry : fs::directory_iterator(options_.routes_dir, ec)) {
    if (entry.path().extension() != ".json") continue;
    auto text = readFile(entry.path().string(), "routes file");
    if (!text.ok()) continue;
    auto routes = parseRoutes(*text);
    if (!routes.ok()) continue;
    Sentinel& s = sentinels_[entry.path().stem().string()];
    s.live = routes->deployment_id;
    s.published = *std::move(routes);
    s.written = true;
  }
}

RoutesPublisher::~RoutesPublisher() { stop(); }

void RoutesPublisher::start() {
  std::lock_guard lock(mutex_);
  if (thread_.joinable()) return;
  stopping_ = false;
  thread_ = std::thread([this] { loop(); });
}

void RoutesPublisher::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::string RoutesPublisher::routesFile(const std::string& sentinel_id) const {
  // Sentinel ids are 1-64 of [A-Za-z0-9._:-] (the feed checks): safe as a file name.
  return strCat(options_.routes_dir, "/", sentinel_id, ".json");
}

void RoutesPublisher::setLive(const std::string& sentinel_id, const std::string& deployment_id,
                              const std::string& rolling_deployment_id) {
  std::lock_guard lock(mutex_);
  Sentinel& s = sentinels_[sentinel_id];
  s.live = deployment_id;
  s.rolling = rolling_deployment_id;
  publishLocked(sentinel_id, s);
}

void RoutesPublisher::forget(const std::string& sentinel_id) {
  std::lock_guard lock(mutex_);
  sentinels_.erase(sentinel_id);
  std::error_code ec;
  fs::remove(routesFile(sentinel_id), ec);
}

void RoutesPublisher::publishAll() {
  std::lock_guard lock(mutex_);
  for (auto& [id, s] : sentinels_) publishLocked(id, s);
}

std::vector<Endpoint> RoutesPublisher::endpointsOf(const std::string& deployment_id) const {
  std::vector<Endpoint> out;
  if (deployment_id.empty() || options_.deployment_state_dir.empty()) return out;
  auto text = readFile(
      runtime::endpointsFile(options_.deployment_state_dir, strCat("deployment/", deployment_id)),
      "endpoints file");
  if (!text.ok()) return out;
  const json doc = json::parse(*text, nullptr, false);
  if (!doc.is_object() || !doc.value("endpoints", json()).is_array()) return out;
  for (const auto& e : doc["endpoints"]) {
    if (!e.is_string()) continue;
    if (auto endpoint = parseEndpoint(e.get<std::string>()); endpoint.ok()) {
      out.push_back(*std::move(endpoint));
    }
  }
  return out;
}

void RoutesPublisher::publishLocked(const std::string& id, Sentinel& s) {
  Routes next = nextRoutes(s.published, s.live, s.rolling,
                           [this](const std::string& d) { return endpointsOf(d); });
  if (s.written && next == s.published) return;
  if (auto st = replaceFile(routesFile(id), routesJson(next)); !st.ok()) {
    spdlog::error("sentinel plugin: sentinel={} cannot write its routes: {}", id,
                  std::string(st.message()));
    return;  // tried again next round
  }
  spdlog::info("sentinel plugin: sentinel={} routes to deployment={} ({} endpoints){}", id,
               next.deployment_id.empty() ? "-" : next.deployment_id, next.endpoints.size(),
               next.deployment_id != s.live ? strCat(", until ", s.live, " has a ready one") : "");
  s.published = std::move(next);
  s.written = true;
}

void RoutesPublisher::loop() {
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    wake_.wait_for(lock, options_.poll, [this] { return stopping_; });
    if (stopping_) break;
    for (auto& [id, s] : sentinels_) publishLocked(id, s);
  }
}

}  // namespace krane::sentinel
