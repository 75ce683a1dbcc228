// `krane-ctrl workflow ...`: the operator's view of the workflow engine, straight on the database
// (no running engine needed): list, show, cancel, kill, resume, resolve / reject an awakeable,
// the watchdog of keys held too long, and retention cleanup. Replicas pick changes up on their
// next poll.
#pragma once

#include "CLI/CLI.hpp"

namespace krane::workflow {

void addWorkflowCommands(CLI::App& app, int& exit_code);

}  // namespace krane::workflow
