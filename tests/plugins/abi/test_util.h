// Shared helpers of the plugin ABI tests: a HostCallbacks that keeps what the plugin sent, and
// change builders.
#pragma once

#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "agent/plugin_loader.h"
#include "krane/cluster/v1/cluster.pb.h"

namespace krane::plugin_tests {

// Collects logs and status reports; safe to call from the plugin's threads.
class CapturedHost {
 public:
  agent::HostCallbacks callbacks() {
    return agent::HostCallbacks{
        .log =
            [this](agent::PluginLogLevel level, std::string_view message) {
              std::lock_guard lock(mutex_);
              logs_.emplace_back(level, std::string(message));
            },
        .report_status =
            [this](const plugin::v1::StatusReport& report) {
              std::lock_guard lock(mutex_);
              reports_.push_back(report);
            },
    };
  }

  std::vector<std::pair<agent::PluginLogLevel, std::string>> logs() {
    std::lock_guard lock(mutex_);
    return logs_;
  }
  std::vector<plugin::v1::StatusReport> reports() {
    std::lock_guard lock(mutex_);
    return reports_;
  }
  bool logged(std::string_view needle) {
    std::lock_guard lock(mutex_);
    for (const auto& [level, text] : logs_) {
      if (text.find(needle) != std::string::npos) return true;
    }
    return false;
  }

 private:
  std::mutex mutex_;
  std::vector<std::pair<agent::PluginLogLevel, std::string>> logs_;
  std::vector<plugin::v1::StatusReport> reports_;
};

inline cluster::v1::Change makeChange(const std::string& type, const std::string& id,
                                      uint64_t version,
                                      cluster::v1::ChangeOp op = cluster::v1::CHANGE_OP_APPLY) {
  cluster::v1::Change change;
  change.set_op(op);
  change.set_version(version);
  auto* resource = change.mutable_resource();
  resource->set_type(type);
  resource->set_id(id);
  resource->set_region("eu-1");
  if (op == cluster::v1::CHANGE_OP_APPLY) {
    resource->set_version(version);
    auto* generic = resource->mutable_generic();
    generic->set_type(type);
    generic->set_id(id);
    generic->set_region("eu-1");
    generic->set_spec(std::string("{\"size\": 3}\0binary", 18));
    generic->set_content_type("application/json");
  }
  return change;
}

}  // namespace krane::plugin_tests
