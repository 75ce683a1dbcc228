// A process that uses a cursor store the way the agent or a plugin host does, for the crash and
// cross-process tests.
//
//   store_child writer --state-dir D --seed S   runs the crash workload (crash_model.h) as the
//       agent until killed, printing "done <seq>" after every 1024 operations.
//   store_child host --state-dir D --plugin P   heartbeats slot P as its host and acknowledges the
//       version the agent recorded for resource ("echo", "probe").
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include <CLI/CLI.hpp>

#include "ipc/cursor_store.h"
#include "tests/ipc/crash_model.h"

namespace krane::ipc::testing {
namespace {

void say(const std::string& line) {
  const std::string out = line + "\n";
  (void)::write(1, out.data(), out.size());
}

int fail(const absl::Status& status) {
  say(strCat("error: ", status.message()));
  return 2;
}

int runWriter(const std::string& state_dir, uint64_t seed, uint64_t max_resources,
              uint64_t max_ops) {
  CursorStoreOptions options;
  options.region = "crash";
  options.max_resources = max_resources;
  options.parked_capacity = 2 * kCrashKeys;
  auto opened = CursorStore::open(state_dir, options);
  if (!opened.ok()) return fail(opened.status());
  CursorStore& store = **opened;
  auto slot = store.registerPlugin(kCrashPlugin);
  if (!slot.ok()) return fail(slot.status());
  store.setPluginPid(*slot, ::getpid());
  const uint64_t start = store.watermark() + 1;
  say(strCat("start ", start, " generation ", store.generation()));
  for (uint64_t seq = start; max_ops == 0 || seq < start + max_ops; ++seq) {
    if (absl::Status s = runCrashOp(store, seed, seq); !s.ok()) return fail(s);
    store.heartbeat(*slot);
    store.ackPlugin(*slot, seq);
    store.countApplied(*slot);
    if (seq % 1024 == 0) say(strCat("done ", seq));
  }
  say("finished");
  return 0;
}

int runHost(const std::string& state_dir, const std::string& plugin, double seconds) {
  CursorStoreOptions options;
  options.mode = OpenMode::kHost;
  auto opened = CursorStore::open(state_dir, options);
  if (!opened.ok()) return fail(opened.status());
  CursorStore& store = **opened;
  auto slot = store.findPlugin(plugin);
  if (!slot.ok()) return fail(slot.status());
  store.setPluginPid(*slot, ::getpid());
  say(strCat("host ", plugin, " slot ", *slot));
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    store.heartbeat(*slot);
    store.ackPlugin(*slot, store.lastApplied("echo", "probe").value_or(0));
    store.countApplied(*slot);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return 0;
}

}  // namespace
}  // namespace krane::ipc::testing

int main(int argc, char** argv) {
  CLI::App app{"cursor store test child"};
  app.require_subcommand(1);
  std::string state_dir;
  uint64_t seed = 1;
  uint64_t max_resources = 8192;
  uint64_t max_ops = 0;
  std::string plugin;
  double seconds = 30;
  CLI::App* writer = app.add_subcommand("writer", "crash workload as the agent");
  writer->add_option("--state-dir", state_dir)->required();
  writer->add_option("--seed", seed);
  writer->add_option("--max-resources", max_resources);
  writer->add_option("--ops", max_ops, "stop after this many operations (0: never)");
  CLI::App* host = app.add_subcommand("host", "heartbeat a plugin slot as its host");
  host->add_option("--state-dir", state_dir)->required();
  host->add_option("--plugin", plugin)->required();
  host->add_option("--seconds", seconds);
  CLI11_PARSE(app, argc, argv);
  if (writer->parsed()) {
    return krane::ipc::testing::runWriter(state_dir, seed, max_resources, max_ops);
  }
  return krane::ipc::testing::runHost(state_dir, plugin, seconds);
}
