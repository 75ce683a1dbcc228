#include "common/random_id.h"

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

}  // namespace krane
