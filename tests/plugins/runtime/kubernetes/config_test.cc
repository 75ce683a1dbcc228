#include "plugins/runtime/kubernetes/config.h"

#include <filesystem>
#include <fstream>

#include <catch2/catch.hpp>

#include "absl/strings/escaping.h"
#include "common/strings.h"
#include "tests/support/matchers.h"

namespace krane::kube {
namespace {

std::string b64(const std::string& s) {
  std::string out;
  absl::Base64Escape(s, &out);
  return out;
}

class TempDir {
 public:
  TempDir() {
    const std::string base = std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp";
    char tmpl[512];
    std::snprintf(tmpl, sizeof tmpl, "%s/kubecfg-XXXXXX", base.c_str());
    path_ = mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }
  std::string write(const std::string& name, const std::string& text) const {
    std::string p = path_ + "/" + name;
    std::ofstream(p) << text;
    return p;
  }

 private:
  std::string path_;
};

std::string kubeconfig(const std::string& user_block, const std::string& cluster_extra = "") {
  return strCat(R"(apiVersion: v1
kind: Config
current-context: prod
preferences: {}
contexts:
- name: dev
  context: {cluster: dev-cluster, user: dev-user}
- name: prod
  context:
    cluster: prod-cluster
    user: prod-user
    namespace: krane-system
clusters:
- name: dev-cluster
  cluster:
    server: https://dev.example:6443
    insecure-skip-tls-verify: true
- name: prod-cluster
  cluster:
    server: https://10.1.2.3:6443/
    certificate-authority-data: )",
                b64("CA PEM"), "\n", cluster_extra, R"(users:
- name: dev-user
  user:
    token: dev-token
- name: prod-user
  user:
)",
                user_block);
}

TEST_CASE("current context with token and inline ca", "[kubeconfig]") {
  auto config = kubeconfigFromYaml(kubeconfig("    token: prod-token\n"), "kubeconfig k", "");
  REQUIRE_THAT(config, IsOk());
  CHECK(config->server == "https://10.1.2.3:6443");
  CHECK(config->bearer_token == "prod-token");
  CHECK(config->ca_pem == "CA PEM");
  CHECK(config->default_namespace == "krane-system");
  CHECK_FALSE(config->insecure_skip_tls_verify);
  CHECK(config->client_cert_pem.empty());
}

TEST_CASE("an explicit context wins", "[kubeconfig]") {
  auto config =
      kubeconfigFromYaml(kubeconfig("    token: prod-token\n"), "kubeconfig k", "", "dev");
  REQUIRE_THAT(config, IsOk());
  CHECK(config->server == "https://dev.example:6443");
  CHECK(config->bearer_token == "dev-token");
  CHECK(config->insecure_skip_tls_verify);
  CHECK(config->default_namespace == "default");
}

TEST_CASE("client certificate inline and from files relative to the kubeconfig", "[kubeconfig]") {
  auto inline_cert =
      kubeconfigFromYaml(kubeconfig(strCat("    client-certificate-data: ", b64("CERT"), "\n",
                                           "    client-key-data: ", b64("KEY"), "\n")),
                         "kubeconfig k", "");
  REQUIRE_THAT(inline_cert, IsOk());
  CHECK(inline_cert->client_cert_pem == "CERT");
  CHECK(inline_cert->client_key_pem == "KEY");
  CHECK(inline_cert->bearer_token.empty());

  TempDir dir;
  dir.write("client.crt", "CERT FILE");
  dir.write("client.key", "KEY FILE");
  dir.write("ca.crt", "CA FILE");
  const std::string path = dir.write(
      "config", kubeconfig("    client-certificate: client.crt\n    client-key: client.key\n",
                           "    certificate-authority: ca.crt\n"));
  // The inline CA data comes first in the cluster entry; drop it to read the file.
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  const std::string ca_line = strCat("    certificate-authority-data: ", b64("CA PEM"), "\n");
  text.erase(text.find(ca_line), ca_line.size());
  dir.write("config", text);
  auto from_files = kubeconfigFromFile(path);
  REQUIRE_THAT(from_files, IsOk());
  CHECK(from_files->client_cert_pem == "CERT FILE");
  CHECK(from_files->client_key_pem == "KEY FILE");
  CHECK(from_files->ca_pem == "CA FILE");
  CHECK_THAT(from_files->source, Catch::Contains(path));
}

TEST_CASE("bad values are refused naming the field", "[kubeconfig]") {
  auto bad_base64 =
      kubeconfigFromYaml(kubeconfig(strCat("    client-certificate-data: ", b64("CERT"), "\n",
                                           "    client-key-data: '*** not base64 ***'\n")),
                         "kubeconfig /etc/k", "");
  CHECK(absl::IsInvalidArgument(bad_base64.status()));
  CHECK_THAT(std::string(bad_base64.status().message()),
             Catch::Contains("kubeconfig /etc/k: users[1].user.client-key-data: not valid base64"));

  auto missing_key = kubeconfigFromYaml(
      kubeconfig(strCat("    client-certificate-data: ", b64("CERT"), "\n")), "k", "");
  CHECK_THAT(std::string(missing_key.status().message()),
             Catch::Contains("users[1].user.client-key-data: missing"));

  auto missing_file = kubeconfigFromYaml(kubeconfig("    token: t\n    client-certificate: "
                                                    "/nonexistent/c.crt\n    client-key: k\n"),
                                         "k", "");
  CHECK_THAT(std::string(missing_file.status().message()),
             Catch::Contains("users[1].user.client-certificate: cannot read"));

  auto exec_only = kubeconfigFromYaml(kubeconfig("    exec:\n      command: aws\n"), "k", "");
  CHECK_THAT(std::string(exec_only.status().message()),
             Catch::Contains("users[1].user.exec: credential plugins are not supported"));

  auto no_context = kubeconfigFromYaml(kubeconfig("    token: t\n"), "k", "", "staging");
  CHECK_THAT(std::string(no_context.status().message()),
             Catch::Contains("contexts: no entry named \"staging\""));

  auto plain_http_is_fine_but_ftp_is_not = kubeconfigFromYaml(
      "current-context: c\ncontexts: [{name: c, context: {cluster: x}}]\n"
      "clusters: [{name: x, cluster: {server: 'ftp://x'}}]\n",
      "k", "");
  CHECK_THAT(std::string(plain_http_is_fine_but_ftp_is_not.status().message()),
             Catch::Contains("clusters[0].cluster.server: must be an https:// URL"));

  auto no_current = kubeconfigFromYaml("apiVersion: v1\nkind: Config\n", "k", "");
  CHECK_THAT(std::string(no_current.status().message()),
             Catch::Contains("k: current-context: not set"));

  auto not_yaml = kubeconfigFromYaml("clusters: [\n", "k", "");
  CHECK_THAT(std::string(not_yaml.status().message()), Catch::Contains("k: not valid YAML"));

  auto no_file = kubeconfigFromFile("/nonexistent/kubeconfig");
  CHECK(absl::IsNotFound(no_file.status()));
  CHECK_THAT(std::string(no_file.status().message()),
             Catch::Contains("kubeconfig /nonexistent/kubeconfig"));
}

TEST_CASE("service account token ca and namespace", "[in-cluster-config]") {
  TempDir dir;
  dir.write("token", "sa-token\n");
  dir.write("ca.crt", "CLUSTER CA");
  dir.write("namespace", "krane-system");
  auto config = inClusterConfig({dir.path(), "10.96.0.1", "443"});
  REQUIRE_THAT(config, IsOk());
  CHECK(config->server == "https://10.96.0.1:443");
  CHECK(config->bearer_token == "sa-token");
  INFO("re-read when the kubelet rotates it");
  CHECK(config->token_file == (dir.path() + "/token"));
  CHECK(config->ca_pem == "CLUSTER CA");
  CHECK(config->default_namespace == "krane-system");

  auto v6 = inClusterConfig({dir.path(), "fd00::1", "6443"});
  REQUIRE_THAT(v6, IsOk());
  CHECK(v6->server == "https://[fd00::1]:6443");
}

TEST_CASE("environment variables are read", "[in-cluster-config]") {
  TempDir dir;
  dir.write("token", "t");
  dir.write("ca.crt", "CA");
  setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1", 1);
  setenv("KUBERNETES_SERVICE_PORT", "8443", 1);
  InClusterSources sources;
  sources.service_account_dir = dir.path();
  auto config = inClusterConfig(sources);
  unsetenv("KUBERNETES_SERVICE_HOST");
  unsetenv("KUBERNETES_SERVICE_PORT");
  REQUIRE_THAT(config, IsOk());
  CHECK(config->server == "https://10.0.0.1:8443");
  CHECK(config->default_namespace == "default");
}

TEST_CASE("outside a pod the error says what is missing", "[in-cluster-config]") {
  unsetenv("KUBERNETES_SERVICE_HOST");
  auto no_env = inClusterConfig({"/nonexistent", "", ""});
  CHECK(absl::IsFailedPrecondition(no_env.status()));
  CHECK_THAT(std::string(no_env.status().message()), Catch::Contains("KUBERNETES_SERVICE_HOST"));

  TempDir dir;
  auto no_token = inClusterConfig({dir.path(), "10.0.0.1", "443"});
  CHECK(absl::IsFailedPrecondition(no_token.status()));
  CHECK_THAT(std::string(no_token.status().message()),
             Catch::Contains(strCat("service-account token ", dir.path(), "/token")));

  dir.write("token", "t");
  auto no_ca = inClusterConfig({dir.path(), "10.0.0.1", "443"});
  CHECK_THAT(std::string(no_ca.status().message()), Catch::Contains("ca.crt"));
}

}  // namespace
}  // namespace krane::kube
