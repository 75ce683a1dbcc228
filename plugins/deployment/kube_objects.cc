#include "plugins/deployment/kube_objects.h"

#include <algorithm>
#include <map>

#include "common/strings.h"
#include "controlplane/strategy/rolling.h"
#include "plugins/deployment/signals.h"
#include "plugins/runtime/kubernetes/names.h"

namespace krane::deployment {
namespace {

using nlohmann::json;

// Identity labels, over the topology's own labels (ours win on the same key).
absl::StatusOr<json> labelsOf(const cluster::v1::DeploymentTopology& t,
                              const std::string& deployment_id) {
  json labels = json::object();
  // Sorted, so the rendering does not depend on the map's iteration order.
  std::map<std::string, std::string> extra(t.labels().begin(), t.labels().end());
  for (const auto& [key, value] : extra) {
    if (!kube::validLabelKey(key)) {
      return absl::InvalidArgumentError(
          strCat("labels: key \"", key,
                 "\" is not a label key (an optional DNS prefix and '/', then at most 63 "
                 "characters of [A-Za-z0-9-_.], alphanumeric at both ends)"));
    }
    if (!kube::validLabelValue(value)) {
      return absl::InvalidArgumentError(
          strCat("labels[", key, "]: \"", value,
                 "\" must be at most 63 characters of [A-Za-z0-9-_.], alphanumeric at both ends"));
    }
    labels[key] = value;
  }
  const std::pair<const char*, std::pair<const char*, const std::string*>> ids[] = {
      {"krane.dev/workspace.id", {"workspace_id", &t.workspace_id()}},
      {"krane.dev/project.id", {"project_id", &t.project_id()}},
      {"krane.dev/app.id", {"app_id", &t.app_id()}},
      {"krane.dev/environment.id", {"environment_id", &t.environment_id()}},
      {"krane.dev/region", {"region", &t.region()}},
      {kDeploymentIdLabel, {"resource id", &deployment_id}},
  };
  for (const auto& [key, field] : ids) {
    if (!kube::validLabelValue(*field.second)) {
      return absl::InvalidArgumentError(
          strCat(field.first, ": \"", *field.second,
                 "\" must be at most 63 characters of [A-Za-z0-9-_.], alphanumeric at both ends"));
    }
    labels[key] = *field.second;
  }
  labels["app.kubernetes.io/managed-by"] = "krane";
  labels["app.kubernetes.io/component"] = kComponent;
  return labels;
}

// An HTTP probe; null when the probe is disabled (no path).
absl::StatusOr<json> probeOf(const cluster::v1::HttpProbe& p, uint32_t app_port, bool liveness,
                             const std::string& field) {
  if (p.path().empty()) return json();
  const uint32_t port = p.port() > 0 ? p.port() : app_port;
  if (port == 0 || port > 65535) {
    return absl::InvalidArgumentError(
        strCat(field, ".port: required (1-65535) when the topology has no port"));
  }
  json probe = {{"httpGet", {{"path", p.path()}, {"port", port}, {"scheme", "HTTP"}}}};
  // Zero keeps Kubernetes' default, as on the process runtime.
  if (p.initial_delay_seconds() > 0) probe["initialDelaySeconds"] = p.initial_delay_seconds();
  if (p.period_seconds() > 0) probe["periodSeconds"] = p.period_seconds();
  if (p.timeout_seconds() > 0) probe["timeoutSeconds"] = p.timeout_seconds();
  if (p.failure_threshold() > 0) probe["failureThreshold"] = p.failure_threshold();
  // Kubernetes requires 1 for a liveness probe (one success proves the process alive), so the
  // field only means something for readiness.
  if (!liveness && p.success_threshold() > 0) probe["successThreshold"] = p.success_threshold();
  return probe;
}

absl::StatusOr<json> envOf(const cluster::v1::DeploymentTopology& t,
                           const std::string& deployment_id) {
  json env = json::array();
  std::map<std::string, size_t> at;  // name -> index in env
  for (int i = 0; i < t.env_size(); ++i) {
    const auto& e = t.env(i);
    if (e.name().empty()) return absl::InvalidArgumentError(strCat("env[", i, "].name: required"));
    if (at.count(e.name()) > 0) {
      // Server-side apply keys the list by name: a second entry would be refused.
      return absl::InvalidArgumentError(
          strCat("env[", i, "].name: \"", e.name(), "\" is set twice"));
    }
    at[e.name()] = env.size();
    env.push_back({{"name", e.name()}, {"value", e.value()}});
  }
  // What the process runtime gives its instances too; Krane's identity wins over a user value.
  const auto set = [&](const std::string& name, const std::string& value, bool user_wins) {
    auto it = at.find(name);
    if (it == at.end()) {
      at[name] = env.size();
      env.push_back({{"name", name}, {"value", value}});
    } else if (!user_wins) {
      env[it->second]["value"] = value;
    }
  };
  set("KRANE_DEPLOYMENT_ID", t.deployment_id().empty() ? deployment_id : t.deployment_id(), false);
  if (!t.app_id().empty()) set("KRANE_APP_ID", t.app_id(), false);
  if (!t.environment_id().empty()) set("KRANE_ENVIRONMENT_ID", t.environment_id(), false);
  if (!t.region().empty()) set("KRANE_REGION", t.region(), false);
  if (t.port() > 0) {
    set("KRANE_APP_PORT", std::to_string(t.port()), false);
    // Apps written for the process runtime listen on $PORT; the same image works here.
    set("PORT", std::to_string(t.port()), true);
  }
  return env;
}

json metadata(const std::string& name, const std::string& ns, const json& labels) {
  return {{"name", name}, {"namespace", ns}, {"labels", labels}};
}

}  // namespace

const std::vector<std::pair<std::string, std::string>> kNotOnKubernetes = {};

std::string workspaceNamespace(const std::string& workspace_id, const KubeOptions& options) {
  return kube::dnsLabel(options.namespace_prefix, workspace_id);
}

std::string objectName(const std::string& deployment_id) {
  // Service names must start with a letter: the prefix makes sure of it.
  return kube::dnsLabel("d", deployment_id);
}

const std::vector<std::pair<std::string, std::string>>& deploymentKinds() {
  static const std::vector<std::pair<std::string, std::string>> kinds = {
      {"apps/v1", "Deployment"},
      {"v1", "Service"},
      {"autoscaling/v2", "HorizontalPodAutoscaler"},
      {"networking.k8s.io/v1", "NetworkPolicy"},
  };
  return kinds;
}

absl::StatusOr<std::vector<json>> kubeObjects(const cluster::v1::DeploymentTopology& t,
                                              const std::string& deployment_id,
                                              const KubeOptions& options) {
  if (deployment_id.empty()) return absl::InvalidArgumentError("resource id: required");
  if (t.workspace_id().empty()) {
    return absl::InvalidArgumentError("workspace_id: required (it names the namespace)");
  }
  if (t.image().empty()) return absl::InvalidArgumentError("image: required");
  if (t.port() > 65535) {
    return absl::InvalidArgumentError(strCat("port: must be at most 65535, got ", t.port()));
  }
  if (t.has_rolling_update()) {
    if (auto st = strategy::checkRollingUpdate(t.rolling_update(), "rolling_update."); !st.ok()) {
      return st;
    }
  }
  auto labels = labelsOf(t, deployment_id);
  if (!labels.ok()) return labels.status();
  const std::string ns = workspaceNamespace(t.workspace_id(), options);
  const std::string name = objectName(deployment_id);
  const json selector = {{kDeploymentIdLabel, deployment_id}};

  // Replicas: zero when stopped; an autoscaler when min and max differ (then spec.replicas
  // belongs to it and is not applied: every full sync re-applies each topology, and would
  // otherwise reset what the autoscaler chose); else the count, clamped into [min, max].
  const bool stopped = t.desired_status() == cluster::v1::DESIRED_STATUS_STOPPED;
  const auto& as = t.autoscaling();
  const bool bounded = t.has_autoscaling() && as.max_replicas() > 0;
  // The autoscaler needs at least one replica; min 0 means 1.
  const uint32_t min_replicas = std::max<uint32_t>(as.min_replicas(), 1);
  if (bounded && min_replicas > as.max_replicas()) {
    return absl::InvalidArgumentError(strCat("autoscaling.min_replicas: ", as.min_replicas(),
                                             " is above max_replicas ", as.max_replicas()));
  }
  if (t.has_autoscaling() && as.target_cpu_percent() > 1000) {
    return absl::InvalidArgumentError(
        strCat("autoscaling.target_cpu_percent: must be at most "
               "1000, got ",
               as.target_cpu_percent()));
  }
  const bool autoscaled = !stopped && bounded && min_replicas != as.max_replicas();

  json container = {
      {"name", kContainerName}, {"image", t.image()}, {"imagePullPolicy", "IfNotPresent"}};
  // command replaces the image's ENTRYPOINT, args its CMD, as the topology's fields mean.
  if (t.command_size() > 0) {
    container["command"] = std::vector<std::string>(t.command().begin(), t.command().end());
  }
  if (t.args_size() > 0) {
    container["args"] = std::vector<std::string>(t.args().begin(), t.args().end());
  }
  auto env = envOf(t, deployment_id);
  if (!env.ok()) return env.status();
  container["env"] = *env;
  if (t.port() > 0) {
    container["ports"] =
        json::array({{{"name", "http"}, {"containerPort", t.port()}, {"protocol", "TCP"}}});
  }
  auto liveness = probeOf(t.healthcheck().liveness(), t.port(), true, "healthcheck.liveness");
  if (!liveness.ok()) return liveness.status();
  if (!liveness->is_null()) container["livenessProbe"] = *liveness;
  auto readiness = probeOf(t.healthcheck().readiness(), t.port(), false, "healthcheck.readiness");
  if (!readiness.ok()) return readiness.status();
  if (!readiness->is_null()) container["readinessProbe"] = *readiness;
  json resources = json::object();
  // Requests equal limits: the instance gets what the topology says, no more, no less.
  if (t.cpu_millicores() > 0) {
    resources["requests"]["cpu"] = strCat(t.cpu_millicores(), "m");
    resources["limits"]["cpu"] = strCat(t.cpu_millicores(), "m");
  }
  if (t.memory_mib() > 0) {
    resources["requests"]["memory"] = strCat(t.memory_mib(), "Mi");
    resources["limits"]["memory"] = strCat(t.memory_mib(), "Mi");
  }
  if (!resources.empty()) container["resources"] = resources;
  // Kubernetes stops a container with the image's STOPSIGNAL (SIGTERM by default); a pod spec
  // cannot name another signal on the clusters Krane supports. Another signal is sent by a
  // preStop hook to PID 1 (the container's entrypoint), which then waits for the process to
  // end; the kubelet's own SIGTERM only follows once the hook returns, all within the grace
  // period. This needs /bin/sh in the image.
  auto sig = signalName(t.shutdown_signal());
  if (!sig.ok()) return sig.status();
  if (*sig != "TERM") {
    container["lifecycle"] = {
        {"preStop",
         {{"exec",
           {{"command",
             json::array({"/bin/sh", "-c",
                          strCat("kill -s ", *sig,
                                 " 1; while kill -0 1 2>/dev/null; do sleep 1; done")})}}}}}};
  }

  json pod_spec = {
      {"containers", json::array({container})},
      // Workloads do not talk to the API server; a service-link variable for every Service of
      // the workspace namespace would only grow their environment.
      {"automountServiceAccountToken", false},
      {"enableServiceLinks", false},
  };
  if (t.termination_grace_period_seconds() > 0) {
    pod_spec["terminationGracePeriodSeconds"] = t.termination_grace_period_seconds();
  }

  // A Deployment rather than a bare ReplicaSet: a change of the pod template (env, resources,
  // probes, command) must replace running pods step by step, within the topology's rolling
  // update spec (default surge 1, unavailable 0, as on the process runtime). A ReplicaSet never
  // replaces pods whose template changed, so Krane would have to run that rollout itself; the
  // Deployment controller already does, keeps a revision history, and its status
  // (observedGeneration, updated / available replicas) says when a rollout converged.
  const auto& update = t.rolling_update();
  auto intOrPercent = [](const cluster::v1::IntOrPercent& v) -> json {
    return v.percent() ? json(strCat(v.value(), "%")) : json(v.value());
  };
  json deployment_spec = {
      {"selector", {{"matchLabels", selector}}},
      {"strategy",
       {{"type", "RollingUpdate"},
        {"rollingUpdate",
         {{"maxSurge", update.has_max_surge() ? intOrPercent(update.max_surge()) : json(1)},
          {"maxUnavailable",
           update.has_max_unavailable() ? intOrPercent(update.max_unavailable()) : json(0)}}}}},
      {"revisionHistoryLimit", 3},
      {"template", {{"metadata", {{"labels", *labels}}}, {"spec", pod_spec}}},
  };
  if (update.min_ready_seconds() > 0)
    deployment_spec["minReadySeconds"] = update.min_ready_seconds();
  if (update.progress_deadline_seconds() > 0) {
    deployment_spec["progressDeadlineSeconds"] = update.progress_deadline_seconds();
  }
  if (!autoscaled) {
    uint32_t replicas = t.replicas();
    if (bounded) replicas = std::clamp(replicas, min_replicas, as.max_replicas());
    if (stopped) replicas = 0;
    deployment_spec["replicas"] = replicas;
  }

  std::vector<json> objects;
  objects.push_back({{"apiVersion", "v1"},
                     {"kind", "Namespace"},
                     {"metadata",
                      {{"name", ns},
                       {"labels",
                        {{"app.kubernetes.io/managed-by", "krane"},
                         {"app.kubernetes.io/component", "workspace"},
                         {"krane.dev/workspace.id", t.workspace_id()}}}}}});
  objects.push_back({{"apiVersion", "apps/v1"},
                     {"kind", "Deployment"},
                     {"metadata", metadata(name, ns, *labels)},
                     {"spec", deployment_spec}});
  if (t.port() > 0) {
    objects.push_back({{"apiVersion", "v1"},
                       {"kind", "Service"},
                       {"metadata", metadata(name, ns, *labels)},
                       {"spec",
                        {{"type", "ClusterIP"},
                         {"selector", selector},
                         {"ports", json::array({{{"name", "http"},
                                                 {"port", t.port()},
                                                 {"targetPort", t.port()},
                                                 {"protocol", "TCP"}}})}}}});
  }
  if (autoscaled) {
    objects.push_back(
        {{"apiVersion", "autoscaling/v2"},
         {"kind", "HorizontalPodAutoscaler"},
         {"metadata", metadata(name, ns, *labels)},
         {"spec",
          {{"scaleTargetRef", {{"apiVersion", "apps/v1"}, {"kind", "Deployment"}, {"name", name}}},
           {"minReplicas", min_replicas},
           {"maxReplicas", as.max_replicas()},
           {"metrics", json::array({{{"type", "Resource"},
                                     {"resource",
                                      {{"name", "cpu"},
                                       {"target",
                                        {{"type", "Utilization"},
                                         {"averageUtilization", as.target_cpu_percent() > 0
                                                                    ? as.target_cpu_percent()
                                                                    : 80}}}}}}})}}}});
  }
  // Only the sentinels (the routing layer) reach the app port; nothing else reaches the pods.
  json policy_spec = {{"podSelector", {{"matchLabels", selector}}},
                      {"policyTypes", json::array({"Ingress"})}};
  if (t.port() > 0) {
    policy_spec["ingress"] = json::array(
        {{{"from",
           json::array({{{"namespaceSelector",
                          {{"matchLabels",
                            {{"kubernetes.io/metadata.name", options.sentinel_namespace}}}}}}})},
          {"ports", json::array({{{"protocol", "TCP"}, {"port", t.port()}}})}}});
  }
  objects.push_back({{"apiVersion", "networking.k8s.io/v1"},
                     {"kind", "NetworkPolicy"},
                     {"metadata", metadata(name, ns, *labels)},
                     {"spec", policy_spec}});
  return objects;
}

}  // namespace krane::deployment
