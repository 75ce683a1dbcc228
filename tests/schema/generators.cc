#include "tests/schema/generators.h"

namespace krane::schema {

const std::vector<Generator>& generators() {
  static const std::vector<Generator> list = {
      {"sentinel", &sentinelObjects},
      {"cilium", &ciliumObjects},
      {"deployment", &deploymentObjects},
  };
  return list;
}

}  // namespace krane::schema
