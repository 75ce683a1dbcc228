// BuildSlotService: caps how many deployments of a workspace build at once, with production
// deployments served before preview ones. A virtual object keyed by workspace id, so Acquire and
// Release never race. State: one message, `slots` (krane.services.v1.BuildSlots): the deployment
// ids holding a slot, and the production and preview wait lists (FIFO of deployment id and
// awakeable id).
//
// A deploy workflow creates an awakeable, calls AcquireOrWait with it and waits on it; the
// awakeable is resolved when the deployment holds a slot (at once, or when a Release promotes
// it). It calls Release on success, and from its compensation stack on failure or cancellation.
// Both handlers are idempotent. The cap is quotas.max_concurrent_builds (1 without a row).
//
// Handlers (typed, messages of proto/krane/services/v1/buildslot.proto):
//   AcquireOrWait(AcquireSlotRequest) -> AcquireSlotResponse   exclusive
//   Release(ReleaseSlotRequest)       -> ReleaseSlotResponse   exclusive
//   Slots(SlotsRequest)               -> BuildSlots            shared (reads state)
#pragma once

#include <memory>

#include "controlplane/db/pool.h"
#include "controlplane/workflow/service.h"
#include "krane/services/v1/buildslot.pb.h"

namespace krane::services::buildslot {

inline constexpr char kServiceName[] = "BuildSlotService";
inline constexpr int kDefaultMaxConcurrentBuilds = 1;

using AcquireSlotRequest = services::v1::AcquireSlotRequest;
using AcquireSlotResponse = services::v1::AcquireSlotResponse;
using ReleaseSlotRequest = services::v1::ReleaseSlotRequest;
using ReleaseSlotResponse = services::v1::ReleaseSlotResponse;
using BuildSlots = services::v1::BuildSlots;
using SlotWaiter = services::v1::SlotWaiter;
using SlotsRequest = services::v1::SlotsRequest;

workflow::ServiceDefinition buildSlotService(const std::shared_ptr<db::Pool>& pool);

}  // namespace krane::services::buildslot
