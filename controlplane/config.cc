#include "controlplane/config.h"

#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "common/files.h"
#include "common/host_port.h"
#include "common/status.h"
#include "common/strings.h"
#include "common/yaml_config.h"
#include "controlplane/api/auth.h"

namespace krane::ctrl {
using config::bad;
using config::flag;
using config::number;
using config::text;
using config::validHostPort;
using config::walk;

namespace {

// Where the other replicas dial this one: a host:port with a real port and a host that is not
// every interface (and not a Kubernetes variable left unexpanded).
absl::Status checkAdvertised(const std::string& address) {
  if (address.find("$(") != std::string::npos) {
    return absl::InvalidArgumentError(
        strCat("\"", address, "\" has an unexpanded variable (define it before this one)"));
  }
  if (address.find("://") != std::string::npos) {
    return absl::InvalidArgumentError(
        strCat("\"", address, "\": host:port only, without a scheme"));
  }
  if (!config::validHostPort(address)) {
    return absl::InvalidArgumentError(strCat("\"", address, "\" is not host:port"));
  }
  const std::string host = splitHostPort(address).first;
  if (portOf(address) == 0) {
    return absl::InvalidArgumentError(strCat("\"", address, "\": port 0 cannot be dialled"));
  }
  if (isAnyAddress(host)) {
    return absl::InvalidArgumentError(strCat(
        "\"", address, "\": every interface cannot be dialled; give this replica's address"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CtrlConfig> parseCtrlConfig(const std::string& yaml, const std::string& source) {
  KRANE_ASSIGN_OR_RETURN(YAML::Node root, config::parse(yaml, source));
  CtrlConfig c;
  const std::string& s = source;
  auto status = walk(
      root, s, "",
      {
          {"listen", text(c.listen, s)},
          {"http_listen", text(c.http_listen, s)},
          {"database",
           [&](const YAML::Node& n, const std::string& p) {
             return walk(
                 n, s, p,
                 {{"dsn", text(c.database.dsn, s)},
                  {"max_connections", number(c.database.max_connections, s, 1, 1000)},
                  {"acquire_timeout_ms", number(c.database.acquire_timeout, s, 1, 600000)}});
           }},
          {"auth",
           [&](const YAML::Node& n, const std::string& p) {
             return walk(
                 n, s, p,
                 {{"operator_tokens_file", text(c.auth.operator_tokens_file, s)},
                  {"agent_token_cache_ms", number(c.auth.agent_token_cache, s, 0, 3600000)}});
           }},
          {"tls",
           [&](const YAML::Node& n, const std::string& p) {
             return walk(n, s, p,
                         {{"cert_file", text(c.tls.cert_file, s)},
                          {"key_file", text(c.tls.key_file, s)},
                          {"client_ca_file", text(c.tls.client_ca_file, s)}});
           }},
          {"feed",
           [&](const YAML::Node& n, const std::string& p) {
             return walk(
                 n, s, p,
                 {{"poll_interval_ms", number(c.feed.poll_interval, s, 1, 60000)},
                  {"bookmark_interval_ms", number(c.feed.bookmark_interval, s, 100, 3600000)},
                  {"stream_max_queued", number(c.feed.stream_max_queued, s, 100, 10000000)},
                  {"sync_workers", number(c.feed.sync_workers, s, 1, 256)},
                  {"write_threads", number(c.feed.write_threads, s, 0, 256)},
                  {"sync_snapshots", number(c.feed.sync_snapshots, s, 1, 256)},
                  {"sync_high_water", number(c.feed.sync_high_water, s, 1, 1000000)},
                  {"sync_batch", number(c.feed.sync_batch, s, 1, 100000)},
                  {"sync_stall_ms", number(c.feed.sync_stall, s, 100, 3600000)},
                  {"change_ttl_s", number(c.feed.change_ttl, s, 60, 365LL * 24 * 3600)},
                  {"cleanup_interval_s", number(c.feed.cleanup_interval, s, 1, 86400)},
                  {"cleanup_batch", number(c.feed.cleanup_batch, s, 1, 10000)},
                  {"watch_listen", text(c.feed.watch_listen, s)},
                  {"keepalive_ms", number(c.feed.keepalive, s, 0, 3600000)},
                  {"keepalive_timeout_ms", number(c.feed.keepalive_timeout, s, 1000, 600000)},
                  {"peer_hints", [&](const YAML::Node& h, const std::string& hp) {
                     return walk(h, s, hp,
                                 {{"listen", text(c.feed.peer_hints.listen, s)},
                                  {"advertise", text(c.feed.peer_hints.advertise, s)}});
                   }}});
           }},
          {"workflow",
           [&](const YAML::Node& n, const std::string& p) {
             return walk(
                 n, s, p,
                 {{"threads", number(c.workflow.threads, s, 1, 1024)},
                  {"lease_ms", number(c.workflow.lease, s, 1000, 3600000)},
                  {"poll_interval_ms", number(c.workflow.poll_interval, s, 1, 60000)},
                  {"max_payload_bytes", number(c.workflow.max_payload_bytes, s, 1024, 1 << 24)},
                  {"maintenance_interval_s", number(c.workflow.maintenance_interval, s, 1, 86400)},
                  {"watchdog_threshold_s",
                   number(c.workflow.watchdog_threshold, s, 1, 30LL * 24 * 3600)},
                  {"retention_s", number(c.workflow.retention, s, 60, 365LL * 24 * 3600)}});
           }},
          {"deploy",
           [&](const YAML::Node& n, const std::string& p) {
             return walk(
                 n, s, p,
                 {{"build_log_dir", text(c.deploy.build_log_dir, s)},
                  {"build_timeout_s", number(c.deploy.build_timeout, s, 1, 24 * 3600)},
                  {"sentinel_image", text(c.deploy.sentinel_image, s)},
                  {"sentinel_replicas", number(c.deploy.sentinel_replicas, s, 1, 100)},
                  {"sentinel_cpu_millicores",
                   number(c.deploy.sentinel_cpu_millicores, s, 10, 64000)},
                  {"sentinel_memory_mib", number(c.deploy.sentinel_memory_mib, s, 16, 262144)},
                  {"cilium_policy", flag(c.deploy.cilium_policy, s)},
                  {"previous_stop_delay_s",
                   number(c.deploy.previous_stop_delay, s, 0, 30LL * 24 * 3600)},
                  {"sentinel_timeout_s", number(c.deploy.sentinel_timeout, s, 1, 24 * 3600)},
                  {"rolling_give_up_per_replica",
                   number(c.deploy.rolling_give_up_per_replica, s, 0, 1000)},
                  {"watch_max_streams", number(c.deploy.watch_max_streams, s, 1, 100000)},
                  {"watch_max_lifetime_s",
                   number(c.deploy.watch_max_lifetime, s, 1, 7LL * 24 * 3600)}});
           }},
      });
  if (!status.ok()) return status;
  if (c.deploy.sentinel_image.empty()) return bad(s, "deploy.sentinel_image", "must not be empty");
  if (!validHostPort(c.listen))
    return bad(s, "listen", strCat("\"", c.listen, "\" is not host:port"));
  if (!validHostPort(c.http_listen))
    return bad(s, "http_listen", strCat("\"", c.http_listen, "\" is not host:port"));
  if (!c.feed.watch_listen.empty() && !validHostPort(c.feed.watch_listen)) {
    return bad(s, "feed.watch_listen", strCat("\"", c.feed.watch_listen, "\" is not host:port"));
  }
  const auto& hints = c.feed.peer_hints;
  if (!hints.listen.empty()) {
    if (!validHostPort(hints.listen)) {
      return bad(s, "feed.peer_hints.listen", strCat("\"", hints.listen, "\" is not host:port"));
    }
    if (const std::string host = splitHostPort(hints.listen).first;
        host != "*" && !isIpLiteral(host)) {
      return bad(s, "feed.peer_hints.listen",
                 strCat("\"", hints.listen,
                        "\": the host must be an IP address ([...] for IPv6) or * (every"
                        " interface, IPv4 and IPv6)"));
    }
  }
  if (!hints.advertise.empty()) {
    if (absl::Status st = checkAdvertised(hints.advertise); !st.ok()) {
      return bad(s, "feed.peer_hints.advertise", std::string(st.message()));
    }
    if (hints.listen.empty()) {
      return bad(s, "feed.peer_hints.advertise", "needs feed.peer_hints.listen");
    }
  }
  return c;
}

absl::StatusOr<CtrlConfig> loadCtrlConfig(const std::string& path) {
  KRANE_ASSIGN_OR_RETURN(std::string text, readFile(path, "config file"));
  return parseCtrlConfig(text, path);
}

absl::Status finishCtrlConfig(CtrlConfig& c) {
  if (c.database.dsn.empty()) {
    if (const char* env = std::getenv("KRANE_DSN")) c.database.dsn = env;
  }
  if (c.database.dsn.empty()) {
    return absl::InvalidArgumentError(
        "database.dsn: required (in the config file, --dsn, or $KRANE_DSN)");
  }
  if (!c.auth.operator_tokens_file.empty()) {
    KRANE_ASSIGN_OR_RETURN(auto tokens, api::readTokenFile(c.auth.operator_tokens_file));
    c.auth.operator_tokens.insert(c.auth.operator_tokens.end(), tokens.begin(), tokens.end());
  }
  if (const char* env = std::getenv("KRANE_OPERATOR_TOKEN"); env != nullptr && *env != '\0') {
    c.auth.operator_tokens.emplace_back(env);
  }
  auto& hints = c.feed.peer_hints;
  if (!hints.listen.empty() && hints.advertise.empty()) {
    // In Kubernetes: "$(POD_IP):7072", from the pod's own address.
    if (const char* env = std::getenv("KRANE_PEER_HINTS_ADVERTISE"); env != nullptr && *env) {
      if (absl::Status st = checkAdvertised(env); !st.ok()) {
        return absl::InvalidArgumentError(
            strCat("feed.peer_hints.advertise (from $KRANE_PEER_HINTS_ADVERTISE): ", st.message()));
      }
      hints.advertise = env;
    }
  }
  if (!hints.listen.empty()) {
    const std::string host = splitHostPort(hints.listen).first;
    if (!hints.advertise.empty() && portOf(hints.listen) == 0) {
      return absl::InvalidArgumentError(
          strCat("feed.peer_hints.listen: \"", hints.listen,
                 "\" picks a free port, which the advertised address (\"", hints.advertise,
                 "\") cannot know; give the port"));
    }
    if (hints.advertise.empty() && isAnyAddress(host)) {
      return absl::InvalidArgumentError(strCat(
          "feed.peer_hints.advertise: required when feed.peer_hints.listen (\"", hints.listen,
          "\") binds every interface: the host:port the other replicas reach this one on"
          " (or $KRANE_PEER_HINTS_ADVERTISE)"));
    }
  }
  if (c.tls.cert_file.empty() != c.tls.key_file.empty()) {
    return absl::InvalidArgumentError("tls: cert_file and key_file go together");
  }
  if (!c.tls.client_ca_file.empty() && c.tls.cert_file.empty()) {
    return absl::InvalidArgumentError("tls.client_ca_file: needs tls.cert_file and tls.key_file");
  }
  return absl::OkStatus();
}

}  // namespace krane::ctrl
