// krane: the agent of one region. `krane run --config agent.yaml`, `krane inspect`,
// `krane check-config --config agent.yaml`.
#include <libgen.h>
#include <signal.h>
#include <unistd.h>

#include <climits>
#include <cstdio>

#include "CLI/CLI.hpp"
#include "agent/agent.h"
#include "agent/config.h"
#include "common/process_setup.h"
#include "common/strings.h"
#include "common/version.h"
#include "ipc/cursor_store.h"
#include "ipc/inspect.h"
#include "plugins/runtime/kubernetes/client.h"
#include "plugins/runtime/kubernetes/config.h"
#include "plugins/runtime/kubernetes/lease_client.h"
#include "spdlog/spdlog.h"

namespace {

int fail(const char* command, const absl::Status& status) {
  std::fprintf(stderr, "krane %s: error: %s\n", command,
               std::string(krane::toStd(status.message())).c_str());
  return 1;
}

// krane-plugin-host is installed next to krane.
std::string defaultHostBinary() {
  char self[PATH_MAX] = {0};
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return "krane-plugin-host";
  return krane::strCat(::dirname(self), "/krane-plugin-host");
}

// The Lease of `leader.mode: lease`, through the kubeconfig of the configuration or the pod's
// service account.
absl::StatusOr<std::shared_ptr<krane::agent::LeaseClient>> leaseClient(
    const krane::agent::AgentConfig& config) {
  auto cluster = config.leader.kubeconfig.empty()
                     ? krane::kube::inClusterConfig()
                     : krane::kube::kubeconfigFromFile(config.leader.kubeconfig);
  if (!cluster.ok()) return cluster.status();
  const std::string ns = config.leader.lease_namespace.empty() ? cluster->default_namespace
                                                               : config.leader.lease_namespace;
  const std::string name = config.leader.lease_name.empty()
                               ? krane::strCat("krane-agent-", config.region)
                               : config.leader.lease_name;
  auto client = krane::kube::Client::create(*std::move(cluster));
  if (!client.ok()) return client.status();
  std::shared_ptr<krane::kube::Client> shared = *std::move(client);
  return std::make_shared<krane::kube::KubernetesLeaseClient>(shared, ns, name);
}

int run(const std::string& config_path, const std::string& host_binary,
        const std::string& log_level) {
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");
  spdlog::set_level(spdlog::level::from_str(log_level));
  auto config = krane::agent::loadAgentConfig(config_path);
  if (!config.ok()) return fail("run", config.status());
  if (auto st = krane::agent::finishAgentConfig(*config); !st.ok()) return fail("run", st);
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  krane::agent::Agent agent(*config, host_binary.empty() ? defaultHostBinary() : host_binary,
                            leaseClient);
  if (auto st = agent.start(); !st.ok()) return fail("run", st);
  int signal = 0;
  sigwait(&signals, &signal);
  spdlog::info("agent: {} received, stopping", signal == SIGINT ? "SIGINT" : "SIGTERM");
  agent.stop();
  return 0;
}

// Loads and checks a configuration as `run` does, without starting anything. The token file is
// not read: it is a secret mounted where the agent runs, not where the file is checked.
int checkConfig(const std::string& config_path) {
  auto config = krane::agent::loadAgentConfig(config_path);
  if (!config.ok()) return fail("check-config", config.status());
  krane::agent::AgentConfig checked = *config;
  checked.control_plane.token_file.clear();
  checked.control_plane.token = "not read by check-config";
  if (auto st = krane::agent::finishAgentConfig(checked); !st.ok()) {
    return fail("check-config", st);
  }
  std::string plugins;
  for (const auto& p : checked.plugins) {
    krane::strAppend(&plugins, plugins.empty() ? "" : ", ", p.name);
  }
  std::printf("%s: valid (region %s, runtime %s, leader %s, plugins: %s)\n", config_path.c_str(),
              checked.region.c_str(), checked.runtime.c_str(), checked.leader.mode.c_str(),
              plugins.empty() ? "none" : plugins.c_str());
  return 0;
}

int inspect(const std::string& state_dir, bool json) {
  krane::ipc::CursorStoreOptions options;
  options.mode = krane::ipc::OpenMode::kReadOnly;
  auto store = krane::ipc::CursorStore::open(state_dir, options);
  if (!store.ok()) return fail("inspect", store.status());
  const auto snapshot = (*store)->snapshot();
  std::printf("%s\n", json ? krane::ipc::renderJson(snapshot).c_str()
                           : krane::ipc::renderText(snapshot).c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  krane::setUpProcess();
  CLI::App app{"krane: the Krane agent of one region", "krane"};
  app.set_version_flag("--version", krane::kVersion);
  app.require_subcommand(1);
  int exit_code = 0;

  std::string config_path, host_binary, log_level = "info";
  CLI::App* run_cmd =
      app.add_subcommand("run", "Watch the region's changes and apply them through the plugins.");
  run_cmd->add_option("--config", config_path, "YAML configuration (see docs/configuration.md)")
      ->required();
  run_cmd->add_option("--plugin-host", host_binary,
                      "krane-plugin-host to run (default: next to krane)");
  run_cmd->add_option("--log-level", log_level, "trace, debug, info, warn, error")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
  run_cmd->callback([&] { exit_code = run(config_path, host_binary, log_level); });

  std::string check_path;
  CLI::App* check_cmd = app.add_subcommand(
      "check-config", "Load and check a configuration file, then exit (0 when it is valid).");
  check_cmd->add_option("--config", check_path, "YAML configuration (see docs/configuration.md)")
      ->required();
  check_cmd->callback([&] { exit_code = checkConfig(check_path); });

  std::string state_dir;
  bool json = false;
  CLI::App* inspect_cmd =
      app.add_subcommand("inspect", "Print the cursor store of a state directory.");
  inspect_cmd->add_option("--state-dir", state_dir, "The agent's state directory")->required();
  inspect_cmd->add_flag("--json", json, "JSON instead of text");
  inspect_cmd->callback([&] { exit_code = inspect(state_dir, json); });

  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "krane: error: %s (see krane --help)\n", e.what());
    return 2;
  }
  return exit_code;
}
