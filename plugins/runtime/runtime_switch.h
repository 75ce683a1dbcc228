// A plugin that serves its resource types on the runtime its configuration names:
//
//   {"runtime": "process" (the default) | "kubernetes", "process": {...}, "kubernetes": {...}}
//
// Both sections may be present; the chosen runtime's plugin reads its own and refuses unknown
// keys by path. Everything else is forwarded to that plugin.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "nlohmann/json.hpp"
#include "plugins/sdk/plugin.h"

namespace krane::runtime {

template <typename ProcessPlugin, typename KubePlugin>
class RuntimeSwitch : public sdk::Plugin {
 public:
  explicit RuntimeSwitch(std::string name) : name_(std::move(name)) {}

  absl::Status init(sdk::Host& host, std::string_view config) override {
    const auto parsed =
        nlohmann::json::parse(config.empty() ? std::string_view("{}") : config, nullptr, false);
    std::string runtime = "process";
    if (parsed.is_object() && parsed.contains("runtime")) {
      if (!parsed["runtime"].is_string()) {
        return absl::InvalidArgumentError(name_ + " config: runtime: must be a string");
      }
      runtime = parsed["runtime"].template get<std::string>();
    }
    if (runtime == "process") {
      impl_ = std::make_unique<ProcessPlugin>();
    } else if (runtime == "kubernetes") {
      impl_ = std::make_unique<KubePlugin>();
    } else {
      return absl::InvalidArgumentError(name_ + " config: runtime: \"" + runtime +
                                        "\" is not one of process, kubernetes");
    }
    return impl_->init(host, config);
  }
  std::vector<std::string> resourceTypes() override { return impl_->resourceTypes(); }
  absl::Status apply(const cluster::v1::Change& change) override { return impl_->apply(change); }
  absl::Status remove(const cluster::v1::Change& change) override { return impl_->remove(change); }
  absl::Status syncBegin(uint64_t snapshot_version) override {
    return impl_->syncBegin(snapshot_version);
  }
  absl::Status syncEnd(const plugin::v1::SyncEnd& sync_end) override {
    return impl_->syncEnd(sync_end);
  }
  absl::Status observe() override { return impl_->observe(); }
  void shutdown() override {
    if (impl_) impl_->shutdown();
  }

 private:
  const std::string name_;
  std::unique_ptr<sdk::Plugin> impl_;
};

}  // namespace krane::runtime
