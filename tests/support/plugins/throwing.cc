// Test plugin "throwing": its class throws from apply (a std::runtime_error) and from remove
// (an int, not a std::exception). The SDK must turn both into errors; nothing may unwind into
// the host.
//
// Config: types=a,b (default "throwing").
#include <stdexcept>

#include "plugins/sdk/plugin.h"
#include "tests/support/plugins/test_config.h"

namespace krane::test_plugins {
namespace {

class ThrowingPlugin : public sdk::Plugin {
 public:
  absl::Status init(sdk::Host&, std::string_view config_text) override {
    auto config = parseConfig("throwing", config_text, {"types"});
    if (!config.ok()) return config.status();
    types_ = typesFrom(*config, "throwing");
    return absl::OkStatus();
  }
  std::vector<std::string> resourceTypes() override { return types_; }
  absl::Status apply(const cluster::v1::Change& change) override {
    throw std::runtime_error(strCat("apply of ", change.resource().id(), " blew up"));
  }
  absl::Status remove(const cluster::v1::Change&) override { throw 42; }

 private:
  std::vector<std::string> types_;
};

}  // namespace
}  // namespace krane::test_plugins

KRANE_DEFINE_PLUGIN(krane::test_plugins::ThrowingPlugin, "throwing", "1.0.0-test");
