// kranectl rollout ... (fleet-wide sentinel image rollouts) and kranectl sentinels ... .
#pragma once

#include "CLI/CLI.hpp"
#include "cli/common.h"

namespace krane::cli {

// What the `rollout` and `sentinels` commands parse into; owned by the caller, it must outlive
// the parse.
struct StartArgs {
  std::string image;
  std::string waves;
  std::string bake = "0";
  std::string slack_webhook;
  uint32_t max_parallel = 0;
  std::string sentinel_timeout = "0";
  bool watch = false;
};

struct RolloutCommandArgs {
  StartArgs start;
  bool watch = false;
  v1::ListSentinelsRequest filter;
  std::string env, region, deploy_status, id;
};

// Adds `rollout` and `sentinels` to `app`; a command's exit code lands in `code`.
void addRolloutCommands(CLI::App& app, const Globals& g, int& code, RolloutCommandArgs& args);

// "90", "90s", "2m", "1h30m" as seconds; nullopt when it is none of these.
std::optional<int64_t> parseSeconds(const std::string& text);

}  // namespace krane::cli
