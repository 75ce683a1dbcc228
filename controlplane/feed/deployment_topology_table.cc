// Resource type "deployment_topology", in table `deployment_topology` keyed by
// (deployment_id = resource id, region_id).
#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "common/strings.h"
#include "controlplane/feed/single_type_table.h"
#include "controlplane/feed/tables.h"
#include "controlplane/strategy/rolling.h"
#include "google/protobuf/util/json_util.h"

namespace krane::feed {
namespace {

using cluster::v1::DeploymentTopology;
using cluster::v1::HttpProbe;
using Json = nlohmann::json;

constexpr size_t kMaxImageBytes = 512;
constexpr size_t kMaxArgs = 256;  // each of command and args
constexpr size_t kMaxArgBytes = 4096;
constexpr size_t kMaxEnv = 200;
constexpr size_t kMaxEnvNameBytes = 256;
constexpr size_t kMaxEnvValueBytes = size_t{32} * 1024;
constexpr size_t kMaxEnvTotalBytes = 1 << 20;
constexpr uint32_t kMaxCpuMillicores = 64000;
constexpr uint32_t kMaxMemoryMib = 1024 * 1024;  // 1 TiB
constexpr uint32_t kMaxReplicas = 1000;
constexpr uint32_t kMaxGracePeriodSeconds = 3600;
constexpr uint32_t kMaxProbeSeconds = 3600;
constexpr uint32_t kMaxProbeThreshold = 100;
constexpr size_t kMaxProbePathBytes = 1024;
constexpr size_t kMaxLabels = 64;
constexpr size_t kMaxLabelNameBytes = 63;
constexpr size_t kMaxLabelPrefixBytes = 253;
constexpr size_t kMaxLabelValueBytes = 63;

// Names accepted in shutdown_signal: the Linux signals a container runtime can send by name.
constexpr std::array<std::string_view, 31> kSignals = {
    "SIGHUP",  "SIGINT",    "SIGQUIT", "SIGILL",   "SIGTRAP", "SIGABRT", "SIGBUS",  "SIGFPE",
    "SIGKILL", "SIGUSR1",   "SIGSEGV", "SIGUSR2",  "SIGPIPE", "SIGALRM", "SIGTERM", "SIGSTKFLT",
    "SIGCHLD", "SIGCONT",   "SIGSTOP", "SIGTSTP",  "SIGTTIN", "SIGTTOU", "SIGURG",  "SIGXCPU",
    "SIGXFSZ", "SIGVTALRM", "SIGPROF", "SIGWINCH", "SIGIO",   "SIGPWR",  "SIGSYS",
};

constexpr std::string_view kColumns =
    "deployment_id, region_id, workspace_id, project_id, app_id, environment_id, image, command,"
    " args, env, port, healthcheck, cpu_millicores, memory_mib, replicas, autoscale_min_replicas,"
    " autoscale_max_replicas, autoscale_target_cpu_percent, shutdown_signal,"
    " termination_grace_period_seconds, desired_status, labels, rolling_update, version,"
    " deleted_at";

absl::Status invalid(const std::string& message) { return absl::InvalidArgumentError(message); }

bool validUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      n = 1;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + n >= s.size()) return false;
    for (size_t k = 1; k <= n; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) ||
        cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      return false;
    }
    i += n + 1;
  }
  return true;
}

// Text that goes into a JSON column: valid UTF-8 without NUL bytes, at most `max_size` bytes.
absl::Status checkText(std::string_view field, std::string_view value, size_t max_size) {
  if (value.size() > max_size) {
    return invalid(strCat(field, ": at most ", max_size, " bytes, got ", value.size()));
  }
  if (!validUtf8(value)) return invalid(strCat(field, ": not valid UTF-8"));
  if (value.find('\0') != std::string_view::npos) {
    return invalid(strCat(field, ": must not contain NUL bytes"));
  }
  return absl::OkStatus();
}

absl::Status checkRange(std::string_view field, uint64_t value, uint64_t min, uint64_t max) {
  if (value < min || value > max) {
    return invalid(strCat(field, ": must be between ", min, " and ", max, ", got ", value));
  }
  return absl::OkStatus();
}

bool isAlnum(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}
bool isLowerAlnum(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }

// Kubernetes label name / value syntax: [A-Za-z0-9]([-_.A-Za-z0-9]*[A-Za-z0-9])?
bool labelSyntax(std::string_view s) {
  if (s.empty() || !isAlnum(s.front()) || !isAlnum(s.back())) return false;
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return isAlnum(c) || c == '-' || c == '_' || c == '.'; });
}

// DNS subdomain (RFC 1123): lower-case alphanumerics, '-' and '.', starting and ending
// alphanumeric.
bool dnsSubdomain(std::string_view s) {
  if (s.empty() || !isLowerAlnum(s.front()) || !isLowerAlnum(s.back())) return false;
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return isLowerAlnum(c) || c == '-' || c == '.'; });
}

absl::Status checkLabelKey(std::string_view field, std::string_view key) {
  if (key.empty()) return invalid(strCat(field, ": key must not be empty"));
  std::string_view name = key;
  const size_t slash = key.find('/');
  if (slash != std::string_view::npos) {
    const std::string_view prefix = key.substr(0, slash);
    name = key.substr(slash + 1);
    if (prefix.size() > kMaxLabelPrefixBytes || !dnsSubdomain(prefix)) {
      return invalid(strCat(field, ": key prefix ", quote(prefix),
                            " must be a DNS subdomain of at most ", kMaxLabelPrefixBytes,
                            " characters"));
    }
  }
  if (name.size() > kMaxLabelNameBytes || !labelSyntax(name)) {
    return invalid(strCat(field, ": key name ", quote(name), " must be 1-", kMaxLabelNameBytes,
                          " characters of [A-Za-z0-9-_.], starting and ending alphanumeric"));
  }
  return absl::OkStatus();
}

absl::Status checkLabelValue(std::string_view field, std::string_view value) {
  if (value.empty()) return absl::OkStatus();
  if (value.size() > kMaxLabelValueBytes || !labelSyntax(value)) {
    return invalid(strCat(field, ": value ", quote(value), " must be at most ", kMaxLabelValueBytes,
                          " characters of [A-Za-z0-9-_.], starting and ending alphanumeric"));
  }
  return absl::OkStatus();
}

// Kubernetes' portable environment variable names: [-._a-zA-Z][-._a-zA-Z0-9]*
absl::Status checkEnvName(std::string_view field, std::string_view name) {
  if (name.empty()) return invalid(strCat(field, ": required"));
  if (name.size() > kMaxEnvNameBytes) {
    return invalid(strCat(field, ": at most ", kMaxEnvNameBytes, " bytes, got ", name.size()));
  }
  const auto allowed = [](char c) { return isAlnum(c) || c == '-' || c == '.' || c == '_'; };
  if (!std::all_of(name.begin(), name.end(), allowed) || (name[0] >= '0' && name[0] <= '9')) {
    return invalid(strCat(field, ": ", quote(name),
                          " must consist of letters, digits, '_', '-' and '.' and not start "
                          "with a digit"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status checkProbe(std::string_view field, const HttpProbe& p, bool liveness) {
  if (!p.path().empty()) {
    if (p.path().front() != '/') return invalid(strCat(field, ".path: must start with '/'"));
    if (p.path().size() > kMaxProbePathBytes) {
      return invalid(
          strCat(field, ".path: at most ", kMaxProbePathBytes, " bytes, got ", p.path().size()));
    }
    const bool printable = std::all_of(p.path().begin(), p.path().end(), [](char c) {
      return static_cast<unsigned char>(c) > 0x20 && c != 0x7F;
    });
    if (!printable || !validUtf8(p.path())) {
      return invalid(strCat(field, ".path: must not contain spaces or control characters"));
    }
  }
  KRANE_RETURN_IF_ERROR(checkMax(strCat(field, ".port"), p.port(), 65535));
  KRANE_RETURN_IF_ERROR(checkMax(strCat(field, ".initial_delay_seconds"), p.initial_delay_seconds(),
                                 kMaxProbeSeconds));
  KRANE_RETURN_IF_ERROR(
      checkMax(strCat(field, ".period_seconds"), p.period_seconds(), kMaxProbeSeconds));
  KRANE_RETURN_IF_ERROR(
      checkMax(strCat(field, ".timeout_seconds"), p.timeout_seconds(), kMaxProbeSeconds));
  KRANE_RETURN_IF_ERROR(
      checkMax(strCat(field, ".failure_threshold"), p.failure_threshold(), kMaxProbeThreshold));
  KRANE_RETURN_IF_ERROR(
      checkMax(strCat(field, ".success_threshold"), p.success_threshold(), kMaxProbeThreshold));
  if (liveness && p.success_threshold() > 1) {
    return invalid(strCat(field, ".success_threshold: must be 0 or 1 for a liveness probe, got ",
                          p.success_threshold()));
  }
  return absl::OkStatus();
}

namespace {

absl::Status validateTopology(const Resource& r) {
  if (!r.has_deployment_topology()) {
    return invalid(strCat("resource.deployment_topology: required for type ", quote(r.type())));
  }
  const DeploymentTopology& t = r.deployment_topology();
  if (!t.deployment_id().empty() && t.deployment_id() != r.id()) {
    return invalid(strCat("deployment_topology.deployment_id: ", quote(t.deployment_id()),
                          " differs from resource.id ", quote(r.id())));
  }
  if (!t.region().empty() && t.region() != r.region()) {
    return invalid(strCat("deployment_topology.region: ", quote(t.region()),
                          " differs from resource.region ", quote(r.region())));
  }
  KRANE_RETURN_IF_ERROR(checkId("deployment_topology.workspace_id", t.workspace_id()));
  KRANE_RETURN_IF_ERROR(checkId("deployment_topology.project_id", t.project_id()));
  KRANE_RETURN_IF_ERROR(checkId("deployment_topology.app_id", t.app_id()));
  KRANE_RETURN_IF_ERROR(checkId("deployment_topology.environment_id", t.environment_id()));

  KRANE_RETURN_IF_ERROR(checkNotEmpty("deployment_topology.image", t.image(), kMaxImageBytes));
  const bool image_ok = std::all_of(t.image().begin(), t.image().end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u > 0x20 && u < 0x7F;
  });
  if (!image_ok) {
    return invalid("deployment_topology.image: must be printable ASCII without spaces");
  }

  const std::pair<std::string_view, const google::protobuf::RepeatedPtrField<std::string>*>
      lists[] = {{"command", &t.command()}, {"args", &t.args()}};
  for (const auto& [name, list] : lists) {
    if (static_cast<size_t>(list->size()) > kMaxArgs) {
      return invalid(strCat("deployment_topology.", name, ": at most ", kMaxArgs, " entries, got ",
                            list->size()));
    }
    for (int i = 0; i < list->size(); ++i) {
      KRANE_RETURN_IF_ERROR(
          checkText(strCat("deployment_topology.", name, "[", i, "]"), list->Get(i), kMaxArgBytes));
    }
  }

  if (static_cast<size_t>(t.env_size()) > kMaxEnv) {
    return invalid(
        strCat("deployment_topology.env: at most ", kMaxEnv, " entries, got ", t.env_size()));
  }
  std::map<std::string_view, int> env_seen;
  size_t env_bytes = 0;
  for (int i = 0; i < t.env_size(); ++i) {
    const auto& e = t.env(i);
    const std::string field = strCat("deployment_topology.env[", i, "]");
    KRANE_RETURN_IF_ERROR(checkEnvName(strCat(field, ".name"), e.name()));
    const auto [it, inserted] = env_seen.emplace(e.name(), i);
    if (!inserted) {
      return invalid(
          strCat(field, ".name: ", quote(e.name()), " already set by env[", it->second, "]"));
    }
    KRANE_RETURN_IF_ERROR(checkText(strCat(field, ".value"), e.value(), kMaxEnvValueBytes));
    env_bytes += e.name().size() + e.value().size();
  }
  if (env_bytes > kMaxEnvTotalBytes) {
    return invalid(strCat("deployment_topology.env: at most ", kMaxEnvTotalBytes,
                          " bytes of names and values in all, got ", env_bytes));
  }

  KRANE_RETURN_IF_ERROR(checkRange("deployment_topology.port", t.port(), 1, 65535));
  if (t.has_healthcheck()) {
    if (t.healthcheck().has_liveness()) {
      KRANE_RETURN_IF_ERROR(
          checkProbe("deployment_topology.healthcheck.liveness", t.healthcheck().liveness(), true));
    }
    if (t.healthcheck().has_readiness()) {
      KRANE_RETURN_IF_ERROR(checkProbe("deployment_topology.healthcheck.readiness",
                                       t.healthcheck().readiness(), false));
    }
  }

  if (t.has_rolling_update()) {
    KRANE_RETURN_IF_ERROR(
        strategy::checkRollingUpdate(t.rolling_update(), "deployment_topology.rolling_update."));
  }

  KRANE_RETURN_IF_ERROR(
      checkRange("deployment_topology.cpu_millicores", t.cpu_millicores(), 1, kMaxCpuMillicores));
  KRANE_RETURN_IF_ERROR(
      checkRange("deployment_topology.memory_mib", t.memory_mib(), 1, kMaxMemoryMib));
  KRANE_RETURN_IF_ERROR(checkMax("deployment_topology.replicas", t.replicas(), kMaxReplicas));
  if (t.has_autoscaling()) {
    const auto& a = t.autoscaling();
    KRANE_RETURN_IF_ERROR(checkRange("deployment_topology.autoscaling.min_replicas",
                                     a.min_replicas(), 1, kMaxReplicas));
    KRANE_RETURN_IF_ERROR(checkRange("deployment_topology.autoscaling.max_replicas",
                                     a.max_replicas(), 1, kMaxReplicas));
    if (a.min_replicas() > a.max_replicas()) {
      return invalid(
          strCat("deployment_topology.autoscaling.min_replicas: must not exceed "
                 "max_replicas (",
                 a.min_replicas(), " > ", a.max_replicas(), ")"));
    }
    KRANE_RETURN_IF_ERROR(checkRange("deployment_topology.autoscaling.target_cpu_percent",
                                     a.target_cpu_percent(), 1, 100));
  }

  if (!t.shutdown_signal().empty() &&
      std::find(kSignals.begin(), kSignals.end(), t.shutdown_signal()) == kSignals.end()) {
    return invalid(strCat("deployment_topology.shutdown_signal: ", quote(t.shutdown_signal()),
                          " is not a signal (use e.g. SIGTERM)"));
  }
  KRANE_RETURN_IF_ERROR(checkMax("deployment_topology.termination_grace_period_seconds",
                                 t.termination_grace_period_seconds(), kMaxGracePeriodSeconds));

  switch (t.desired_status()) {
    case cluster::v1::DESIRED_STATUS_UNSPECIFIED:
    case cluster::v1::DESIRED_STATUS_RUNNING:
    case cluster::v1::DESIRED_STATUS_STOPPED:
      break;
    default:
      return invalid(strCat("deployment_topology.desired_status: unknown value ",
                            static_cast<int>(t.desired_status())));
  }

  if (static_cast<size_t>(t.labels_size()) > kMaxLabels) {
    return invalid(strCat("deployment_topology.labels: at most ", kMaxLabels, " entries, got ",
                          t.labels_size()));
  }
  // Sorted, so the first bad label reported does not depend on the map's iteration order.
  const std::map<std::string, std::string> labels(t.labels().begin(), t.labels().end());
  for (const auto& [key, value] : labels) {
    const std::string field = strCat("deployment_topology.labels[", quote(key), "]");
    if (!validUtf8(key) || !validUtf8(value)) return invalid(strCat(field, ": not valid UTF-8"));
    KRANE_RETURN_IF_ERROR(checkLabelKey(field, key));
    KRANE_RETURN_IF_ERROR(checkLabelValue(field, value));
  }
  return absl::OkStatus();
}

// JSON text of a list of strings, NULL when empty.
db::Value stringsJson(const google::protobuf::RepeatedPtrField<std::string>& list) {
  if (list.empty()) return db::Value();
  Json out = Json::array();
  for (const auto& s : list) out.push_back(s);
  return db::Value(out.dump());
}

db::Value envJson(const DeploymentTopology& t) {
  if (t.env().empty()) return db::Value();
  Json out = Json::array();
  for (const auto& e : t.env()) out.push_back(Json{{"name", e.name()}, {"value", e.value()}});
  return db::Value(out.dump());
}

db::Value labelsJson(const DeploymentTopology& t) {
  if (t.labels().empty()) return db::Value();
  Json out = Json::object();
  for (const auto& [key, value] : t.labels()) out[key] = value;
  return db::Value(out.dump());
}

absl::StatusOr<db::Value> rollingUpdateJson(const DeploymentTopology& t) {
  if (!t.has_rolling_update()) return db::Value();
  std::string out;
  const auto status = google::protobuf::util::MessageToJsonString(t.rolling_update(), &out);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        strCat("deployment_topology.rolling_update: cannot encode as JSON: ", status.ToString()));
  }
  return db::Value(std::move(out));
}

absl::StatusOr<db::Value> healthcheckJson(const DeploymentTopology& t) {
  if (!t.has_healthcheck()) return db::Value();
  std::string out;
  const auto status = google::protobuf::util::MessageToJsonString(t.healthcheck(), &out);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        strCat("deployment_topology.healthcheck: cannot encode as JSON: ", status.ToString()));
  }
  return db::Value(std::move(out));
}

std::string_view desiredStatusName(cluster::v1::DesiredStatus s) {
  return s == cluster::v1::DESIRED_STATUS_STOPPED ? "stopped" : "running";
}

absl::Status corrupt(const db::Row& row, std::string_view column, std::string_view what) {
  return absl::DataLossError(strCat("deployment_topology ", row.str("deployment_id"), " in region ",
                                    row.str("region_id"), ": column ", column, ": ", what));
}

absl::StatusOr<Resource> fromRow(const db::Row& row) {
  Resource r;
  r.set_type(std::string(kDeploymentTopology));
  r.set_id(row.str("deployment_id"));
  r.set_region(row.str("region_id"));
  r.set_version(row.u64("version"));
  DeploymentTopology* t = r.mutable_deployment_topology();
  t->set_deployment_id(r.id());
  t->set_region(r.region());
  t->set_workspace_id(row.str("workspace_id"));
  t->set_project_id(row.str("project_id"));
  t->set_app_id(row.str("app_id"));
  t->set_environment_id(row.str("environment_id"));
  t->set_image(row.str("image"));

  const char* column = "";
  try {
    column = "command";
    if (!row.isNull(column)) {
      for (const auto& s : Json::parse(row.str(column))) t->add_command(s.get<std::string>());
    }
    column = "args";
    if (!row.isNull(column)) {
      for (const auto& s : Json::parse(row.str(column))) t->add_args(s.get<std::string>());
    }
    column = "env";
    if (!row.isNull(column)) {
      for (const auto& e : Json::parse(row.str(column))) {
        auto* env = t->add_env();
        env->set_name(e.at("name").get<std::string>());
        if (e.contains("value")) env->set_value(e.at("value").get<std::string>());
      }
    }
    column = "labels";
    if (!row.isNull(column)) {
      const Json labels = Json::parse(row.str(column));
      if (!labels.is_object()) return corrupt(row, column, "not a JSON object");
      for (const auto& [key, value] : labels.items()) {
        (*t->mutable_labels())[key] = value.get<std::string>();
      }
    }
  } catch (const Json::exception& e) {
    return corrupt(row, column, e.what());
  }

  t->set_port(static_cast<uint32_t>(row.u64("port")));
  if (!row.isNull("healthcheck")) {
    google::protobuf::util::JsonParseOptions options;
    options.ignore_unknown_fields = true;
    const auto status = google::protobuf::util::JsonStringToMessage(
        row.str("healthcheck"), t->mutable_healthcheck(), options);
    if (!status.ok()) return corrupt(row, "healthcheck", status.ToString());
  }
  if (!row.isNull("rolling_update")) {
    google::protobuf::util::JsonParseOptions options;
    options.ignore_unknown_fields = true;
    const auto status = google::protobuf::util::JsonStringToMessage(
        row.str("rolling_update"), t->mutable_rolling_update(), options);
    if (!status.ok()) return corrupt(row, "rolling_update", status.ToString());
  }
  t->set_cpu_millicores(static_cast<uint32_t>(row.u64("cpu_millicores")));
  t->set_memory_mib(static_cast<uint32_t>(row.u64("memory_mib")));
  t->set_replicas(static_cast<uint32_t>(row.u64("replicas")));
  if (!row.isNull("autoscale_min_replicas") || !row.isNull("autoscale_max_replicas") ||
      !row.isNull("autoscale_target_cpu_percent")) {
    auto* a = t->mutable_autoscaling();
    const auto get = [&](std::string_view c) -> uint32_t {
      return row.isNull(c) ? 0 : static_cast<uint32_t>(row.u64(c));
    };
    a->set_min_replicas(get("autoscale_min_replicas"));
    a->set_max_replicas(get("autoscale_max_replicas"));
    a->set_target_cpu_percent(get("autoscale_target_cpu_percent"));
  }
  t->set_shutdown_signal(row.str("shutdown_signal"));
  t->set_termination_grace_period_seconds(
      static_cast<uint32_t>(row.u64("termination_grace_period_seconds")));
  t->set_desired_status(row.str("desired_status") == "stopped"
                            ? cluster::v1::DESIRED_STATUS_STOPPED
                            : cluster::v1::DESIRED_STATUS_RUNNING);
  return r;
}

class DeploymentTopologyTable final : public SingleTypeTable {
 public:
  DeploymentTopologyTable()
      : SingleTypeTable(kDeploymentTopology, "deployment_topology", "deployment_id", kColumns,
                        /*unique_per_region=*/true) {}

  absl::Status validate(const Resource& r) const override { return validateTopology(r); }

 protected:
  absl::StatusOr<Resource> decode(const db::Row& row) const override { return fromRow(row); }

  absl::Status write(db::Connection& conn, const Resource& r, uint64_t version,
                     int64_t now_ms) const override {
    if (!r.has_deployment_topology()) return validateTopology(r);
    const DeploymentTopology& t = r.deployment_topology();
    db::Value command, args, env, labels;
    try {
      command = stringsJson(t.command());
      args = stringsJson(t.args());
      env = envJson(t);
      labels = labelsJson(t);
    } catch (const Json::exception& e) {
      return invalid(strCat("resource.deployment_topology: cannot encode as JSON: ", e.what()));
    }
    KRANE_ASSIGN_OR_RETURN(db::Value healthcheck, healthcheckJson(t));
    KRANE_ASSIGN_OR_RETURN(db::Value rolling_update, rollingUpdateJson(t));
    db::Value min_replicas, max_replicas, target_cpu;
    if (t.has_autoscaling()) {
      min_replicas = t.autoscaling().min_replicas();
      max_replicas = t.autoscaling().max_replicas();
      target_cpu = t.autoscaling().target_cpu_percent();
    }
    return conn
        .exec(
            "INSERT INTO deployment_topology (deployment_id, region_id, workspace_id, project_id,"
            " app_id, environment_id, image, command, args, env, port, healthcheck, cpu_millicores,"
            " memory_mib, replicas, autoscale_min_replicas, autoscale_max_replicas,"
            " autoscale_target_cpu_percent, shutdown_signal, termination_grace_period_seconds,"
            " desired_status, labels, rolling_update, version, created_at, updated_at, deleted_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?,"
            " NULL)"
            " ON DUPLICATE KEY UPDATE workspace_id = VALUES(workspace_id),"
            " project_id = VALUES(project_id), app_id = VALUES(app_id),"
            " environment_id = VALUES(environment_id), image = VALUES(image),"
            " command = VALUES(command), args = VALUES(args), env = VALUES(env),"
            " port = VALUES(port), healthcheck = VALUES(healthcheck),"
            " cpu_millicores = VALUES(cpu_millicores), memory_mib = VALUES(memory_mib),"
            " replicas = VALUES(replicas), autoscale_min_replicas = VALUES(autoscale_min_replicas),"
            " autoscale_max_replicas = VALUES(autoscale_max_replicas),"
            " autoscale_target_cpu_percent = VALUES(autoscale_target_cpu_percent),"
            " shutdown_signal = VALUES(shutdown_signal),"
            " termination_grace_period_seconds = VALUES(termination_grace_period_seconds),"
            " desired_status = VALUES(desired_status), labels = VALUES(labels),"
            " rolling_update = VALUES(rolling_update),"
            " version = VALUES(version), updated_at = VALUES(updated_at), deleted_at = NULL",
            {r.id(),
             r.region(),
             t.workspace_id(),
             t.project_id(),
             t.app_id(),
             t.environment_id(),
             t.image(),
             command,
             args,
             env,
             t.port(),
             healthcheck,
             t.cpu_millicores(),
             t.memory_mib(),
             t.replicas(),
             min_replicas,
             max_replicas,
             target_cpu,
             t.shutdown_signal(),
             t.termination_grace_period_seconds(),
             desiredStatusName(t.desired_status()),
             labels,
             rolling_update,
             version,
             now_ms,
             now_ms})
        .status();
  }
};

}  // namespace

std::unique_ptr<ResourceTable> makeDeploymentTopologyTable() {
  return std::make_unique<DeploymentTopologyTable>();
}

}  // namespace krane::feed
