// A krane-ctrl stand-in in its own process for the rollout crash test: an engine serving
// SentinelService and SentinelRolloutService, until it is killed.
//
//   rollout_child --dsn mysql://root@127.0.0.1:PORT/db --worker NAME [--lease-ms N]
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include <CLI/CLI.hpp>

#include "common/strings.h"
#include "controlplane/db/pool.h"
#include "controlplane/feed/writer.h"
#include "controlplane/services/sentinel/sentinel.h"
#include "controlplane/services/sentinelrollout/rollout.h"
#include "controlplane/workflow/engine.h"
#include "tests/support/child_engine.h"

namespace krane::services::sentinelrollout {
namespace {

int serve(const std::string& dsn_text, const std::string& worker, int lease_ms) {
  std::shared_ptr<db::Pool> p = testing::childPool(dsn_text);
  if (!p) return 2;
  workflow::EngineOptions options = testing::childEngineOptions(worker, lease_ms);
  workflow::Engine engine(p, options);
  auto writer = std::make_shared<feed::Writer>(p, std::make_shared<feed::ResourceTables>());
  if (!engine.registerService(sentinel::sentinelService(p, writer)).ok()) return 2;
  if (!engine.registerService(sentinelRolloutService(p)).ok()) return 2;
  engine.start();
  std::printf("serving %s\n", worker.c_str());
  std::fflush(stdout);
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

}  // namespace
}  // namespace krane::services::sentinelrollout

int main(int argc, char** argv) {
  CLI::App app("rollout crash child");
  std::string dsn, worker;
  int lease_ms = 1000;
  app.add_option("--dsn", dsn)->required();
  app.add_option("--worker", worker)->required();
  app.add_option("--lease-ms", lease_ms);
  CLI11_PARSE(app, argc, argv);
  return krane::services::sentinelrollout::serve(dsn, worker, lease_ms);
}
