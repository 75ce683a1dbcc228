#include "plugins/runtime/kubernetes/config.h"

#include <cstdlib>
#include <filesystem>

#include <yaml-cpp/yaml.h>

#include "absl/strings/escaping.h"
#include "common/files.h"
#include "common/status.h"
#include "common/strings.h"

namespace krane::kube {
namespace {

std::string trimmed(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

std::string bracketedHost(const std::string& host) {
  // An IPv6 address needs brackets in a URL.
  return host.find(':') != std::string::npos ? strCat("[", host, "]") : host;
}

class KubeconfigReader {
 public:
  KubeconfigReader(std::string source, std::string base_dir)
      : source_(std::move(source)), base_dir_(std::move(base_dir)) {}

  absl::Status bad(const std::string& path, const std::string& what) const {
    return absl::InvalidArgumentError(strCat(source_, ": ", path, ": ", what));
  }

  // The entry named `name` in the list `list_key` ("clusters"), with its index for messages.
  absl::StatusOr<std::pair<YAML::Node, std::string>> entry(const YAML::Node& root,
                                                           const std::string& list_key,
                                                           const std::string& inner_key,
                                                           const std::string& name) const {
    const YAML::Node list = root[list_key];
    if (list && !list.IsSequence()) return bad(list_key, "must be a list");
    if (list) {
      for (size_t i = 0; i < list.size(); ++i) {
        const YAML::Node item = list[i];
        if (!item.IsMap() || !item["name"] || !item["name"].IsScalar()) continue;
        if (item["name"].as<std::string>() != name) continue;
        const std::string path = strCat(list_key, "[", i, "].", inner_key);
        const YAML::Node inner = item[inner_key];
        if (!inner || !inner.IsMap()) return bad(path, "must be a mapping");
        return std::make_pair(inner, path);
      }
    }
    return bad(list_key, strCat("no entry named \"", name, "\""));
  }

  absl::StatusOr<std::string> text(const YAML::Node& node, const std::string& key,
                                   const std::string& path) const {
    const YAML::Node value = node[key];
    if (!value || value.IsNull()) return std::string();
    if (!value.IsScalar()) return bad(strCat(path, ".", key), "must be a string");
    return value.as<std::string>();
  }

  // `<key>-data` (base64) or `<key>` (a file path); empty when neither is set.
  absl::StatusOr<std::string> dataOrFile(const YAML::Node& node, const std::string& key,
                                         const std::string& path) const {
    KRANE_ASSIGN_OR_RETURN(std::string data, text(node, key + "-data", path));
    if (!data.empty()) {
      std::string decoded;
      if (!absl::Base64Unescape(data, &decoded) || decoded.empty()) {
        return bad(strCat(path, ".", key, "-data"), "not valid base64");
      }
      return decoded;
    }
    KRANE_ASSIGN_OR_RETURN(std::string file, text(node, key, path));
    if (file.empty()) return std::string();
    std::filesystem::path p(file);
    if (p.is_relative() && !base_dir_.empty()) p = std::filesystem::path(base_dir_) / p;
    auto contents = readFile(p.string(), key);
    if (!contents.ok()) {
      return bad(strCat(path, ".", key), std::string(contents.status().message()));
    }
    return *contents;
  }

  const std::string& source() const { return source_; }

 private:
  std::string source_;
  std::string base_dir_;
};

}  // namespace

absl::StatusOr<ClusterConfig> inClusterConfig(const InClusterSources& sources) {
  auto env = [](const char* name) {
    const char* v = std::getenv(name);
    return v ? std::string(v) : std::string();
  };
  const std::string host = sources.host.empty() ? env("KUBERNETES_SERVICE_HOST") : sources.host;
  const std::string port = sources.port.empty() ? env("KUBERNETES_SERVICE_PORT") : sources.port;
  if (host.empty() || port.empty()) {
    return absl::FailedPreconditionError(
        "in-cluster config: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must be set "
        "(not running in a pod?)");
  }
  ClusterConfig config;
  config.source = "in-cluster";
  config.server = strCat("https://", bracketedHost(host), ":", port);
  const std::string dir = sources.service_account_dir;
  config.token_file = dir + "/token";
  auto token = readFile(config.token_file, "service-account token");
  if (!token.ok()) {
    return absl::FailedPreconditionError(strCat("in-cluster config: ", token.status().message()));
  }
  config.bearer_token = trimmed(*token);
  if (config.bearer_token.empty()) {
    return absl::FailedPreconditionError(
        strCat("in-cluster config: service-account token ", config.token_file, " is empty"));
  }
  auto ca = readFile(dir + "/ca.crt", "service-account CA");
  if (!ca.ok()) {
    return absl::FailedPreconditionError(strCat("in-cluster config: ", ca.status().message()));
  }
  config.ca_pem = *ca;
  if (auto ns = readFile(dir + "/namespace", "namespace"); ns.ok() && !trimmed(*ns).empty()) {
    config.default_namespace = trimmed(*ns);
  }
  return config;
}

absl::StatusOr<ClusterConfig> kubeconfigFromYaml(const std::string& yaml, const std::string& source,
                                                 const std::string& base_dir,
                                                 const std::string& context) {
  KubeconfigReader r(source, base_dir);
  YAML::Node root;
  try {
    root = YAML::Load(yaml);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        strCat(source, ": not valid YAML: line ", e.mark.line + 1, ": ", e.msg));
  }
  if (!root.IsMap()) return r.bad("(top level)", "must be a mapping");

  std::string context_name = context;
  if (context_name.empty()) {
    KRANE_ASSIGN_OR_RETURN(context_name, r.text(root, "current-context", ""));
    if (context_name.empty()) return r.bad("current-context", "not set (and no context was given)");
  }
  KRANE_ASSIGN_OR_RETURN(auto ctx, r.entry(root, "contexts", "context", context_name));
  const auto& [ctx_node, ctx_path] = ctx;
  KRANE_ASSIGN_OR_RETURN(std::string cluster_name, r.text(ctx_node, "cluster", ctx_path));
  if (cluster_name.empty()) return r.bad(ctx_path + ".cluster", "missing");
  KRANE_ASSIGN_OR_RETURN(std::string user_name, r.text(ctx_node, "user", ctx_path));

  ClusterConfig config;
  config.source = source;
  KRANE_ASSIGN_OR_RETURN(std::string ns, r.text(ctx_node, "namespace", ctx_path));
  if (!ns.empty()) config.default_namespace = ns;

  KRANE_ASSIGN_OR_RETURN(auto cl, r.entry(root, "clusters", "cluster", cluster_name));
  const auto& [cl_node, cl_path] = cl;
  KRANE_ASSIGN_OR_RETURN(config.server, r.text(cl_node, "server", cl_path));
  if (config.server.empty()) return r.bad(cl_path + ".server", "missing");
  if (config.server.rfind("https://", 0) != 0 && config.server.rfind("http://", 0) != 0) {
    return r.bad(cl_path + ".server",
                 strCat("must be an https:// URL, got \"", config.server, "\""));
  }
  while (!config.server.empty() && config.server.back() == '/') config.server.pop_back();
  KRANE_ASSIGN_OR_RETURN(config.ca_pem, r.dataOrFile(cl_node, "certificate-authority", cl_path));
  if (const YAML::Node skip = cl_node["insecure-skip-tls-verify"]; skip) {
    if (!skip.IsScalar() || !YAML::convert<bool>::decode(skip, config.insecure_skip_tls_verify)) {
      return r.bad(cl_path + ".insecure-skip-tls-verify", "must be true or false");
    }
  }

  if (!user_name.empty()) {
    KRANE_ASSIGN_OR_RETURN(auto us, r.entry(root, "users", "user", user_name));
    const auto& [user_node, user_path] = us;
    KRANE_ASSIGN_OR_RETURN(config.bearer_token, r.text(user_node, "token", user_path));
    KRANE_ASSIGN_OR_RETURN(std::string token_file, r.text(user_node, "tokenFile", user_path));
    if (config.bearer_token.empty() && !token_file.empty()) {
      std::filesystem::path p(token_file);
      if (p.is_relative() && !base_dir.empty()) p = std::filesystem::path(base_dir) / p;
      auto token = readFile(p.string(), "token file");
      if (!token.ok()) {
        return r.bad(user_path + ".tokenFile", std::string(token.status().message()));
      }
      config.token_file = p.string();
      config.bearer_token = trimmed(*token);
    }
    KRANE_ASSIGN_OR_RETURN(config.client_cert_pem,
                           r.dataOrFile(user_node, "client-certificate", user_path));
    KRANE_ASSIGN_OR_RETURN(config.client_key_pem, r.dataOrFile(user_node, "client-key", user_path));
    if (config.client_cert_pem.empty() != config.client_key_pem.empty()) {
      return r.bad(user_path + (config.client_cert_pem.empty() ? ".client-certificate-data"
                                                               : ".client-key-data"),
                   "missing (a client certificate needs both the certificate and its key)");
    }
    if (user_node["exec"] || user_node["auth-provider"]) {
      if (config.bearer_token.empty() && config.client_cert_pem.empty()) {
        return r.bad(user_path + (user_node["exec"] ? ".exec" : ".auth-provider"),
                     "credential plugins are not supported; use a token or a client certificate");
      }
    }
    if (const YAML::Node username = user_node["username"];
        username && config.bearer_token.empty() && config.client_cert_pem.empty()) {
      return r.bad(user_path + ".username", "basic authentication is not supported");
    }
  }
  return config;
}

absl::StatusOr<ClusterConfig> kubeconfigFromFile(const std::string& path,
                                                 const std::string& context) {
  auto yaml = readFile(path, "kubeconfig");
  if (!yaml.ok()) return yaml.status();
  return kubeconfigFromYaml(*yaml, strCat("kubeconfig ", path),
                            std::filesystem::path(path).parent_path().string(), context);
}

}  // namespace krane::kube
