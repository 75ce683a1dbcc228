// The agent of one region: start-up is an ordered list of named steps, teardown always runs in
// reverse order.
//
//   state directory -> leader election (a standby waits here) -> cursor store -> plugins
//   -> control plane channel -> reporter -> dispatcher -> watcher
//
// Only the leader applies. When leadership is lost (a lease not renewed in time), the watcher
// and the dispatcher stop at once: no plugin is called once that returns, and what was queued
// is dropped unacknowledged. Leadership regained starts a fresh dispatcher and watcher, which
// resume from the watermark.
//
// The durable watermark lives in the cursor store: a restarted agent (or an upgraded pod on the
// same node) resumes from it without a full sync.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "agent/config.h"
#include "agent/dispatcher.h"
#include "agent/leader.h"
#include "agent/plugin_endpoints.h"
#include "agent/reporter.h"
#include "agent/watcher.h"
#include "agent/watermark.h"
#include "ipc/cursor_store.h"

namespace krane::agent {

class Agent {
 public:
  // Makes the Lease client of `leader.mode: lease`. The agent core has no Kubernetes dependency:
  // the binary that links the Kubernetes client provides this.
  using LeaseClientFactory =
      std::function<absl::StatusOr<std::shared_ptr<LeaseClient>>(const AgentConfig&)>;

  // `host_binary`: the krane-plugin-host to run for plugins with process isolation.
  Agent(AgentConfig config, std::string host_binary, LeaseClientFactory lease_clients = {});
  ~Agent();

  // Runs the start-up steps; on failure stops what was started and names the failed step.
  absl::Status start();
  void stop();

  bool isLeader() const { return leader_ && leader_->isLeader(); }
  uint64_t watermark() const { return tracker_ ? tracker_->watermark() : 0; }

 private:
  absl::Status openStateDir();
  absl::Status openCursorStore();
  absl::Status startPlugins();
  absl::Status connect();
  absl::Status startReporter();
  absl::Status startDispatcher();
  std::shared_ptr<Dispatcher> makeDispatcher();
  std::shared_ptr<Dispatcher> dispatcher();
  absl::Status startLeaderElection();
  absl::Status startWatcher();
  void onLeadership(bool leader);
  void persistWatermark();

  AgentConfig config_;
  std::string host_binary_;
  LeaseClientFactory lease_clients_;
  std::unique_ptr<ipc::CursorStore> store_;
  std::unique_ptr<WatermarkTracker> tracker_;
  std::unique_ptr<ResourceLedger> ledger_;
  std::vector<std::shared_ptr<PluginEndpoint>> plugins_;
  std::vector<std::shared_ptr<HostEndpoint>> hosts_;
  std::shared_ptr<grpc::Channel> channel_;
  std::shared_ptr<grpc::Channel> watch_channel_;  // control_plane.watch_address, or channel_
  std::shared_ptr<grpc::ChannelCredentials> credentials_;
  // With no control_plane.watch_address: the watch listener krane-ctrl told of (port, on the
  // host of control_plane.address), for the watchers of this and later terms.
  void onHeartbeatAnswer(const cluster::v1::HeartbeatResponse& answer);
  std::shared_ptr<grpc::Channel> listener_channel_;  // under watcher_mutex_
  std::string listener_address_;                     // under watcher_mutex_
  std::mutex listener_mutex_;
  // Under listener_mutex_: the listener address heartbeats told last ("" none), and how many
  // answers in a row told of none since.
  std::string listener_told_;
  int listener_gone_answers_ = 0;
  static constexpr int kListenerGoneAnswers = 30;
  std::unique_ptr<Reporter> reporter_;
  // One per term of leadership: made when the agent becomes leader, stopped and dropped when it
  // stops being leader (what was queued is delivered again from the watermark next term).
  std::shared_ptr<Dispatcher> dispatcher_;
  std::mutex dispatcher_mutex_;  // dispatcher_ set and reset, against the heartbeat reading it
  std::unique_ptr<LeaderElector> leader_;
  // Serialises leadership changes (watcher_, dispatcher_ made or dropped, ready_).
  std::mutex watcher_mutex_;
  bool ready_ = false;  // start-up reached the watcher: leadership changes apply from now on
  std::mutex persist_mutex_;
  std::vector<int> in_process_slots_;        // cursor store slots the agent heartbeats for
  std::map<std::string, int> slot_by_type_;  // resource type -> its plugin's slot  // orders
                                             // watermark writes: persister and full-sync end
  std::unique_ptr<Watcher> watcher_;
  std::atomic<bool> stopping_{false};
  std::thread persister_;
  std::vector<std::string> started_;
};

}  // namespace krane::agent
