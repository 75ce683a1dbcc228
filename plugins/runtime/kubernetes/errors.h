// Errors from the Kubernetes API as absl::Status values.
//
// The message names the request and carries the API server's own Status message and reason
// ("PATCH /apis/apps/v1/namespaces/a/deployments/b: HTTP 422 Invalid: Deployment.apps \"b\" is
// invalid: ..."). The HTTP code and reason also travel as payloads, readable with httpCode() and
// reason(). HTTP codes map to absl codes:
//   400, 422 -> INVALID_ARGUMENT      401 -> UNAUTHENTICATED      403 -> PERMISSION_DENIED
//   404 -> NOT_FOUND                  409 AlreadyExists -> ALREADY_EXISTS, other 409 -> ABORTED
//   410 -> OUT_OF_RANGE (isGone(): the resourceVersion or continue token is too old; relist)
//   429 -> RESOURCE_EXHAUSTED         504 -> DEADLINE_EXCEEDED   500 -> INTERNAL
//   other 5xx and connection failures -> UNAVAILABLE
#pragma once

#include <optional>
#include <string>

#include "absl/status/status.h"

namespace krane::kube {

// The status for an HTTP answer `http_code` whose body is `body` (a Status object when the
// server sent one); `request` names the request ("GET /api/v1/...").
absl::Status apiError(long http_code, const std::string& body, const std::string& request);

// The status for an error Status object received inside a watch stream.
absl::Status watchError(const std::string& status_json, const std::string& request);

// True when the server answered 410 Gone / Expired: the caller must list again.
bool isGone(const absl::Status& status);

// The HTTP code and the Status reason ("NotFound", "Conflict", ...) of an API error, if any.
std::optional<int> httpCode(const absl::Status& status);
std::string reason(const absl::Status& status);

}  // namespace krane::kube
