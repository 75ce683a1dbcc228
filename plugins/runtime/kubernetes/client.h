// A small typed client for the Kubernetes REST API over libcurl.
//
// Objects are nlohmann::json values in their wire form. Writes use server-side apply (PATCH with
// content type application/apply-patch+yaml - JSON is valid YAML - fieldManager=krane,
// force=true), so Krane owns exactly the fields it sets and repeated applies are idempotent.
//
// Every request takes a token from the client-side rate limiter (qps / burst) and is retried with
// jittered exponential backoff on 429 (honouring Retry-After), 5xx and connection failures, up to
// `max_retries` times. Failures are absl::Status values described in errors.h.
//
// Thread-safe: one Client may serve many threads; idle connections are pooled and reused.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "common/backoff.h"
#include "plugins/runtime/kubernetes/config.h"
#include "plugins/runtime/kubernetes/rate_limiter.h"
#include "plugins/runtime/kubernetes/resources.h"

namespace krane::kube {

using Json = nlohmann::json;

struct ClientOptions {
  double qps = 50;  // <= 0: no client-side limit
  int burst = 100;
  int max_retries = 5;  // retries after the first attempt
  BackoffPolicy backoff{std::chrono::milliseconds(100), 2.0, std::chrono::seconds(5), 0.5};
  // A Retry-After longer than this is cut to it.
  std::chrono::seconds max_retry_after{30};
  std::chrono::milliseconds connect_timeout{5000};
  std::chrono::seconds request_timeout{60};  // not applied to watches
  // How often ClusterConfig::token_file is read again (the kubelet rotates projected tokens).
  std::chrono::milliseconds token_reread_interval{std::chrono::seconds(60)};
  std::string field_manager = "krane";
  std::string user_agent = "krane";
};

// One object: its apiVersion, kind, namespace (ignored for cluster-scoped kinds) and name.
struct ObjectRef {
  std::string api_version;
  std::string kind;
  std::string ns;
  std::string name;
};

struct ListRequest {
  std::string api_version;
  std::string kind;
  std::string ns;              // empty: every namespace
  std::string label_selector;  // "a=b,c!=d,e in (f,g),!h"
  int64_t limit = 0;           // page size; 0 for everything at once
  std::string continue_token;
  std::string field_selector;  // "status.phase!=Failed,metadata.name=x"
};

struct ListPage {
  std::vector<Json> items;
  std::string resource_version;  // of the list: watch from here
  std::string continue_token;    // empty on the last page
};

struct WatchRequest {
  std::string api_version;
  std::string kind;
  std::string ns;
  std::string label_selector;
  std::string resource_version;  // events after this version; empty: current state, then changes
  int timeout_seconds = 300;     // the server ends the watch after this long
  std::string field_selector;
};

// With a selector, an object that starts or stops matching arrives as ADDED or DELETED.
struct WatchEvent {
  std::string type;  // ADDED, MODIFIED, DELETED, BOOKMARK (object carries only a resourceVersion)
  Json object;
};

enum class Propagation { kBackground, kForeground, kOrphan };

struct ClientStats {
  uint64_t requests = 0;   // attempts sent, retries included
  uint64_t retries = 0;    // attempts after a retriable failure
  uint64_t throttled = 0;  // requests that waited for the rate limiter
};

class Client {
 public:
  // INVALID_ARGUMENT when the configuration cannot be used (no server, bad scheme).
  static absl::StatusOr<std::unique_ptr<Client>> create(ClusterConfig config,
                                                        ClientOptions options = {});
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Server-side apply of `object` (apiVersion, kind, metadata.name and, for namespaced kinds,
  // metadata.namespace required); returns the object as stored.
  absl::StatusOr<Json> apply(const Json& object);
  // Server-side apply of the status subresource (`object` carries apiVersion, kind, metadata and
  // status).
  absl::StatusOr<Json> applyStatus(const Json& object);
  // POST: creates `object`; ALREADY_EXISTS when it exists.
  absl::StatusOr<Json> create(const Json& object);
  // PUT: replaces `object`; when metadata.resourceVersion is set the write only succeeds if the
  // stored object still has that version (ABORTED otherwise).
  absl::StatusOr<Json> replace(const Json& object);
  absl::StatusOr<Json> get(const ObjectRef& ref);
  absl::StatusOr<Json> getStatus(const ObjectRef& ref);
  // JSON merge patch (RFC 7386) of the status subresource.
  absl::StatusOr<Json> patchStatus(const ObjectRef& ref, const Json& merge_patch);
  // NOT_FOUND when the object does not exist.
  absl::Status remove(const ObjectRef& ref, Propagation propagation = Propagation::kBackground);

  absl::StatusOr<ListPage> list(const ListRequest& request);
  // Every page of a list (following continue tokens). A token that expired mid-way (410) is
  // returned as the error (isGone()).
  absl::StatusOr<ListPage> listAll(ListRequest request);

  // Streams the changes after request.resource_version to `on_event` until the server ends the
  // watch (OK), `on_event` returns false (OK), `*cancel` becomes true (OK, within about a
  // second), or an error. A version too old for the server is an error with isGone() true: list
  // again and watch from the list's version. Not retried.
  absl::Status watch(const WatchRequest& request,
                     const std::function<bool(const WatchEvent&)>& on_event,
                     const std::atomic<bool>* cancel = nullptr);

  ClientStats stats() const;
  const ClusterConfig& config() const { return config_; }

 private:
  struct Response {
    long code = 0;
    std::string body;
  };
  class Handle;

  Client(ClusterConfig config, ClientOptions options);
  // One request with rate limiting and retries; the answer of the last attempt.
  absl::StatusOr<Response> send(const std::string& method, const std::string& path_and_query,
                                const std::string& content_type, const std::string& body);
  absl::StatusOr<Json> call(const std::string& method, const std::string& path_and_query,
                            const std::string& content_type, const std::string& body);
  std::string currentToken();
  std::unique_ptr<Handle> takeHandle();
  void returnHandle(std::unique_ptr<Handle> handle);

  ClusterConfig config_;
  ClientOptions options_;
  TokenBucket limiter_;
  std::mutex mutex_;  // guards the pool and the token
  std::vector<std::unique_ptr<Handle>> idle_;
  std::string token_;
  std::chrono::steady_clock::time_point token_read_{};
  std::atomic<uint64_t> requests_{0};
  std::atomic<uint64_t> retries_{0};
  std::atomic<uint64_t> throttled_{0};
};

}  // namespace krane::kube
