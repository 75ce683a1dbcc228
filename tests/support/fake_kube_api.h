// FakeKubeApi stands in for a real Kubernetes API server, which cannot run on these machines.
//
// It is an HTTP server (cpp-httplib on 127.0.0.1, port 0) speaking enough of the Kubernetes REST
// protocol for krane's client and runtime plugins, with in-memory storage. It serves plain
// http:// by default (krane's client accepts http:// for this); with Options::tls it serves
// HTTPS with a certificate from a CA it generates at start-up (ca_pem()), and with
// Options::require_client_cert it also demands a client certificate signed by that CA
// (clientCertPem() / clientKeyPem()), as an API server configured for x509 client auth does.
// - the kinds of plugins/runtime/kubernetes/resources.h, at their real paths (core and group
//   APIs, namespaced and cluster scoped); namespaced objects need their Namespace to exist
//   ("default" and "kube-system" exist from the start), as on a real server;
// - server-side apply (PATCH application/apply-patch+yaml with a JSON body, fieldManager
//   required): creates, or merges into the stored object (objects merge recursively, lists are
//   replaced, fields this manager applied before and now omits are removed, null removes);
//   create (POST), replace (PUT, with metadata.resourceVersion as a precondition), JSON merge
//   patch, get, delete (immediate, with ownerReference propagation unless Orphan; deleting a
//   Namespace deletes its objects); the status subresource (GET, PATCH, PUT); `status` sent to
//   the main resource is ignored, as for kinds with a status subresource;
// - server-managed metadata: uid, creationTimestamp, resourceVersion from one global counter
//   (an unchanged apply does not bump it), generation bumped when anything but metadata and
//   status changes;
// - list with label selectors (=, ==, !=, in, notin, exists, !exists), field selectors (=, !=
//   on metadata.name and metadata.namespace, and for pods the fields the real server allows,
//   status.phase among them; others are refused with 400 as upstream) and pagination (limit /
//   continue; pages follow the live data, not a snapshot; a continue token older than the
//   retained history is answered 410 Expired);
// - watch (?watch=true) streaming one JSON {type, object} per line from a resourceVersion, or
//   the current objects as ADDED first when none is given; an object that starts or stops
//   matching the watch's selectors arrives as ADDED or DELETED, as from the real watch cache;
//   bookmarks when asked for (every idle second); a version older than the retained history
//   window gets an ERROR event carrying a 410 Expired Status, as the real server does;
// - errors as real Status objects: 400, 401, 404, 409 (AlreadyExists / Conflict), 410, 422
//   (names, labels, Deployment selector vs template labels, container names and images,
//   Service ports), 429 and 500 on demand.
// Test hooks: pods of a Deployment made ready, crash-looping or failing to pull their image (a
// ReplicaSet and Pods owned through ownerReferences, Deployment status updated, watch events
// sent), injected failures, a required bearer token, a request log. Thread-safe.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "plugins/runtime/kubernetes/config.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace krane::testing {

class FakeKubeApi {
 public:
  using Json = nlohmann::json;

  struct Options {
    // Watch events kept for watches from an older resourceVersion; older ones get 410.
    size_t history = 10000;
    bool tls = false;
    bool require_client_cert = false;  // implies tls
  };

  struct Request {
    std::string method;
    std::string path;
    std::string query;  // raw, without '?'
    std::string content_type;
    std::string body;
    int status = 0;
  };

  FakeKubeApi();
  explicit FakeKubeApi(Options options);
  ~FakeKubeApi();
  FakeKubeApi(const FakeKubeApi&) = delete;
  FakeKubeApi& operator=(const FakeKubeApi&) = delete;

  int port() const { return port_; }
  std::string url() const;
  // A configuration pointing krane's client at this server: the required token, if any, and with
  // TLS the CA and (when required) the client certificate.
  kube::ClusterConfig clusterConfig() const;
  // The same as a kubeconfig file's text (context "fake", the required token if any), for
  // processes and plugins that read one. Plain HTTP only: with TLS, write the CA in yourself.
  std::string kubeconfigYaml() const;
  // PEM of the generated CA and client credentials (empty without TLS).
  const std::string& caPem() const { return ca_pem_; }
  const std::string& clientCertPem() const { return client_cert_pem_; }
  const std::string& clientKeyPem() const { return client_key_pem_; }

  // --- state, bypassing HTTP (watchers still see the changes) ---
  std::optional<Json> object(const std::string& api_version, const std::string& kind,
                             const std::string& ns, const std::string& name) const;
  // Objects of a kind, in one namespace or all (ns empty), sorted by namespace and name.
  std::vector<Json> objects(const std::string& api_version, const std::string& kind,
                            const std::string& ns = "") const;
  // Stores `object` as given (creating its namespace is up to the caller); returns it stored.
  Json put(const Json& object);
  uint64_t resourceVersion() const;

  // --- test hooks ---
  // Requests without "Authorization: Bearer <token>" get 401 (empty: no check).
  void requireToken(std::string token);
  // The next `count` requests (of `method` only, when given) get `http_code` with a Status body,
  // and a Retry-After header when retry_after_seconds >= 0.
  void failNext(int count, int http_code, int retry_after_seconds = -1, std::string method = "");
  // Forgets the watch history: watches and continue tokens from any older version get 410.
  void compactHistory();
  // The Deployment's pods (spec.replicas of them) run and are ready; its status says so.
  absl::Status makePodsReady(const std::string& ns, const std::string& deployment);
  // The Deployment's pods crash-loop: waiting CrashLoopBackOff, `restarts`, last exit code.
  absl::Status makePodsCrashLoop(const std::string& ns, const std::string& deployment,
                                 int restarts = 5, int exit_code = 1);
  // The Deployment's pods cannot pull their image: pending, waiting `reason` (ImagePullBackOff
  // or ErrImagePull).
  absl::Status makePodsFailImagePull(const std::string& ns, const std::string& deployment,
                                     const std::string& reason = "ImagePullBackOff");

  // --- request log ---
  std::vector<Request> requests() const;
  // Requests whose method matches (any when empty) and whose path contains `path_part`.
  size_t countRequests(const std::string& method, const std::string& path_part = "") const;
  void clearRequests();

 private:
  struct Event {
    uint64_t rv;
    std::string type;
    std::string type_key;  // group/plural
    std::string ns;
    Json object;
    Json previous;  // the object before a MODIFIED, for watches whose selector it left
  };
  struct Injected {
    int count = 0;
    int code = 0;
    int retry_after = -1;
    std::string method;
  };
  struct Route;

  void serve(const httplib::Request& req, httplib::Response& res);
  void handle(const httplib::Request& req, httplib::Response& res, const Route& route);
  void watch(const httplib::Request& req, httplib::Response& res, const Route& route);

  // Callers hold mutex_.
  Json store(const std::string& key, Json object, const std::string& type_key,
             const std::string& ns, bool created);
  void erase(const std::string& key, const std::string& type_key, bool orphan);
  void record(const Event& event);
  absl::Status podsHook(const std::string& ns, const std::string& deployment,
                        const std::string& mode, int restarts, int exit_code,
                        const std::string& reason);

  Options options_;
  std::string ca_pem_;
  std::string client_cert_pem_;
  std::string client_key_pem_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  bool stopping_ = false;
  uint64_t rv_ = 1;
  uint64_t compacted_rv_ = 0;  // watches from a version below this get 410
  uint64_t uid_counter_ = 0;
  uint64_t ip_counter_ = 0;
  std::map<std::string, Json> objects_;  // "<group>/<plural>/<ns>/<name>"
  std::map<std::string, Json> applied_;  // key + "|" + manager -> last applied
  std::deque<Event> history_;
  std::string token_;
  Injected injected_;
  std::vector<Request> log_;
};

}  // namespace krane::testing
