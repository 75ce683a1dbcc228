// The client over HTTPS: the server's CA pinned from the configuration, client certificates,
// and a kubeconfig read end to end.
#include <filesystem>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/escaping.h"
#include "common/strings.h"
#include "plugins/runtime/kubernetes/client.h"
#include "plugins/runtime/kubernetes/config.h"
#include "tests/support/fake_kube_api.h"

namespace krane::kube {
namespace {

using krane::testing::FakeKubeApi;
using ::testing::HasSubstr;

ObjectRef defaultNamespace() { return {"v1", "Namespace", "", "default"}; }

ClientOptions quick() {
  ClientOptions options;
  options.max_retries = 1;
  options.backoff = {std::chrono::milliseconds(1), 2.0, std::chrono::milliseconds(5), 0.5};
  return options;
}

absl::StatusOr<Json> getWith(const ClusterConfig& config) {
  auto client = Client::create(config, quick());
  if (!client.ok()) return client.status();
  return (*client)->get(defaultNamespace());
}

TEST(Tls, TheServerIsTrustedThroughTheConfiguredCaOnly) {
  FakeKubeApi api(FakeKubeApi::Options{.tls = true});
  ASSERT_THAT(api.url(), ::testing::StartsWith("https://"));
  ClusterConfig config = api.clusterConfig();
  ASSERT_FALSE(config.ca_pem.empty());
  auto trusted = getWith(config);
  ASSERT_TRUE(trusted.ok()) << trusted.status();
  EXPECT_EQ((*trusted)["metadata"]["name"], "default");

  config.ca_pem.clear();  // the system CAs do not know the cluster's CA
  auto untrusted = getWith(config);
  EXPECT_TRUE(absl::IsUnavailable(untrusted.status()));
  EXPECT_THAT(std::string(untrusted.status().message()), HasSubstr("certificate"));

  config.insecure_skip_tls_verify = true;
  EXPECT_TRUE(getWith(config).ok());
}

TEST(Tls, ClientCertificateAuthentication) {
  FakeKubeApi api(FakeKubeApi::Options{.require_client_cert = true});
  ClusterConfig config = api.clusterConfig();
  ASSERT_FALSE(config.client_cert_pem.empty());
  auto with_cert = getWith(config);
  EXPECT_TRUE(with_cert.ok()) << with_cert.status();

  config.client_cert_pem.clear();
  config.client_key_pem.clear();
  auto without = getWith(config);
  EXPECT_FALSE(without.ok());
  EXPECT_TRUE(absl::IsUnavailable(without.status())) << without.status();
}

TEST(Tls, KubeconfigWithInlineCaAndClientCertificate) {
  FakeKubeApi api(FakeKubeApi::Options{.require_client_cert = true});
  auto b64 = [](const std::string& s) {
    std::string out;
    absl::Base64Escape(s, &out);
    return out;
  };
  const std::string dir = std::getenv("TEST_TMPDIR");
  const std::string path = dir + "/kubeconfig";
  std::ofstream(path) << strCat(
      "apiVersion: v1\nkind: Config\ncurrent-context: fake\n",
      "contexts:\n- name: fake\n  context: {cluster: c, user: u}\n",
      "clusters:\n- name: c\n  cluster:\n    server: ", api.url(),
      "\n    certificate-authority-data: ", b64(api.caPem()), "\n",
      "users:\n- name: u\n  user:\n    client-certificate-data: ", b64(api.clientCertPem()),
      "\n    client-key-data: ", b64(api.clientKeyPem()), "\n");
  auto config = kubeconfigFromFile(path);
  ASSERT_TRUE(config.ok()) << config.status();
  auto got = getWith(*config);
  EXPECT_TRUE(got.ok()) << got.status();
}

}  // namespace
}  // namespace krane::kube
