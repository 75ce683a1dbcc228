// Certificates for TLS tests, made with openssl in the test's own directory.
#pragma once

#include <string>

namespace krane::testing {

// A CA, a server certificate for 127.0.0.1 and localhost, and a client certificate, both
// signed by the CA; PEM files under `dir`.
struct TestCertificates {
  std::string ca_cert;
  std::string server_cert, server_key;
  std::string client_cert, client_key;
};

// Makes them under `dir` (REQUIREs that openssl succeeds).
TestCertificates makeTestCertificates(const std::string& dir);

// The whole content of a file ("" when it cannot be read).
std::string fileText(const std::string& path);

}  // namespace krane::testing
