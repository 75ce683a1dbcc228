// Test plugin "slow": sleeps `apply_ms` milliseconds in every apply and remove, then succeeds.
// Stands in for a slow cluster (timeouts, parallelism, back-pressure, long garbage collection).
//
// Config:
//   apply_ms=N     sleep per apply and remove (default 100)
//   slow_calls=N   only the first N applies/removes of each resource sleep (default: every one)
//   sync_ms=N      sleep in sync_begin and sync_end (default 0)
//   log=PATH       appends "start <what>", "end <what>" per call (<what> is "type/id" or "sync"),
//                  and "overlap <what>" when a call starts while the ABI forbids it: another call
//                  of the same resource is running, or a sync call runs next to any other call
//   types=a,b      (default "slow")
#include <chrono>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include "plugins/sdk/plugin.h"
#include "tests/support/plugins/test_config.h"

namespace krane::test_plugins {
namespace {

absl::StatusOr<std::chrono::milliseconds> millis(const Config& config, const std::string& key,
                                                 const std::string& fallback) {
  const std::string ms = valueOr(config, key, fallback);
  try {
    return std::chrono::milliseconds(std::stoul(ms));
  } catch (const std::exception&) {
    return absl::InvalidArgumentError(strCat("slow: ", key, "=", ms, " is not a number"));
  }
}

class SlowPlugin : public sdk::Plugin {
 public:
  absl::Status init(sdk::Host&, std::string_view config_text) override {
    auto config =
        parseConfig("slow", config_text, {"apply_ms", "slow_calls", "sync_ms", "log", "types"});
    if (!config.ok()) return config.status();
    auto apply = millis(*config, "apply_ms", "100");
    if (!apply.ok()) return apply.status();
    auto sync = millis(*config, "sync_ms", "0");
    if (!sync.ok()) return sync.status();
    auto slow_calls = millis(*config, "slow_calls", "0");
    if (!slow_calls.ok()) return slow_calls.status();
    delay_ = *apply;
    sync_delay_ = *sync;
    slow_calls_ = static_cast<int>(slow_calls->count());
    if (auto path = valueOr(*config, "log"); !path.empty()) {
      log_.open(path, std::ios::app);
      if (!log_) return absl::FailedPreconditionError(strCat("slow: cannot open ", path));
    }
    types_ = typesFrom(*config, "slow");
    return absl::OkStatus();
  }
  std::vector<std::string> resourceTypes() override { return types_; }
  absl::Status apply(const cluster::v1::Change& change) override { return resourceCall(change); }
  absl::Status remove(const cluster::v1::Change& change) override { return resourceCall(change); }
  absl::Status syncBegin(uint64_t) override { return syncCall(); }
  absl::Status syncEnd(const plugin::v1::SyncEnd&) override { return syncCall(); }

 private:
  absl::Status resourceCall(const cluster::v1::Change& change) {
    const std::string key = strCat(change.resource().type(), "/", change.resource().id());
    bool slow;
    {
      std::lock_guard lock(mutex_);
      if (running_[key] > 0 || syncing_) record(strCat("overlap ", key));
      ++running_[key];
      ++running_total_;
      slow = slow_calls_ == 0 || calls_[key]++ < slow_calls_;
      record(strCat("start ", key));
    }
    if (slow) std::this_thread::sleep_for(delay_);
    std::lock_guard lock(mutex_);
    --running_[key];
    --running_total_;
    record(strCat("end ", key));
    return absl::OkStatus();
  }

  absl::Status syncCall() {
    {
      std::lock_guard lock(mutex_);
      if (running_total_ > 0 || syncing_) record("overlap sync");
      syncing_ = true;
      record("start sync");
    }
    std::this_thread::sleep_for(sync_delay_);
    std::lock_guard lock(mutex_);
    syncing_ = false;
    record("end sync");
    return absl::OkStatus();
  }

  void record(const std::string& line) {
    if (!log_.is_open()) return;
    log_ << line << '\n';
    log_.flush();
  }

  std::chrono::milliseconds delay_{100};
  std::chrono::milliseconds sync_delay_{0};
  int slow_calls_ = 0;
  std::vector<std::string> types_;
  std::mutex mutex_;
  std::ofstream log_;
  std::map<std::string, int> running_;
  std::map<std::string, int> calls_;
  int running_total_ = 0;
  bool syncing_ = false;
};

}  // namespace
}  // namespace krane::test_plugins

KRANE_DEFINE_PLUGIN(krane::test_plugins::SlowPlugin, "slow", "1.0.0-test");
