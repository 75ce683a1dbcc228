// The floor of the workflow engine's figures on this schema: the row changes a resumed invocation
// and a journaled step need at the least, issued straight from a few threads with no engine in
// between. Comparing the engine with them tells how much of its cost is the storage itself
// (bench/README.md, "The floor").
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "controlplane/db/pool.h"

namespace krane::bench {

struct FloorOptions {
  int threads = 8;
  // Invocations handled per group of statements. One by one (false): the four steps of a resume
  // are a statement per invocation each, except the claim, one statement for `group`
  // invocations as the engine's claims are. Grouped (true): every step is one statement for the
  // whole group.
  int group = 4;
  bool grouped = false;
  // The statements an engine's callers make (the send of an invocation, the settle of an
  // awakeable) one per invocation even when `grouped`: an engine receives them one at a time and
  // can group only its own (claims, journal entries, finishes).
  bool callers_one_by_one = false;
};

// Creates `n` invocations suspended on an awakeable each, then resumes them all: settle the
// awakeable (waking the invocation), claim it, journal the await, finish it. Returns resumes per
// second, from the first settle to the last finish; checks afterwards that every invocation
// succeeded with its journal entry. `tag` makes the ids unique within the database.
absl::StatusOr<double> resumeFloorRate(db::Pool& pool, int n, const FloorOptions& options,
                                       const std::string& tag);

// `n` five-step workflows: send (insert the invocation), claim, five journal entries each
// fenced on the lease token as the engine writes them, finish. Returns steps per second.
absl::StatusOr<double> stepFloorRate(db::Pool& pool, int n, const FloorOptions& options,
                                     const std::string& tag);

}  // namespace krane::bench
