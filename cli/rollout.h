// kranectl rollout ... (fleet-wide sentinel image rollouts) and kranectl sentinels ... .
#pragma once

#include "CLI/CLI.hpp"
#include "cli/common.h"

namespace krane::cli {

// Adds `rollout` and `sentinels` to `app`; a command's exit code lands in `code`.
void addRolloutCommands(CLI::App& app, const Globals& g, int& code);

// "90", "90s", "2m", "1h30m" as seconds; nullopt when it is none of these.
std::optional<int64_t> parseSeconds(const std::string& text);

}  // namespace krane::cli
