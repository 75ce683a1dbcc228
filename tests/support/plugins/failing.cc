// Test plugin "failing": fails changes by resource id prefix, accepts the rest. For poison-event
// and retry tests.
//
// Config (each optional): retryable_prefix=P (UNAVAILABLE -> KRANE_RETRYABLE),
// invalid_prefix=P (INVALID_ARGUMENT -> KRANE_INVALID), fatal_prefix=P (INTERNAL ->
// KRANE_FATAL), types=a,b (default "failing").
#include "plugins/sdk/plugin.h"
#include "tests/support/plugins/test_config.h"

namespace krane::test_plugins {
namespace {

bool hasPrefix(const std::string& id, const std::string& prefix) {
  return !prefix.empty() && id.rfind(prefix, 0) == 0;
}

class FailingPlugin : public sdk::Plugin {
 public:
  absl::Status init(sdk::Host&, std::string_view config_text) override {
    auto config = parseConfig("failing", config_text,
                              {"retryable_prefix", "invalid_prefix", "fatal_prefix", "types"});
    if (!config.ok()) return config.status();
    config_ = *config;
    types_ = typesFrom(config_, "failing");
    return absl::OkStatus();
  }
  std::vector<std::string> resourceTypes() override { return types_; }
  absl::Status apply(const cluster::v1::Change& change) override { return check(change); }
  absl::Status remove(const cluster::v1::Change& change) override { return check(change); }

 private:
  absl::Status check(const cluster::v1::Change& change) const {
    const std::string& id = change.resource().id();
    if (hasPrefix(id, valueOr(config_, "retryable_prefix"))) {
      return absl::UnavailableError(strCat(id, " is not ready yet"));
    }
    if (hasPrefix(id, valueOr(config_, "invalid_prefix"))) {
      return absl::InvalidArgumentError(strCat(id, " can never be applied"));
    }
    if (hasPrefix(id, valueOr(config_, "fatal_prefix"))) {
      return absl::InternalError(strCat(id, " broke the plugin"));
    }
    return absl::OkStatus();
  }
  Config config_;
  std::vector<std::string> types_;
};

}  // namespace
}  // namespace krane::test_plugins

KRANE_DEFINE_PLUGIN(krane::test_plugins::FailingPlugin, "failing", "1.0.0-test");
