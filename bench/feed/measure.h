// What the feed benchmark measures with: a paced write load, per-receiver latency samples, and
// the database server's own statement counter.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "controlplane/db/connection.h"
#include "krane/cluster/v1/state.pb.h"

namespace krane::bench {

// steady_clock in nanoseconds: senders and receivers are threads of this one process.
int64_t nowNs();

// The resource type the write load and the sync data use (a generic resource).
inline constexpr const char* kBenchType = "bench.krane.dev/item";

// A small generic resource whose spec is the decimal steady_clock time it was sent at.
cluster::v1::Resource timedResource(const std::string& region, const std::string& id,
                                    int64_t send_ns);
// The send time written by timedResource, or -1 when `spec` is not one.
int64_t parseSendNs(const std::string& spec);

// One change seen by one receiver (a Watch stream, or a polling client).
struct Sample {
  uint64_t version = 0;
  int64_t receive_ns = 0;
  // From the resource's spec when the resource is at this change's version, else -1 (the send
  // time is then taken from the writer's record of that version).
  int64_t send_ns = -1;
};

struct Sent {
  uint64_t version = 0;
  int64_t send_ns = 0;
};

// Puts `rate` resources per second on a fixed schedule, cycling over `distinct_ids` ids, and
// remembers the version and send time of each. The schedule does not wait for slow puts: several
// sender threads take the next slot when it is due, so a slow server gets the same offered load
// (a slot more than a second late is skipped and counted instead).
class WriteLoad {
 public:
  // Returns the version of the change the put made. Called from several threads at once.
  using PutFn = std::function<absl::StatusOr<uint64_t>(const cluster::v1::Resource&)>;

  WriteLoad(PutFn put, std::string region, double rate, size_t senders = 8,
            size_t distinct_ids = 1000);
  ~WriteLoad();
  void start();
  void stop();

  std::vector<Sent> sent() const;
  uint64_t errors() const { return errors_.load(); }
  uint64_t skipped() const { return skipped_.load(); }
  // Round trip of the puts themselves, in ms.
  std::vector<double> putMillis() const;

 private:
  void run();

  PutFn put_;
  const std::string region_;
  const std::chrono::nanoseconds period_;
  const size_t senders_;
  const size_t distinct_ids_;
  std::chrono::steady_clock::time_point start_;
  std::atomic<uint64_t> next_slot_{0};
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> errors_{0};
  std::atomic<uint64_t> skipped_{0};
  mutable std::mutex mutex_;
  std::vector<Sent> sent_;
  std::vector<double> put_ms_;
  std::vector<std::thread> threads_;
};

struct LatencySummary {
  size_t receivers = 0;
  size_t changes = 0;  // changes written inside the window
  size_t samples = 0;  // (receiver, change) pairs received
  size_t missing = 0;  // receivers x changes - samples
  double p50_ms = 0;
  double p99_ms = 0;
  double max_ms = 0;
};

// Latency of every change sent in [from_ns, to_ns) at every receiver.
LatencySummary summarizeLatency(const std::vector<std::vector<Sample>>& per_receiver,
                                const std::vector<Sent>& sent, int64_t from_ns, int64_t to_ns);

// How far apart the receivers got the same change: per change sent in [from_ns, to_ns), the
// time from its first receiver to its last, and the latency of its first receiver.
struct FanOutSummary {
  double spread_p50_ms = 0;
  double spread_p99_ms = 0;
  double first_p50_ms = 0;
  double first_p99_ms = 0;
};
FanOutSummary summarizeFanOut(const std::vector<std::vector<Sample>>& per_receiver,
                              const std::vector<Sent>& sent, int64_t from_ns, int64_t to_ns);

// CPU time (user + system, or system only: the kernel's work for it) a process has used, in
// seconds; -1 when it cannot be read.
double processCpuSeconds(int pid, bool system_only = false);
// Busy and total CPU time of the whole machine, in seconds, from /proc/stat.
struct MachineCpu {
  double busy = 0;
  double total = 0;
};
MachineCpu machineCpu();

// The q-th quantile (0..1) of `values` by nearest rank; 0 when empty. Reorders `values`.
double quantile(std::vector<double>& values, double q);

// Statements the database server executed, from its own counter (`Questions`), minus the ones
// this counter sent to read it.
class QueryCounter {
 public:
  explicit QueryCounter(std::unique_ptr<db::Connection> admin);
  // Reads the counter; each read is itself a statement, which rate() takes out again.
  uint64_t read();
  // Statements per second over `window`, excluding the counter's own reads.
  double rate(std::chrono::milliseconds window);
  // How many statements one read adds to the counter (measured in calibrate()).
  uint64_t selfCost() const { return self_cost_; }
  void calibrate();

 private:
  std::unique_ptr<db::Connection> admin_;
  uint64_t self_cost_ = 1;
};

}  // namespace krane::bench
