// TLS and mutual TLS on krane-ctrl's gRPC port and its watch listener, with certificates made by
// openssl for the test.
#include <fstream>
#include <sstream>

#include <catch2/catch.hpp>

#include "common/strings.h"
#include "krane/cluster/v1/cluster.grpc.pb.h"
#include "tests/support/control_plane.h"
#include "tests/support/matchers.h"
#include "tests/support/process.h"

namespace krane {
namespace {

using krane::testing::kOperatorToken;
using krane::testing::TestControlPlane;

std::string dir() { return std::getenv("TEST_TMPDIR"); }

std::string read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void openssl(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"/usr/bin/openssl"};
  argv.insert(argv.end(), args.begin(), args.end());
  auto r = krane::testing::runCommand(argv);
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
}

// A CA, a server certificate for 127.0.0.1 and a client certificate, all signed by the CA.
void makeCertificates() {
  const std::string d = dir();
  openssl({"req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
           "/CN=krane-test-ca", "-keyout", d + "/ca.key", "-out", d + "/ca.crt"});
  std::ofstream(d + "/server.ext") << "subjectAltName=IP:127.0.0.1,DNS:localhost\n";
  for (const std::string name : {"server", "client"}) {
    openssl({"req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=krane-" + name, "-keyout",
             d + "/" + name + ".key", "-out", d + "/" + name + ".csr"});
    std::vector<std::string> sign = {"x509",
                                     "-req",
                                     "-in",
                                     d + "/" + name + ".csr",
                                     "-CA",
                                     d + "/ca.crt",
                                     "-CAkey",
                                     d + "/ca.key",
                                     "-CAcreateserial",
                                     "-days",
                                     "1",
                                     "-out",
                                     d + "/" + name + ".crt"};
    if (name == "server") sign.insert(sign.end(), {"-extfile", d + "/server.ext"});
    openssl(sign);
  }
}

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
  makeCertificates();
  const std::string d = dir();
  TestControlPlane cp;
  auto& tls = cp.startReplica([&](ctrl::CtrlConfig& c) {
    c.tls.cert_file = d + "/server.crt";
    c.tls.key_file = d + "/server.key";
    c.feed.watch_listen = "127.0.0.1:0";
  });
  auto& mtls = cp.startReplica([&](ctrl::CtrlConfig& c) {
    c.tls.cert_file = d + "/server.crt";
    c.tls.key_file = d + "/server.key";
    c.tls.client_ca_file = d + "/ca.crt";
    c.feed.watch_listen = "127.0.0.1:0";
  });
  const std::string token = cp.agentToken("eu-1");

  grpc::SslCredentialsOptions trust;
  trust.pem_root_certs = read(d + "/ca.crt");
  grpc::SslCredentialsOptions trust_with_cert = trust;
  trust_with_cert.pem_cert_chain = read(d + "/client.crt");
  trust_with_cert.pem_private_key = read(d + "/client.key");
  grpc::SslCredentialsOptions wrong_ca;
  wrong_ca.pem_root_certs = read(d + "/client.crt");

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
