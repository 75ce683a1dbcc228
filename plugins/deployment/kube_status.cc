#include "plugins/deployment/kube_status.h"

#include <algorithm>
#include <set>

#include "common/strings.h"

namespace krane::deployment {
namespace {

using nlohmann::json;

bool failingToStart(const std::string& reason) {
  static const std::set<std::string> reasons = {
      "ErrImagePull",      "ImagePullBackOff",           "InvalidImageName",
      "ErrImageNeverPull", "CreateContainerConfigError", "CreateContainerError",
      "RunContainerError",
  };
  return reasons.count(reason) > 0;
}

std::string conditionStatus(const json& status, const std::string& type, std::string* message) {
  for (const auto& c : status.value("conditions", json::array())) {
    if (c.value("type", "") != type) continue;
    if (message != nullptr) {
      *message = c.value("reason", "");
      if (!c.value("message", "").empty()) strAppend(message, ": ", c.value("message", ""));
    }
    return c.value("status", "");
  }
  return "";
}

}  // namespace

std::optional<runtime::InstanceStatus> podInstance(const json& pod) {
  const json& meta = pod.value("metadata", json::object());
  const json& status = pod.value("status", json::object());
  const std::string phase = status.value("phase", "");
  if (phase == "Succeeded" || phase == "Failed") return std::nullopt;
  runtime::InstanceStatus i;
  i.name = meta.value("name", "");
  i.revision = meta.value("labels", json::object()).value("pod-template-hash", "");
  const std::string ip = status.value("podIP", "");
  int port = 0;
  const json containers = pod.value("spec", json::object()).value("containers", json::array());
  if (!containers.empty()) {
    for (const auto& p : containers[0].value("ports", json::array())) {
      if (p.value("protocol", "TCP") == "TCP") {
        port = p.value("containerPort", 0);
        break;
      }
    }
  }
  i.port = port;
  if (!ip.empty()) i.address = port > 0 ? strCat(ip, ":", port) : ip;
  if (meta.contains("deletionTimestamp")) {
    i.phase = runtime::InstancePhase::kTerminating;
    return i;
  }
  std::string waiting_reason;
  for (const auto& cs : status.value("containerStatuses", json::array())) {
    i.restarts += cs.value("restartCount", 0);
    const json& waiting = cs.value("state", json::object()).value("waiting", json::object());
    const std::string reason = waiting.value("reason", "");
    const std::string message = waiting.value("message", "");
    if (reason == "CrashLoopBackOff") {
      i.phase = runtime::InstancePhase::kFailed;
      i.reason = reason;
      const json& last = cs.value("lastState", json::object()).value("terminated", json::object());
      if (last.contains("exitCode")) {
        strAppend(&i.reason, ": exit code ", last.value("exitCode", 0));
      }
      if (last.contains("signal")) strAppend(&i.reason, ", signal ", last.value("signal", 0));
      strAppend(&i.reason, ", ", cs.value("restartCount", 0), " restarts");
      if (!message.empty()) strAppend(&i.reason, ": ", message);
      return i;
    }
    if (failingToStart(reason)) {
      i.phase = runtime::InstancePhase::kFailed;
      i.reason = message.empty() ? reason : strCat(reason, ": ", message);
      return i;
    }
    if (!reason.empty() && waiting_reason.empty()) {
      waiting_reason = message.empty() ? reason : strCat(reason, ": ", message);
    }
  }
  if (phase == "Running") {
    i.phase = runtime::InstancePhase::kRunning;
    i.ready = conditionStatus(status, "Ready", nullptr) == "True";
    if (!i.ready) i.reason = waiting_reason;
    return i;
  }
  i.phase = runtime::InstancePhase::kPending;
  std::string unscheduled;
  if (conditionStatus(status, "PodScheduled", &unscheduled) == "False") {
    i.reason = unscheduled;
  } else {
    i.reason = waiting_reason;
  }
  return i;
}

runtime::WorkloadStatus podsStatus(const std::string& workload_id, const std::vector<json>& pods) {
  runtime::WorkloadStatus s;
  s.id = workload_id;
  for (const auto& pod : pods) {
    auto i = podInstance(pod);
    if (!i) continue;
    if (i->phase == runtime::InstancePhase::kRunning && i->ready) ++s.ready;
    s.instances.push_back(*std::move(i));
  }
  std::sort(s.instances.begin(), s.instances.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  return s;
}

}  // namespace krane::deployment
