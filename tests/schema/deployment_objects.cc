// The deployment plugin's objects for the variants that change them: fixed replicas or an
// autoscaler, with and without a port (no Service, no NetworkPolicy port), probes on another
// port, a custom shutdown signal (preStop hook), command and args, labels, stopped.
#include "common/strings.h"
#include "plugins/deployment/kube_objects.h"
#include "tests/schema/generators.h"

namespace krane::schema {
namespace {

cluster::v1::DeploymentTopology base() {
  cluster::v1::DeploymentTopology t;
  t.set_workspace_id("ws_1");
  t.set_project_id("proj_1");
  t.set_app_id("app_1");
  t.set_environment_id("env_prod");
  t.set_deployment_id("dep_abc123");
  t.set_region("eu-west-1");
  t.set_image("registry.example.com/app@sha256:0123456789abcdef");
  t.set_port(8080);
  t.set_replicas(3);
  t.set_cpu_millicores(250);
  t.set_memory_mib(128);
  auto* env = t.add_env();
  env->set_name("LOG_LEVEL");
  env->set_value("info");
  t.mutable_healthcheck()->mutable_liveness()->set_path("/healthz/live");
  t.mutable_healthcheck()->mutable_readiness()->set_path("/healthz/ready");
  t.mutable_healthcheck()->mutable_readiness()->set_period_seconds(2);
  return t;
}

}  // namespace

std::vector<GeneratedObject> deploymentObjects() {
  std::vector<std::pair<std::string, cluster::v1::DeploymentTopology>> variants;
  variants.emplace_back("fixed replicas", base());
  auto autoscaled = base();
  autoscaled.mutable_autoscaling()->set_min_replicas(2);
  autoscaled.mutable_autoscaling()->set_max_replicas(10);
  autoscaled.mutable_autoscaling()->set_target_cpu_percent(70);
  variants.emplace_back("autoscaled", autoscaled);
  auto worker = base();
  worker.clear_port();
  worker.clear_healthcheck();
  variants.emplace_back("no port", worker);
  auto custom = base();
  custom.add_command("/app/server");
  custom.add_args("--listen=:8080");
  custom.set_shutdown_signal("SIGINT");
  custom.set_termination_grace_period_seconds(45);
  custom.mutable_healthcheck()->mutable_liveness()->set_port(9090);
  (*custom.mutable_labels())["team"] = "web";
  variants.emplace_back("command, signal, probe port, labels", custom);
  auto rolling = base();
  rolling.mutable_rolling_update()->mutable_max_surge()->set_value(25);
  rolling.mutable_rolling_update()->mutable_max_surge()->set_percent(true);
  rolling.mutable_rolling_update()->mutable_max_unavailable()->set_value(1);
  rolling.mutable_rolling_update()->set_min_ready_seconds(10);
  rolling.mutable_rolling_update()->set_progress_deadline_seconds(300);
  variants.emplace_back("rolling update spec", rolling);
  auto stopped = base();
  stopped.set_desired_status(cluster::v1::DESIRED_STATUS_STOPPED);
  variants.emplace_back("stopped", stopped);

  std::vector<GeneratedObject> out;
  for (const auto& [name, topology] : variants) {
    auto objects = deployment::kubeObjects(topology, topology.deployment_id());
    if (!objects.ok()) {
      // A variant the renderer refuses is a defect of this list: surface it as a broken object.
      out.push_back({strCat("deployment ", name, ": refused: ", objects.status().message()),
                     nlohmann::json::object()});
      continue;
    }
    for (auto& o : *objects) {
      out.push_back({strCat("deployment ", name, ": ", o.value("kind", "?")), std::move(o)});
    }
  }
  return out;
}

}  // namespace krane::schema
