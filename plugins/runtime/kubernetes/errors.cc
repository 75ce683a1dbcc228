#include "plugins/runtime/kubernetes/errors.h"

#include <nlohmann/json.hpp>

#include "absl/strings/cord.h"
#include "common/strings.h"

namespace krane::kube {
namespace {

constexpr char kHttpCodeUrl[] = "krane.dev/kubernetes/http-code";
constexpr char kReasonUrl[] = "krane.dev/kubernetes/reason";

absl::StatusCode codeFor(long http, const std::string& reason) {
  switch (http) {
    case 400:
    case 422:
      return absl::StatusCode::kInvalidArgument;
    case 401:
      return absl::StatusCode::kUnauthenticated;
    case 403:
      return absl::StatusCode::kPermissionDenied;
    case 404:
      return absl::StatusCode::kNotFound;
    case 409:
      return reason == "AlreadyExists" ? absl::StatusCode::kAlreadyExists
                                       : absl::StatusCode::kAborted;
    case 410:
      return absl::StatusCode::kOutOfRange;
    case 429:
      return absl::StatusCode::kResourceExhausted;
    case 500:
      return absl::StatusCode::kInternal;
    case 504:
      return absl::StatusCode::kDeadlineExceeded;
    default:
      if (http >= 500) return absl::StatusCode::kUnavailable;
      if (http >= 400) return absl::StatusCode::kFailedPrecondition;
      return absl::StatusCode::kUnknown;
  }
}

absl::Status fromStatusObject(long http, const nlohmann::json& status, const std::string& body,
                              const std::string& request) {
  std::string reason;
  std::string message;
  if (status.is_object()) {
    if (auto it = status.find("reason"); it != status.end() && it->is_string()) reason = *it;
    if (auto it = status.find("message"); it != status.end() && it->is_string()) message = *it;
    if (auto it = status.find("code"); http == 0 && it != status.end() && it->is_number_integer()) {
      http = it->get<long>();
    }
  } else {
    message = body.substr(0, 512);
  }
  std::string text = strCat(request, ": HTTP ", static_cast<int64_t>(http));
  if (!reason.empty()) strAppend(&text, " ", reason);
  if (!message.empty()) strAppend(&text, ": ", message);
  absl::Status out(codeFor(http, reason), text);
  out.SetPayload(kHttpCodeUrl, absl::Cord(std::to_string(http)));
  if (!reason.empty()) out.SetPayload(kReasonUrl, absl::Cord(reason));
  return out;
}

}  // namespace

absl::Status apiError(long http_code, const std::string& body, const std::string& request) {
  auto parsed = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!parsed.is_object() || parsed.value("kind", "") != "Status") parsed = nullptr;
  return fromStatusObject(http_code, parsed, body, request);
}

absl::Status watchError(const std::string& status_json, const std::string& request) {
  auto parsed = nlohmann::json::parse(status_json, nullptr, false);
  return fromStatusObject(0, parsed.is_object() ? parsed : nlohmann::json(), status_json, request);
}

bool isGone(const absl::Status& status) { return httpCode(status) == 410; }

std::optional<int> httpCode(const absl::Status& status) {
  auto payload = status.GetPayload(kHttpCodeUrl);
  if (!payload) return std::nullopt;
  return std::stoi(std::string(*payload));
}

std::string reason(const absl::Status& status) {
  auto payload = status.GetPayload(kReasonUrl);
  return payload ? std::string(*payload) : std::string();
}

}  // namespace krane::kube
