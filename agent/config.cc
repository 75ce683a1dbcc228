#include "agent/config.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include "common/files.h"
#include "common/status.h"
#include "common/strings.h"
#include "common/yaml_config.h"
#include "nlohmann/json.hpp"

namespace krane::agent {
namespace {

using config::bad;
using config::number;
using config::oneOf;
using config::text;
using config::walk;

nlohmann::json toJson(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map: {
      nlohmann::json out = nlohmann::json::object();
      for (const auto& e : node) out[e.first.as<std::string>()] = toJson(e.second);
      return out;
    }
    case YAML::NodeType::Sequence: {
      nlohmann::json out = nlohmann::json::array();
      for (const auto& e : node) out.push_back(toJson(e));
      return out;
    }
    case YAML::NodeType::Scalar: {
      const std::string s = node.Scalar();
      int64_t i = 0;
      double d = 0;
      bool b = false;
      if (node.Tag() != "!" && YAML::convert<int64_t>::decode(node, i)) return i;
      if (node.Tag() != "!" && YAML::convert<double>::decode(node, d)) return d;
      if (node.Tag() != "!" && YAML::convert<bool>::decode(node, b)) return b;
      return s;
    }
    default:
      return nullptr;
  }
}

}  // namespace

absl::StatusOr<AgentConfig> parseAgentConfig(const std::string& yaml, const std::string& source) {
  KRANE_ASSIGN_OR_RETURN(YAML::Node root, config::parse(yaml, source));
  AgentConfig c;
  const std::string& s = source;
  auto status = walk(
      root, s, "",
      {
          {"region", text(c.region, s)},
          {"agent_id", text(c.agent_id, s)},
          {"state_dir", text(c.state_dir, s)},
          {"runtime", oneOf(c.runtime, s, {"process", "kubernetes"})},
          {"resync_interval_s", number(c.resync_interval, s, 0, 86400)},
          {"reconnect_min_ms", number(c.reconnect_min, s, 10, 600000)},
          {"reconnect_max_ms", number(c.reconnect_max, s, 10, 600000)},
          {"control_plane",
           [&](const YAML::Node& n, const std::string& p) {
             return walk(n, s, p,
                         {{"address", text(c.control_plane.address, s)},
                          {"watch_address", text(c.control_plane.watch_address, s)},
                          {"token_file", text(c.control_plane.token_file, s)},
                          {"ca_file", text(c.control_plane.ca_file, s)},
                          {"cert_file", text(c.control_plane.cert_file, s)},
                          {"key_file", text(c.control_plane.key_file, s)},
                          {"keepalive_ms", number(c.control_plane.keepalive, s, 0, 3600000)},
                          {"keepalive_timeout_ms",
                           number(c.control_plane.keepalive_timeout, s, 1000, 600000)}});
           }},
          {"leader",
           [&](const YAML::Node& n, const std::string& p) {
             return walk(n, s, p,
                         {{"mode", oneOf(c.leader.mode, s, {"lockfile", "lease", "none"})},
                          {"lease_duration_s", number(c.leader.lease_duration, s, 3, 600)},
                          {"lease_namespace", text(c.leader.lease_namespace, s)},
                          {"lease_name", text(c.leader.lease_name, s)},
                          {"kubeconfig", text(c.leader.kubeconfig, s)}});
           }},
          {"reporter",
           [&](const YAML::Node& n, const std::string& p) {
             return walk(
                 n, s, p,
                 {{"heartbeat_interval_ms", number(c.reporter.heartbeat_interval, s, 100, 600000)},
                  {"max_pending", number(c.reporter.max_pending, s, 10, 10000000)}});
           }},
          {"dispatch",
           [&](const YAML::Node& n, const std::string& p) {
             return walk(n, s, p,
                         {{"max_attempts", number(c.dispatch.max_attempts, s, 1, 1000)},
                          {"batch", number(c.dispatch.batch, s, 1, 1024)}});
           }},
          {"plugins",
           [&](const YAML::Node& n, const std::string& p) -> absl::Status {
             if (!n.IsSequence()) return bad(s, p, "must be a list");
             for (size_t i = 0; i < n.size(); ++i) {
               PluginConfig plugin;
               const std::string item = strCat(p, "[", i, "]");
               KRANE_RETURN_IF_ERROR(walk(
                   n[i], s, item,
                   {{"name", text(plugin.name, s)},
                    {"path", text(plugin.path, s)},
                    {"isolation", oneOf(plugin.isolation, s, {"process", "in_process"})},
                    {"workers", number(plugin.workers, s, 1, 64)},
                    {"call_timeout_ms", number(plugin.call_timeout, s, 100, 3600000)},
                    {"cancel_grace_ms", number(plugin.cancel_grace, s, 100, 600000)},
                    {"config_text", text(plugin.config_text, s)},
                    {"config", [&](const YAML::Node& cfg, const std::string& cp) -> absl::Status {
                       if (!cfg.IsMap() && !cfg.IsNull()) return bad(s, cp, "must be a mapping");
                       plugin.config_json = cfg.IsNull() ? "{}" : toJson(cfg).dump();
                       return absl::OkStatus();
                     }}}));
               if (plugin.name.empty()) return bad(s, strCat(item, ".name"), "required");
               if (plugin.path.empty()) return bad(s, strCat(item, ".path"), "required");
               if (!plugin.config_text.empty()) plugin.config_json = plugin.config_text;
               c.plugins.push_back(std::move(plugin));
             }
             return absl::OkStatus();
           }},
      });
  if (!status.ok()) return status;
  if (c.region.empty()) return bad(s, "region", "required");
  if (!config::validHostPort(c.control_plane.address)) {
    return bad(s, "control_plane.address",
               strCat("\"", c.control_plane.address, "\" is not host:port"));
  }
  if (!c.control_plane.watch_address.empty() &&
      c.control_plane.watch_address != AgentConfig::kWatchAddressOff &&
      !config::validHostPort(c.control_plane.watch_address)) {
    return bad(s, "control_plane.watch_address",
               strCat("\"", c.control_plane.watch_address, "\" is not host:port, \"",
                      AgentConfig::kWatchAddressOff, "\" or empty"));
  }
  if (c.control_plane.keepalive.count() > 0 &&
      c.control_plane.keepalive < AgentConfig::kMinKeepalive) {
    return bad(s, "control_plane.keepalive_ms",
               strCat("must be 0 (off) or at least ", AgentConfig::kMinKeepalive.count(),
                      " (krane-ctrl refuses pings more frequent than that), got ",
                      c.control_plane.keepalive.count()));
  }
  if (c.reconnect_min > c.reconnect_max)
    return bad(s, "reconnect_min_ms", "must not exceed reconnect_max_ms");
  std::set<std::string> names;
  for (size_t i = 0; i < c.plugins.size(); ++i) {
    if (!names.insert(c.plugins[i].name).second) {
      return bad(s, strCat("plugins[", i, "].name"),
                 strCat("\"", c.plugins[i].name, "\" is configured twice"));
    }
  }
  return c;
}

absl::StatusOr<AgentConfig> loadAgentConfig(const std::string& path) {
  KRANE_ASSIGN_OR_RETURN(std::string text, readFile(path, "config file"));
  return parseAgentConfig(text, path);
}

absl::Status finishAgentConfig(AgentConfig& c) {
  auto& cp = c.control_plane;
  if (!cp.token_file.empty()) {
    std::ifstream in(cp.token_file);
    if (!in)
      return absl::NotFoundError(strCat("control_plane.token_file: cannot read ", cp.token_file));
    std::getline(in, cp.token);
    while (!cp.token.empty() && (cp.token.back() == '\r' || cp.token.back() == ' '))
      cp.token.pop_back();
  }
  if (cp.token.empty()) {
    if (const char* env = std::getenv("KRANE_AGENT_TOKEN")) cp.token = env;
  }
  if (cp.token.empty()) {
    return absl::InvalidArgumentError(
        "control_plane.token_file: required (or $KRANE_AGENT_TOKEN); create one with `krane-ctrl "
        "token create --region " +
        c.region + "`");
  }
  if (cp.cert_file.empty() != cp.key_file.empty()) {
    return absl::InvalidArgumentError("control_plane: cert_file and key_file go together");
  }
  if (!cp.cert_file.empty() && cp.ca_file.empty()) {
    return absl::InvalidArgumentError("control_plane.cert_file: needs control_plane.ca_file (TLS)");
  }
  if (c.agent_id.empty()) {
    char host[256] = {0};
    ::gethostname(host, sizeof(host) - 1);
    c.agent_id = strCat(host, "-", ::getpid());
  }
  return absl::OkStatus();
}

}  // namespace krane::agent
