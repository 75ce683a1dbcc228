// A krane-ctrl stand-in in its own process for the deploy crash test: an engine serving the
// deploy workflow and the services it calls, until it is killed.
//
//   deploy_child --dsn mysql://root@127.0.0.1:PORT/db --worker NAME --log-dir DIR [--lease-ms N]
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include <CLI/CLI.hpp>

#include "common/strings.h"
#include "controlplane/db/pool.h"
#include "controlplane/feed/writer.h"
#include "controlplane/services/buildslot/buildslot.h"
#include "controlplane/services/deploy/deploy.h"
#include "controlplane/services/routing/routing.h"
#include "controlplane/workflow/engine.h"
#include "tests/support/child_engine.h"

namespace krane::services::deploy {
namespace {

int serve(const std::string& dsn_text, const std::string& worker, const std::string& log_dir,
          int lease_ms) {
  std::shared_ptr<db::Pool> p = testing::childPool(dsn_text);
  if (!p) return 2;
  workflow::EngineOptions options = testing::childEngineOptions(worker, lease_ms);
  workflow::Engine engine(p, options);
  DeployDependencies deps{
      p, std::make_shared<feed::Writer>(p, std::make_shared<feed::ResourceTables>()),
      std::make_shared<builder::PrebuiltBuilder>(),
      std::make_shared<builder::CommandBuilder>(
          builder::CommandBuilderOptions{.log_dir = log_dir})};
  for (auto& service : deployServices(deps)) {
    if (!engine.registerService(std::move(service)).ok()) return 2;
  }
  engine.start();
  std::printf("serving %s\n", worker.c_str());
  std::fflush(stdout);
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

}  // namespace
}  // namespace krane::services::deploy

int main(int argc, char** argv) {
  CLI::App app("deploy crash child");
  std::string dsn, worker, log_dir;
  int lease_ms = 1000;
  app.add_option("--dsn", dsn)->required();
  app.add_option("--worker", worker)->required();
  app.add_option("--log-dir", log_dir)->required();
  app.add_option("--lease-ms", lease_ms);
  CLI11_PARSE(app, argc, argv);
  return krane::services::deploy::serve(dsn, worker, log_dir, lease_ms);
}
