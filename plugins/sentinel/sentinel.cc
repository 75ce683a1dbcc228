#include "plugins/sentinel/sentinel.h"

#include <algorithm>
#include <cctype>

#include "common/strings.h"
#include "plugins/runtime/kubernetes/names.h"

namespace krane::sentinel {
namespace {

using nlohmann::json;

json commonLabels(const cluster::v1::Sentinel& s) {
  json labels = {{"app.kubernetes.io/managed-by", "krane"},
                 {"app.kubernetes.io/component", "sentinel"}};
  const std::pair<const char*, const std::string*> ids[] = {
      {"krane.dev/workspace.id", &s.workspace_id()},
      {"krane.dev/project.id", &s.project_id()},
      {"krane.dev/app.id", &s.app_id()},
      {"krane.dev/environment.id", &s.environment_id()},
  };
  for (const auto& [key, value] : ids) labels[key] = *value;
  return labels;
}

json sentinelLabels(const cluster::v1::Sentinel& s) {
  json labels = commonLabels(s);
  labels["krane.dev/sentinel.id"] = s.sentinel_id();
  // Garbage collection after a sync only considers its own region's sentinels.
  if (!s.region().empty()) labels["krane.dev/region"] = s.region();
  return labels;
}

json selector(const cluster::v1::Sentinel& s) {
  return {{"krane.dev/sentinel.id", s.sentinel_id()}};
}

json environmentSelector(const cluster::v1::Sentinel& s) {
  return {{"krane.dev/environment.id", s.environment_id()},
          {"app.kubernetes.io/component", "sentinel"}};
}

json metadata(const std::string& name, const json& labels) {
  return {{"name", name}, {"namespace", kNamespace}, {"labels", labels}};
}

int32_t replicasOf(const cluster::v1::Sentinel& s) {
  return s.desired_state() == cluster::v1::SENTINEL_DESIRED_STATE_STANDBY
             ? 0
             : static_cast<int32_t>(s.replicas());
}

}  // namespace

std::string objectName(const std::string& prefix, const std::string& id) {
  return kube::dnsLabel(prefix, id);
}

std::string deploymentName(const cluster::v1::Sentinel& s) {
  return objectName("sentinel", s.sentinel_id());
}

std::string gossipName(const cluster::v1::Sentinel& s) {
  return objectName("sentinel-gossip", s.environment_id());
}

absl::Status validate(const cluster::v1::Sentinel& s) {
  const std::pair<const char*, const std::string*> ids[] = {
      {"sentinel_id", &s.sentinel_id()},       {"workspace_id", &s.workspace_id()},
      {"project_id", &s.project_id()},         {"app_id", &s.app_id()},
      {"environment_id", &s.environment_id()},
  };
  for (const auto& [field, value] : ids) {
    if (value->empty()) return absl::InvalidArgumentError(strCat("sentinel.", field, ": required"));
    if (!kube::validLabelValue(*value)) {
      return absl::InvalidArgumentError(
          strCat("sentinel.", field, ": \"", *value,
                 "\" must be at most 63 characters of [A-Za-z0-9-_.], alphanumeric at both ends"));
    }
  }
  if (!s.region().empty() && !kube::validLabelValue(s.region())) {
    return absl::InvalidArgumentError(
        strCat("sentinel.region: \"", s.region(), "\" must be a label value"));
  }
  if (s.image().empty()) return absl::InvalidArgumentError("sentinel.image: required");
  if (!s.config_json().empty() && json::parse(s.config_json(), nullptr, false).is_discarded()) {
    return absl::InvalidArgumentError("sentinel.config_json: not valid JSON");
  }
  return absl::OkStatus();
}

std::vector<json> sentinelObjects(const cluster::v1::Sentinel& s) {
  const std::string name = deploymentName(s);
  const json labels = sentinelLabels(s);
  json resources = json::object();
  if (s.cpu_millicores() > 0) {
    resources["requests"]["cpu"] = strCat(s.cpu_millicores(), "m");
    resources["limits"]["cpu"] = strCat(s.cpu_millicores(), "m");
  }
  if (s.memory_mib() > 0) {
    resources["requests"]["memory"] = strCat(s.memory_mib(), "Mi");
    resources["limits"]["memory"] = strCat(s.memory_mib(), "Mi");
  }
  json env = json::array({
      {{"name", "KRANE_SENTINEL_ID"}, {"value", s.sentinel_id()}},
      {{"name", "KRANE_WORKSPACE_ID"}, {"value", s.workspace_id()}},
      {{"name", "KRANE_ENVIRONMENT_ID"}, {"value", s.environment_id()}},
      {{"name", "KRANE_REGION"}, {"value", s.region()}},
      {{"name", "KRANE_GOSSIP_SERVICE"}, {"value", strCat(gossipName(s), ".", kNamespace, ".svc")}},
  });
  if (!s.config_json().empty()) {
    env.push_back({{"name", "KRANE_SENTINEL_CONFIG"}, {"value", s.config_json()}});
  }
  json container = {
      {"name", "sentinel"},
      {"image", s.image()},
      {"ports",
       json::array(
           {{{"name", "http"}, {"containerPort", kHttpPort}, {"protocol", "TCP"}},
            {{"name", "gossip-tcp"}, {"containerPort", kGossipPort}, {"protocol", "TCP"}},
            {{"name", "gossip-udp"}, {"containerPort", kGossipPort}, {"protocol", "UDP"}}})},
      {"env", env},
      {"livenessProbe",
       {{"httpGet", {{"path", kLivenessPath}, {"port", kHttpPort}}},
        {"periodSeconds", 10},
        {"timeoutSeconds", 2},
        {"failureThreshold", 3}}},
      {"readinessProbe",
       {{"httpGet", {{"path", kReadinessPath}, {"port", kHttpPort}}},
        {"periodSeconds", 5},
        {"timeoutSeconds", 2},
        {"failureThreshold", 2}}},
  };
  if (!resources.empty()) container["resources"] = resources;
  json deployment = {
      {"apiVersion", "apps/v1"},
      {"kind", "Deployment"},
      {"metadata", metadata(name, labels)},
      {"spec",
       {{"replicas", replicasOf(s)},
        {"selector", {{"matchLabels", selector(s)}}},
        {"strategy",
         {{"type", "RollingUpdate"}, {"rollingUpdate", {{"maxUnavailable", 0}, {"maxSurge", 1}}}}},
        {"minReadySeconds", 5},
        {"template",
         {{"metadata", {{"labels", labels}}},
          {"spec",
           {{"tolerations", json::array({{{"key", "node-class"},
                                          {"operator", "Equal"},
                                          {"value", "sentinel"},
                                          {"effect", "NoSchedule"}}})},
            {"topologySpreadConstraints",
             json::array({{{"maxSkew", 1},
                           {"topologyKey", "topology.kubernetes.io/zone"},
                           {"whenUnsatisfiable", "ScheduleAnyway"},
                           {"labelSelector", {{"matchLabels", selector(s)}}}}})},
            {"containers", json::array({container})}}}}}}},
  };
  json service = {
      {"apiVersion", "v1"},
      {"kind", "Service"},
      {"metadata", metadata(name, labels)},
      {"spec",
       {{"type", "ClusterIP"},
        {"selector", selector(s)},
        {"ports", json::array({{{"name", "http"},
                                {"port", kHttpPort},
                                {"targetPort", kHttpPort},
                                {"protocol", "TCP"}}})}}},
  };
  json pdb = {
      {"apiVersion", "policy/v1"},
      {"kind", "PodDisruptionBudget"},
      {"metadata", metadata(name, labels)},
      {"spec", {{"minAvailable", 1}, {"selector", {{"matchLabels", selector(s)}}}}},
  };
  return {deployment, service, pdb};
}

std::vector<json> environmentObjects(const cluster::v1::Sentinel& s) {
  const std::string name = gossipName(s);
  const json labels = commonLabels(s);
  json headless = {
      {"apiVersion", "v1"},
      {"kind", "Service"},
      {"metadata", metadata(name, labels)},
      {"spec",
       {{"clusterIP", "None"},
        {"publishNotReadyAddresses", true},
        {"selector", environmentSelector(s)},
        {"ports",
         json::array({{{"name", "gossip-tcp"}, {"port", kGossipPort}, {"protocol", "TCP"}},
                      {{"name", "gossip-udp"}, {"port", kGossipPort}, {"protocol", "UDP"}}})}}},
  };
  const std::string port = std::to_string(kGossipPort);
  json policy = {
      {"apiVersion", "cilium.io/v2"},
      {"kind", "CiliumNetworkPolicy"},
      {"metadata", metadata(name, labels)},
      {"spec",
       {{"endpointSelector", {{"matchLabels", environmentSelector(s)}}},
        {"ingress",
         json::array(
             {{{"fromEndpoints", json::array({{{"matchLabels", environmentSelector(s)}}})},
               {"toPorts", json::array({{{"ports", json::array({
                                                       {{"port", port}, {"protocol", "TCP"}},
                                                       {{"port", port}, {"protocol", "UDP"}},
                                                   })}}})}}})}}},
  };
  return {headless, policy};
}

std::string workloadId(const std::string& sentinel_id) { return strCat("sentinel/", sentinel_id); }

runtime::WorkloadSpec toWorkload(const cluster::v1::Sentinel& s, const std::string& sentinel_id) {
  runtime::WorkloadSpec w;
  w.id = workloadId(sentinel_id);
  w.image = s.image();
  w.replicas = replicasOf(s);
  w.env["KRANE_SENTINEL_ID"] = sentinel_id;
  w.env["KRANE_WORKSPACE_ID"] = s.workspace_id();
  w.env["KRANE_ENVIRONMENT_ID"] = s.environment_id();
  w.env["KRANE_REGION"] = s.region();
  if (!s.config_json().empty()) w.env["KRANE_SENTINEL_CONFIG"] = s.config_json();
  w.liveness.path = kLivenessPath;
  w.liveness.interval = std::chrono::seconds(10);
  w.liveness.timeout = std::chrono::seconds(2);
  w.readiness.path = kReadinessPath;
  w.readiness.interval = std::chrono::seconds(1);
  w.readiness.timeout = std::chrono::seconds(2);
  w.readiness.failure_threshold = 2;
  w.grace = std::chrono::seconds(30);
  return w;
}

cluster::v1::ReportSentinelStatusRequest sentinelReport(const Observed& o,
                                                        const std::string& sentinel_id,
                                                        const std::string& running_image,
                                                        uint64_t applied_version) {
  cluster::v1::ReportSentinelStatusRequest r;
  r.set_sentinel_id(sentinel_id);
  r.set_available_replicas(static_cast<uint32_t>(std::max(o.available, 0)));
  r.set_updated_replicas(static_cast<uint32_t>(std::max(o.updated, 0)));
  r.set_ready_replicas(static_cast<uint32_t>(std::max(o.ready, 0)));
  r.set_observed_generation(o.observed_generation);
  r.set_running_image(running_image);
  r.set_applied_version(applied_version);
  if (o.replicas == 0) {
    r.set_health(cluster::v1::SENTINEL_HEALTH_PAUSED);
  } else if (o.available > 0) {
    r.set_health(cluster::v1::SENTINEL_HEALTH_HEALTHY);
  } else {
    r.set_health(cluster::v1::SENTINEL_HEALTH_UNHEALTHY);
  }
  return r;
}

cluster::v1::ReportSentinelStatusRequest toReport(const runtime::WorkloadStatus& status,
                                                  const std::string& sentinel_id,
                                                  int64_t generation,
                                                  const std::string& converged_image,
                                                  uint64_t applied_version) {
  // The process runtime has no minimum ready time: a ready instance is available.
  Observed o;
  o.replicas = status.replicas;
  o.available = status.ready;
  o.updated = status.updated;
  o.ready = status.ready;
  o.observed_generation = generation;
  o.converged = status.converged;
  o.image = status.image;
  return sentinelReport(o, sentinel_id, converged_image, applied_version);
}

Observed observeDeployment(const json& deployment) {
  const json& spec = deployment.value("spec", json::object());
  const json& status = deployment.value("status", json::object());
  Observed o;
  // Absent counts are zero (the API server omits them); absent spec.replicas defaults to 1.
  o.replicas = spec.value("replicas", 1);
  o.available = status.value("availableReplicas", 0);
  o.updated = status.value("updatedReplicas", 0);
  o.ready = status.value("readyReplicas", 0);
  const int total = status.value("replicas", 0);
  o.observed_generation = status.value("observedGeneration", int64_t{0});
  const int64_t generation =
      deployment.value("metadata", json::object()).value("generation", int64_t{0});
  const json containers = spec.value("template", json::object())
                              .value("spec", json::object())
                              .value("containers", json::array());
  for (const auto& c : containers) {
    if (c.value("name", "") == "sentinel") o.image = c.value("image", "");
  }
  // The controller saw the current spec, and every pod is of it and available (no old pod left).
  o.converged = o.observed_generation >= generation && o.updated == o.replicas &&
                total == o.replicas && o.available == o.replicas;
  return o;
}

}  // namespace krane::sentinel
