#include "tests/support/certificates.h"

#include <fstream>
#include <sstream>
#include <vector>

#include <catch2/catch.hpp>

#include "tests/support/process.h"

namespace krane::testing {
namespace {

void openssl(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"/usr/bin/openssl"};
  argv.insert(argv.end(), args.begin(), args.end());
  auto r = runCommand(argv);
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
}

}  // namespace

TestCertificates makeTestCertificates(const std::string& dir) {
  openssl({"req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
           "/CN=krane-test-ca", "-keyout", dir + "/ca.key", "-out", dir + "/ca.crt"});
  std::ofstream(dir + "/server.ext") << "subjectAltName=IP:127.0.0.1,DNS:localhost\n";
  for (const std::string name : {"server", "client"}) {
    const std::string base = dir + "/" + name;
    openssl({"req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=krane-" + name, "-keyout",
             base + ".key", "-out", base + ".csr"});
    std::vector<std::string> sign = {"x509",
                                     "-req",
                                     "-in",
                                     base + ".csr",
                                     "-CA",
                                     dir + "/ca.crt",
                                     "-CAkey",
                                     dir + "/ca.key",
                                     "-CAcreateserial",
                                     "-days",
                                     "1",
                                     "-out",
                                     base + ".crt"};
    if (name == "server") sign.insert(sign.end(), {"-extfile", dir + "/server.ext"});
    openssl(sign);
  }
  return {dir + "/ca.crt", dir + "/server.crt", dir + "/server.key", dir + "/client.crt",
          dir + "/client.key"};
}

std::string fileText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace krane::testing
