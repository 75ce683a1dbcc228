#include "controlplane/services/sentinelrollout/slack.h"

#include <httplib.h>

#include <thread>

#include "common/strings.h"
#include "nlohmann/json.hpp"

namespace krane::services::sentinelrollout {
namespace {

struct ParsedUrl {
  std::string scheme_host_port;  // what httplib::Client takes
  std::string host;
  std::string path;
  bool https = false;
};

bool parse(std::string_view url, ParsedUrl* out) {
  std::string_view rest;
  if (url.substr(0, 8) == "https://") {
    out->https = true;
    rest = url.substr(8);
  } else if (url.substr(0, 7) == "http://") {
    rest = url.substr(7);
  } else {
    return false;
  }
  const size_t slash = rest.find('/');
  const std::string_view authority = rest.substr(0, slash);
  out->path = slash == std::string_view::npos ? "/" : std::string(rest.substr(slash));
  if (authority.empty() || authority.find('@') != std::string_view::npos) return false;
  if (authority.front() == '[') {
    const size_t close = authority.find(']');
    if (close == std::string_view::npos) return false;
    out->host = std::string(authority.substr(1, close - 1));
  } else {
    out->host = std::string(authority.substr(0, authority.find(':')));
  }
  if (out->host.empty()) return false;
  out->scheme_host_port = strCat(out->https ? "https://" : "http://", authority);
  return true;
}

bool loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

}  // namespace

absl::Status checkWebhookUrl(std::string_view field, std::string_view url) {
  ParsedUrl parsed;
  if (url.size() > 2048 || !parse(url, &parsed)) {
    return absl::InvalidArgumentError(strCat(field, ": not an http(s) URL"));
  }
  if (!parsed.https && !loopback(parsed.host)) {
    return absl::InvalidArgumentError(
        strCat(field, ": must be https:// (http:// only to a loopback address)"));
  }
  return absl::OkStatus();
}

absl::Status postSlack(const std::string& url, const std::string& text,
                       const SlackOptions& options) {
  ParsedUrl parsed;
  if (!parse(url, &parsed)) return absl::InvalidArgumentError("slack webhook: not a URL");
  const std::string body = nlohmann::json{{"text", text}}.dump();
  auto backoff = options.backoff;
  std::string last;
  for (int attempt = 1; attempt <= options.attempts; ++attempt) {
    httplib::Client client(parsed.scheme_host_port);
    client.set_connection_timeout(options.timeout);
    client.set_read_timeout(options.timeout);
    client.set_write_timeout(options.timeout);
    auto response = client.Post(parsed.path, body, "application/json");
    if (response && response->status >= 200 && response->status < 300) return absl::OkStatus();
    last = response ? strCat("HTTP ", response->status)
                    : strCat("no response (", httplib::to_string(response.error()), ")");
    // A 4xx other than 429 will not get better.
    if (response && response->status >= 400 && response->status < 500 && response->status != 429) {
      break;
    }
    if (attempt < options.attempts) {
      std::this_thread::sleep_for(backoff);
      backoff *= 2;
    }
  }
  return absl::UnavailableError(strCat("slack post to ", parsed.host, " failed: ", last));
}

}  // namespace krane::services::sentinelrollout
