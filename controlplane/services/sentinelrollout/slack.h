// Slack incoming-webhook posts for fleet rollouts. The webhook URL is a secret: it is checked
// here, kept in the rollout's state, and never logged or returned by the API.
#pragma once

#include <chrono>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace krane::services::sentinelrollout {

// An https:// URL, or http:// to a loopback address (127.0.0.1, ::1, localhost) for tests.
// INVALID_ARGUMENT naming `field` otherwise.
absl::Status checkWebhookUrl(std::string_view field, std::string_view url);

struct SlackOptions {
  int attempts = 3;
  std::chrono::milliseconds backoff{300};  // doubled after each failed attempt
  std::chrono::milliseconds timeout{5000};
};

// Posts {"text": text} to the webhook, retrying a failed attempt. The error (for a log line)
// never contains the URL.
absl::Status postSlack(const std::string& url, const std::string& text,
                       const SlackOptions& options = {});

}  // namespace krane::services::sentinelrollout
