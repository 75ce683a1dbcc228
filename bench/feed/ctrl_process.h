// The real krane-ctrl binary as a child process of the benchmark, so that its memory can be read
// from /proc and its work is not mixed with the clients' in one process.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "controlplane/db/dsn.h"
#include "tests/support/process.h"

namespace krane::bench {

// Path of a file of the workspace in this binary's runfiles (e.g. "controlplane/krane-ctrl").
// Tries $RUNFILES_DIR, $TEST_SRCDIR, <argv0>.runfiles and /proc/self/exe.runfiles; throws with
// the places it looked when none has it.
std::string findRunfile(std::string_view path_in_workspace, const char* argv0);

struct ProcessMemory {
  uint64_t rss_kib = 0;  // VmRSS
  uint64_t hwm_kib = 0;  // VmHWM: peak resident set
};

// VmRSS and VmHWM of a process, from /proc/<pid>/status; throws if the process is gone.
ProcessMemory readProcessMemory(int pid);

struct CtrlOptions {
  std::string binary;    // krane-ctrl
  std::string work_dir;  // config and log go here
  std::string name;      // tells the files of several servers apart
  db::Dsn dsn;
  std::string operator_token;
  size_t max_connections = 32;
  int poll_interval_ms = 50;
  // feed.peer_hints on a free port of 127.0.0.1: replicas hint each other of their commits.
  bool peer_hints = true;
  // feed.watch_listen on a free port of 127.0.0.1: the feed's own HTTP/2 listener for Watch.
  bool watch_listener = false;
  // tls.cert_file and tls.key_file (both ports speak TLS); empty: plaintext.
  std::string tls_cert_file;
  std::string tls_key_file;
};

// `krane-ctrl serve --config <yaml>` on free ports of 127.0.0.1. The constructor returns once
// the server printed its ports (throws with the log's tail if it does not within 60 s).
class CtrlProcess {
 public:
  explicit CtrlProcess(CtrlOptions options);
  ~CtrlProcess();
  CtrlProcess(const CtrlProcess&) = delete;
  CtrlProcess& operator=(const CtrlProcess&) = delete;

  int pid() const { return child_->pid(); }
  int grpcPort() const { return grpc_port_; }
  int httpPort() const { return http_port_; }
  std::string grpcTarget() const;
  // Where agents' Watch calls go: the watch listener when it is on, the gRPC port otherwise.
  std::string watchTarget() const;
  const std::string& logPath() const { return log_path_; }

  ProcessMemory memory() const { return readProcessMemory(child_->pid()); }
  // A value of /metrics (the first sample of that name); nullopt when absent or unreachable.
  std::optional<double> metric(std::string_view name) const;

  // SIGTERM, then waits up to `grace` for a clean exit (SIGKILL after). Returns the exit code
  // (negative: the signal that ended it). Safe to call twice.
  int stop(std::chrono::seconds grace = std::chrono::seconds(15));

 private:
  std::string logTail() const;

  CtrlOptions options_;
  std::string config_path_;
  std::string log_path_;
  std::unique_ptr<testing::ChildProcess> child_;
  int grpc_port_ = 0;
  int http_port_ = 0;
  int watch_port_ = 0;
  std::optional<int> exit_code_;
};

}  // namespace krane::bench
