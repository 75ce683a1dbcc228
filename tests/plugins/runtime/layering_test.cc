// The runtime layer sits below the agent: the agent uses plugins/runtime (the Lease interface,
// the Kubernetes client), never the other way, so a runtime target can be built, tested and
// linked into a plugin without the agent. Checked on the sources and BUILD files themselves.
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "tests/support/process.h"

namespace krane {
namespace {

// Every source and BUILD file of the runtime packages, as listed in their `layer_files`.
std::vector<std::filesystem::path> layerFiles() {
  std::vector<std::filesystem::path> files;
  for (const char* package :
       {"plugins/runtime", "plugins/runtime/kubernetes", "plugins/runtime/process"}) {
    const std::filesystem::path dir = testing::runfile(package);
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      if (entry.is_regular_file()) files.push_back(entry.path());
    }
  }
  return files;
}

TEST_CASE("no runtime source includes an agent header and no runtime target depends on //agent",
          "[layering]") {
  const auto files = layerFiles();
  REQUIRE(files.size() > 20);  // the packages were found, not an empty directory
  bool saw_lease_client = false;
  for (const auto& path : files) {
    std::ifstream in(path);
    REQUIRE(in.good());
    std::stringstream text;
    text << in.rdbuf();
    const std::string contents = text.str();
    INFO(path.string());
    CHECK(contents.find("#include \"agent/") == std::string::npos);
    CHECK(contents.find("\"//agent") == std::string::npos);
    if (path.filename() == "lease_client.h") saw_lease_client = true;
  }
  CHECK(saw_lease_client);
}

}  // namespace
}  // namespace krane
