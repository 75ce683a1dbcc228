// Test plugin "slow": sleeps `apply_ms` milliseconds in every apply and remove, then succeeds.
// Stands in for a slow cluster (timeouts, parallelism, back-pressure).
//
// Config: apply_ms=N (default 100), types=a,b (default "slow").
#include <chrono>
#include <thread>

#include "plugins/sdk/plugin.h"
#include "tests/support/plugins/test_config.h"

namespace krane::test_plugins {
namespace {

class SlowPlugin : public sdk::Plugin {
 public:
  absl::Status init(sdk::Host&, std::string_view config_text) override {
    auto config = parseConfig("slow", config_text, {"apply_ms", "types"});
    if (!config.ok()) return config.status();
    const std::string ms = valueOr(*config, "apply_ms", "100");
    try {
      delay_ = std::chrono::milliseconds(std::stoul(ms));
    } catch (const std::exception&) {
      return absl::InvalidArgumentError(strCat("slow: apply_ms=", ms, " is not a number"));
    }
    types_ = typesFrom(*config, "slow");
    return absl::OkStatus();
  }
  std::vector<std::string> resourceTypes() override { return types_; }
  absl::Status apply(const cluster::v1::Change&) override { return wait(); }
  absl::Status remove(const cluster::v1::Change&) override { return wait(); }

 private:
  absl::Status wait() {
    std::this_thread::sleep_for(delay_);
    return absl::OkStatus();
  }
  std::chrono::milliseconds delay_{100};
  std::vector<std::string> types_;
};

}  // namespace
}  // namespace krane::test_plugins

KRANE_DEFINE_PLUGIN(krane::test_plugins::SlowPlugin, "slow", "1.0.0-test");
