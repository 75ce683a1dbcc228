// A minimal plugin for the krane_plugin macro test: one exported entry point, one internal
// function that must stay hidden.
#include <string>

namespace {
std::string internalName() { return "sample"; }
}  // namespace

int kraneSampleHelper() { return static_cast<int>(internalName().size()); }

extern "C" __attribute__((visibility("default"))) int krane_sample_entry() {
  return kraneSampleHelper();
}
