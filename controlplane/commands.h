// krane-ctrl's subcommands other than migrate: serve, region, token.
#pragma once

#include "CLI/CLI.hpp"

namespace krane::ctrl {

void addServeCommand(CLI::App& app, int& exit_code);
void addRegionCommands(CLI::App& app, int& exit_code);
void addTokenCommands(CLI::App& app, int& exit_code);
void addAgentCommands(CLI::App& app, int& exit_code);
void addFeedCommands(CLI::App& app, int& exit_code);

}  // namespace krane::ctrl
