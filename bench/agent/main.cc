// bench/agent: how fast the agent moves changes to plugins, and what its cursor store costs.
//
//   ./dev bench agent [--json] [--quick]
//
// Figures: events_per_s_process_host (dispatcher -> krane-plugin-host over ZeroMQ -> ack, with a
// no-op plugin), events_per_s_in_process (the same plugin loaded into the process),
// cursor_updates_per_s (recordApplied on the shared-memory store), bytes_per_tracked_resource.
// The watch stream itself is measured by bench/feed; this isolates the agent's part.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "agent/dispatcher.h"
#include "agent/plugin_endpoints.h"
#include "agent/plugin_loader.h"
#include "common/strings.h"
#include "ipc/cursor_store.h"

namespace {

using Clock = std::chrono::steady_clock;

std::string runfilesDir(const char* argv0) {
  if (const char* d = std::getenv("RUNFILES_DIR")) return d;
  return std::string(argv0) + ".runfiles";
}

class NoLedger : public krane::agent::ResourceLedger {
 public:
  bool shouldApply(const std::string&, const std::string&, uint64_t) override { return true; }
  void recordApplied(const std::string&, const std::string&, uint64_t) override {}
  void recordSynced(const std::string&, const std::string&, uint64_t) override {}
  void retainOnly(const std::map<std::string, std::set<std::string>>&) override {}
  void forget(const std::string&, const std::string&) override {}
  void park(const std::string&, const std::string&, uint64_t, int, const std::string&) override {}
  void unpark(const std::string&, const std::string&) override {}
};

krane::cluster::v1::Change change(uint64_t version, int resources) {
  krane::cluster::v1::Change c;
  c.set_op(krane::cluster::v1::CHANGE_OP_APPLY);
  c.set_version(version);
  auto* r = c.mutable_resource();
  r->set_type("bench");
  r->set_id(krane::strCat("r", version % resources));
  r->set_region("bench-1");
  r->set_version(version);
  r->mutable_generic()->set_spec(std::string(200, 'x'));
  return c;
}

// Events per second through `endpoint`, with `workers` resources in flight.
double eventsPerSecond(std::shared_ptr<krane::agent::PluginEndpoint> endpoint, uint64_t events,
                       size_t workers, size_t batch) {
  NoLedger ledger;
  krane::agent::WatermarkTracker watermark;
  krane::agent::DispatcherOptions options;
  options.workers_per_plugin = workers;
  options.batch = batch;
  krane::agent::Dispatcher dispatcher(
      {endpoint}, ledger, watermark, [](const auto&, const auto&, int) {}, options);
  const auto start = Clock::now();
  for (uint64_t v = 1; v <= events; ++v) dispatcher.change(change(v, 1000), false);
  dispatcher.drain();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (watermark.watermark() != events) {
    std::fprintf(stderr, "bench: only %llu of %llu events acknowledged\n",
                 static_cast<unsigned long long>(watermark.watermark()),
                 static_cast<unsigned long long>(events));
  }
  return static_cast<double>(events) / seconds;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  bool json = false;
  bool quick = false;
  size_t workers = 8;
  size_t batch = krane::agent::DispatcherOptions{}.batch;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json") {
      json = true;
    } else if (a == "--quick") {
      quick = true;
    } else if ((a == "--workers" || a == "--batch") && i + 1 < argc) {
      (a == "--workers" ? workers : batch) = std::max(1, std::atoi(argv[++i]));
    } else {
      std::printf(
          "usage: agent [--json] [--quick] [--workers N (default 8)] [--batch N (default %zu)]\n",
          batch);
      return a == "--help" ? 0 : 2;
    }
  }
  const std::string runfiles = runfilesDir(argv[0]) + "/krane";
  const std::string plugin = runfiles + "/tests/support/plugins/libslow.so";
  const std::string host_binary = runfiles + "/agent/krane-plugin-host";
  const uint64_t events = quick ? 20000 : 100000;
  const int rounds = quick ? 1 : 5;
  char pattern[] = "/tmp/krane-bench-XXXXXX";
  const std::string dir = ::mkdtemp(pattern);
  const std::string config = "apply_ms=0\ntypes=bench\n";

  // In process.
  auto loaded = krane::agent::loadPlugin(plugin, config, {});
  if (!loaded.ok()) {
    std::fprintf(stderr, "bench: %s\n", std::string(loaded.status().message()).c_str());
    return 1;
  }
  auto in_process_endpoint = std::make_shared<krane::agent::InProcessEndpoint>(*std::move(loaded));

  // Through a plugin host.
  krane::agent::HostOptions host_options;
  host_options.name = "bench";
  host_options.plugin_path = plugin;
  host_options.config_json = config;
  host_options.workers = workers;
  host_options.host_binary = host_binary;
  host_options.state_dir = dir;
  auto host = std::make_shared<krane::agent::HostEndpoint>(host_options, nullptr);
  if (auto st = host->start(); !st.ok()) {
    std::fprintf(stderr, "bench: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  // Side by side, round after round; the median of each is reported.
  std::vector<double> in_process_runs;
  std::vector<double> host_runs;
  for (int round = 0; round < rounds; ++round) {
    in_process_runs.push_back(eventsPerSecond(in_process_endpoint, events, workers, batch));
    host_runs.push_back(eventsPerSecond(host, events, workers, batch));
  }
  host->stop();
  const double in_process = median(in_process_runs);
  const double through_host = median(host_runs);

  // Cursor store: updates of 100,000 tracked resources, store sized for them.
  const uint64_t tracked = 100000;
  krane::ipc::CursorStoreOptions store_options;
  store_options.region = "bench-1";
  store_options.max_resources = tracked;
  std::filesystem::create_directories(dir + "/store");
  auto store = krane::ipc::CursorStore::open(dir + "/store", store_options);
  if (!store.ok()) {
    std::fprintf(stderr, "bench: %s\n", std::string(store.status().message()).c_str());
    return 1;
  }
  std::vector<std::string> ids;
  for (uint64_t i = 0; i < tracked; ++i) ids.push_back(krane::strCat("resource-", i));
  for (uint64_t i = 0; i < tracked; ++i) (void)(*store)->recordApplied("bench", ids[i], 1);
  const uint64_t updates = quick ? 2000000 : 10000000;
  const auto start = Clock::now();
  for (uint64_t i = 0; i < updates; ++i)
    (void)(*store)->recordApplied("bench", ids[i % tracked], 2 + i / tracked);
  const double update_rate =
      static_cast<double>(updates) / std::chrono::duration<double>(Clock::now() - start).count();
  const double bytes_per_resource = (*store)->bytesPerTrackedResource();
  store->reset();
  std::filesystem::remove_all(dir);

  if (json) {
    std::printf(
        "{\"figures\": [{\"name\": \"events_per_s_process_host\", \"value\": %.0f, \"unit\": "
        "\"events/s\"}, "
        "{\"name\": \"events_per_s_in_process\", \"value\": %.0f, \"unit\": \"events/s\"}, "
        "{\"name\": \"cursor_updates_per_s\", \"value\": %.0f, \"unit\": \"updates/s\"}, "
        "{\"name\": \"bytes_per_tracked_resource\", \"value\": %.1f, \"unit\": \"bytes\"}]}\n",
        through_host, in_process, update_rate, bytes_per_resource);
    return 0;
  }
  std::printf("%-34s %14s %14s  %s\n", "figure", "value", "target", "");
  std::printf("%-34s %14.0f %14s  %s\n", "events_per_s_process_host", through_host, ">= 50000",
              through_host >= 50000 ? "ok" : "BELOW TARGET");
  std::printf("%-34s %14.0f %14s\n", "events_per_s_in_process", in_process, "");
  std::printf("%-34s %14.0f %14s  %s\n", "cursor_updates_per_s", update_rate, ">= 1000000",
              update_rate >= 1e6 ? "ok" : "BELOW TARGET");
  std::printf("%-34s %14.1f %14s  %s\n", "bytes_per_tracked_resource", bytes_per_resource, "<= 100",
              bytes_per_resource <= 100 ? "ok" : "ABOVE TARGET");
  std::printf(
      "(%llu events, %zu workers, batches of up to %zu, no-op plugin; %llu cursor updates over "
      "%llu "
      "resources)\n",
      static_cast<unsigned long long>(events), workers, batch,
      static_cast<unsigned long long>(updates), static_cast<unsigned long long>(tracked));
  return 0;
}
