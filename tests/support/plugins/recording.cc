// Test plugin "recording": appends one line per call to the file named by `log=PATH` and
// returns OK. Payloads are recorded as hex of their serialized bytes so a test can parse them
// back. observe() reports every resource applied so far as READY.
//
// Config: log=PATH (required), types=a,b (default "recorded"), apply_ms=N: each apply and remove
// takes N milliseconds before it is recorded (default 0; a slow cluster).
#include <chrono>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "plugins/sdk/plugin.h"
#include "tests/support/plugins/test_config.h"

namespace krane::test_plugins {
namespace {

std::string hex(const std::string& bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out.empty() ? "-" : out;
}

class RecordingPlugin : public sdk::Plugin {
 public:
  absl::Status init(sdk::Host& host, std::string_view config_text) override {
    auto config =
        parseConfig("recording", config_text, {"log", "types", "apply_ms", "report_at_init"});
    if (!config.ok()) return config.status();
    const std::string ms = valueOr(*config, "apply_ms", "0");
    try {
      delay_ = std::chrono::milliseconds(std::stoul(ms));
    } catch (const std::exception&) {
      return absl::InvalidArgumentError(strCat("recording: apply_ms=", ms, " is not a number"));
    }
    const std::string path = valueOr(*config, "log");
    if (path.empty()) {
      return absl::InvalidArgumentError("recording: config has no log=PATH line");
    }
    out_.open(path, std::ios::app);
    if (!out_) return absl::FailedPreconditionError(strCat("recording: cannot open ", path));
    host_ = &host;
    types_ = typesFrom(*config, "recorded");
    host.log(sdk::LogLevel::kInfo, strCat("recording calls to ", path));
    record(strCat("init host_abi=", host.abiMajor(), ".", host.abiMinor()));
    // report_at_init=TYPE/ID: reported READY from init, as a runtime does with what it adopted
    // from an earlier host.
    if (const std::string early = valueOr(*config, "report_at_init"); !early.empty()) {
      cluster::v1::ReportResourceStatusRequest status;
      status.set_type(early.substr(0, early.find('/')));
      status.set_id(early.substr(early.find('/') + 1));
      status.set_phase(cluster::v1::RESOURCE_PHASE_READY);
      status.set_message("adopted");
      status.set_plugin("recording");
      host.reportResourceStatus(status);
    }
    return absl::OkStatus();
  }

  std::vector<std::string> resourceTypes() override {
    record("resource_types");
    return types_;
  }

  absl::Status apply(const cluster::v1::Change& change) override {
    std::this_thread::sleep_for(delay_);
    {
      std::lock_guard lock(mutex_);
      const auto& r = change.resource();
      applied_[{r.type(), r.id()}] = {r.region(), change.version()};
    }
    record(strCat("apply ", hex(change.SerializeAsString())));
    return absl::OkStatus();
  }

  absl::Status remove(const cluster::v1::Change& change) override {
    std::this_thread::sleep_for(delay_);
    {
      std::lock_guard lock(mutex_);
      applied_.erase({change.resource().type(), change.resource().id()});
    }
    record(strCat("remove ", hex(change.SerializeAsString())));
    return absl::OkStatus();
  }

  absl::Status syncBegin(uint64_t snapshot_version) override {
    record(strCat("sync_begin ", snapshot_version));
    return absl::OkStatus();
  }

  absl::Status syncEnd(const plugin::v1::SyncEnd& sync_end) override {
    record(strCat("sync_end ", hex(sync_end.SerializeAsString())));
    return absl::OkStatus();
  }

  absl::Status observe() override {
    record("observe");
    std::map<std::pair<std::string, std::string>, std::pair<std::string, uint64_t>> applied;
    {
      std::lock_guard lock(mutex_);
      applied = applied_;
    }
    for (const auto& [key, value] : applied) {
      cluster::v1::ReportResourceStatusRequest status;
      status.set_type(key.first);
      status.set_id(key.second);
      status.set_region(value.first);
      status.set_version(value.second);
      status.set_phase(cluster::v1::RESOURCE_PHASE_READY);
      status.set_message("recorded");
      status.set_plugin("recording");
      host_->reportResourceStatus(status);
    }
    return absl::OkStatus();
  }

  void shutdown() override { record("shutdown"); }

 private:
  void record(const std::string& line) {
    std::lock_guard lock(mutex_);
    out_ << line << '\n';
    out_.flush();
  }

  sdk::Host* host_ = nullptr;
  std::vector<std::string> types_;
  std::chrono::milliseconds delay_{0};
  std::mutex mutex_;
  std::ofstream out_;
  std::map<std::pair<std::string, std::string>, std::pair<std::string, uint64_t>> applied_;
};

}  // namespace
}  // namespace krane::test_plugins

KRANE_DEFINE_PLUGIN(krane::test_plugins::RecordingPlugin, "recording", "1.0.0-test");
