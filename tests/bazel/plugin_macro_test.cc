// krane_plugin builds a shared object that dlopen can load and that exports only what is marked.
#include <dlfcn.h>

#include <catch2/catch.hpp>

#include "tests/support/process.h"

namespace krane {
namespace {

TEST_CASE("exports only the entry point", "[krane-plugin]") {
  const std::string path = krane::testing::runfile("tests/bazel/libsample_plugin.so");
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  INFO(::dlerror());
  REQUIRE(handle != nullptr);
  auto* entry = reinterpret_cast<int (*)()>(::dlsym(handle, "krane_sample_entry"));
  REQUIRE(entry != nullptr);
  CHECK(entry() == 6);
  // Everything else is hidden: a plugin cannot clash with the host's or another plugin's symbols.
  CHECK(::dlsym(handle, "_Z17kraneSampleHelperv") == nullptr);
  ::dlclose(handle);
}

}  // namespace
}  // namespace krane
