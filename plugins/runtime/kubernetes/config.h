// How to reach a Kubernetes API server: from inside a pod (service account) or from a kubeconfig.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace krane::kube {

struct ClusterConfig {
  // "https://host:port". The client also accepts "http://" (tests talk to the fake API server in
  // tests/support over plain HTTP; a real API server always uses HTTPS).
  std::string server;
  std::string bearer_token;
  // When set, the token is read again from this file every minute (ClientOptions): the kubelet
  // rotates service-account tokens.
  std::string token_file;
  std::string ca_pem;  // PEM bundle trusted for the server's certificate; empty: system CAs
  std::string client_cert_pem;
  std::string client_key_pem;
  bool insecure_skip_tls_verify = false;
  std::string default_namespace = "default";
  std::string source;  // where this came from, for messages: "in-cluster", "kubeconfig <path>"
};

// The files and variables of the in-cluster configuration; overridable for tests.
struct InClusterSources {
  std::string service_account_dir = "/var/run/secrets/kubernetes.io/serviceaccount";
  // Read with getenv when empty.
  std::string host;
  std::string port;
};

// In-cluster configuration: KUBERNETES_SERVICE_HOST / KUBERNETES_SERVICE_PORT, the token and CA in
// the service-account directory, the pod's namespace. FAILED_PRECONDITION naming what is missing.
absl::StatusOr<ClusterConfig> inClusterConfig(const InClusterSources& sources = {});

// The kubeconfig at `path`, using `context` (the file's current-context when empty). Relative
// file paths in it resolve against the file's folder. INVALID_ARGUMENT naming the file and the
// field ("kubeconfig /k: users[0].user.client-key-data: not valid base64").
absl::StatusOr<ClusterConfig> kubeconfigFromFile(const std::string& path,
                                                 const std::string& context = "");

// The same from YAML text; `source` names it in errors and `base_dir` resolves relative paths.
absl::StatusOr<ClusterConfig> kubeconfigFromYaml(const std::string& yaml, const std::string& source,
                                                 const std::string& base_dir,
                                                 const std::string& context = "");

}  // namespace krane::kube
