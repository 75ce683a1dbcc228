// The Kubernetes objects of a deployment topology, setting by setting: kinds and names, labels,
// the container (command, args, env, port, probes, resources, shutdown signal), replicas and the
// autoscaler, the Service and the network policy; refusals name the field. And pods as
// instances (kube_status.h).
#include <regex>

#include <catch2/catch.hpp>

#include "common/strings.h"
#include "plugins/deployment/kube_objects.h"
#include "plugins/deployment/kube_status.h"
#include "tests/support/matchers.h"

namespace krane::deployment {
namespace {

using nlohmann::json;

cluster::v1::DeploymentTopology topology() {
  cluster::v1::DeploymentTopology t;
  t.set_workspace_id("ws_Acme");
  t.set_project_id("proj_1");
  t.set_app_id("app_1");
  t.set_environment_id("env_prod");
  t.set_deployment_id("dep_42");
  t.set_region("eu-west-1");
  t.set_image("registry.example/app@sha256:abc");
  t.add_command("/srv/app");
  t.add_args("serve");
  t.add_args("--verbose");
  auto* e = t.add_env();
  e->set_name("B");
  e->set_value("2");
  e = t.add_env();
  e->set_name("A");
  e->set_value("$(B)1");
  t.set_port(8080);
  auto* live = t.mutable_healthcheck()->mutable_liveness();
  live->set_path("/healthz/live");
  live->set_period_seconds(10);
  live->set_failure_threshold(3);
  auto* ready = t.mutable_healthcheck()->mutable_readiness();
  ready->set_path("/healthz/ready");
  ready->set_port(9090);
  ready->set_initial_delay_seconds(2);
  ready->set_timeout_seconds(1);
  ready->set_success_threshold(2);
  t.set_cpu_millicores(250);
  t.set_memory_mib(512);
  t.set_replicas(3);
  t.set_termination_grace_period_seconds(45);
  (*t.mutable_labels())["team"] = "payments";
  (*t.mutable_labels())["krane.dev/app.id"] = "spoofed";
  return t;
}

std::vector<json> render(const cluster::v1::DeploymentTopology& t, const KubeOptions& o = {}) {
  auto objects = kubeObjects(t, "dep_42", o);
  CHECK_THAT(objects, IsOk());
  return objects.ok() ? *objects : std::vector<json>{};
}

const json* find(const std::vector<json>& objects, const std::string& kind) {
  for (const auto& o : objects) {
    if (o["kind"] == kind) return &o;
  }
  return nullptr;
}

std::string refusal(const cluster::v1::DeploymentTopology& t) {
  auto objects = kubeObjects(t, "dep_42");
  CHECK(objects.status().code() == absl::StatusCode::kInvalidArgument);
  return std::string(toStd(objects.status().message()));
}

TEST_CASE("kinds names and labels", "[deployment-kube-objects]") {
  const auto objects = render(topology());
  std::vector<std::string> kinds;
  kinds.reserve(objects.size());
  for (const auto& o : objects) kinds.push_back(o["kind"]);
  CHECK(kinds == std::vector<std::string>{"Namespace", "Deployment", "Service", "NetworkPolicy"});
  const std::regex dns_label("[a-z]([-a-z0-9]{0,61}[a-z0-9])?");
  const std::string ns = objects[0]["metadata"]["name"];
  INFO(ns);
  CHECK(std::regex_match(ns, dns_label));
  CHECK_THAT(ns, Catch::StartsWith("ws-ws-acme-"));
  CHECK(ns == workspaceNamespace("ws_Acme", {}));
  INFO("ids differing in case stay apart");
  CHECK(workspaceNamespace("ws_acme", {}) != ns);
  CHECK(objects[0]["metadata"]["labels"]["app.kubernetes.io/component"] == "workspace");
  for (size_t i = 1; i < objects.size(); ++i) {
    const json& m = objects[i]["metadata"];
    CHECK(m["namespace"] == ns);
    CHECK(m["name"] == objectName("dep_42"));
    INFO(m["name"]);
    CHECK(std::regex_match(m["name"].get<std::string>(), dns_label));
    const json& labels = m["labels"];
    CHECK(labels["app.kubernetes.io/managed-by"] == "krane");
    CHECK(labels["app.kubernetes.io/component"] == "deployment");
    CHECK(labels["krane.dev/workspace.id"] == "ws_Acme");
    CHECK(labels["krane.dev/project.id"] == "proj_1");
    INFO("Krane's ids win over the topology's labels");
    CHECK(labels["krane.dev/app.id"] == "app_1");
    CHECK(labels["krane.dev/environment.id"] == "env_prod");
    CHECK(labels["krane.dev/deployment.id"] == "dep_42");
    CHECK(labels["krane.dev/region"] == "eu-west-1");
    CHECK(labels["team"] == "payments");
  }
  const json& d = *find(objects, "Deployment");
  CHECK(d["spec"]["selector"]["matchLabels"] == json({{"krane.dev/deployment.id", "dep_42"}}));
  CHECK(d["spec"]["template"]["metadata"]["labels"] == d["metadata"]["labels"]);
  CHECK(d["spec"]["strategy"]["rollingUpdate"] == json({{"maxSurge", 1}, {"maxUnavailable", 0}}));
  CHECK_FALSE(d["spec"].contains("minReadySeconds"));
}

TEST_CASE("the rolling update spec reaches the deployment's strategy",
          "[deployment-kube-objects]") {
  auto t = topology();
  auto* u = t.mutable_rolling_update();
  u->mutable_max_surge()->set_value(25);
  u->mutable_max_surge()->set_percent(true);
  u->mutable_max_unavailable()->set_value(1);
  u->set_min_ready_seconds(10);
  u->set_progress_deadline_seconds(300);
  auto objects = kubeObjects(t, "dep_42");
  REQUIRE_THAT(objects, IsOk());
  const json& d = *find(*objects, "Deployment");
  CHECK(d["spec"]["strategy"]["rollingUpdate"] ==
        json({{"maxSurge", "25%"}, {"maxUnavailable", 1}}));
  CHECK(d["spec"]["minReadySeconds"] == 10);
  CHECK(d["spec"]["progressDeadlineSeconds"] == 300);
}

TEST_CASE("the container carries every setting", "[deployment-kube-objects]") {
  const auto objects = render(topology());
  const json& d = *find(objects, "Deployment");
  CHECK(d["spec"]["replicas"] == 3);
  const json& pod = d["spec"]["template"]["spec"];
  CHECK(pod["terminationGracePeriodSeconds"] == 45);
  CHECK(pod["automountServiceAccountToken"] == false);
  REQUIRE(pod["containers"].size() == 1u);
  const json& c = pod["containers"][0];
  CHECK(c["image"] == "registry.example/app@sha256:abc");
  CHECK(c["command"] == json({"/srv/app"}));
  CHECK(c["args"] == json({"serve", "--verbose"}));
  // The user's order first (a value may refer to an earlier one), then Krane's.
  std::vector<std::string> names;
  for (const auto& e : c["env"]) names.push_back(e["name"]);
  CHECK(names == std::vector<std::string>{"B", "A", "KRANE_DEPLOYMENT_ID", "KRANE_APP_ID",
                                          "KRANE_ENVIRONMENT_ID", "KRANE_REGION", "KRANE_APP_PORT",
                                          "PORT"});
  CHECK(c["env"][1]["value"] == "$(B)1");
  CHECK(c["env"][2]["value"] == "dep_42");
  CHECK(c["env"][7]["value"] == "8080");
  CHECK(c["ports"] == json::parse(R"([{"name":"http","containerPort":8080,"protocol":"TCP"}])"));
  CHECK(c["livenessProbe"] == json::parse(R"({"httpGet": {"path": "/healthz/live", "port": 8080,
        "scheme": "HTTP"}, "periodSeconds": 10, "failureThreshold": 3})"));
  CHECK(c["readinessProbe"] == json::parse(R"({"httpGet": {"path": "/healthz/ready", "port": 9090,
        "scheme": "HTTP"}, "initialDelaySeconds": 2, "timeoutSeconds": 1, "successThreshold": 2})"));
  CHECK(c["resources"] == json::parse(R"({"requests": {"cpu": "250m", "memory": "512Mi"},
        "limits": {"cpu": "250m", "memory": "512Mi"}})"));
  INFO("SIGTERM is what Kubernetes sends anyway");
  CHECK_FALSE(c.contains("lifecycle"));
}

TEST_CASE("another shutdown signal is sent by a pre stop hook", "[deployment-kube-objects]") {
  auto t = topology();
  t.set_shutdown_signal("SIGINT");
  const json c = find(render(t), "Deployment")->at("spec")["template"]["spec"]["containers"][0];
  const json command = c["lifecycle"]["preStop"]["exec"]["command"];
  REQUIRE(command.size() == 3u);
  CHECK(command[0] == "/bin/sh");
  CHECK_THAT(command[2].get<std::string>(), Catch::Contains("kill -s INT 1"));
  t.set_shutdown_signal("QUIT");
  const json q = find(render(t), "Deployment")->at("spec")["template"]["spec"]["containers"][0];
  CHECK_THAT(q["lifecycle"]["preStop"]["exec"]["command"][2].get<std::string>(),
             Catch::Contains("kill -s QUIT 1"));
}

TEST_CASE("user environment cannot override kranes identity but may its port",
          "[deployment-kube-objects]") {
  auto t = topology();
  auto* e = t.add_env();
  e->set_name("KRANE_DEPLOYMENT_ID");
  e->set_value("fake");
  e = t.add_env();
  e->set_name("PORT");
  e->set_value("3000");
  const json env =
      find(render(t), "Deployment")->at("spec")["template"]["spec"]["containers"][0]["env"];
  std::map<std::string, std::string> values;
  for (const auto& v : env) values[v["name"]] = v["value"];
  CHECK(values["KRANE_DEPLOYMENT_ID"] == "dep_42");
  CHECK(values["PORT"] == "3000");
  INFO("no name twice (server-side apply keys env by name)");
  CHECK(env.size() == values.size());
}

TEST_CASE("service and policy let only the sentinel namespace in", "[deployment-kube-objects]") {
  KubeOptions o;
  o.sentinel_namespace = "edge";
  const auto objects = render(topology(), o);
  const json& svc = *find(objects, "Service");
  CHECK(svc["spec"]["type"] == "ClusterIP");
  CHECK(svc["spec"]["selector"] == json({{"krane.dev/deployment.id", "dep_42"}}));
  CHECK(svc["spec"]["ports"][0]["port"] == 8080);
  CHECK(svc["spec"]["ports"][0]["targetPort"] == 8080);
  const json& np = *find(objects, "NetworkPolicy");
  CHECK(np["spec"]["podSelector"]["matchLabels"] == json({{"krane.dev/deployment.id", "dep_42"}}));
  CHECK(np["spec"]["policyTypes"] == json({"Ingress"}));
  REQUIRE(np["spec"]["ingress"].size() == 1u);
  CHECK(np["spec"]["ingress"][0] == json::parse(R"({"from": [{"namespaceSelector":
        {"matchLabels": {"kubernetes.io/metadata.name": "edge"}}}],
        "ports": [{"protocol": "TCP", "port": 8080}]})"));

  auto portless = topology();
  portless.set_port(0);
  portless.clear_healthcheck();
  const auto none = render(portless);
  CHECK(find(none, "Service") == nullptr);
  INFO("nothing gets in");
  CHECK_FALSE(find(none, "NetworkPolicy")->at("spec").contains("ingress"));
}

TEST_CASE("replicas autoscaler and stop", "[deployment-kube-objects]") {
  auto t = topology();
  t.set_replicas(10);
  auto* as = t.mutable_autoscaling();
  as->set_min_replicas(2);
  as->set_max_replicas(8);
  auto objects = render(t);
  const json* hpa = find(objects, "HorizontalPodAutoscaler");
  REQUIRE(hpa != nullptr);
  CHECK((*hpa)["apiVersion"] == "autoscaling/v2");
  CHECK((*hpa)["spec"]["scaleTargetRef"] ==
        json({{"apiVersion", "apps/v1"}, {"kind", "Deployment"}, {"name", objectName("dep_42")}}));
  CHECK((*hpa)["spec"]["minReplicas"] == 2);
  CHECK((*hpa)["spec"]["maxReplicas"] == 8);
  INFO("the default target");
  CHECK((*hpa)["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"] == 80);
  INFO("the autoscaler owns the count");
  CHECK_FALSE(find(objects, "Deployment")->at("spec").contains("replicas"));

  as->set_min_replicas(5);
  as->set_max_replicas(5);
  objects = render(t);
  CHECK(find(objects, "HorizontalPodAutoscaler") == nullptr);
  INFO("clamped into min..max");
  CHECK(find(objects, "Deployment")->at("spec")["replicas"] == 5);

  as->set_max_replicas(9);
  t.set_desired_status(cluster::v1::DESIRED_STATUS_STOPPED);
  objects = render(t);
  INFO("nothing to scale when stopped");
  CHECK(find(objects, "HorizontalPodAutoscaler") == nullptr);
  CHECK(find(objects, "Deployment")->at("spec")["replicas"] == 0);
}

TEST_CASE("refusals name the field", "[deployment-kube-objects]") {
  auto t = topology();
  t.clear_workspace_id();
  CHECK_THAT(refusal(t), Catch::Contains("workspace_id: required"));
  t = topology();
  t.clear_image();
  CHECK_THAT(refusal(t), Catch::Contains("image: required"));
  t = topology();
  t.set_environment_id("env prod");
  CHECK_THAT(refusal(t), Catch::Contains("environment_id: \"env prod\" must be at most 63"));
  t = topology();
  (*t.mutable_labels())["bad key!"] = "x";
  CHECK_THAT(refusal(t), Catch::Contains("labels: key \"bad key!\""));
  t = topology();
  t.add_env()->set_name("B");
  CHECK_THAT(refusal(t), Catch::Contains("env[2].name: \"B\" is set twice"));
  t = topology();
  t.add_env();
  CHECK_THAT(refusal(t), Catch::Contains("env[2].name: required"));
  t = topology();
  t.mutable_autoscaling()->set_min_replicas(4);
  t.mutable_autoscaling()->set_max_replicas(2);
  CHECK_THAT(refusal(t), Catch::Contains("autoscaling.min_replicas: 4 is above max_replicas 2"));
  t = topology();
  t.set_port(0);
  t.mutable_healthcheck()->mutable_readiness()->set_port(0);
  CHECK_THAT(refusal(t), Catch::Contains("healthcheck.liveness.port: required"));
  t = topology();
  t.set_shutdown_signal("SIGSTOP");
  CHECK_THAT(refusal(t), Catch::Contains("shutdown_signal: \"SIGSTOP\" is not one of"));
  t = topology();
  t.mutable_rolling_update()->mutable_max_surge()->set_value(0);
  t.mutable_rolling_update()->mutable_max_unavailable()->set_value(0);
  CHECK_THAT(refusal(t), Catch::Contains("rolling_update.max_surge, rolling_update.max_unavailable:"
                                         " at least one must be positive"));
  t = topology();
  t.mutable_rolling_update()->mutable_max_unavailable()->set_value(150);
  t.mutable_rolling_update()->mutable_max_unavailable()->set_percent(true);
  CHECK_THAT(refusal(t), Catch::Contains("rolling_update.max_unavailable: at most 100%, got 150%"));
  t = topology();
  t.mutable_rolling_update()->set_min_ready_seconds(30);
  t.mutable_rolling_update()->set_progress_deadline_seconds(20);
  CHECK_THAT(refusal(t),
             Catch::Contains("rolling_update.progress_deadline_seconds: must be above"));
}

json pod(const std::string& name, const std::string& phase, const json& container_status,
         bool ready = false) {
  return {
      {"metadata", {{"name", name}, {"labels", {{"pod-template-hash", "abc"}}}}},
      {"spec",
       {{"containers", json::array({{{"name", "app"},
                                     {"ports", json::array({{{"containerPort", 8080},
                                                             {"protocol", "TCP"}}})}}})}}},
      {"status",
       {{"phase", phase},
        {"podIP", "10.0.0.7"},
        {"conditions", json::array({{{"type", "Ready"}, {"status", ready ? "True" : "False"}}})},
        {"containerStatuses", json::array({container_status})}}}};
}

TEST_CASE("pods become instances", "[deployment-kube-status]") {
  using runtime::InstancePhase;
  const json running = {{"restartCount", 0}, {"state", {{"running", json::object()}}}};
  auto i = podInstance(pod("p1", "Running", running, true));
  REQUIRE(i);
  CHECK(i->phase == InstancePhase::kRunning);
  CHECK(i->ready);
  CHECK(i->address == "10.0.0.7:8080");

  i = podInstance(pod("p2", "Running", running, false));
  CHECK(i->phase == InstancePhase::kRunning);
  INFO("running but not ready is reported pending");
  CHECK_FALSE(i->ready);

  CHECK_FALSE(podInstance(pod("done", "Succeeded", running)));
  CHECK_FALSE(podInstance(pod("dead", "Failed", running)));

  json deleting = pod("p3", "Running", running, true);
  deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z";
  CHECK(podInstance(deleting)->phase == InstancePhase::kTerminating);

  const json crash = {{"restartCount", 4},
                      {"state", {{"waiting", {{"reason", "CrashLoopBackOff"}, {"message", "m"}}}}},
                      {"lastState", {{"terminated", {{"exitCode", 137}, {"signal", 9}}}}}};
  i = podInstance(pod("p4", "Running", crash));
  CHECK(i->phase == InstancePhase::kFailed);
  CHECK(i->reason == "CrashLoopBackOff: exit code 137, signal 9, 4 restarts: m");

  const json config_error = {
      {"state",
       {{"waiting", {{"reason", "CreateContainerConfigError"}, {"message", "no secret"}}}}}};
  i = podInstance(pod("p5", "Pending", config_error));
  CHECK(i->phase == InstancePhase::kFailed);
  CHECK(i->reason == "CreateContainerConfigError: no secret");

  json unscheduled = pod("p6", "Pending", json::object());
  unscheduled["status"].erase("podIP");
  unscheduled["status"]["conditions"] = json::array({{{"type", "PodScheduled"},
                                                      {"status", "False"},
                                                      {"reason", "Unschedulable"},
                                                      {"message", "0/3 nodes are available"}}});
  i = podInstance(unscheduled);
  CHECK(i->phase == InstancePhase::kPending);
  CHECK(i->reason == "Unschedulable: 0/3 nodes are available");
  CHECK(i->address == "");

  const auto status = podsStatus(
      "deployment/d", {pod("b", "Running", running, true), pod("a", "Running", running, false),
                       pod("c", "Succeeded", running)});
  REQUIRE(status.instances.size() == 2u);
  CHECK(status.instances[0].name == "a");
  CHECK(status.ready == 1);
}

}  // namespace
}  // namespace krane::deployment
