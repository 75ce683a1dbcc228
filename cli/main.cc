// kranectl: the operator's command line for krane-ctrl's public API.
//
//   kranectl apply -f app.yaml          create or replace the resources of a file
//   kranectl get deployments            list (table, json or yaml)
//   kranectl status deployment demo --region local-1 --wait
//   kranectl watch                      changes as they are committed
//   kranectl agents                     each agent: region, leader, version, lag, heartbeat
//   kranectl delete deployment demo --region local-1   (or delete -f app.yaml)
//
//   kranectl deploy --app demo --env production --image demo-app:v2   follow the deploy's steps
//   kranectl deploy --app demo --env production --image-name demo-app -- make image
//   kranectl deployments list --app demo | deployments get ID
//   kranectl promote ID | rollback --env production | cancel ID
//   kranectl create workspace|project|app|environment ...   what deployments belong to
//
//   kranectl rollout sentinels --image sentinel:v2 [--waves 1,5,25,50,100] [--bake 2m] --watch
//   kranectl rollout status [--watch] | resume | cancel | rollback
//   kranectl sentinels list [--env E] [--region R] | sentinels get ID
//
// Exit codes (stable, for scripts): 0 success; 1 the server refused the request; 2 bad usage or
// an invalid file; 3 the server cannot be reached; 4 the token was refused; 5 not found;
// 6 `status --wait` saw the resource fail, the deploy did not become ready, or the sentinel
// rollout is paused; 7 timed out.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>
#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include "CLI/CLI.hpp"
#include "cli/common.h"
#include "cli/manifest.h"
#include "cli/rollout.h"
#include "common/strings.h"
#include "common/version.h"
#include "krane/api/v1/agents.grpc.pb.h"
#include "krane/api/v1/deployments.grpc.pb.h"
#include "krane/api/v1/resources.grpc.pb.h"
#include "krane/api/v1/tenancy.grpc.pb.h"

namespace krane::cli {
namespace {

std::string summary(const cluster::v1::Resource& r) {
  if (r.has_deployment_topology()) {
    const auto& d = r.deployment_topology();
    return strCat(d.image(), " x", d.replicas());
  }
  if (r.has_sentinel()) return strCat(r.sentinel().image(), " x", r.sentinel().replicas());
  if (r.has_cilium_network_policy())
    return strCat(r.cilium_network_policy().policy_json().size(), " bytes of policy");
  if (r.has_generic()) return r.generic().content_type();
  return "";
}

// --- commands ----------------------------------------------------------------------------------

int apply(const Globals& g, const std::string& file, bool dry_run) {
  auto entries = loadManifests(file);
  if (!entries.ok()) return fail(kUsage, std::string(toStd(entries.status().message())));
  if (dry_run) {
    for (const auto& e : *entries)
      std::printf("%s/%s (%s): valid\n", e.resource.type().c_str(), e.resource.id().c_str(),
                  e.resource.region().c_str());
    return kOk;
  }
  Api api(g);
  for (const auto& e : *entries) {
    v1::PutResourceRequest request;
    *request.mutable_resource() = e.resource;
    v1::PutResourceResponse response;
    const auto s = api.resources().Put(api.context().get(), request, &response);
    if (!s.ok()) return rpcFail(g, e.origin, s);
    std::printf("%s/%s (%s) %s, version %llu\n", e.resource.type().c_str(), e.resource.id().c_str(),
                e.resource.region().c_str(), response.created() ? "created" : "configured",
                static_cast<unsigned long long>(response.version()));
  }
  return kOk;
}

int get(const Globals& g, const std::string& type_name, const std::string& id,
        const std::string& region) {
  Api api(g);
  const std::string type = type_name.empty() ? "" : resourceType(type_name);
  std::vector<cluster::v1::Resource> found;
  std::string token;
  do {
    v1::ListResourcesRequest request;
    request.set_region(region);
    request.set_type(type);
    request.set_page_token(token);
    v1::ListResourcesResponse response;
    const auto s = api.resources().List(api.context().get(), request, &response);
    if (!s.ok()) return rpcFail(g, "get", s);
    for (const auto& r : response.resources())
      if (id.empty() || r.id() == id) found.push_back(r);
    token = response.next_page_token();
  } while (!token.empty());
  if (!id.empty() && found.empty()) {
    return fail(kNotFound, strCat(type, " \"", id, "\" does not exist",
                                  region.empty() ? "" : strCat(" in region \"", region, "\"")));
  }
  if (g.output != "table") {
    Json all = Json::array();
    for (const auto& r : found) all.push_back(protoJson(r));
    printStructured(g, id.empty() ? all : (found.size() == 1 ? all[0] : all));
    return kOk;
  }
  std::vector<std::vector<std::string>> rows{{"TYPE", "ID", "REGION", "VERSION", "SPEC"}};
  for (const auto& r : found)
    rows.push_back({r.type(), r.id(), r.region(), strCat(r.version()), summary(r)});
  if (found.empty()) {
    std::printf("no resources\n");
  } else {
    printTable(rows);
  }
  return kOk;
}

int remove(const Globals& g, const std::string& type_name, const std::string& id,
           const std::string& region, const std::string& file, bool ignore_not_found) {
  std::vector<cluster::v1::Resource> targets;
  if (!file.empty()) {
    auto entries = loadManifests(file);
    if (!entries.ok()) return fail(kUsage, std::string(toStd(entries.status().message())));
    for (const auto& e : *entries) targets.push_back(e.resource);
  } else {
    if (type_name.empty() || id.empty() || region.empty())
      return fail(kUsage, "delete: give TYPE ID --region REGION, or -f FILE");
    cluster::v1::Resource r;
    r.set_type(resourceType(type_name));
    r.set_id(id);
    r.set_region(region);
    targets.push_back(r);
  }
  Api api(g);
  int code = kOk;
  for (const auto& r : targets) {
    v1::DeleteResourceRequest request;
    request.set_type(r.type());
    request.set_id(r.id());
    request.set_region(r.region());
    v1::DeleteResourceResponse response;
    const auto s = api.resources().Delete(api.context().get(), request, &response);
    const std::string name = strCat(r.type(), "/", r.id(), " (", r.region(), ")");
    if (s.error_code() == grpc::StatusCode::NOT_FOUND && ignore_not_found) {
      std::printf("%s: not found\n", name.c_str());
      continue;
    }
    if (!s.ok()) {
      code = rpcFail(g, strCat("delete ", name), s);
      if (code != kNotFound) return code;
      continue;
    }
    std::printf("%s deleted, version %llu\n", name.c_str(),
                static_cast<unsigned long long>(response.version()));
  }
  return code;
}

// Whether the status shows the resource converged, failed, or neither; `line` says where it is.
enum class Verdict { kWaiting, kConverged, kFailed };

Verdict judge(const std::string& type, const v1::GetResourceStatusResponse& s, std::string* line) {
  const bool applied = s.applied_version() >= s.version() && s.reported_ms() > 0;
  if (type == "deployment_topology") {
    uint32_t running = 0, pending = 0, failed = 0;
    std::string failure;
    for (const auto& in : s.instances()) {
      if (in.status() == cluster::v1::INSTANCE_STATUS_RUNNING) ++running;
      if (in.status() == cluster::v1::INSTANCE_STATUS_PENDING) ++pending;
      if (in.status() == cluster::v1::INSTANCE_STATUS_FAILED) {
        ++failed;
        if (failure.empty()) failure = strCat(in.id(), ": ", in.failure_reason());
      }
    }
    *line = strCat(
        s.current_instances(), "/", s.desired_replicas(), " updated and running, ", running,
        " running, ", pending, " pending, ", failed, " failed",
        applied ? ""
                : strCat(" (agent at version ", s.applied_version(), " of ", s.version(), ")"));
    if (s.phase() == "failed") {
      *line = strCat("the apply failed: ", s.apply_error());
      return Verdict::kFailed;
    }
    if (applied && failed > 0) {
      *line = strCat(*line, "; ", failure);
      return Verdict::kFailed;
    }
    if (applied && s.current_instances() == s.desired_replicas() &&
        static_cast<int>(running) == s.instances_size() && running == s.desired_replicas())
      return Verdict::kConverged;
    return Verdict::kWaiting;
  }
  if (type == "sentinel" && s.has_sentinel()) {
    const auto& r = s.sentinel();
    *line = strCat(r.available_replicas(), "/", r.replicas(), " available, health ", r.health(),
                   r.running_image().empty() ? "" : strCat(", running ", r.running_image()));
    if (s.phase() == "failed") {
      *line = strCat("the apply failed: ", s.apply_error());
      return Verdict::kFailed;
    }
    if (r.replicas() == 0 && r.health() == "paused") return Verdict::kConverged;
    if (r.replicas() > 0 && r.available_replicas() >= r.replicas() && r.health() == "healthy" &&
        !r.running_image().empty())
      return Verdict::kConverged;
    return Verdict::kWaiting;
  }
  *line = s.phase().empty() ? "no report yet"
                            : strCat(s.phase(), s.message().empty() ? "" : ": ", s.message());
  if (s.phase() == "failed") {
    *line = strCat("the apply failed: ", s.apply_error());
    return Verdict::kFailed;
  }
  return applied && s.phase() == "ready" ? Verdict::kConverged : Verdict::kWaiting;
}

int status(const Globals& g, const std::string& type_name, const std::string& id,
           const std::string& region, bool wait, double wait_timeout_s) {
  const std::string type = resourceType(type_name);
  Api api(g);
  const bool tty = ::isatty(STDOUT_FILENO) != 0;
  const auto started = std::chrono::steady_clock::now();
  const auto deadline =
      started + std::chrono::milliseconds(static_cast<int64_t>(wait_timeout_s * 1000));
  std::string shown;
  const std::string name = strCat(type, "/", id, " (", region, ")");
  for (int tick = 0;; ++tick) {
    v1::GetResourceStatusRequest request;
    request.set_type(type);
    request.set_id(id);
    request.set_region(region);
    v1::GetResourceStatusResponse response;
    const auto s = api.resources().GetStatus(api.context().get(), request, &response);
    if (!s.ok()) {
      if (tty && !shown.empty()) std::printf("\n");
      return rpcFail(g, strCat("status ", name), s);
    }
    std::string line;
    const Verdict verdict = judge(type, response, &line);
    if (!wait) {
      if (g.output != "table") {
        printStructured(g, protoJson(response));
      } else {
        std::printf("%s: %s\n", name.c_str(), line.c_str());
        std::vector<std::vector<std::string>> rows{{"INSTANCE", "ADDRESS", "STATUS", "REASON"}};
        for (const auto& in : response.instances()) {
          std::string st = cluster::v1::InstanceStatus_Name(in.status()).substr(16);
          std::transform(st.begin(), st.end(), st.begin(), ::tolower);
          rows.push_back({in.id(), in.address(), st, in.failure_reason()});
        }
        if (response.instances_size() > 0) printTable(rows);
      }
      return verdict == Verdict::kFailed ? kFailed : kOk;
    }
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    if (tty) {
      static const char* kSpin = "|/-\\";
      std::printf("\r\033[K%c %s: %s (%.0fs)", verdict == Verdict::kWaiting ? kSpin[tick % 4] : ' ',
                  name.c_str(), line.c_str(), elapsed);
      std::fflush(stdout);
    } else if (line != shown) {
      std::printf("%s: %s\n", name.c_str(), line.c_str());
      std::fflush(stdout);
    }
    shown = line;
    if (verdict == Verdict::kConverged) {
      std::printf(tty ? "\n%s: converged in %.1fs\n" : "%s: converged in %.1fs\n", name.c_str(),
                  elapsed);
      return kOk;
    }
    if (verdict == Verdict::kFailed) {
      if (tty) std::printf("\n");
      return fail(kFailed, strCat(name, ": failed: ", line));
    }
    if (std::chrono::steady_clock::now() > deadline) {
      if (tty) std::printf("\n");
      return fail(kTimedOut, strCat(name, ": not converged after ", wait_timeout_s, "s: ", line));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
}

int watch(const Globals& g, const std::string& type_name, const std::string& region) {
  Api api(g);
  v1::WatchResourcesRequest request;
  request.set_region(region);
  request.set_type(type_name.empty() ? "" : resourceType(type_name));
  auto context = api.context(false);
  auto reader = api.resources().Watch(context.get(), request);
  v1::ResourceChange change;
  while (reader->Read(&change)) {
    if (change.op() == "watching") {
      std::fprintf(stderr, "watching %s (Ctrl-C stops)\n",
                   region.empty() ? "every region" : region.c_str());
      continue;
    }
    if (g.output == "json") {
      std::printf("%s\n", protoJson(change).dump().c_str());
    } else {
      const std::time_t t = static_cast<std::time_t>(change.committed_ms() / 1000);
      char when[32];
      std::strftime(when, sizeof(when), "%H:%M:%S", std::localtime(&t));
      std::printf("%s  %-10s %-7s %s/%s  version %llu\n", when, change.region().c_str(),
                  change.op().c_str(), change.type().c_str(), change.id().c_str(),
                  static_cast<unsigned long long>(change.version()));
    }
    std::fflush(stdout);
  }
  const auto s = reader->Finish();
  return s.ok() ? kOk : rpcFail(g, "watch", s);
}

int agents(const Globals& g, const std::string& region) {
  Api api(g);
  v1::ListAgentsRequest request;
  request.set_region(region);
  v1::ListAgentsResponse response;
  const auto s = api.agents().ListAgents(api.context().get(), request, &response);
  if (!s.ok()) return rpcFail(g, "agents", s);
  if (g.output != "table") {
    Json all = Json::array();
    for (const auto& a : response.agents()) all.push_back(protoJson(a));
    printStructured(g, all);
    return kOk;
  }
  if (response.agents_size() == 0) {
    std::printf("no agents have reported\n");
    return kOk;
  }
  std::vector<std::vector<std::string>> rows{{"AGENT", "REGION", "LEADER", "BUILD", "APPLIED",
                                              "LATEST", "LAG", "RETRYING", "PARKED",
                                              "LAST HEARTBEAT"}};
  for (const auto& a : response.agents()) {
    rows.push_back({a.agent_id(), a.region(), a.is_leader() ? "yes" : "no", a.build_version(),
                    strCat(a.applied_version()), strCat(a.latest_version()), strCat(a.lag()),
                    strCat(a.retrying_events()), strCat(a.parked_events()), ago(a.last_seen_ms())});
  }
  printTable(rows);
  return kOk;
}

int removeAgent(const Globals& g, const std::string& region, const std::string& agent_id,
                bool force) {
  Api api(g);
  v1::RemoveAgentRequest request;
  request.set_region(region);
  request.set_agent_id(agent_id);
  request.set_force(force);
  v1::RemoveAgentResponse response;
  const auto s = api.agents().RemoveAgent(api.context().get(), request, &response);
  if (!s.ok()) return rpcFail(g, strCat("agents remove ", agent_id), s);
  std::printf("removed agent %s of region %s (last heartbeat %s)\n", agent_id.c_str(),
              region.c_str(), ago(response.last_seen_ms()).c_str());
  return kOk;
}

// --- deploys -----------------------------------------------------------------------------------

struct DeployArgs {
  std::string app, env, image, image_name, branch, sha, working_dir;
  std::vector<std::string> build;
  std::vector<std::string> env_vars;  // KEY=VALUE
  uint32_t port = 8080, cpu_millicores = 250, memory_mib = 128;
  bool no_wait = false;
  double timeout_s = 1800;
};

std::string seconds(int64_t from_ms, int64_t to_ms) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1fs", static_cast<double>(to_ms - from_ms) / 1000.0);
  return text;
}

int64_t nowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Prints each step as it ends, from WatchDeployment, until the deployment finished or
// `timeout_s` passed. Exit 0 ready, 6 anything else final, 7 timed out.
int follow(const Globals& g, Api& api, const std::string& id, double timeout_s) {
  v1::DeploymentRef ref;
  ref.set_id(id);
  const auto deadline = std::chrono::system_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  size_t printed = 0;
  v1::Deployment d;
  grpc::Status s;
  for (;;) {
    auto context = api.context(/*deadline=*/false);
    context->set_deadline(deadline);
    auto reader = api.deployments().WatchDeployment(context.get(), ref);
    while (reader->Read(&d)) {
      while (printed < static_cast<size_t>(d.steps_size()) && d.steps(printed).ended_at_ms() > 0) {
        const auto& step = d.steps(printed);
        const std::string took = seconds(step.started_at_ms(), step.ended_at_ms());
        if (step.error().empty()) {
          std::printf("  %-11s %s\n", step.step().c_str(), took.c_str());
        } else {
          std::printf("  %-11s %s, %s\n", step.step().c_str(), took.c_str(), step.error().c_str());
        }
        std::fflush(stdout);
        ++printed;
      }
    }
    s = reader->Finish();
    // krane-ctrl ends a watch after deploy.watch_max_lifetime_s; the deploy goes on, and so does
    // following it (the next watch starts with the deployment as it is).
    if (s.error_code() != grpc::StatusCode::OUT_OF_RANGE) break;
  }
  if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    const std::string at = printed < static_cast<size_t>(d.steps_size())
                               ? strCat(" in step ", d.steps(printed).step())
                               : "";
    return fail(kTimedOut, strCat("deployment ", id, " is still ", d.status(), at, " after ",
                                  timeout_s, " s (it goes on; kranectl deployments get ", id, ")"));
  }
  if (!s.ok()) return rpcFail(g, strCat("deployment ", id), s);
  if (d.status() == "ready") {
    std::printf("deployment %s is ready%s: %s\n", id.c_str(), d.live() ? " and live" : "",
                d.image().c_str());
    return kOk;
  }
  std::string why;
  for (const auto& step : d.steps()) {
    if (!step.error().empty()) why = strCat(": ", step.step(), ": ", step.error());
  }
  return fail(kFailed, strCat("deployment ", id, " ", d.status(), why));
}

int deploy(const Globals& g, const DeployArgs& a) {
  v1::CreateDeploymentRequest request;
  request.set_app_id(a.app);
  request.set_environment_id(a.env);
  request.set_git_branch(a.branch);
  request.set_git_commit_sha(a.sha);
  if (!a.image.empty() && !a.build.empty()) {
    return fail(kUsage, "deploy: give --image or a build command (after --), not both");
  }
  if (!a.image.empty()) request.set_image(a.image);
  if (!a.build.empty()) {
    auto* b = request.mutable_build();
    for (const auto& arg : a.build) b->add_argv(arg);
    b->set_image_name(a.image_name);
    b->set_working_dir(a.working_dir);
  }
  auto* spec = request.mutable_spec();
  spec->set_port(a.port);
  spec->set_cpu_millicores(a.cpu_millicores);
  spec->set_memory_mib(a.memory_mib);
  for (const auto& kv : a.env_vars) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) {
      return fail(kUsage, strCat("deploy: --env-var \"", kv, "\": use KEY=VALUE"));
    }
    auto* e = spec->add_env();
    e->set_name(kv.substr(0, eq));
    e->set_value(kv.substr(eq + 1));
  }
  Api api(g);
  v1::Deployment created;
  const auto s = api.deployments().CreateDeployment(api.context().get(), request, &created);
  if (!s.ok()) return rpcFail(g, "deploy", s);
  std::printf("deployment %s created (app %s, environment %s%s)\n", created.id().c_str(),
              a.app.c_str(), a.env.c_str(),
              a.branch.empty() ? "" : strCat(", branch ", a.branch).c_str());
  std::fflush(stdout);
  if (a.no_wait) return kOk;
  return follow(g, api, created.id(), a.timeout_s);
}

std::vector<std::string> deploymentRow(const v1::Deployment& d) {
  std::string step;
  if (d.steps_size() > 0) step = d.steps(d.steps_size() - 1).step();
  return {d.id(),
          d.status(),
          step,
          d.git_branch(),
          d.git_commit_sha(),
          d.image(),
          d.live() ? "yes" : "",
          ago(d.created_at_ms())};
}

int listDeployments(const Globals& g, const std::string& app, const std::string& env,
                    uint32_t limit, const std::string& page_token) {
  Api api(g);
  v1::ListDeploymentsRequest request;
  request.set_app_id(app);
  request.set_environment_id(env);
  request.set_limit(limit);
  request.set_page_token(page_token);
  v1::ListDeploymentsResponse response;
  const auto s = api.deployments().ListDeployments(api.context().get(), request, &response);
  if (!s.ok()) return rpcFail(g, "deployments list", s);
  if (g.output != "table") {
    printStructured(g, protoJson(response)["deployments"]);
    return kOk;
  }
  if (response.deployments().empty()) {
    std::printf("no deployments\n");
    return kOk;
  }
  std::vector<std::vector<std::string>> rows{
      {"ID", "STATUS", "STEP", "BRANCH", "COMMIT", "IMAGE", "LIVE", "CREATED"}};
  for (const auto& d : response.deployments()) rows.push_back(deploymentRow(d));
  printTable(rows);
  if (!response.next_page_token().empty()) {
    std::fprintf(stderr, "older ones: the same command with --page-token %s\n",
                 response.next_page_token().c_str());
  }
  return kOk;
}

int getDeployment(const Globals& g, const std::string& id) {
  Api api(g);
  v1::DeploymentRef ref;
  ref.set_id(id);
  v1::Deployment d;
  const auto s = api.deployments().GetDeployment(api.context().get(), ref, &d);
  if (!s.ok()) return rpcFail(g, strCat("deployment ", id), s);
  if (g.output != "table") {
    printStructured(g, protoJson(d));
    return kOk;
  }
  printTable(
      {{"ID", "STATUS", "STEP", "BRANCH", "COMMIT", "IMAGE", "LIVE", "CREATED"}, deploymentRow(d)});
  std::printf("\n");
  std::vector<std::vector<std::string>> steps{{"STEP", "TOOK", "ERROR"}};
  for (const auto& step : d.steps()) {
    steps.push_back({step.step(),
                     step.ended_at_ms() > 0
                         ? seconds(step.started_at_ms(), step.ended_at_ms())
                         : strCat("running for ", seconds(step.started_at_ms(), nowMs())),
                     step.error()});
  }
  printTable(steps);
  if (d.phases_size() > 0) {
    // A rolling deploy's history: each phase once, with how often it was found in a row.
    std::printf("\nrolling%s:\n", d.deploying() ? " (deploying revision)" : "");
    std::vector<std::vector<std::string>> phases{
        {"REGION", "PHASE", "SINCE", "FOR", "CYCLES", "DETAIL"}};
    for (const auto& p : d.phases()) {
      phases.push_back({p.region(), p.phase(), ago(p.phase_started_at_ms()),
                        seconds(p.phase_started_at_ms(), p.updated_at_ms()),
                        std::to_string(p.attempts()), p.detail()});
    }
    printTable(phases);
  }
  return kOk;
}

int liveChange(const Globals& g, const std::string& what, const grpc::Status& s,
               const v1::LiveChange& change) {
  if (!s.ok()) return rpcFail(g, what, s);
  if (!change.swapped()) {
    std::printf("%s: %s stays live: %s\n", what.c_str(), change.live_deployment_id().c_str(),
                change.reason().c_str());
    return kOk;
  }
  std::printf("%s: %s is live%s\n", what.c_str(), change.live_deployment_id().c_str(),
              change.previous_deployment_id().empty()
                  ? ""
                  : strCat(" (was ", change.previous_deployment_id(), ")").c_str());
  return kOk;
}

int promote(const Globals& g, const std::string& id) {
  Api api(g);
  v1::DeploymentRef ref;
  ref.set_id(id);
  v1::LiveChange change;
  const auto s = api.deployments().PromoteDeployment(api.context().get(), ref, &change);
  return liveChange(g, strCat("promote ", id), s, change);
}

int rollback(const Globals& g, const std::string& env) {
  Api api(g);
  v1::RollbackEnvironmentRequest request;
  request.set_environment_id(env);
  v1::LiveChange change;
  const auto s = api.deployments().RollbackEnvironment(api.context().get(), request, &change);
  return liveChange(g, strCat("rollback ", env), s, change);
}

int cancel(const Globals& g, const std::string& id) {
  Api api(g);
  v1::DeploymentRef ref;
  ref.set_id(id);
  v1::Deployment d;
  const auto s = api.deployments().CancelDeployment(api.context().get(), ref, &d);
  if (!s.ok()) return rpcFail(g, strCat("cancel ", id), s);
  std::printf(
      "deployment %s: cancel requested (it undoes what it did; kranectl deployments get"
      " %s)\n",
      id.c_str(), id.c_str());
  return kOk;
}

// --- tenancy -----------------------------------------------------------------------------------

struct CreateArgs {
  std::string kind;  // workspace, project, app, environment
  std::string name, id, slug, parent, env_kind = "production", strategy;
  uint32_t max_builds = 0, min_ready_s = 0;
  uint32_t deploy_timeout_s = 0;           // 0: the server's default
  std::string max_surge, max_unavailable;  // N or N%
  std::vector<std::string> regions;        // REGION=REPLICAS
};

int created(const Globals& g, const std::string& what, const grpc::Status& s,
            const google::protobuf::Message& m, const std::string& id, const std::string& detail) {
  if (!s.ok()) return rpcFail(g, strCat("create ", what), s);
  if (g.output != "table") {
    printStructured(g, protoJson(m));
  } else {
    std::printf("%s %s created%s\n", what.c_str(), id.c_str(), detail.c_str());
  }
  return kOk;
}

int create(const Globals& g, const CreateArgs& a) {
  Api api(g);
  if (a.kind == "workspace") {
    v1::CreateWorkspaceRequest r;
    r.set_name(a.name);
    r.set_id(a.id);
    r.set_slug(a.slug);
    r.set_max_concurrent_builds(a.max_builds);
    v1::Workspace out;
    const auto s = api.tenancy().CreateWorkspace(api.context().get(), r, &out);
    return created(
        g, a.kind, s, out, out.id(),
        strCat(" (slug ", out.slug(), ", builds at once: ", out.max_concurrent_builds(), ")"));
  }
  if (a.kind == "project") {
    v1::CreateProjectRequest r;
    r.set_name(a.name);
    r.set_id(a.id);
    r.set_slug(a.slug);
    r.set_workspace_id(a.parent);
    v1::Project out;
    const auto s = api.tenancy().CreateProject(api.context().get(), r, &out);
    return created(g, a.kind, s, out, out.id(), strCat(" in workspace ", out.workspace_id()));
  }
  if (a.kind == "app") {
    v1::CreateAppRequest r;
    r.set_name(a.name);
    r.set_id(a.id);
    r.set_slug(a.slug);
    r.set_project_id(a.parent);
    v1::App out;
    const auto s = api.tenancy().CreateApp(api.context().get(), r, &out);
    return created(g, a.kind, s, out, out.id(), strCat(" in project ", out.project_id()));
  }
  v1::CreateEnvironmentRequest r;
  r.set_slug(a.name);
  r.set_id(a.id);
  r.set_app_id(a.parent);
  r.set_kind(a.env_kind);
  r.set_strategy(a.strategy);
  if (a.deploy_timeout_s > 0) r.set_deploy_timeout_seconds(a.deploy_timeout_s);
  r.set_min_ready_seconds(a.min_ready_s);
  // "N" or "N%": a count or a percentage of the desired replicas.
  auto countOrPercent = [](const std::string& text, const char* flag, auto set_count,
                           auto set_percent) -> int {
    if (text.empty()) return kOk;
    const bool percent = text.back() == '%';
    const std::string digits = percent ? text.substr(0, text.size() - 1) : text;
    if (digits.empty() || digits.size() > 9 ||
        digits.find_first_not_of("0123456789") != std::string::npos) {
      return fail(kUsage, strCat(flag, ": a count or a percentage (2, 25%), got ", text));
    }
    const auto value = static_cast<uint32_t>(std::stoul(digits));
    percent ? set_percent(value) : set_count(value);
    return kOk;
  };
  if (int c = countOrPercent(
          a.max_surge, "--max-surge", [&](uint32_t v) { r.set_max_surge(v); },
          [&](uint32_t v) { r.set_max_surge_percent(v); });
      c != kOk) {
    return c;
  }
  if (int c = countOrPercent(
          a.max_unavailable, "--max-unavailable", [&](uint32_t v) { r.set_max_unavailable(v); },
          [&](uint32_t v) { r.set_max_unavailable_percent(v); });
      c != kOk) {
    return c;
  }
  for (const auto& spec : a.regions) {
    const size_t eq = spec.find('=');
    auto* region = r.add_regions();
    region->set_region(spec.substr(0, eq));
    region->set_replicas(1);
    if (eq != std::string::npos) {
      const std::string n = spec.substr(eq + 1);
      if (n.empty() || n.find_first_not_of("0123456789") != std::string::npos || n.size() > 6) {
        return fail(kUsage, strCat("create environment: --region \"", spec,
                                   "\": use REGION or REGION=REPLICAS"));
      }
      region->set_replicas(static_cast<uint32_t>(std::stoul(n)));
    }
  }
  v1::Environment out;
  const auto s = api.tenancy().CreateEnvironment(api.context().get(), r, &out);
  std::string regions;
  for (const auto& region : out.regions()) {
    regions += strCat(regions.empty() ? "" : ", ", region.region(), " x", region.replicas());
  }
  return created(
      g, a.kind, s, out, out.id(),
      strCat(" (app ", out.app_id(), ", ", out.kind(), ", ", out.strategy(), ": ", regions, ")"));
}

std::string readToken(const std::string& path) {
  std::ifstream in(path);
  std::string token;
  std::getline(in, token);
  while (!token.empty() && std::isspace(static_cast<unsigned char>(token.back()))) token.pop_back();
  return token;
}

}  // namespace
}  // namespace krane::cli

int main(int argc, char** argv) {
  using namespace krane::cli;
  Globals g;
  if (const char* s = std::getenv("KRANE_SERVER")) g.server = s;
  if (g.server.empty()) g.server = "127.0.0.1:7070";
  if (const char* t = std::getenv("KRANE_TOKEN")) g.token = t;

  CLI::App app{
      "kranectl: operate Krane through krane-ctrl's public API.\n"
      "Exit codes: 0 ok, 1 refused by the server, 2 bad usage or invalid file, 3 server\n"
      "unreachable, 4 token refused, 5 not found, 6 failed (status --wait, deploy, a paused\n"
      "rollout), 7 timed out.",
      "kranectl"};
  app.set_version_flag("--version", krane::kVersion);
  app.require_subcommand(1);
  app.fallthrough();  // global options may follow the command
  app.option_defaults()->always_capture_default();
  app.add_option("--server", g.server, "krane-ctrl's gRPC address ($KRANE_SERVER)");
  app.add_option("--token", g.token, "operator token ($KRANE_TOKEN)");
  app.add_option("--token-file", g.token_file, "read the operator token from this file");
  app.add_option("--ca-file", g.ca_file, "use TLS, trusting this CA (PEM)");
  app.add_option("-o,--output", g.output, "table, json or yaml")
      ->check(CLI::IsMember({"table", "json", "yaml"}));
  app.add_option("--request-timeout", g.timeout_s, "seconds per request");
  app.add_option("--keepalive", g.keepalive_s,
                 "seconds without data from krane-ctrl before a ping; a connection that stays"
                 " silent fails the command (watch, deploy, --wait) instead of hanging it; 0: off")
      ->check([](const std::string& v) -> std::string {
        const double s = std::atof(v.c_str());
        return s == 0 || (s >= 1 && s <= 3600) ? "" : "0 (off) or 1 to 3600 seconds";
      });

  int code = 0;
  std::string file, type, id, region;
  bool dry_run = false, ignore_not_found = false, wait = false;
  double wait_timeout = 300;

  auto* apply_cmd = app.add_subcommand("apply", "Create or replace the resources of a YAML file.");
  apply_cmd->add_option("-f,--filename", file, "YAML file (- for standard input)")->required();
  apply_cmd->add_flag("--dry-run", dry_run, "only check the file");
  apply_cmd->callback([&] { code = apply(g, file, dry_run); });

  auto* get_cmd = app.add_subcommand("get", "List resources, or show one.");
  get_cmd->add_option("type", type, "deployment, sentinel, cnp or a plugin's type");
  get_cmd->add_option("id", id, "one resource");
  get_cmd->add_option("--region", region, "only this region");
  get_cmd->callback([&] { code = get(g, type, id, region); });

  auto* delete_cmd =
      app.add_subcommand("delete", "Delete resources (agents remove what they run).");
  delete_cmd->add_option("type", type, "deployment, sentinel, cnp or a plugin's type");
  delete_cmd->add_option("id", id, "resource id");
  delete_cmd->add_option("--region", region, "the resource's region");
  delete_cmd->add_option("-f,--filename", file, "delete every resource of this YAML file");
  delete_cmd->add_flag("--ignore-not-found", ignore_not_found,
                       "a missing resource is not an error");
  delete_cmd->callback([&] { code = remove(g, type, id, region, file, ignore_not_found); });

  auto* status_cmd = app.add_subcommand(
      "status", "What the region's agent reports for a resource; --wait until it converged.");
  status_cmd->add_option("type", type, "deployment, sentinel, cnp or a plugin's type")->required();
  status_cmd->add_option("id", id, "resource id")->required();
  status_cmd->add_option("--region", region, "the resource's region")->required();
  status_cmd->add_flag("--wait", wait, "show progress until converged (exit 6 failed, 7 timeout)");
  status_cmd->add_option("--timeout", wait_timeout, "seconds --wait waits");
  status_cmd->callback([&] { code = status(g, type, id, region, wait, wait_timeout); });

  auto* watch_cmd = app.add_subcommand("watch", "Print changes as they are committed.");
  watch_cmd->add_option("type", type, "only this type");
  watch_cmd->add_option("--region", region, "only this region");
  watch_cmd->callback([&] { code = watch(g, type, region); });

  auto* agents_cmd = app.add_subcommand(
      "agents", "Each agent: region, leader, build version, applied version and lag, heartbeat.");
  agents_cmd->add_option("--region", region, "only this region");
  agents_cmd->require_subcommand(0, 1);
  std::string remove_agent_id;
  bool remove_force = false;
  auto* agents_remove = agents_cmd->add_subcommand(
      "remove", "Forget an agent that is gone (refused while it still sends heartbeats).");
  agents_remove->add_option("agent", remove_agent_id, "the agent's id (kranectl agents)")
      ->required();
  agents_remove->add_option("--region", region, "its region")->required();
  agents_remove->add_flag("--force", remove_force,
                          "remove it even though it sent a heartbeat in the last minute");
  agents_remove->callback([&] { code = removeAgent(g, region, remove_agent_id, remove_force); });
  agents_cmd->callback([&] {
    if (agents_cmd->get_subcommands().empty()) code = agents(g, region);
  });

  DeployArgs deploy_args;
  auto* deploy_cmd = app.add_subcommand(
      "deploy", "Deploy an app to every region of an environment and follow its steps.");
  deploy_cmd->add_option("--app", deploy_args.app, "app id")->required();
  deploy_cmd->add_option("--env", deploy_args.env, "environment id")->required();
  deploy_cmd->add_option("--image", deploy_args.image, "a prebuilt image");
  deploy_cmd->add_option("build", deploy_args.build,
                         "after --: a build command and its arguments, run by krane-ctrl without"
                         " a shell (instead of --image)");
  deploy_cmd->add_option("--image-name", deploy_args.image_name,
                         "with a build command: the image it produces, tagged with the commit");
  deploy_cmd->add_option("--working-dir", deploy_args.working_dir,
                         "with a build command: where it runs");
  deploy_cmd->add_option("--branch", deploy_args.branch, "git branch (commit dedup is per branch)");
  deploy_cmd->add_option("--commit", deploy_args.sha, "git commit sha");
  deploy_cmd->add_option("--port", deploy_args.port, "the port instances serve on");
  deploy_cmd->add_option("--cpu-millicores", deploy_args.cpu_millicores, "per instance");
  deploy_cmd->add_option("--memory-mib", deploy_args.memory_mib, "per instance");
  deploy_cmd->add_option("--env-var", deploy_args.env_vars, "KEY=VALUE, repeatable");
  deploy_cmd->add_flag("--no-wait", deploy_args.no_wait, "create it and return");
  deploy_cmd->add_option("--timeout", deploy_args.timeout_s, "seconds to follow it");
  deploy_cmd->callback([&] { code = deploy(g, deploy_args); });

  std::string app_id, env_id;
  auto* deployments_cmd = app.add_subcommand("deployments", "List deployments, or show one.");
  deployments_cmd->require_subcommand(1);
  auto* list_cmd = deployments_cmd->add_subcommand("list", "Newest first.");
  list_cmd->add_option("--app", app_id, "of this app");
  list_cmd->add_option("--env", env_id, "of this environment");
  uint32_t list_limit = 50;
  std::string page_token;
  list_cmd->add_option("--limit", list_limit, "at most this many (1 to 1000)")
      ->check(CLI::Range(1, 1000));
  list_cmd->add_option("--page-token", page_token, "the next page, as a list printed it");
  list_cmd->callback([&] { code = listDeployments(g, app_id, env_id, list_limit, page_token); });
  auto* show_cmd = deployments_cmd->add_subcommand("get", "One deployment with its steps.");
  show_cmd->add_option("id", id, "deployment id")->required();
  show_cmd->callback([&] { code = getDeployment(g, id); });

  auto* promote_cmd = app.add_subcommand(
      "promote", "Make a ready deployment live (and clear a rollback's hold on new deploys).");
  promote_cmd->add_option("id", id, "deployment id")->required();
  promote_cmd->callback([&] { code = promote(g, id); });
  auto* rollback_cmd = app.add_subcommand(
      "rollback", "Make the previous ready deployment of an environment live again.");
  rollback_cmd->add_option("--env", env_id, "environment id")->required();
  rollback_cmd->callback([&] { code = rollback(g, env_id); });
  auto* cancel_cmd = app.add_subcommand("cancel", "Cancel a deployment that is not finished.");
  cancel_cmd->add_option("id", id, "deployment id")->required();
  cancel_cmd->callback([&] { code = cancel(g, id); });

  CreateArgs create_args;
  RolloutCommandArgs rollout_args;
  addRolloutCommands(app, g, code, rollout_args);

  auto* create_cmd = app.add_subcommand("create",
                                        "Create what deployments belong to: workspaces, projects,"
                                        " apps, environments.");
  create_cmd->require_subcommand(1);
  auto common = [&](CLI::App* c, const char* name_help) {
    c->add_option("name", create_args.name, name_help)->required();
    c->add_option("--id", create_args.id, "the id (default: generated)");
  };
  auto* ws_cmd = create_cmd->add_subcommand("workspace", "A workspace and its build quota.");
  common(ws_cmd, "display name");
  ws_cmd->add_option("--slug", create_args.slug, "default: from the name");
  ws_cmd->add_option("--max-builds", create_args.max_builds,
                     "deployments that build at once (default 1)");
  ws_cmd->callback([&] {
    create_args.kind = "workspace";
    code = create(g, create_args);
  });
  auto* proj_cmd = create_cmd->add_subcommand("project", "A project of a workspace.");
  common(proj_cmd, "display name");
  proj_cmd->add_option("--slug", create_args.slug, "default: from the name");
  proj_cmd->add_option("--workspace", create_args.parent, "workspace id")->required();
  proj_cmd->callback([&] {
    create_args.kind = "project";
    code = create(g, create_args);
  });
  auto* app_cmd = create_cmd->add_subcommand("app", "An app of a project.");
  common(app_cmd, "display name");
  app_cmd->add_option("--slug", create_args.slug, "default: from the name");
  app_cmd->add_option("--project", create_args.parent, "project id")->required();
  app_cmd->callback([&] {
    create_args.kind = "app";
    code = create(g, create_args);
  });
  auto* env_cmd = create_cmd->add_subcommand("environment", "An environment of an app.");
  common(env_cmd, "slug, e.g. production");
  env_cmd->add_option("--app", create_args.parent, "app id")->required();
  env_cmd->add_option("--kind", create_args.env_kind, "production or preview");
  env_cmd->add_option("--region", create_args.regions, "REGION or REGION=REPLICAS, repeatable")
      ->required();
  env_cmd->add_option("--strategy", create_args.strategy, "blue_green (default) or rolling");
  env_cmd->add_option("--max-surge", create_args.max_surge,
                      "rolling: replicas above desired, a count or a percentage (1, 25%)");
  env_cmd->add_option("--max-unavailable", create_args.max_unavailable,
                      "rolling: replicas below desired, a count or a percentage (0, 25%)");
  env_cmd->add_option("--min-ready", create_args.min_ready_s,
                      "rolling: seconds a new instance must be ready before it counts");
  env_cmd
      ->add_option("--deploy-timeout", create_args.deploy_timeout_s,
                   "seconds a deployment may take to become ready (default 1800)")
      ->check(CLI::Range(1u, 86400u));
  env_cmd->callback([&] {
    create_args.kind = "environment";
    code = create(g, create_args);
  });

  app.parse_complete_callback([&] {
    if (!g.token_file.empty()) g.token = readToken(g.token_file);
  });
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int r = app.exit(e);
    return r == 0 ? 0 : kUsage;
  }
  return code;
}
