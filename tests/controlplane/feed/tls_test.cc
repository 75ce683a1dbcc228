// TLS and mutual TLS on krane-ctrl's gRPC port and its watch listener, with certificates made by
// openssl for the test.
#include <catch2/catch.hpp>

#include "common/strings.h"
#include "krane/cluster/v1/cluster.grpc.pb.h"
#include "tests/support/certificates.h"
#include "tests/support/control_plane.h"
#include "tests/support/matchers.h"

namespace krane {
namespace {

using krane::testing::fileText;
using krane::testing::kOperatorToken;
using krane::testing::TestControlPlane;

grpc::Status listWith(std::shared_ptr<grpc::ChannelCredentials> credentials, int port) {
  auto stub = krane::api::v1::ResourceService::NewStub(
      grpc::CreateChannel(strCat("127.0.0.1:", port), credentials));
  krane::api::v1::ListResourcesRequest request;
  krane::api::v1::ListResourcesResponse response;
  return stub->List(TestControlPlane::withToken(kOperatorToken, std::chrono::seconds(5)).get(),
                    request, &response);
}

// The first event of a Watch on the watch listener of `port` (false when the call fails).
bool watchesWith(std::shared_ptr<grpc::ChannelCredentials> credentials, int port,
                 const std::string& token) {
  auto stub = cluster::v1::ClusterService::NewStub(
      grpc::CreateChannel(strCat("127.0.0.1:", port), credentials));
  auto context = TestControlPlane::withToken(token, std::chrono::seconds(5));
  cluster::v1::WatchRequest request;
  request.set_region("eu-1");
  auto reader = stub->Watch(context.get(), request);
  cluster::v1::WatchEvent event;
  const bool read = reader->Read(&event);
  context->TryCancel();
  reader->Finish();
  return read;
}

TEST_CASE("server certificate and mutual tls, on the grpc port and the watch listener", "[tls]") {
  const auto certs = krane::testing::makeTestCertificates(std::getenv("TEST_TMPDIR"));
  TestControlPlane cp;
  auto& tls = cp.startReplica([&](ctrl::CtrlConfig& c) {
    c.tls.cert_file = certs.server_cert;
    c.tls.key_file = certs.server_key;
    c.feed.watch_listen = "127.0.0.1:0";
  });
  auto& mtls = cp.startReplica([&](ctrl::CtrlConfig& c) {
    c.tls.cert_file = certs.server_cert;
    c.tls.key_file = certs.server_key;
    c.tls.client_ca_file = certs.ca_cert;
    c.feed.watch_listen = "127.0.0.1:0";
  });
  const std::string token = cp.agentToken("eu-1");

  grpc::SslCredentialsOptions trust;
  trust.pem_root_certs = fileText(certs.ca_cert);
  grpc::SslCredentialsOptions trust_with_cert = trust;
  trust_with_cert.pem_cert_chain = fileText(certs.client_cert);
  trust_with_cert.pem_private_key = fileText(certs.client_key);
  grpc::SslCredentialsOptions wrong_ca;
  wrong_ca.pem_root_certs = fileText(certs.client_cert);

  // TLS: a client trusting the CA gets through; a plaintext client does not.
  CHECK_THAT(listWith(grpc::SslCredentials(trust), tls.grpcPort()), IsOk());
  CHECK_FALSE(listWith(grpc::InsecureChannelCredentials(), tls.grpcPort()).ok());
  CHECK(watchesWith(grpc::SslCredentials(trust), tls.watchPort(), token));
  CHECK_FALSE(watchesWith(grpc::InsecureChannelCredentials(), tls.watchPort(), token));
  // A client that does not trust the server's CA refuses it.
  CHECK_FALSE(listWith(grpc::SslCredentials(wrong_ca), tls.grpcPort()).ok());
  CHECK_FALSE(watchesWith(grpc::SslCredentials(wrong_ca), tls.watchPort(), token));

  // Mutual TLS: a client certificate signed by the CA is required.
  CHECK_THAT(listWith(grpc::SslCredentials(trust_with_cert), mtls.grpcPort()), IsOk());
  CHECK_FALSE(listWith(grpc::SslCredentials(trust), mtls.grpcPort()).ok());
  CHECK(watchesWith(grpc::SslCredentials(trust_with_cert), mtls.watchPort(), token));
  CHECK_FALSE(watchesWith(grpc::SslCredentials(trust), mtls.watchPort(), token));
  // The listener still serves after the failed handshakes.
  CHECK(watchesWith(grpc::SslCredentials(trust), tls.watchPort(), token));
}

TEST_CASE("missing certificate files stop start up naming them", "[tls]") {
  TestControlPlane cp;
  ctrl::CtrlConfig config;
  config.listen = "127.0.0.1:0";
  config.http_listen = "127.0.0.1:0";
  config.database.dsn = strCat("mysql://root@127.0.0.1:", cp.dsn().port, "/", cp.dsn().database);
  config.tls.cert_file = "/nonexistent/server.crt";
  config.tls.key_file = "/nonexistent/server.key";
  ctrl::Server server(config);
  auto status = server.start();
  REQUIRE_FALSE(status.ok());
  CHECK_THAT(std::string(toStd(status.message())),
             Catch::Contains("cannot read tls.cert_file /nonexistent/server.crt"));
}

}  // namespace
}  // namespace krane
