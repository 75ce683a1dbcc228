#include "plugins/runtime/kubernetes/config.h"

#include <filesystem>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/escaping.h"
#include "common/strings.h"

namespace krane::kube {
namespace {

using ::testing::HasSubstr;

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

TEST(Kubeconfig, CurrentContextWithTokenAndInlineCa) {
  auto config = kubeconfigFromYaml(kubeconfig("    token: prod-token\n"), "kubeconfig k", "");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server, "https://10.1.2.3:6443");
  EXPECT_EQ(config->bearer_token, "prod-token");
  EXPECT_EQ(config->ca_pem, "CA PEM");
  EXPECT_EQ(config->default_namespace, "krane-system");
  EXPECT_FALSE(config->insecure_skip_tls_verify);
  EXPECT_TRUE(config->client_cert_pem.empty());
}

TEST(Kubeconfig, AnExplicitContextWins) {
  auto config =
      kubeconfigFromYaml(kubeconfig("    token: prod-token\n"), "kubeconfig k", "", "dev");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server, "https://dev.example:6443");
  EXPECT_EQ(config->bearer_token, "dev-token");
  EXPECT_TRUE(config->insecure_skip_tls_verify);
  EXPECT_EQ(config->default_namespace, "default");
}

TEST(Kubeconfig, ClientCertificateInlineAndFromFilesRelativeToTheKubeconfig) {
  auto inline_cert =
      kubeconfigFromYaml(kubeconfig(strCat("    client-certificate-data: ", b64("CERT"), "\n",
                                           "    client-key-data: ", b64("KEY"), "\n")),
                         "kubeconfig k", "");
  ASSERT_TRUE(inline_cert.ok()) << inline_cert.status();
  EXPECT_EQ(inline_cert->client_cert_pem, "CERT");
  EXPECT_EQ(inline_cert->client_key_pem, "KEY");
  EXPECT_TRUE(inline_cert->bearer_token.empty());

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
  ASSERT_TRUE(from_files.ok()) << from_files.status();
  EXPECT_EQ(from_files->client_cert_pem, "CERT FILE");
  EXPECT_EQ(from_files->client_key_pem, "KEY FILE");
  EXPECT_EQ(from_files->ca_pem, "CA FILE");
  EXPECT_THAT(from_files->source, HasSubstr(path));
}

TEST(Kubeconfig, BadValuesAreRefusedNamingTheField) {
  auto bad_base64 =
      kubeconfigFromYaml(kubeconfig(strCat("    client-certificate-data: ", b64("CERT"), "\n",
                                           "    client-key-data: '*** not base64 ***'\n")),
                         "kubeconfig /etc/k", "");
  EXPECT_TRUE(absl::IsInvalidArgument(bad_base64.status()));
  EXPECT_THAT(std::string(bad_base64.status().message()),
              HasSubstr("kubeconfig /etc/k: users[1].user.client-key-data: not valid base64"));

  auto missing_key = kubeconfigFromYaml(
      kubeconfig(strCat("    client-certificate-data: ", b64("CERT"), "\n")), "k", "");
  EXPECT_THAT(std::string(missing_key.status().message()),
              HasSubstr("users[1].user.client-key-data: missing"));

  auto missing_file = kubeconfigFromYaml(kubeconfig("    token: t\n    client-certificate: "
                                                    "/nonexistent/c.crt\n    client-key: k\n"),
                                         "k", "");
  EXPECT_THAT(std::string(missing_file.status().message()),
              HasSubstr("users[1].user.client-certificate: cannot read"));

  auto exec_only = kubeconfigFromYaml(kubeconfig("    exec:\n      command: aws\n"), "k", "");
  EXPECT_THAT(std::string(exec_only.status().message()),
              HasSubstr("users[1].user.exec: credential plugins are not supported"));

  auto no_context = kubeconfigFromYaml(kubeconfig("    token: t\n"), "k", "", "staging");
  EXPECT_THAT(std::string(no_context.status().message()),
              HasSubstr("contexts: no entry named \"staging\""));

  auto plain_http_is_fine_but_ftp_is_not = kubeconfigFromYaml(
      "current-context: c\ncontexts: [{name: c, context: {cluster: x}}]\n"
      "clusters: [{name: x, cluster: {server: 'ftp://x'}}]\n",
      "k", "");
  EXPECT_THAT(std::string(plain_http_is_fine_but_ftp_is_not.status().message()),
              HasSubstr("clusters[0].cluster.server: must be an https:// URL"));

  auto no_current = kubeconfigFromYaml("apiVersion: v1\nkind: Config\n", "k", "");
  EXPECT_THAT(std::string(no_current.status().message()), HasSubstr("k: current-context: not set"));

  auto not_yaml = kubeconfigFromYaml("clusters: [\n", "k", "");
  EXPECT_THAT(std::string(not_yaml.status().message()), HasSubstr("k: not valid YAML"));

  auto no_file = kubeconfigFromFile("/nonexistent/kubeconfig");
  EXPECT_TRUE(absl::IsNotFound(no_file.status()));
  EXPECT_THAT(std::string(no_file.status().message()),
              HasSubstr("kubeconfig /nonexistent/kubeconfig"));
}

TEST(InClusterConfig, ServiceAccountTokenCaAndNamespace) {
  TempDir dir;
  dir.write("token", "sa-token\n");
  dir.write("ca.crt", "CLUSTER CA");
  dir.write("namespace", "krane-system");
  auto config = inClusterConfig({dir.path(), "10.96.0.1", "443"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server, "https://10.96.0.1:443");
  EXPECT_EQ(config->bearer_token, "sa-token");
  EXPECT_EQ(config->token_file, dir.path() + "/token") << "re-read when the kubelet rotates it";
  EXPECT_EQ(config->ca_pem, "CLUSTER CA");
  EXPECT_EQ(config->default_namespace, "krane-system");

  auto v6 = inClusterConfig({dir.path(), "fd00::1", "6443"});
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ(v6->server, "https://[fd00::1]:6443");
}

TEST(InClusterConfig, EnvironmentVariablesAreRead) {
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
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server, "https://10.0.0.1:8443");
  EXPECT_EQ(config->default_namespace, "default");
}

TEST(InClusterConfig, OutsideAPodTheErrorSaysWhatIsMissing) {
  unsetenv("KUBERNETES_SERVICE_HOST");
  auto no_env = inClusterConfig({"/nonexistent", "", ""});
  EXPECT_TRUE(absl::IsFailedPrecondition(no_env.status()));
  EXPECT_THAT(std::string(no_env.status().message()), HasSubstr("KUBERNETES_SERVICE_HOST"));

  TempDir dir;
  auto no_token = inClusterConfig({dir.path(), "10.0.0.1", "443"});
  EXPECT_TRUE(absl::IsFailedPrecondition(no_token.status()));
  EXPECT_THAT(std::string(no_token.status().message()),
              HasSubstr(strCat("service-account token ", dir.path(), "/token")));

  dir.write("token", "t");
  auto no_ca = inClusterConfig({dir.path(), "10.0.0.1", "443"});
  EXPECT_THAT(std::string(no_ca.status().message()), HasSubstr("ca.crt"));
}

}  // namespace
}  // namespace krane::kube
