// bench/plugins: how fast the plugins make workloads real.
//
//   ./dev bench plugins [--json] [--quick]
//
// Figures (medians of rounds):
//   process_50_instances_healthy_s  the process runtime, from apply of a 50-replica workload of
//                                   the demo app to all 50 passing their readiness probe
//   apply_1000_topologies_s         1000 deployment topologies (50 workspaces) applied through
//                                   libdeployment.so on the Kubernetes runtime, 4 workers as the
//                                   agent's default, to the fake API server in its own process
//   apply_1000_topologies_cpu_s     the CPU (user + system) this process - the plugin side:
//                                   rendering, JSON, libcurl - used for those applies
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "agent/plugin_loader.h"
#include "nlohmann/json.hpp"
#include "plugins/runtime/process/process_runtime.h"
#include "spdlog/spdlog.h"

namespace {

using Clock = std::chrono::steady_clock;

std::string runfilesDir(const char* argv0) {
  if (const char* d = std::getenv("RUNFILES_DIR")) return d;
  return std::string(argv0) + ".runfiles";
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Seconds from apply to `replicas` ready instances; -1 on failure.
double timeToHealthy(const std::string& demo_app, int replicas) {
  char pattern[] = "/tmp/krane-bench-rt-XXXXXX";
  const std::string dir = ::mkdtemp(pattern);
  krane::runtime::ProcessRuntimeOptions options;
  options.state_dir = dir;
  options.port_from = 24000;
  options.port_to = 24999;
  options.tick = std::chrono::milliseconds(20);
  options.images["krane.dev/demo-app"] = {demo_app, "--version", "{tag}"};
  auto runtime = krane::runtime::ProcessRuntime::start(options);
  if (!runtime.ok()) {
    std::fprintf(stderr, "bench: %s\n", std::string(runtime.status().message()).c_str());
    return -1;
  }
  krane::runtime::WorkloadSpec spec;
  spec.id = "bench";
  spec.image = "krane.dev/demo-app:v1";
  spec.replicas = replicas;
  spec.readiness.path = "/healthz/ready";
  spec.readiness.interval = std::chrono::milliseconds(100);
  const auto start = Clock::now();
  if (!(*runtime)->apply(spec).ok()) return -1;
  double seconds = -1;
  while (Clock::now() - start < std::chrono::seconds(120)) {
    const auto s = (*runtime)->status("bench");
    if (s && s->converged) {
      seconds = std::chrono::duration<double>(Clock::now() - start).count();
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  (*runtime)->shutdown(/*stop_instances=*/true);
  std::filesystem::remove_all(dir);
  return seconds;
}

double cpuSeconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  const auto sec = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6;
  };
  return sec(u.ru_utime) + sec(u.ru_stime);
}

// The fake API server as a child process; killed when this goes out of scope.
class FakeApiProcess {
 public:
  explicit FakeApiProcess(const std::string& binary) {
    int in[2];
    int out[2];
    if (::pipe(in) != 0 || ::pipe(out) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(in[0], 0);
      ::dup2(out[1], 1);
      ::close(in[1]);
      ::close(out[0]);
      ::execl(binary.c_str(), binary.c_str(), nullptr);
      ::_exit(127);
    }
    ::close(in[0]);
    ::close(out[1]);
    stdin_ = in[1];
    FILE* f = ::fdopen(out[0], "r");
    if (f == nullptr || std::fscanf(f, "port %d", &port_) != 1) port_ = 0;
    if (f != nullptr) std::fclose(f);
  }
  ~FakeApiProcess() {
    if (stdin_ >= 0) ::close(stdin_);
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  int port() const { return port_; }

 private:
  int pid_ = -1;
  int stdin_ = -1;
  int port_ = 0;
};

krane::cluster::v1::Change topologyChange(int i) {
  krane::cluster::v1::Change c;
  c.set_op(krane::cluster::v1::CHANGE_OP_APPLY);
  c.set_version(static_cast<uint64_t>(i) + 1);
  auto* r = c.mutable_resource();
  const std::string id = "dep_" + std::to_string(i);
  r->set_type("deployment_topology");
  r->set_id(id);
  r->set_region("bench-1");
  auto* t = r->mutable_deployment_topology();
  t->set_workspace_id("ws_" + std::to_string(i % 50));
  t->set_project_id("proj_" + std::to_string(i % 50));
  t->set_app_id("app_" + std::to_string(i % 200));
  t->set_environment_id("env_" + std::to_string(i % 400));
  t->set_deployment_id(id);
  t->set_region("bench-1");
  t->set_image("registry.example/app:" + std::to_string(i));
  t->add_args("serve");
  auto* e = t->add_env();
  e->set_name("LOG_LEVEL");
  e->set_value("info");
  t->set_port(8080);
  t->mutable_healthcheck()->mutable_liveness()->set_path("/healthz/live");
  t->mutable_healthcheck()->mutable_readiness()->set_path("/healthz/ready");
  t->set_cpu_millicores(250);
  t->set_memory_mib(256);
  t->set_replicas(2);
  if (i % 4 == 0) {  // a quarter autoscaled
    t->mutable_autoscaling()->set_min_replicas(2);
    t->mutable_autoscaling()->set_max_replicas(6);
  }
  return c;
}

struct ApplyRun {
  double wall_s = -1;
  double cpu_s = -1;
};

// One round: a fresh fake API server and plugin instance, 1000 topologies by `workers` threads.
ApplyRun applyTopologies(const std::string& runfiles, int count, int workers) {
  FakeApiProcess api(runfiles + "/krane/tests/support/fake-kube-api");
  if (api.port() == 0) {
    std::fprintf(stderr, "bench: the fake API server did not start\n");
    return {};
  }
  char pattern[] = "/tmp/krane-bench-kube-XXXXXX";
  const std::string dir = ::mkdtemp(pattern);
  const std::string kubeconfig = dir + "/kubeconfig";
  std::ofstream(kubeconfig) << "apiVersion: v1\nkind: Config\ncurrent-context: fake\n"
                               "contexts:\n- name: fake\n  context: {cluster: fake}\n"
                               "clusters:\n- name: fake\n  cluster:\n    server: "
                               "http://127.0.0.1:"
                            << api.port() << "\n";
  // The rate limit is the operator's choice; the benchmark measures the plugin, not the limit.
  const std::string config =
      nlohmann::json{
          {"runtime", "kubernetes"},
          {"kubernetes", {{"kubeconfig", kubeconfig}, {"qps", 100000}, {"burst", 100000}}}}
          .dump();
  krane::agent::HostCallbacks callbacks;
  std::atomic<uint64_t> reports{0};
  callbacks.report_status = [&](const krane::plugin::v1::StatusReport&) { ++reports; };
  auto plugin = krane::agent::loadPlugin(runfiles + "/krane/plugins/deployment/libdeployment.so",
                                         config, callbacks);
  if (!plugin.ok()) {
    std::fprintf(stderr, "bench: %s\n", std::string(plugin.status().message()).c_str());
    return {};
  }
  std::vector<krane::cluster::v1::Change> changes;
  changes.reserve(count);
  for (int i = 0; i < count; ++i) changes.push_back(topologyChange(i));
  std::atomic<int> next{0};
  std::atomic<int> failed{0};
  std::mutex error_mutex;
  std::string first_error;
  const double cpu0 = cpuSeconds();
  const auto start = Clock::now();
  std::vector<std::thread> threads;
  threads.reserve(workers);
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&] {
      for (int i = next++; i < count; i = next++) {
        auto st = (*plugin)->apply(changes[i]);
        if (!st.ok()) {
          ++failed;
          std::lock_guard lock(error_mutex);
          if (first_error.empty()) first_error = std::string(st.message());
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  ApplyRun run;
  run.wall_s = std::chrono::duration<double>(Clock::now() - start).count();
  run.cpu_s = cpuSeconds() - cpu0;
  plugin->reset();
  std::filesystem::remove_all(dir);
  if (failed > 0) {
    std::fprintf(stderr, "bench: %d applies failed, first: %s\n", failed.load(),
                 first_error.c_str());
    return {};
  }
  return run;
}

}  // namespace

int main(int argc, char** argv) {
  bool json = false;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json") {
      json = true;
    } else if (a == "--quick") {
      quick = true;
    } else {
      std::printf("usage: plugins [--json] [--quick]\n");
      return a == "--help" ? 0 : 2;
    }
  }
  spdlog::set_level(spdlog::level::warn);  // one line per instance start otherwise
  const std::string runfiles = runfilesDir(argv[0]);
  const std::string demo_app = runfiles + "/krane/tests/support/demo_app/krane-demo-app";
  std::vector<double> runs;
  for (int round = 0; round < (quick ? 1 : 3); ++round) {
    const double s = timeToHealthy(demo_app, 50);
    if (s < 0) {
      std::fprintf(stderr, "bench: 50 instances did not become healthy within 120 s\n");
      return 1;
    }
    runs.push_back(s);
  }
  const double healthy = median(runs);

  std::vector<double> walls;
  std::vector<double> cpus;
  for (int round = 0; round < (quick ? 1 : 5); ++round) {
    const ApplyRun run = applyTopologies(runfiles, 1000, 4);
    if (run.wall_s < 0) return 1;
    std::fprintf(stderr, "bench: round %d: 1000 topologies in %.3f s wall, %.3f s CPU\n", round + 1,
                 run.wall_s, run.cpu_s);
    walls.push_back(run.wall_s);
    cpus.push_back(run.cpu_s);
  }
  const double apply_s = median(walls);
  const double apply_cpu_s = median(cpus);
  if (json) {
    std::printf(
        "{\"figures\": [{\"name\": \"process_50_instances_healthy_s\", \"value\": %.3f, "
        "\"unit\": \"s\"}, {\"name\": \"apply_1000_topologies_s\", \"value\": %.3f, "
        "\"unit\": \"s\"}, {\"name\": \"apply_1000_topologies_cpu_s\", \"value\": %.3f, "
        "\"unit\": \"s\"}]}\n",
        healthy, apply_s, apply_cpu_s);
    return 0;
  }
  std::printf("%-34s %10s\n", "figure", "value");
  std::printf("%-34s %9.3fs\n", "process_50_instances_healthy_s", healthy);
  std::printf("%-34s %9.3fs\n", "apply_1000_topologies_s", apply_s);
  std::printf("%-34s %9.3fs\n", "apply_1000_topologies_cpu_s", apply_cpu_s);
  std::printf(
      "(medians: %zu rounds of 50 demo-app instances from apply to all ready, probe every 100 ms;"
      " %zu rounds of 1000 topologies through libdeployment.so on the Kubernetes runtime, 4 "
      "workers, fake API server in its own process; CPU is this process's, the plugin side)\n",
      runs.size(), walls.size());
  return 0;
}
