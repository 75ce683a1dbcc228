// The client over HTTPS: the server's CA pinned from the configuration, client certificates,
// and a kubeconfig read end to end.
#include <filesystem>
#include <fstream>

#include <catch2/catch.hpp>

#include "absl/strings/escaping.h"
#include "common/strings.h"
#include "plugins/runtime/kubernetes/client.h"
#include "plugins/runtime/kubernetes/config.h"
#include "tests/support/fake_kube_api.h"
#include "tests/support/matchers.h"

namespace krane::kube {
namespace {

using krane::testing::FakeKubeApi;

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

TEST_CASE("the server is trusted through the configured ca only", "[tls]") {
  FakeKubeApi api(FakeKubeApi::Options{.tls = true});
  REQUIRE_THAT(api.url(), Catch::StartsWith("https://"));
  ClusterConfig config = api.clusterConfig();
  REQUIRE_FALSE(config.ca_pem.empty());
  auto trusted = getWith(config);
  REQUIRE_THAT(trusted, IsOk());
  CHECK((*trusted)["metadata"]["name"] == "default");

  config.ca_pem.clear();  // the system CAs do not know the cluster's CA
  auto untrusted = getWith(config);
  CHECK(absl::IsUnavailable(untrusted.status()));
  CHECK_THAT(std::string(untrusted.status().message()), Catch::Contains("certificate"));

  config.insecure_skip_tls_verify = true;
  CHECK_THAT(getWith(config), IsOk());
}

TEST_CASE("client certificate authentication", "[tls]") {
  FakeKubeApi api(FakeKubeApi::Options{.require_client_cert = true});
  ClusterConfig config = api.clusterConfig();
  REQUIRE_FALSE(config.client_cert_pem.empty());
  auto with_cert = getWith(config);
  CHECK_THAT(with_cert, IsOk());

  config.client_cert_pem.clear();
  config.client_key_pem.clear();
  auto without = getWith(config);
  CHECK_FALSE(without.ok());
  INFO(without.status());
  CHECK(absl::IsUnavailable(without.status()));
}

TEST_CASE("kubeconfig with inline ca and client certificate", "[tls]") {
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
  REQUIRE_THAT(config, IsOk());
  auto got = getWith(*config);
  CHECK_THAT(got, IsOk());
}

}  // namespace
}  // namespace krane::kube
