// krane-ctrl: the Krane control plane. Subcommands are added here as they land.
#include <cstdio>

#include "CLI/CLI.hpp"
#include "common/process_setup.h"
#include "common/version.h"
#include "controlplane/commands.h"
#include "controlplane/migrate_command.h"
#include "controlplane/workflow/command.h"

int main(int argc, char** argv) {
  krane::setUpProcess();
  CLI::App app{"krane-ctrl: the Krane control plane (API, change feed, workflows)", "krane-ctrl"};
  app.set_version_flag("--version", krane::kVersion);
  app.require_subcommand(1);
  int exit_code = 0;
  krane::ctrl::MigrateFlags migrate;
  krane::ctrl::addMigrateCommand(app, migrate, exit_code);
  krane::ctrl::addServeCommand(app, exit_code);
  krane::ctrl::addRegionCommands(app, exit_code);
  krane::ctrl::addTokenCommands(app, exit_code);
  krane::ctrl::addAgentCommands(app, exit_code);
  krane::ctrl::addFeedCommands(app, exit_code);
  krane::workflow::addWorkflowCommands(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // Usage errors exit 2, with the message on one line and a pointer to --help.
    std::fprintf(stderr, "krane-ctrl: error: %s (see krane-ctrl --help)\n", e.what());
    return 2;
  }
  return exit_code;
}
