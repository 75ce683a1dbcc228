#include "plugins/runtime/kubernetes/lease_client.h"

#include <cstdio>
#include <ctime>

#include "common/status.h"
#include "common/strings.h"
#include "plugins/runtime/kubernetes/errors.h"

namespace krane::kube {

std::string formatMicroTime(std::chrono::system_clock::time_point t) {
  const auto micros =
      std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
  const std::time_t seconds = static_cast<std::time_t>(micros / 1000000);
  std::tm tm{};
  gmtime_r(&seconds, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%06lldZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<long long>(micros % 1000000));
  return buf;
}

absl::StatusOr<std::chrono::system_clock::time_point> parseMicroTime(const std::string& text) {
  std::tm tm{};
  int consumed = 0;
  if (std::sscanf(text.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
                  &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &consumed) != 6) {
    return absl::InvalidArgumentError(strCat("not an RFC 3339 time: \"", text, "\""));
  }
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  int64_t micros = static_cast<int64_t>(timegm(&tm)) * 1000000;
  size_t pos = static_cast<size_t>(consumed);
  if (pos < text.size() && text[pos] == '.') {
    int64_t scale = 100000;
    for (++pos; pos < text.size() && std::isdigit(static_cast<unsigned char>(text[pos])); ++pos) {
      micros += (text[pos] - '0') * scale;
      scale /= 10;
    }
  }
  if (pos < text.size() && (text[pos] == '+' || text[pos] == '-')) {
    int hours = 0;
    int minutes = 0;
    if (std::sscanf(text.c_str() + pos + 1, "%2d:%2d", &hours, &minutes) != 2) {
      return absl::InvalidArgumentError(strCat("not an RFC 3339 time: \"", text, "\""));
    }
    const int64_t offset = (hours * 3600 + minutes * 60) * int64_t{1000000};
    micros += text[pos] == '+' ? -offset : offset;
  } else if (pos >= text.size() || (text[pos] != 'Z' && text[pos] != 'z')) {
    return absl::InvalidArgumentError(strCat("not an RFC 3339 time: \"", text, "\""));
  }
  return std::chrono::system_clock::time_point(std::chrono::microseconds(micros));
}

KubernetesLeaseClient::KubernetesLeaseClient(std::shared_ptr<Client> client, std::string ns,
                                             std::string name)
    : client_(std::move(client)), ns_(std::move(ns)), name_(std::move(name)) {}

absl::StatusOr<runtime::LeaseClient::Lease> KubernetesLeaseClient::get() {
  KRANE_ASSIGN_OR_RETURN(Json object,
                         client_->get({"coordination.k8s.io/v1", "Lease", ns_, name_}));
  Lease lease;
  const Json spec = object.value("spec", Json::object());
  // A Lease handed back may have no holderIdentity, or a null one.
  if (spec.contains("holderIdentity") && spec["holderIdentity"].is_string())
    lease.holder = spec["holderIdentity"].get<std::string>();
  lease.duration = std::chrono::seconds(spec.value("leaseDurationSeconds", 15));
  if (const std::string renewed = spec.value("renewTime", ""); !renewed.empty()) {
    auto t = parseMicroTime(renewed);
    if (!t.ok()) {
      return absl::InternalError(
          strCat("Lease ", ns_, "/", name_, ": spec.renewTime: ", t.status().message()));
    }
    lease.renewed = *t;
  }
  lease.resource_version = object["metadata"].value("resourceVersion", "");
  std::lock_guard lock(mutex_);
  last_ = std::move(object);
  return lease;
}

absl::Status KubernetesLeaseClient::write(const Lease& lease,
                                          const std::string& expected_resource_version) {
  Json previous;
  {
    std::lock_guard lock(mutex_);
    previous = last_;
  }
  const Json old_spec =
      previous.is_object() ? previous.value("spec", Json::object()) : Json::object();
  const bool same_holder = old_spec.value("holderIdentity", "") == lease.holder;
  const int64_t transitions = old_spec.value("leaseTransitions", int64_t{0});
  Json object = {
      {"apiVersion", "coordination.k8s.io/v1"},
      {"kind", "Lease"},
      {"metadata", {{"name", name_}, {"namespace", ns_}}},
      {"spec",
       {{"holderIdentity", lease.holder},
        {"leaseDurationSeconds", lease.duration.count()},
        {"renewTime", formatMicroTime(lease.renewed)},
        {"acquireTime", same_holder && old_spec.contains("acquireTime")
                            ? old_spec["acquireTime"]
                            : Json(formatMicroTime(lease.renewed))},
        // A holder handing the lease back (no holder) is no transition; the next
        // one to take it is.
        {"leaseTransitions", expected_resource_version.empty()
                                 ? 0
                                 : transitions + (same_holder || lease.holder.empty() ? 0 : 1)}}}};
  absl::StatusOr<Json> written;
  if (expected_resource_version.empty()) {
    written = client_->create(object);
    if (absl::IsAlreadyExists(written.status())) {
      return absl::AbortedError(
          strCat("Lease ", ns_, "/", name_, " was created by another agent meanwhile"));
    }
  } else {
    object["metadata"]["resourceVersion"] = expected_resource_version;
    written = client_->replace(object);
  }
  if (!written.ok()) return written.status();
  std::lock_guard lock(mutex_);
  last_ = std::move(*written);
  return absl::OkStatus();
}

}  // namespace krane::kube
