// Test plugin "crashing": abort()s on a change whose resource id contains "crash", accepts
// everything else. Stands in for a plugin with a fatal bug (the host process dies).
//
// Config: types=a,b (default "crashable").
#include <cstdlib>

#include "plugins/sdk/plugin.h"
#include "tests/support/plugins/test_config.h"

namespace krane::test_plugins {
namespace {

class CrashingPlugin : public sdk::Plugin {
 public:
  absl::Status init(sdk::Host&, std::string_view config_text) override {
    auto config = parseConfig("crashing", config_text, {"types"});
    if (!config.ok()) return config.status();
    types_ = typesFrom(*config, "crashable");
    return absl::OkStatus();
  }
  std::vector<std::string> resourceTypes() override { return types_; }
  absl::Status apply(const cluster::v1::Change& change) override { return check(change); }
  absl::Status remove(const cluster::v1::Change& change) override { return check(change); }

 private:
  static absl::Status check(const cluster::v1::Change& change) {
    if (change.resource().id().find("crash") != std::string::npos) std::abort();
    return absl::OkStatus();
  }
  std::vector<std::string> types_;
};

}  // namespace
}  // namespace krane::test_plugins

KRANE_DEFINE_PLUGIN(krane::test_plugins::CrashingPlugin, "crashing", "1.0.0-test");
