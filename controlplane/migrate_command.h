// `krane-ctrl migrate`: applies or shows the schema migrations of the control plane database.
#pragma once

#include <string>

#include "CLI/CLI.hpp"

namespace krane::ctrl {

struct MigrateFlags {
  std::string dsn;             // --dsn, else $KRANE_DSN
  std::string migrations_dir;  // --migrations-dir: read files instead of the built-in set
  bool status = false;         // --status: list, do not apply
  bool check = false;          // --check: exit 1 unless fully migrated
  int lock_timeout_s = 60;
};

// Registers the subcommand; `exit_code` receives the result when it runs.
void addMigrateCommand(CLI::App& app, MigrateFlags& flags, int& exit_code);

}  // namespace krane::ctrl
