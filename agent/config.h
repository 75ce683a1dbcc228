// The agent's configuration: a YAML file, every key documented in docs/configuration.md.
// Defaults live here; unknown keys and bad values are refused with the key's path.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/call_limits.h"

namespace krane::agent {

struct PluginConfig {
  std::string name;
  std::string path;                   // the plugin's .so
  std::string isolation = "process";  // "process": its own krane-plugin-host; "in_process"
  size_t workers = 4;                 // resources applied in parallel
  // How long one apply or delete may take before the agent cancels it, and how long the host
  // then has to let it go before it is restarted (process isolation only).
  std::chrono::milliseconds call_timeout = kDefaultCallTimeout;
  std::chrono::milliseconds cancel_grace = kDefaultCancelGrace;
  std::string config_json = "{}";  // the `config:` mapping, handed to the plugin as JSON
  std::string config_text;         // `config_text:`, handed over as is instead (own formats)
};

struct AgentConfig {
  std::string region;
  std::string agent_id;  // default: host name + pid
  std::string state_dir = "/var/lib/krane";
  std::string runtime = "process";  // "process" or "kubernetes"

  struct ControlPlane {
    std::string address = "127.0.0.1:7070";
    // Where the Watch stream goes when the control plane serves it on its own listener
    // (krane-ctrl's feed.watch_listen; TLS as for `address`). Empty: the listener's port that
    // krane-ctrl tells in heartbeats, on the host of `address`, and `address` until it tells
    // one or when streams there keep failing. kWatchAddressOff: `address` always.
    std::string watch_address;
    std::string token_file;  // or $KRANE_AGENT_TOKEN
    std::string token;       // filled from the file or the environment
    std::string ca_file;     // PEM: use TLS, trusting this CA
    std::string cert_file;   // PEM client certificate (mTLS)
    std::string key_file;
    // HTTP/2 pings on every connection to krane-ctrl (the gRPC port and the watch listener):
    // sent after this long without a frame from krane-ctrl (0: never); a ping not answered
    // within keepalive_timeout closes the connection, and its streams start over on a new one.
    // Without them, a connection that goes silent (a partition, a krane-ctrl host that
    // vanished) keeps an idle Watch waiting for ever.
    std::chrono::milliseconds keepalive{30000};
    std::chrono::milliseconds keepalive_timeout{10000};
  } control_plane;
  static constexpr const char* kWatchAddressOff = "off";
  // The shortest control_plane.keepalive; krane-ctrl lets clients ping this often
  // (controlplane/server.cc).
  static constexpr std::chrono::milliseconds kMinKeepalive{1000};

  std::chrono::seconds resync_interval{300};
  std::chrono::milliseconds reconnect_min{1000};
  std::chrono::milliseconds reconnect_max{5000};

  struct Leader {
    std::string mode = "lockfile";  // "lockfile", "lease" (Kubernetes) or "none"
    std::chrono::seconds lease_duration{15};
    // mode lease: the coordination.k8s.io Lease <lease_namespace>/<lease_name>, reached through
    // `kubeconfig` (empty: the pod's service account). Empty namespace: the kubeconfig's or the
    // pod's namespace; empty name: krane-agent-<region>.
    std::string lease_namespace;
    std::string lease_name;
    std::string kubeconfig;
  } leader;

  struct Reporter {
    std::chrono::milliseconds heartbeat_interval{10000};
    size_t max_pending = 10000;
  } reporter;

  struct Dispatch {
    int max_attempts = 3;  // for a change the plugin refuses as invalid, before it is parked
    int batch = 32;        // ready resources one worker hands to a plugin at once
  } dispatch;

  std::vector<PluginConfig> plugins;
};

absl::StatusOr<AgentConfig> parseAgentConfig(const std::string& yaml, const std::string& source);
absl::StatusOr<AgentConfig> loadAgentConfig(const std::string& path);
// Reads the token, fills defaults that need the environment, checks what only makes sense as a
// whole (TLS files in pairs, plugin names unique, ...).
absl::Status finishAgentConfig(AgentConfig& config);

}  // namespace krane::agent
