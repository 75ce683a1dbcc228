// The common part of the plugins that run one resource type as process-runtime workloads
// (deployment, sentinel): configuration, apply / remove, garbage collection after a sync,
// status reports on every change, adoption of what an earlier host left running.
//
// Configuration (JSON): {"runtime": "process", "process": {...}} with the keys of config.h (a
// "kubernetes" section may be present too, for the other runtime; it is not read here).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "nlohmann/json.hpp"
#include "plugins/runtime/process/process_runtime.h"
#include "plugins/sdk/plugin.h"

namespace krane::runtime {

class ProcessWorkloadPlugin : public sdk::Plugin {
 public:
  absl::Status init(sdk::Host& host, std::string_view config) final;
  std::vector<std::string> resourceTypes() final { return {type_}; }
  absl::Status apply(const cluster::v1::Change& change) final;
  absl::Status remove(const cluster::v1::Change& change) final;
  absl::Status syncEnd(const plugin::v1::SyncEnd& sync_end) final;
  absl::Status observe() final;
  void shutdown() final;

 protected:
  // What the plugin knows of one resource from its last apply.
  struct Applied {
    std::string id;  // the resource id
    std::string region;
    uint64_t version = 0;
    std::string image;
    std::string revision;
    int64_t generation = 0;       // +1 for each applied spec that changed the revision
    std::string converged_image;  // image of the last rollout that converged
  };

  // `name` for messages ("deployment plugin"); workloads are "<prefix>/<resource id>".
  ProcessWorkloadPlugin(std::string name, std::string type, const std::string& prefix);

  // The workload of an apply: INVALID_ARGUMENT naming the field when it cannot be run; nullopt
  // when the resource should not run at all (it is removed).
  virtual absl::StatusOr<std::optional<WorkloadSpec>> workloadFor(
      const cluster::v1::Resource& resource) = 0;
  virtual plugin::v1::StatusReport statusReport(const WorkloadStatus& status,
                                                const Applied& applied) = 0;
  virtual plugin::v1::StatusReport deletedReport(const Applied& applied) = 0;

  // Keys of the `process` section that the plugin reads itself: it takes them out of `section`
  // (whose path is `path`) before the runtime's keys are checked. Called once, from init, before
  // any other call. INVALID_ARGUMENT naming the key for a bad value.
  virtual absl::Status configure(nlohmann::json& section, const std::string& path) {
    return absl::OkStatus();
  }
  // Called first in shutdown(), before the runtime stops.
  virtual void stopping() {}

  sdk::Host& host() { return *host_; }

 private:
  // Labels of the workload's spec (WorkloadSpec::labels) with what the plugin applied.
  static constexpr const char* kVersionLabel = "krane.dev/applied-version";
  static constexpr const char* kGenerationLabel = "krane.dev/generation";
  static constexpr const char* kRegionLabel = "krane.dev/region";

  void report(const WorkloadStatus& status);
  // Fills `a` from what an earlier plugin host stored with the workload (its labels).
  void adoptLocked(Applied& a, const std::string& id, const WorkloadStatus& status);
  absl::Status removeWorkload(const std::string& resource_id, const std::string& region,
                              uint64_t version);

  const std::string name_;
  const std::string type_;
  const std::string prefix_;  // "<prefix>/"
  sdk::Host* host_ = nullptr;
  std::unique_ptr<ProcessRuntime> runtime_;
  bool stop_on_shutdown_ = false;
  std::mutex mutex_;
  std::map<std::string, Applied> applied_;  // by resource id
};

}  // namespace krane::runtime
