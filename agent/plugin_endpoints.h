// The two ways the dispatcher reaches a plugin:
// - InProcessEndpoint: the plugin's .so loaded into the agent (isolation: in_process).
// - HostEndpoint: the plugin in its own krane-plugin-host process, over ZeroMQ (the default).
//   A supervisor restarts a host that died or stopped sending heartbeats, with exponential
//   backoff; calls that were in flight fail with UNAVAILABLE, so the dispatcher retries them
//   and they are redelivered to the new host (at-least-once; plugins apply idempotently).
//   The host runs plugin calls off its socket thread, so a long call does not stop its
//   heartbeats. A call unanswered after `call_timeout` is cancelled in the host and fails with
//   DEADLINE_EXCEEDED only once the host confirmed that it no longer runs (it had not started,
//   or it returned); a host that does not confirm within `cancel_grace` is restarted. So a
//   retry never runs beside the call it retries.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "agent/call_limits.h"
#include "agent/dispatcher.h"
#include "agent/frame_channel.h"
#include "agent/plugin_loader.h"
#include "common/backoff.h"

namespace krane::agent {

using StatusSink = std::function<void(const plugin::v1::StatusReport&)>;

class InProcessEndpoint final : public PluginEndpoint {
 public:
  // `on_outcome` sees every apply or delete and its result (the agent counts them in the
  // plugin's cursor store slot, as a host process does for its own).
  using Outcome = std::function<void(const cluster::v1::Change&, const absl::Status&)>;
  explicit InProcessEndpoint(std::unique_ptr<LoadedPlugin> plugin, Outcome on_outcome = {})
      : plugin_(std::move(plugin)), on_outcome_(std::move(on_outcome)) {}
  std::string name() const override { return plugin_->name(); }
  std::vector<std::string> resourceTypes() const override { return plugin_->resourceTypes(); }
  absl::Status handle(const cluster::v1::Change& change) override;
  absl::Status syncBegin(uint64_t snapshot_version) override {
    return plugin_->syncBegin(snapshot_version);
  }
  absl::Status syncEnd(uint64_t version, const std::string& region,
                       const std::map<std::string, std::set<std::string>>& ids) override;

 private:
  std::unique_ptr<LoadedPlugin> plugin_;
  Outcome on_outcome_;
};

struct HostOptions {
  std::string name;  // from the agent's config
  std::string plugin_path;
  std::string config_json = "{}";
  size_t workers = 4;
  std::string host_binary;  // krane-plugin-host
  std::string state_dir;    // sockets and logs live here
  std::string store_dir;    // the cursor store's directory; empty: no slot
  int store_slot = -1;      // the plugin's slot there (the host writes heartbeats and counters)
  std::chrono::milliseconds heartbeat{500};
  int missed_heartbeats = 6;  // then the host counts as hung and is restarted
  std::chrono::milliseconds start_timeout{10000};
  std::chrono::milliseconds call_timeout = kDefaultCallTimeout;
  // After a call's deadline: how long the host has to confirm that the cancelled call no longer
  // runs before it is restarted (which ends the call for sure).
  std::chrono::milliseconds cancel_grace = kDefaultCancelGrace;
  BackoffPolicy restart{std::chrono::milliseconds(200), 2.0, std::chrono::milliseconds(30000), 0.2};
};

struct HostStats {
  uint64_t restarts = 0;
  uint64_t redelivered = 0;  // calls failed by a host death (retried by the dispatcher)
  uint64_t cancelled = 0;    // calls whose deadline passed, cancelled in the host
  int pid = 0;
};

class HostEndpoint final : public PluginEndpoint {
 public:
  HostEndpoint(HostOptions options, StatusSink on_status);
  ~HostEndpoint() override;

  // Called with each restart (the agent records it in the plugin's cursor store slot).
  void onRestart(std::function<void()> callback) { on_restart_ = std::move(callback); }
  // Called with the number of calls a host death left unanswered (the dispatcher retries them,
  // so they are redelivered to the next host).
  void onRedeliver(std::function<void(uint64_t)> callback) { on_redeliver_ = std::move(callback); }
  // Starts the host and waits for its hello; fails with the host's own reason (for example the
  // loader's refusal of the plugin) when it does not come up.
  absl::Status start();
  void stop();

  std::string name() const override { return name_; }
  std::vector<std::string> resourceTypes() const override { return types_; }
  absl::Status handle(const cluster::v1::Change& change) override;
  // Sends the changes together and waits for every answer (one round trip for the batch).
  std::vector<absl::Status> handleBatch(
      const std::vector<const cluster::v1::Change*>& changes) override;
  absl::Status syncBegin(uint64_t snapshot_version) override;
  absl::Status syncEnd(uint64_t version, const std::string& region,
                       const std::map<std::string, std::set<std::string>>& ids) override;
  // Kills the host (its supervisor restarts it) and fails the calls waiting for it at once.
  void abandonCalls(const std::string& why) override;
  HostStats stats() const;

 private:
  absl::Status launch();  // one incarnation: spawn, connect, hello
  void supervise();
  void onFrame(plugin::v1::Frame&& frame);
  void answerLocked(uint64_t sequence, absl::Status status);
  absl::Status call(plugin::v1::Frame frame, uint64_t sequence);
  // Waits for the answers of `sequences` (sent together) until their deadline; cancels in the
  // host those still unanswered then and waits until the host confirms they no longer run.
  std::vector<absl::Status> awaitAnswers(const std::vector<uint64_t>& sequences,
                                         std::vector<std::future<absl::Status>>& results);
  // Fails every unanswered call; `redeliver`: they are lost to a host death (not a stop).
  void failPending(const std::string& why, bool redeliver);
  void killHost();

  HostOptions options_;
  StatusSink on_status_;
  std::function<void()> on_restart_;
  std::function<void(uint64_t)> on_redeliver_;
  std::string name_;
  std::vector<std::string> types_;

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::unique_ptr<FrameChannel> channel_;
  int pid_ = -1;
  uint64_t incarnation_ = 0;
  bool hello_ = false;
  std::string hello_error_;
  std::chrono::steady_clock::time_point last_heartbeat_;
  uint64_t next_sequence_ = 1;
  std::map<uint64_t, std::promise<absl::Status>> pending_;
  // Set by a call whose cancel the host did not confirm in time: the supervisor restarts it.
  std::string restart_reason_;
  std::atomic<bool> stopping_{false};
  HostStats stats_;
  std::thread supervisor_;
};

}  // namespace krane::agent
