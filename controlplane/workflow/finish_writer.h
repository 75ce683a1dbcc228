// Ends invocations that have neither a caller nor a key (their finish is one row change),
// fenced by their lease tokens, grouping the finishes that threads ask for at the same time
// (GroupCommit: at most kWriters batches at once, each of at most kMaxFinishes finishes and about
// kMaxBatchBytes).
//
// One finish is one UPDATE of its invocation's row on its id and lease token: it commits by
// itself and changes nothing when the token moved on. The finishes of several invocations are one
// such UPDATE for all of them (statements::fencedFinishGroup), each row fenced on its own token
// and given its own values. When fewer rows changed than the batch holds, the rows are read back
// to tell the finished ones from the fenced ones. A statement the server refuses (a value of one
// request, say) is written again one finish at a time. While one row of a batch is locked (its
// invocation taken over, and the takeover's transaction not committed), the batch waits for it,
// as a single finish of that row would; a deadlock with such a transaction rolls the statement
// back, and it goes again (db::retryConflicts).
//
// Thread-safety: finish() may be called from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "controlplane/db/pool.h"
#include "controlplane/db/value.h"
#include "controlplane/workflow/group_commit.h"

namespace krane::workflow {

class FinishWriter {
 public:
  struct Request {
    std::string invocation_id;
    int64_t token = 0;
    std::string status;  // the final status: succeeded, failed or cancelled
    db::Value output;    // NULL unless it succeeded
    db::Value error_code;
    db::Value error_message;
    int64_t attempts = 0;
    // True: finished; false: fenced (the lease moved on, nothing changed). An error: the
    // database's, and the finish may or may not have happened.
    absl::StatusOr<bool> result = absl::InternalError("invocation not finished");
  };

  explicit FinishWriter(db::Pool& pool);

  // Finishes `request` (sets its result), grouped with those of other threads at that moment.
  void finish(Request& request);

  // What a batch does: finishes every request of `batch` and sets its result (one statement
  // for the requests of distinct invocations). Public for tests, which build batches.
  void write(const std::vector<Request*>& batch);

  static constexpr size_t kWriters = 4;
  static constexpr size_t kMaxFinishes = 64;

  // Statements run and the invocations they finished so far (for tests and the benchmark).
  uint64_t statements() const { return counts_.statements(); }
  uint64_t finishes() const { return counts_.rows(); }

 private:
  static constexpr size_t kMaxBatchBytes = size_t{4} << 20;
  static size_t weight(const Request& request);
  void writeOne(Request& request, int64_t now);
  void writeGroup(const std::vector<Request*>& group, int64_t now);

  db::Pool& pool_;
  GroupCommit<Request> group_;
  WriteCounts counts_;
};

}  // namespace krane::workflow
