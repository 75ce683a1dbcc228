// The release of this build, shown by `--version` and carried in agent heartbeats.
#pragma once

namespace krane {
inline constexpr const char* kVersion = "0.1.0-dev";
}  // namespace krane
