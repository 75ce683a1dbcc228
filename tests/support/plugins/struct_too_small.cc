// Test plugin "struct_too_small": claims ABI 1.0 but a table that ends after `name`, as if
// built against a truncated header. The loader must refuse it without reading further.
#include <cstddef>

#include "plugins/abi/krane_plugin.h"

namespace {
constexpr krane_plugin_api kApi = {
    .struct_size = offsetof(krane_plugin_api, version),
    .abi_major = KRANE_PLUGIN_ABI_MAJOR,
    .abi_minor = KRANE_PLUGIN_ABI_MINOR,
    .name = "struct_too_small",
    .version = nullptr,
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
