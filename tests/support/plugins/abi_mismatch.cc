// Test plugin "abi_mismatch": a hand-written table claiming plugin ABI 99.0. The loader must
// refuse it before reading anything past the version.
#include "plugins/abi/krane_plugin.h"

namespace {
constexpr krane_plugin_api kApi = {
    .struct_size = sizeof(krane_plugin_api),
    .abi_major = 99,
    .abi_minor = 0,
    .name = "abi_mismatch",
    .version = "99.0.0-test",
    .init = nullptr,
    .resource_types = nullptr,
    .apply = nullptr,
    .remove = nullptr,
    .sync_begin = nullptr,
    .sync_end = nullptr,
    .observe = nullptr,
    .shutdown = nullptr,
};
}  // namespace

extern "C" KRANE_PLUGIN_EXPORT const krane_plugin_api* krane_plugin_entry(void) { return &kApi; }
