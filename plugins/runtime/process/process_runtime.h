// The `process` runtime: workloads as local child processes, for one machine (`./dev up`, the
// demo, tests) and for hosts without Kubernetes.
//
// A workload is a spec (image, command, env, replicas, probes, shutdown signal) and becomes
// `replicas` instances. Each instance is a process with:
//   - a port of its own from the configured range, given to it as PORT;
//   - a directory <state_dir>/instances/<workload>/<instance>/ holding its working directory
//     (work/), its output (output.log, stdout and stderr) and instance.json (pid, the pid's start
//     time, port, revision), written before anything else can notice the process;
//   - liveness and readiness HTTP probes (GET 127.0.0.1:PORT/path, 2xx and 3xx are healthy), or
//     with the spec's `health_port_env`, to a second port of the instance's own, given to it in
//     that variable.
//
// IMAGES. An image reference `name:tag` is looked up in the `images` table: `name` maps to an
// argv template in which `{tag}` is replaced by the tag (`krane.dev/demo-app: [/usr/lib/krane/
// krane-demo-app, --version, "{tag}"]`). An absolute path (`/opt/app/server`) runs that file. The
// spec's `command` replaces the image's argv, and `args` are appended, as in Kubernetes.
//
// SUPERVISION. A dead instance is restarted with exponential backoff. Restarting
// `crash_loop_restarts` times within `crash_loop_window` is a crash loop: the instance is reported
// as failed with its exit code or signal and its last output lines, and is still restarted (with
// the backoff) in case the cause goes away. A liveness probe failing `failure_threshold` times in a
// row restarts the instance. Stopping sends the spec's shutdown signal, then SIGKILL after the
// grace period. An instance being stopped leaves the published endpoints at once and gets its
// stop signal `deregistration_delay` later, so that whoever routes to it has moved away first.
//
// ROLLING REPLACEMENT. When a spec changes (its revision, a hash of everything that shapes an
// instance), instances are replaced by the rolling-update evaluator (controlplane/strategy), one
// cycle per tick: never more than replicas + max_surge instances, never fewer than replicas -
// max_unavailable ready ones (default surge 1, unavailable 0), a new instance counted once it
// has been ready for min_ready, and the last old one kept until a new one is (unless the spec
// allows every instance to be unavailable). Scaling alone starts or stops instances without a
// rollout.
//
// ENDPOINTS. <state_dir>/endpoints/ holds a file per workload (endpointsFile below) listing
// the addresses of its ready instances that are not stopping: {"workload": "<id>", "endpoints":
// ["127.0.0.1:20001", ...]}. It is replaced in one step (a rename) whenever that list changes and
// removed with the workload; a sentinel on the same machine routes to a deployment with it.
//
// RESTARTS OF THE AGENT. Instances run in their own session and outlive the agent, so that an
// agent restart does not take the workloads down. Specs are stored under <state_dir>/workloads/,
// with their labels (a plugin's applied version and generation, which its next host goes on from).
// On start the runtime re-adopts every instance whose pid is alive with the recorded start time
// (so a reused pid is never mistaken for it) and whose workload still exists; it stops and
// removes every other one. Nothing is leaked: an instance is either supervised or gone.
#pragma once

#include <signal.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/backoff.h"

namespace krane::runtime {

struct HttpProbe {
  std::string path;  // empty: no probe (a live process counts as alive and ready)
  std::chrono::milliseconds initial_delay{0};
  std::chrono::milliseconds interval{1000};
  std::chrono::milliseconds timeout{1000};
  int failure_threshold = 3;
};

struct WorkloadSpec {
  std::string id;     // unique in the runtime, e.g. "deployment/<deployment id>"
  std::string image;  // see IMAGES above
  std::vector<std::string> command;
  std::vector<std::string> args;
  std::map<std::string, std::string> env;
  int replicas = 1;
  HttpProbe liveness;
  HttpProbe readiness;
  // Set: each instance gets a second port of its own, in this environment variable, and the
  // probes go to it instead of PORT (a server whose request threads are all busy still answers
  // them there). Empty: the probes go to PORT.
  std::string health_port_env;
  int shutdown_signal = SIGTERM;
  std::chrono::milliseconds grace{10000};
  // How a new revision replaces the instances of the previous one (controlplane/strategy):
  // instances above and below `replicas` during the roll, and how long a new instance must be
  // ready before it counts. They shape the roll, not the instances: not part of the revision.
  int max_surge = 1;
  int max_unavailable = 0;
  std::chrono::milliseconds min_ready{0};
  // What the runtime's user records with the workload (a plugin: the version and generation it
  // applied): stored with the spec and handed back in its status, after a restart too. Not part
  // of the revision.
  std::map<std::string, std::string> labels;
};

// The endpoints file of a workload (see ENDPOINTS) in a runtime whose state_dir is `state_dir`.
std::string endpointsFile(const std::string& state_dir, const std::string& workload_id);

// A hash of everything that shapes an instance (not the replica count).
std::string revisionOf(const WorkloadSpec& spec);
// The spec as JSON (every field), as the runtime stores it.
std::string toJson(const WorkloadSpec& spec);

enum class InstancePhase { kPending, kRunning, kFailed, kTerminating };
const char* phaseName(InstancePhase phase);

struct InstanceStatus {
  std::string name;  // "<workload>-<revision prefix>-<n>"
  std::string revision;
  int64_t pid = 0;  // 0 while waiting for a restart
  int port = 0;
  int health_port = 0;  // with the spec's health_port_env; 0: none
  std::string address;  // 127.0.0.1:PORT
  InstancePhase phase = InstancePhase::kPending;
  bool ready = false;
  int restarts = 0;
  std::string reason;  // why it failed or restarted last, e.g. "exited with code 3"
  std::vector<std::string> last_output;  // the output's last lines, with a failure
  bool adopted = false;                  // started by an earlier agent
};

struct WorkloadStatus {
  std::string id;
  std::string revision;
  std::string image;  // of the current spec
  int replicas = 0;
  int ready = 0;           // ready instances, any revision
  int updated = 0;         // instances of the current revision
  int updated_ready = 0;   // ready instances of the current revision
  bool converged = false;  // exactly `replicas` instances, all current and ready
  std::vector<InstanceStatus> instances;
  std::map<std::string, std::string> labels;  // the spec's
};

struct ProcessRuntimeOptions {
  std::string state_dir;
  int port_from = 20000;
  int port_to = 20999;
  std::map<std::string, std::vector<std::string>> images;
  // Whether the plugin stops its instances when it shuts down (a local stack that must leave
  // nothing behind); by default they keep running and the next plugin host adopts them.
  bool stop_instances_on_shutdown = false;
  BackoffPolicy restart{std::chrono::milliseconds(1000), 2.0, std::chrono::milliseconds(60000),
                        0.2};
  int crash_loop_restarts = 3;
  std::chrono::milliseconds crash_loop_window{60000};
  std::chrono::milliseconds tick{100};
  // An instance being stopped leaves the published endpoints at once, and gets its stop signal
  // this much later, so that whoever routes to it (a sentinel, a client reading the endpoints)
  // moves away first: no request meets an instance that stopped listening. Not while the runtime
  // itself stops.
  std::chrono::milliseconds deregistration_delay{500};
  // Environment every instance gets besides PORT and its spec's env (PATH by default).
  std::map<std::string, std::string> base_env;
  // Called on the supervision thread whenever a workload's status changed.
  std::function<void(const WorkloadStatus&)> on_change;
};

class ProcessRuntime {
 public:
  // Re-adopts or cleans up what an earlier runtime left in the state directory, then supervises.
  static absl::StatusOr<std::unique_ptr<ProcessRuntime>> start(ProcessRuntimeOptions options);
  ~ProcessRuntime();
  ProcessRuntime(const ProcessRuntime&) = delete;
  ProcessRuntime& operator=(const ProcessRuntime&) = delete;

  // Creates or updates a workload (INVALID_ARGUMENT naming the field for a bad spec, such as an
  // image no rule maps). Returns once the spec is stored; instances follow asynchronously.
  absl::Status apply(const WorkloadSpec& spec);
  // Stops every instance of the workload (gracefully) and forgets it. OK if it does not exist.
  absl::Status remove(const std::string& id);
  std::vector<std::string> workloads() const;
  std::optional<WorkloadStatus> status(const std::string& id) const;
  // The argv an instance of `spec` runs.
  absl::StatusOr<std::vector<std::string>> commandLine(const WorkloadSpec& spec) const;

  // Stops supervising. With `stop_instances`, stops every instance first (gracefully) and waits
  // for them; otherwise they keep running for the next runtime to adopt.
  void shutdown(bool stop_instances);

 private:
  struct Instance;
  struct Workload;

  explicit ProcessRuntime(ProcessRuntimeOptions options);
  void adopt();
  void loop();
  void tick();
  void superviseLocked(Workload& w, std::chrono::steady_clock::time_point now);
  void probeLocked(Workload& w, Instance& i, std::chrono::steady_clock::time_point now);
  absl::Status launchLocked(Workload& w, Instance& i);
  void stopLocked(Instance& i, int sig, std::chrono::milliseconds grace, const std::string& why);
  // A free port of the range that no instance holds, other than `taken` (0: none).
  int allocatePortLocked(int taken = 0);
  std::unique_ptr<Instance> newInstanceLocked(Workload& w);
  WorkloadStatus statusLocked(const Workload& w) const;
  std::string workloadDir(const std::string& id) const;
  absl::Status persistSpecLocked(const Workload& w);
  void publishEndpointsLocked(const Workload& w);

  ProcessRuntimeOptions options_;
  mutable std::mutex mutex_;
  std::map<std::string, std::unique_ptr<Workload>> workloads_;
  std::vector<std::unique_ptr<Instance>> orphans_;          // stopping, their workload is gone
  std::map<std::string, std::string> last_reported_;        // workload id -> status fingerprint
  std::map<std::string, std::string> published_endpoints_;  // workload id -> file contents
  bool stopping_ = false;
  bool draining_ = false;  // shutdown(true): stop everything, start nothing
  std::thread thread_;
};

}  // namespace krane::runtime
