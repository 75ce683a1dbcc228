// krane-ctrl's configuration: a YAML file, every key documented in docs/configuration.md.
// Defaults live here; unknown keys and bad values are refused with the key's path.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace krane::ctrl {

struct CtrlConfig {
  // gRPC (agents and operators), host:port; port 0 picks a free port.
  std::string listen = "127.0.0.1:7070";
  // HTTP: /metrics, /healthz, /readyz.
  std::string http_listen = "127.0.0.1:7071";

  struct Database {
    std::string dsn;  // or $KRANE_DSN
    size_t max_connections = 32;
    std::chrono::milliseconds acquire_timeout{5000};
  } database;

  struct Auth {
    // File with operator tokens, one per line (`#` comments). $KRANE_OPERATOR_TOKEN adds one.
    std::string operator_tokens_file;
    std::vector<std::string> operator_tokens;  // filled from the file and the environment
    std::chrono::milliseconds agent_token_cache{10000};
  } auth;

  struct Tls {
    std::string cert_file;       // PEM; with key_file, serve TLS
    std::string key_file;        // PEM
    std::string client_ca_file;  // PEM; when set, clients must present a certificate it signed
  } tls;

  struct Feed {
    std::chrono::milliseconds poll_interval{50};
    std::chrono::milliseconds bookmark_interval{5000};
    size_t stream_max_queued = 20000;
    size_t sync_workers = 4;
    size_t write_threads = 0;       // threads serving the Watch streams; 0: one per core
    size_t sync_snapshots = 4;      // full syncs reading at once (each holds a connection)
    size_t sync_high_water = 1024;  // a set-up pauses while this many events wait to be written
    size_t sync_batch = 2000;       // rows or changes a set-up step reads
    // A full sync whose agent reads nothing for this long (no write completes) gives its
    // snapshot slot to a full sync waiting for one, ending; after ten times as long it ends in
    // any case: an agent that is alive (it answers pings) but stuck would hold a snapshot slot,
    // a connection and an old read view for good.
    std::chrono::milliseconds sync_stall{120000};
    std::chrono::seconds change_ttl{7 * 24 * 3600};
    std::chrono::seconds cleanup_interval{60};
    size_t cleanup_batch = 10000;
    // host:port of the feed's own HTTP/2 listener for agents' Watch calls
    // (controlplane/feed/h2_watch_server.h): an idle agent costs a fraction of what it costs on
    // the gRPC port. Agents learn its port from heartbeats and move their Watch there (or name it
    // in control_plane.watch_address). TLS as `tls`; empty: off (Watch is served on `listen`
    // either way).
    std::string watch_listen;
    // krane-ctrl pings a client's connection (the gRPC port and the watch listener) after this
    // long without a frame from it (0: never), and closes it when nothing came back within
    // keepalive_timeout: the calls of an agent that vanished (its host gone, a partition) end,
    // and free what they hold (a full sync's snapshot slot and connection, a subscription).
    std::chrono::milliseconds keepalive{60000};
    std::chrono::milliseconds keepalive_timeout{20000};
    // Commit hints to and from the other replicas (controlplane/feed/peer_hints.h): their
    // tailers read this replica's commits at once instead of at their next poll. Off while
    // `listen` is empty.
    struct PeerHints {
      std::string listen;     // host:port of this replica's hint socket (port 0: any free one)
      std::string advertise;  // host:port the others reach it on; empty: listen's host and port
    } peer_hints;
  } feed;

  struct Workflow {
    size_t threads = 8;                             // invocations executing at once
    std::chrono::milliseconds lease{30000};         // worker lease (renewed every lease/3)
    std::chrono::milliseconds poll_interval{200};   // claim poll when nothing wakes the engine
    size_t max_payload_bytes = 1 << 20;             // inputs, outputs, step results
    std::chrono::seconds maintenance_interval{60};  // watchdog and cleanup period
    std::chrono::seconds watchdog_threshold{3600};  // report keys held longer than this
    std::chrono::seconds retention{7 * 24 * 3600};  // keep finished invocations this long
  } workflow;

  struct Deploy {
    // Logs of build commands (the `command` builder), one file per deployment; empty: the
    // system's temporary directory / krane-builds.
    std::string build_log_dir;
    std::chrono::seconds build_timeout{600};  // a build command running longer is stopped
    // The sentinel a deploy creates in each region of an environment that has none yet.
    std::string sentinel_image = "krane.dev/sentinel:v1";
    uint32_t sentinel_replicas = 1;
    uint32_t sentinel_cpu_millicores = 250;
    uint32_t sentinel_memory_mib = 256;
    // Whether a deploy writes the environment's CiliumNetworkPolicy in each region.
    bool cilium_policy = true;
    // After a swap, the deployment that was live is stopped this much later (0: never).
    std::chrono::seconds previous_stop_delay{1800};
    // How long a sentinel may take to converge (SentinelService.Deploy) before it is failed.
    std::chrono::seconds sentinel_timeout{600};
    // A rolling deploy rolls back once this many failed new instances per desired replica were
    // seen (crash loops, image pulls); 0: only its timeout ends it.
    uint32_t rolling_give_up_per_replica = 3;
    // WatchDeployment streams this replica serves at once (each polls the database while it
    // lives); one more is refused with RESOURCE_EXHAUSTED.
    uint32_t watch_max_streams = 256;
    // A WatchDeployment stream ends after this long with OUT_OF_RANGE, telling the client to
    // watch again.
    std::chrono::seconds watch_max_lifetime{3600};
  } deploy;
};

// Parses YAML text; `source` names it in errors.
absl::StatusOr<CtrlConfig> parseCtrlConfig(const std::string& yaml, const std::string& source);
absl::StatusOr<CtrlConfig> loadCtrlConfig(const std::string& path);
// Fills what the environment provides (KRANE_DSN, KRANE_OPERATOR_TOKEN), reads the operator
// token file, and checks what only makes sense as a whole (TLS files in pairs, ...).
absl::Status finishCtrlConfig(CtrlConfig& config);

}  // namespace krane::ctrl
