#include "common/random_id.h"

#include <unistd.h>

#include <random>

#include <fmt/format.h>

namespace krane {

std::string randomHex(size_t bytes) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string out;
  while (out.size() < bytes * 2) out += fmt::format("{:016x}", rng());
  out.resize(bytes * 2);
  return out;
}

std::string processInstanceId() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return fmt::format("{}-{}-{}", host, getpid(), randomHex(3));
}

}  // namespace krane
