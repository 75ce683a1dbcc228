// Writes journal entries of the invocations this replica executes, fenced by their lease tokens,
// grouping the writes that threads ask for at the same time (GroupCommit: at most kWriters
// batches at once, each of at most kMaxEntries entries and about kMaxBatchBytes).
//
// A single entry is one INSERT ... SELECT with a locking read of its invocation's row on the
// lease token: it commits by itself and inserts nothing unless the token is still current, and a
// takeover (which changes the token) waits for it to commit. Single entries of several
// invocations are one such statement for all of them, each row fenced on its own token
// (statements::fencedJournalInsertGroup). Requests of several entries are one transaction that
// locks the invocations' rows, reads their tokens and inserts the entries of those still current
// in one multi-row INSERT.
//
// Thread-safety: write() may be called from any thread.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "controlplane/db/pool.h"
#include "controlplane/workflow/context_impl.h"
#include "controlplane/workflow/group_commit.h"

namespace krane::workflow {

class JournalWriter {
 public:
  explicit JournalWriter(db::Pool& pool);

  // Journals `entries` (in order, consecutive seqs) of `invocation_id` if `token` is still its
  // lease token; all of them or none. ABORTED with the message "fenced" when the lease was taken
  // over; other errors from the database as they are (the entries may then be missing).
  absl::Status write(const std::string& invocation_id, int64_t token,
                     const std::vector<const JournalEntry*>& entries);

  // At most this many batches written at once: enough to keep both the server's cores and the
  // network busy while one batch waits for its reply.
  static constexpr size_t kWriters = 4;

  // Statements written and entries in them so far (for tests and the benchmark).
  uint64_t statements() const { return counts_.statements(); }
  uint64_t entries() const { return counts_.rows(); }

 private:
  struct Request {
    const std::string* invocation_id;
    int64_t token;
    const std::vector<const JournalEntry*>* entries;
    absl::Status result = absl::InternalError("journal entries not written");
  };
  // At most this many entries in one batch, and about this many bytes: a statement larger than
  // the server's max_allowed_packet (16 MiB by default) is refused, and its connection closed.
  static constexpr size_t kMaxEntries = 64;
  static constexpr size_t kMaxBatchBytes = size_t{4} << 20;
  // What a request weighs in a batch: its bytes, and at least 1/kMaxEntries of a batch per entry.
  static size_t weight(const Request& request);

  // Writes `batch` and sets each request's result (not `done`).
  void writeBatch(const std::vector<Request*>& batch);
  absl::Status writeOne(const Request& request);
  // Requests of one entry each, of different invocations, in one statement. Sets the results
  // when it returns OK; on an error no entry was written.
  absl::Status writeSingles(const std::vector<Request*>& batch);
  // Sets the results when it returns OK; on an error no entry was written.
  absl::Status writeGroup(const std::vector<Request*>& batch);

  db::Pool& pool_;
  GroupCommit<Request> group_;
  WriteCounts counts_;
};

}  // namespace krane::workflow
