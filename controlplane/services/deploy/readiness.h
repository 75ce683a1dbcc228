// The readiness gate of deploys (seed 001, "Instance readiness"): after the ingestor stored the
// instances a region reported, it checks whether the deployment now has its minimum replicas
// running in enough regions (all but one, at least one), and if the deploy is waiting for that,
// sends DeployService.NotifyInstancesReady once. When so many regions report failed instances
// (crash loops, images that cannot be fetched) that the threshold cannot be met, it rejects the
// deploy's awakeable with their reasons instead: the deploy fails at once rather than waiting
// out its timeout. A rolling deploy waiting between two cycles (kRollAwakeableState) is woken
// instead, so its next cycle sees the report at once.
//
// "Once" holds across control-plane replicas: the notification's idempotency key is the
// awakeable the deploy waits on, so every replica that sees the threshold met sends the same
// invocation. A deploy that is not waiting yet is not notified: it checks for itself when it
// starts waiting (readinessOf), so nothing is missed in between.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "controlplane/db/connection.h"
#include "controlplane/db/pool.h"
#include "controlplane/ingest/ingestor.h"
#include "controlplane/workflow/engine.h"

namespace krane::services::deploy {

struct Readiness {
  int regions = 0;  // regions with a topology row
  int healthy = 0;  // of them, with at least their minimum replicas running
  int needed = 0;   // max(1, regions - 1)
  // Regions short of their minimum with instances that failed (a crash loop, an image that
  // cannot be fetched), and why: "eu-1: CrashLoopBackOff: exit code 1".
  std::vector<std::string> failing;
  bool ready() const { return regions > 0 && healthy >= needed; }
  // So many regions fail that the threshold cannot be met while they do.
  bool hopeless() const { return regions - static_cast<int>(failing.size()) < needed; }
};

// Counts from the topology rows (replicas, or the autoscaler's minimum) and the instances the
// agents reported.
absl::StatusOr<Readiness> readinessOf(db::Connection& conn, const std::string& deployment_id);

class ReadinessGate : public ingest::DeploymentInstancesHook {
 public:
  // `engine` must outlive the gate (both belong to the server).
  ReadinessGate(std::shared_ptr<db::Pool> pool, workflow::Engine& engine)
      : pool_(std::move(pool)), engine_(engine) {}
  void onInstancesReported(const std::string& deployment_id, const std::string& region,
                           uint32_t running, uint32_t pending, uint32_t failed) override;

 private:
  std::shared_ptr<db::Pool> pool_;
  workflow::Engine& engine_;
};

}  // namespace krane::services::deploy
