// The reference figure benchmarks measure in their own run: how many commits per second this
// machine's database takes at all, so that other figures can be stated as ratios to it.
#pragma once

#include <chrono>
#include <string>

#include "absl/status/statusor.h"
#include "controlplane/db/pool.h"

namespace krane::bench {

// Single-row autocommit INSERTs into a fresh table `table` from `threads` connections for
// `window`: commits per second.
absl::StatusOr<double> rawCommitRate(db::Pool& pool, int threads, std::chrono::seconds window,
                                     const std::string& table);

}  // namespace krane::bench
