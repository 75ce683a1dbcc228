// fake-kube-api: the fake API server (fake_kube_api.h) in a process of its own, for benchmarks
// that must tell the client's CPU from the server's. Prints "port N" on stdout, then serves
// until stdin is closed (or its parent dies).
#include <sys/prctl.h>

#include <csignal>
#include <cstdio>
#include <iostream>
#include <string>

#include "tests/support/fake_kube_api.h"

int main() {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  krane::testing::FakeKubeApi api;
  std::printf("port %d\n", api.port());
  std::fflush(stdout);
  std::string line;
  while (std::getline(std::cin, line)) {
  }
  return 0;
}
