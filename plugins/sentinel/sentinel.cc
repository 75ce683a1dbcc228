#include "plugins/sentinel/sentinel.h"

#include <algorithm>
#include <cctype>

#include "common/status.h"
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

std::string routesName(const std::string& sentinel_id) {
  return objectName("sentinel-routes", sentinel_id);
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
  const cluster::v1::Healthcheck probes = probesOf(s);
  for (const auto* p : {&probes.liveness(), &probes.readiness()}) {
    const char* which = p == &probes.liveness() ? "liveness" : "readiness";
    if (p->path().front() != '/') {
      return absl::InvalidArgumentError(
          strCat("sentinel.healthcheck.", which, ".path: must start with '/'"));
    }
    if (p->port() > 65535) {
      return absl::InvalidArgumentError(
          strCat("sentinel.healthcheck.", which, ".port: must be at most 65535"));
    }
  }
  if (probes.liveness().path() == probes.readiness().path()) {
    return absl::InvalidArgumentError(
        strCat("sentinel.healthcheck.readiness.path: \"", probes.readiness().path(),
               "\" is the liveness path; readiness needs its own endpoint"));
  }
  return absl::OkStatus();
}

cluster::v1::Healthcheck probesOf(const cluster::v1::Sentinel& s) {
  cluster::v1::Healthcheck h = s.healthcheck();
  const auto fill = [](cluster::v1::HttpProbe* p, const char* path, uint32_t period,
                       uint32_t failures) {
    if (p->path().empty()) p->set_path(path);
    if (p->port() == 0) p->set_port(kHealthPort);
    if (p->period_seconds() == 0) p->set_period_seconds(period);
    if (p->timeout_seconds() == 0) p->set_timeout_seconds(2);
    if (p->failure_threshold() == 0) p->set_failure_threshold(failures);
    if (p->success_threshold() == 0) p->set_success_threshold(1);
  };
  fill(h.mutable_liveness(), kLivenessPath, 10, 3);
  fill(h.mutable_readiness(), kReadinessPath, 5, 2);
  return h;
}

namespace {

json probeJson(const cluster::v1::HttpProbe& p) {
  // The health port by its name; another port (8040, say, which answers probes too) as given.
  const json port = p.port() == kHealthPort ? json(kHealthPortName) : json(p.port());
  json probe = {{"httpGet", {{"path", p.path()}, {"port", port}}},
                {"periodSeconds", p.period_seconds()},
                {"timeoutSeconds", p.timeout_seconds()},
                {"failureThreshold", p.failure_threshold()},
                {"successThreshold", p.success_threshold()}};
  if (p.initial_delay_seconds() > 0) probe["initialDelaySeconds"] = p.initial_delay_seconds();
  return probe;
}

absl::Status badKey(const std::string& at, std::string_view what) {
  return absl::InvalidArgumentError(strCat(at, ": ", what));
}

// A DNS-1123 subdomain (Secret names): lowercase alphanumerics, '-' and '.', at most 253.
bool dnsSubdomain(const std::string& name) {
  if (name.empty() || name.size() > 253) return false;
  const auto ok = [](char c) {
    return std::islower(static_cast<unsigned char>(c)) ||
           std::isdigit(static_cast<unsigned char>(c));
  };
  if (!ok(name.front()) || !ok(name.back())) return false;
  return std::all_of(name.begin(), name.end(),
                     [&](char c) { return ok(c) || c == '-' || c == '.'; });
}

// An environment variable name Kubernetes accepts (C identifier-like, also '-' and '.').
bool envName(const std::string& name) {
  if (name.empty() || std::isdigit(static_cast<unsigned char>(name.front()))) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
  });
}

absl::StatusOr<std::string> stringOf(const json& object, const std::string& key,
                                     const std::string& at, bool required) {
  if (!object.contains(key)) {
    if (required) return badKey(strCat(at, ".", key), "required");
    return std::string();
  }
  if (!object[key].is_string()) return badKey(strCat(at, ".", key), "must be a string");
  return object[key].get<std::string>();
}

absl::Status onlyKeysOf(const json& object, const std::string& at,
                        std::initializer_list<std::string_view> known) {
  if (!object.is_object()) return badKey(at, "must be a mapping");
  for (const auto& [key, _] : object.items()) {
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      return badKey(strCat(at, ".", key), "unknown key");
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PodOptions> podOptionsFromJson(const json& section, const std::string& path) {
  PodOptions pod;
  if (section.contains("node_selector")) {
    const std::string at = strCat(path, ".node_selector");
    const json& selector = section["node_selector"];
    if (!selector.is_object()) return badKey(at, "must be a mapping of label key to value");
    pod.node_selector.clear();
    for (const auto& [key, value] : selector.items()) {
      if (!kube::validLabelKey(key)) return badKey(strCat(at, ".", key), "not a label key");
      if (!value.is_string() || !kube::validLabelValue(value.get<std::string>())) {
        return badKey(strCat(at, ".", key), "must be a label value");
      }
      pod.node_selector[key] = value.get<std::string>();
    }
  }
  if (section.contains("tolerations")) {
    const std::string at = strCat(path, ".tolerations");
    const json& list = section["tolerations"];
    if (!list.is_array()) return badKey(at, "must be a list of tolerations");
    pod.tolerations.clear();
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string item = strCat(at, "[", i, "]");
      KRANE_RETURN_IF_ERROR(
          onlyKeysOf(list[i], item, {"key", "operator", "value", "effect", "tolerationSeconds"}));
      KRANE_ASSIGN_OR_RETURN(std::string key, stringOf(list[i], "key", item, false));
      KRANE_ASSIGN_OR_RETURN(std::string op, stringOf(list[i], "operator", item, false));
      KRANE_ASSIGN_OR_RETURN(std::string value, stringOf(list[i], "value", item, false));
      KRANE_ASSIGN_OR_RETURN(std::string effect, stringOf(list[i], "effect", item, false));
      if (!key.empty() && !kube::validLabelKey(key))
        return badKey(item + ".key", "not a label key");
      if (!op.empty() && op != "Equal" && op != "Exists") {
        return badKey(item + ".operator", "Equal or Exists");
      }
      if (op == "Exists" && !value.empty()) {
        return badKey(item + ".value", "must be empty with operator Exists");
      }
      if (!effect.empty() && effect != "NoSchedule" && effect != "PreferNoSchedule" &&
          effect != "NoExecute") {
        return badKey(item + ".effect", "NoSchedule, PreferNoSchedule or NoExecute");
      }
      json t = json::object();
      if (!key.empty()) t["key"] = key;
      if (!op.empty()) t["operator"] = op;
      if (!value.empty()) t["value"] = value;
      if (!effect.empty()) t["effect"] = effect;
      if (list[i].contains("tolerationSeconds")) {
        if (!list[i]["tolerationSeconds"].is_number_integer()) {
          return badKey(item + ".tolerationSeconds", "must be a whole number");
        }
        if (effect != "NoExecute") {
          return badKey(item + ".tolerationSeconds", "only with effect NoExecute");
        }
        t["tolerationSeconds"] = list[i]["tolerationSeconds"];
      }
      pod.tolerations.push_back(t);
    }
  }
  if (section.contains("secret_env")) {
    const std::string at = strCat(path, ".secret_env");
    const json& list = section["secret_env"];
    if (!list.is_array()) return badKey(at, "must be a list of {name, secret, key}");
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string item = strCat(at, "[", i, "]");
      KRANE_RETURN_IF_ERROR(onlyKeysOf(list[i], item, {"name", "secret", "key"}));
      SecretEnv e;
      KRANE_ASSIGN_OR_RETURN(e.name, stringOf(list[i], "name", item, true));
      KRANE_ASSIGN_OR_RETURN(e.secret, stringOf(list[i], "secret", item, true));
      KRANE_ASSIGN_OR_RETURN(e.key, stringOf(list[i], "key", item, true));
      if (!envName(e.name)) return badKey(item + ".name", "not an environment variable name");
      if (!dnsSubdomain(e.secret)) return badKey(item + ".secret", "not a Secret name");
      if (!envName(e.key)) return badKey(item + ".key", "not a Secret key");
      pod.secret_env.push_back(std::move(e));
    }
  }
  if (section.contains("env_from_secrets")) {
    const std::string at = strCat(path, ".env_from_secrets");
    const json& list = section["env_from_secrets"];
    if (!list.is_array()) return badKey(at, "must be a list of Secret names");
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string item = strCat(at, "[", i, "]");
      if (!list[i].is_string() || !dnsSubdomain(list[i].get<std::string>())) {
        return badKey(item, "not a Secret name");
      }
      pod.env_from_secrets.push_back(list[i].get<std::string>());
    }
  }
  return pod;
}

std::vector<json> sentinelObjects(const cluster::v1::Sentinel& s, const PodOptions& pod) {
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
  const cluster::v1::Healthcheck probes = probesOf(s);
  env.push_back({{"name", "KRANE_LIVENESS_PATH"}, {"value", probes.liveness().path()}});
  env.push_back({{"name", "KRANE_READINESS_PATH"}, {"value", probes.readiness().path()}});
  env.push_back({{"name", "PORT"}, {"value", std::to_string(kHttpPort)}});
  env.push_back({{"name", "KRANE_HEALTH_PORT"}, {"value", std::to_string(kHealthPort)}});
  env.push_back({{"name", "KRANE_DRAIN_SECONDS"}, {"value", std::to_string(kDrainSeconds)}});
  env.push_back({{"name", "KRANE_ROUTES_CONFIGMAP"},
                 {"value", strCat(kNamespace, "/", routesName(s.sentinel_id()))}});
  for (const auto& e : pod.secret_env) {
    env.push_back({{"name", e.name},
                   {"valueFrom", {{"secretKeyRef", {{"name", e.secret}, {"key", e.key}}}}}});
  }
  json container = {
      {"name", "sentinel"},
      {"image", s.image()},
      {"ports",
       json::array(
           {{{"name", "http"}, {"containerPort", kHttpPort}, {"protocol", "TCP"}},
            {{"name", kHealthPortName}, {"containerPort", kHealthPort}, {"protocol", "TCP"}},
            {{"name", "gossip-tcp"}, {"containerPort", kGossipPort}, {"protocol", "TCP"}},
            {{"name", "gossip-udp"}, {"containerPort", kGossipPort}, {"protocol", "UDP"}}})},
      {"env", env},
      {"livenessProbe", probeJson(probes.liveness())},
      {"readinessProbe", probeJson(probes.readiness())},
  };
  if (!resources.empty()) container["resources"] = resources;
  if (!pod.env_from_secrets.empty()) {
    json from = json::array();
    for (const auto& secret : pod.env_from_secrets) {
      from.push_back({{"secretRef", {{"name", secret}}}});
    }
    container["envFrom"] = from;
  }
  json pod_spec = {
      // Its token lets the proxy read its routes ConfigMap, and nothing else.
      {"serviceAccountName", kServiceAccount},
      {"automountServiceAccountToken", true},
      // SIGTERM starts the proxy's drain: it must not be killed before it is over.
      {"terminationGracePeriodSeconds", kTerminationGraceSeconds},
      {"topologySpreadConstraints",
       json::array({{{"maxSkew", 1},
                     {"topologyKey", "topology.kubernetes.io/zone"},
                     {"whenUnsatisfiable", "ScheduleAnyway"},
                     {"labelSelector", {{"matchLabels", selector(s)}}}}})},
      {"containers", json::array({container})},
  };
  if (!pod.tolerations.empty()) pod_spec["tolerations"] = pod.tolerations;
  if (!pod.node_selector.empty()) pod_spec["nodeSelector"] = pod.node_selector;
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
        {"template", {{"metadata", {{"labels", labels}}}, {"spec", pod_spec}}}}},
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

json routesConfigMap(const cluster::v1::Sentinel& s, const Routes& routes) {
  return {{"apiVersion", "v1"},
          {"kind", "ConfigMap"},
          {"metadata", metadata(routesName(s.sentinel_id()), sentinelLabels(s))},
          {"data", {{kRoutesKey, routesJson(routes)}}}};
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
  // The process runtime gives each instance a health port of its own (KRANE_HEALTH_PORT, as on
  // Kubernetes) and probes it there, so that requests taking every thread of the proxy do not
  // fail its liveness; readiness every second unless the resource says otherwise, so a local
  // sentinel takes traffic soon after it has routes.
  w.health_port_env = "KRANE_HEALTH_PORT";
  const cluster::v1::Healthcheck probes = probesOf(s);
  const auto& live = probes.liveness();
  const auto& ready = probes.readiness();
  w.env["KRANE_LIVENESS_PATH"] = live.path();
  w.env["KRANE_READINESS_PATH"] = ready.path();
  w.liveness.path = live.path();
  w.liveness.initial_delay = std::chrono::seconds(live.initial_delay_seconds());
  w.liveness.interval = std::chrono::seconds(live.period_seconds());
  w.liveness.timeout = std::chrono::seconds(live.timeout_seconds());
  w.liveness.failure_threshold = static_cast<int>(live.failure_threshold());
  w.readiness.path = ready.path();
  w.readiness.initial_delay = std::chrono::seconds(ready.initial_delay_seconds());
  w.readiness.interval = std::chrono::seconds(
      s.healthcheck().readiness().period_seconds() > 0 ? ready.period_seconds() : 1);
  w.readiness.timeout = std::chrono::seconds(ready.timeout_seconds());
  w.readiness.failure_threshold = static_cast<int>(ready.failure_threshold());
  // No drain: the runtime takes an instance out of its published endpoints
  // deregistration_delay_ms before the signal already. Requests in flight may take the upstream
  // timeout.
  w.env["KRANE_DRAIN_SECONDS"] = "0";
  w.grace = std::chrono::seconds(kUpstreamTimeoutSeconds + 10);
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
