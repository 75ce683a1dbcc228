// The shutdown signals a deployment topology may name, for both runtimes.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace krane::deployment {

// "SIGTERM", "TERM" or "" (SIGTERM) -> the signal number. INVALID_ARGUMENT naming
// `shutdown_signal` and the accepted names for any other.
absl::StatusOr<int> signalNumber(const std::string& name);

// The bare name of a signal signalNumber accepts ("INT" for "SIGINT", "TERM" for "").
absl::StatusOr<std::string> signalName(const std::string& name);

}  // namespace krane::deployment
