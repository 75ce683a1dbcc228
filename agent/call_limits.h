// How long one apply or delete of a plugin may take before the agent cancels it, and how long the
// plugin's host then has to let it go before it is restarted: the defaults of a plugin's
// configuration (PluginConfig) and of the hosts the agent starts (HostOptions).
#pragma once

#include <chrono>

namespace krane::agent {

inline constexpr std::chrono::milliseconds kDefaultCallTimeout{120000};
inline constexpr std::chrono::milliseconds kDefaultCancelGrace{10000};

}  // namespace krane::agent
