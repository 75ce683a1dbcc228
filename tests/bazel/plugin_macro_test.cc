// krane_plugin builds a shared object that dlopen can load and that exports only what is marked.
#include <dlfcn.h>

#include <gtest/gtest.h>

#include "tests/support/process.h"

namespace krane {
namespace {

TEST(KranePlugin, ExportsOnlyTheEntryPoint) {
  const std::string path = krane::testing::runfile("tests/bazel/libsample_plugin.so");
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(handle, nullptr) << ::dlerror();
  auto* entry = reinterpret_cast<int (*)()>(::dlsym(handle, "krane_sample_entry"));
  ASSERT_NE(entry, nullptr);
  EXPECT_EQ(entry(), 6);
  // Everything else is hidden: a plugin cannot clash with the host's or another plugin's symbols.
  EXPECT_EQ(::dlsym(handle, "_Z17kraneSampleHelperv"), nullptr);
  ::dlclose(handle);
}

}  // namespace
}  // namespace krane
