#include "agent/agent.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/clock.h"
#include "common/files.h"
#include "common/host_port.h"
#include "common/status.h"
#include "common/strings.h"
#include "common/version.h"
#include "spdlog/spdlog.h"

namespace krane::agent {
namespace {

// The dispatcher's ledger is the cursor store.
class StoreLedger final : public ResourceLedger {
 public:
  explicit StoreLedger(ipc::CursorStore& store) : store_(store) {}
  bool shouldApply(const std::string& type, const std::string& id, uint64_t version) override {
    return store_.shouldApply(type, id, version);
  }
  void recordApplied(const std::string& type, const std::string& id, uint64_t version) override {
    if (auto st = store_.recordApplied(type, id, version); !st.ok()) {
      spdlog::error("agent: cursor store: {} (type={} id={} version={})", st.message(), type, id,
                    version);
    }
  }
  void recordSynced(const std::string& type, const std::string& id, uint64_t version) override {
    if (auto st = store_.replaceApplied(type, id, version); !st.ok()) {
      spdlog::error("agent: cursor store: {} (type={} id={} version={})", st.message(), type, id,
                    version);
    }
  }
  void retainOnly(const std::map<std::string, std::set<std::string>>& ids) override {
    std::vector<ipc::layout::ResourceKey> keep;
    for (const auto& [type, set] : ids) {
      for (const auto& id : set) keep.push_back(ipc::layout::resourceKey(type, id));
    }
    if (const uint64_t n = store_.retainOnly(std::move(keep)); n > 0) {
      spdlog::info("agent: the full sync did not contain {} tracked resources; forgotten", n);
    }
  }
  void forget(const std::string& type, const std::string& id) override { store_.forget(type, id); }
  void park(const std::string& type, const std::string& id, uint64_t version, int attempts,
            const std::string& error) override {
    ipc::ParkedEvent event;
    event.type = type;
    event.id = id;
    event.version = version;
    event.attempts = static_cast<uint32_t>(attempts);
    event.last_error = error;
    if (auto st = store_.park(event); !st.ok())
      spdlog::error("agent: cannot park type={} id={}: {}", type, id, st.message());
  }
  void unpark(const std::string& type, const std::string& id) override { store_.unpark(type, id); }

 private:
  ipc::CursorStore& store_;
};

// A channel to krane-ctrl (its gRPC port or its watch listener), pinging as
// control_plane.keepalive_ms says.
std::shared_ptr<grpc::Channel> dial(const AgentConfig::ControlPlane& cp, const std::string& address,
                                    const std::shared_ptr<grpc::ChannelCredentials>& credentials) {
  grpc::ChannelArguments args;
  if (cp.keepalive.count() > 0) {
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, static_cast<int>(cp.keepalive.count()));
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, static_cast<int>(cp.keepalive_timeout.count()));
    // Between heartbeats no call is open, and a Watch sends nothing after its request: ping
    // all the same (by default gRPC stops after two pings without data of its own).
    args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  }
  return grpc::CreateCustomChannel(address, credentials, args);
}

}  // namespace

Agent::Agent(AgentConfig config, std::string host_binary, LeaseClientFactory lease_clients)
    : config_(std::move(config)),
      host_binary_(std::move(host_binary)),
      lease_clients_(std::move(lease_clients)) {}

Agent::~Agent() { stop(); }

absl::Status Agent::start() {
  const std::vector<std::pair<std::string, absl::Status (Agent::*)()>> steps = {
      {"state directory", &Agent::openStateDir},
      // A standby waits here, holding nothing (the cursor store admits one agent at a time).
      {"leader election", &Agent::startLeaderElection},
      {"cursor store", &Agent::openCursorStore},
      {"plugins", &Agent::startPlugins},
      {"control plane", &Agent::connect},
      {"reporter", &Agent::startReporter},
      {"dispatcher", &Agent::startDispatcher},
      {"watcher", &Agent::startWatcher},
  };
  for (const auto& [name, step] : steps) {
    absl::Status status = (this->*step)();
    if (!status.ok()) {
      stop();
      return absl::Status(status.code(),
                          strCat("start-up step \"", name, "\" failed: ", status.message()));
    }
    started_.push_back(name);
  }
  spdlog::info("agent: running region={} agent_id={} watermark={} plugins={}", config_.region,
               config_.agent_id, tracker_->watermark(), plugins_.size());
  return absl::OkStatus();
}

absl::Status Agent::openStateDir() {
  // Private: it holds plugin configurations (credentials), the cursor store and host sockets.
  if (auto st = makePrivateDir(config_.state_dir); !st.ok()) {
    return absl::FailedPreconditionError(strCat("state_dir: ", toStd(st.message())));
  }
  if (::access(config_.state_dir.c_str(), W_OK) != 0) {
    return absl::PermissionDeniedError(strCat("state_dir ", config_.state_dir, " is not writable"));
  }
  return absl::OkStatus();
}

absl::Status Agent::openCursorStore() {
  ipc::CursorStoreOptions options;
  options.region = config_.region;
  KRANE_ASSIGN_OR_RETURN(store_, ipc::CursorStore::open(config_.state_dir, options));
  tracker_ = std::make_unique<WatermarkTracker>(store_->watermark());
  ledger_ = std::make_unique<StoreLedger>(*store_);
  persister_ = std::thread([this] {
    auto last_flush = std::chrono::steady_clock::now();
    while (!stopping_) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      persistWatermark();
      // An in-process plugin lives as long as the agent does: its heartbeat is the agent's.
      {
        std::lock_guard lock(persist_mutex_);
        for (int slot : in_process_slots_) store_->heartbeat(slot);
      }
      if (std::chrono::steady_clock::now() - last_flush > std::chrono::seconds(5)) {
        (void)store_->flush();
        last_flush = std::chrono::steady_clock::now();
      }
    }
  });
  return absl::OkStatus();
}

void Agent::persistWatermark() {
  std::lock_guard lock(persist_mutex_);
  if (store_ && tracker_) store_->advanceWatermark(tracker_->watermark());
}

absl::Status Agent::startPlugins() {
  std::map<std::string, std::string> owner;
  auto report = [this](const plugin::v1::StatusReport& r) {
    if (!reporter_) return;
    switch (r.report_case()) {
      // A plugin may not know the region (it serves this agent's only): fill it in.
      case plugin::v1::StatusReport::kDeployment: {
        auto d = r.deployment();
        if (d.region().empty()) d.set_region(config_.region);
        reporter_->report(d);
        break;
      }
      case plugin::v1::StatusReport::kSentinel: {
        auto s = r.sentinel();
        if (s.region().empty()) s.set_region(config_.region);
        reporter_->report(s);
        break;
      }
      case plugin::v1::StatusReport::kResource: {
        auto res = r.resource();
        if (res.region().empty()) res.set_region(config_.region);
        reporter_->report(res);
        break;
      }
      default:
        break;
    }
  };
  for (const auto& p : config_.plugins) {
    std::shared_ptr<PluginEndpoint> endpoint;
    if (p.isolation == "in_process") {
      HostCallbacks callbacks;
      callbacks.report_status = report;
      KRANE_ASSIGN_OR_RETURN(auto loaded, loadPlugin(p.path, p.config_json, callbacks));
      KRANE_ASSIGN_OR_RETURN(int slot, store_->registerPlugin(p.name));
      endpoint = std::make_shared<InProcessEndpoint>(
          std::move(loaded), [this, slot](const cluster::v1::Change& c, const absl::Status& st) {
            if (st.ok()) {
              store_->countApplied(slot);
              store_->ackPlugin(slot, c.version());
            } else {
              store_->countFailed(slot);
            }
          });
      store_->setPluginPid(slot, ::getpid());
      store_->heartbeat(slot);
      {
        std::lock_guard lock(persist_mutex_);
        in_process_slots_.push_back(slot);
      }
    } else {
      HostOptions options;
      options.name = p.name;
      options.plugin_path = p.path;
      options.config_json = p.config_json;
      options.workers = p.workers;
      options.call_timeout = p.call_timeout;
      options.cancel_grace = p.cancel_grace;
      options.host_binary = host_binary_;
      options.state_dir = config_.state_dir;
      KRANE_ASSIGN_OR_RETURN(int slot, store_->registerPlugin(p.name));
      options.store_dir = config_.state_dir;
      options.store_slot = slot;
      auto host = std::make_shared<HostEndpoint>(options, report);
      host->onRestart([this, slot] { store_->recordRestart(slot); });
      host->onRedeliver([this, slot](uint64_t n) { store_->countRedelivered(slot, n); });
      KRANE_RETURN_IF_ERROR(host->start());
      hosts_.push_back(host);
      endpoint = host;
    }
    KRANE_ASSIGN_OR_RETURN(const int slot, store_->findPlugin(p.name));
    for (const auto& type : endpoint->resourceTypes()) {
      slot_by_type_[type] = slot;
      auto [it, inserted] = owner.emplace(type, p.name);
      if (!inserted) {
        return absl::FailedPreconditionError(strCat("plugins ", it->second, " and ", p.name,
                                                    " both claim resource type \"", type, "\""));
      }
    }
    spdlog::info("agent: plugin {} ready isolation={} types={}", p.name, p.isolation,
                 endpoint->resourceTypes().size());
    plugins_.push_back(std::move(endpoint));
  }
  return absl::OkStatus();
}

absl::Status Agent::connect() {
  const auto& cp = config_.control_plane;
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (!cp.ca_file.empty()) {
    grpc::SslCredentialsOptions tls;
    KRANE_ASSIGN_OR_RETURN(tls.pem_root_certs, readFile(cp.ca_file, "control_plane.ca_file"));
    if (!cp.cert_file.empty()) {
      KRANE_ASSIGN_OR_RETURN(tls.pem_cert_chain, readFile(cp.cert_file, "control_plane.cert_file"));
      KRANE_ASSIGN_OR_RETURN(tls.pem_private_key, readFile(cp.key_file, "control_plane.key_file"));
    }
    credentials = grpc::SslCredentials(tls);
  }
  channel_ = dial(cp, cp.address, credentials);
  credentials_ = credentials;
  // The watch listener speaks TLS when the gRPC port does: the same credentials.
  watch_channel_ = cp.watch_address.empty() || cp.watch_address == AgentConfig::kWatchAddressOff
                       ? channel_
                       : dial(cp, cp.watch_address, credentials);
  return absl::OkStatus();
}

void Agent::onHeartbeatAnswer(const cluster::v1::HeartbeatResponse& answer) {
  if (!config_.control_plane.watch_address.empty()) return;
  // A replica that serves no listener (another replica's answer, or one being reconfigured)
  // does not move the stream back at once; kListenerGoneAnswers such answers in a row (no
  // replica told of one all that time: the listener was turned off) do. Streams that keep
  // failing there, while the gRPC port answers, leave it for a while (Watcher::preferChannel).
  std::string address;
  if (answer.watch_listener_port() != 0) {
    auto [host, port] = splitHostPort(config_.control_plane.address);
    address = strCat(host, ":", answer.watch_listener_port());
  }
  {
    // Most answers repeat what the last said: they do not wait for a leadership change.
    std::lock_guard lock(listener_mutex_);
    if (!address.empty()) {
      listener_gone_answers_ = 0;
    } else if (listener_told_.empty() || ++listener_gone_answers_ < kListenerGoneAnswers) {
      return;
    }
    if (address == listener_told_) return;
    listener_told_ = address;
  }
  if (address.empty()) {
    spdlog::info(
        "agent: krane-ctrl told of no watch listener in {} heartbeats; watching through "
        "control_plane.address",
        kListenerGoneAnswers);
  } else {
    spdlog::info("agent: krane-ctrl serves Watch on its watch listener; watching at {}", address);
  }
  std::lock_guard lock(watcher_mutex_);
  listener_address_ = address;
  listener_channel_ =
      address.empty() ? nullptr : dial(config_.control_plane, address, credentials_);
  if (watcher_) watcher_->preferChannel(listener_channel_, listener_address_);
}

absl::Status Agent::startReporter() {
  ReporterOptions options;
  options.region = config_.region;
  options.agent_id = config_.agent_id;
  options.token = config_.control_plane.token;
  options.build_version = kVersion;
  options.heartbeat_interval = config_.reporter.heartbeat_interval;
  options.max_pending = config_.reporter.max_pending;
  options.on_heartbeat = [this](const cluster::v1::HeartbeatResponse& answer) {
    onHeartbeatAnswer(answer);
  };
  reporter_ =
      std::make_unique<Reporter>(channel_, options, [this](cluster::v1::HeartbeatRequest& beat) {
        beat.set_applied_version(tracker_->watermark());
        beat.set_is_leader(isLeader());
        beat.set_parked_events(static_cast<uint32_t>(store_->listParked().size()));
        std::lock_guard lock(dispatcher_mutex_);  // started after the reporter, stopped before
        if (dispatcher_)
          beat.set_retrying_events(static_cast<uint32_t>(dispatcher_->stats().retrying));
        for (size_t i = 0; i < plugins_.size() && i < config_.plugins.size(); ++i) {
          auto* info = beat.add_plugins();
          info->set_name(config_.plugins[i].name);
          for (const auto& t : plugins_[i]->resourceTypes()) info->add_resource_types(t);
        }
      });
  reporter_->start();
  return absl::OkStatus();
}

absl::Status Agent::startDispatcher() {
  auto dispatcher = makeDispatcher();
  std::lock_guard lock(dispatcher_mutex_);
  dispatcher_ = std::move(dispatcher);
  return absl::OkStatus();
}

std::shared_ptr<Dispatcher> Agent::dispatcher() {
  std::lock_guard lock(dispatcher_mutex_);
  return dispatcher_;
}

std::shared_ptr<Dispatcher> Agent::makeDispatcher() {
  DispatcherOptions options;
  options.max_attempts = config_.dispatch.max_attempts;
  options.region = config_.region;
  options.batch = static_cast<size_t>(config_.dispatch.batch);
  for (size_t i = 0; i < plugins_.size() && i < config_.plugins.size(); ++i)
    options.workers_by_plugin[plugins_[i]->name()] = config_.plugins[i].workers;
  options.on_sync_end = [this](uint64_t version) {
    // The sync's version replaces the persisted one, even when lower (a restored database).
    std::lock_guard lock(persist_mutex_);
    store_->setWatermark(version);
    store_->recordFullSync(version, unixMillis());
  };
  return std::make_shared<Dispatcher>(
      plugins_, *ledger_, *tracker_,
      [this](const cluster::v1::Change& change, const absl::Status& error, int attempts) {
        if (auto it = slot_by_type_.find(change.resource().type()); it != slot_by_type_.end())
          store_->countParked(it->second);
        cluster::v1::ReportResourceStatusRequest failed;
        failed.set_type(change.resource().type());
        failed.set_id(change.resource().id());
        failed.set_region(change.resource().region().empty() ? config_.region
                                                             : change.resource().region());
        failed.set_phase(cluster::v1::RESOURCE_PHASE_FAILED);
        // The version that failed, so the report is ordered after the status it replaces.
        failed.set_version(std::max(change.version(), change.resource().version()));
        failed.set_message(std::string(toStd(error.message())).substr(0, 4000));
        auto* e = failed.mutable_apply_error();
        e->set_code(static_cast<int>(error.code()));
        e->set_message(std::string(toStd(error.message())).substr(0, 4000));
        e->set_retryable(!absl::IsInvalidArgument(error));  // a refused spec needs a new one
        e->set_attempts(static_cast<uint32_t>(attempts));
        reporter_->report(failed);
      },
      options);
}

absl::Status Agent::startLeaderElection() {
  if (config_.leader.mode == "none") return absl::OkStatus();
  std::string who_leads;
  if (config_.leader.mode == "lease") {
    if (!lease_clients_) {
      return absl::FailedPreconditionError(
          "leader.mode: lease needs a Kubernetes API server, and this build of the agent has no "
          "Kubernetes client; use lockfile or none");
    }
    auto client = lease_clients_(config_);
    if (!client.ok()) return withContext(client.status(), "leader.mode lease");
    leader_ = std::make_unique<LeaseElector>(*std::move(client), config_.agent_id,
                                             config_.leader.lease_duration);
    who_leads = "the agent holding the region's Lease";
  } else {
    leader_ = std::make_unique<FileLockElector>(config_.state_dir, config_.agent_id);
  }
  // Before start-up reaches the watcher, gaining leadership is what it waits for; after, a
  // leader that was demoted and becomes leader again resumes applying.
  leader_->start([this](bool leader) { onLeadership(leader); });
  bool announced = false;
  while (!leader_->isLeader()) {
    if (stopping_) return absl::CancelledError("stopped while standing by");
    if (!announced) {
      if (who_leads.empty()) who_leads = FileLockElector::holder(config_.state_dir);
      if (who_leads.empty()) who_leads = "another agent";
      spdlog::info("agent: standing by; {} leads region {}", who_leads, config_.region);
      announced = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return absl::OkStatus();
}

absl::Status Agent::startWatcher() {
  {
    std::lock_guard lock(watcher_mutex_);
    ready_ = true;
  }
  // Leadership may have been lost (and regained) during start-up; from here on every change is
  // handled as it comes.
  onLeadership(!leader_ || leader_->isLeader());
  return absl::OkStatus();
}

void Agent::onLeadership(bool leader) {
  std::lock_guard lock(watcher_mutex_);
  if (!ready_) return;
  // startWatcher asks while start-up ends, outside this lock: leadership lost since then was
  // already handled (with no watcher to stop), and must not start one now.
  if (leader && leader_ && !leader_->isLeader()) return;
  if (leader && !watcher_ && !stopping_) {
    auto dispatcher = this->dispatcher();
    if (!dispatcher) {
      dispatcher = makeDispatcher();
      std::lock_guard d(dispatcher_mutex_);
      dispatcher_ = dispatcher;
    }
    WatcherOptions options;
    options.region = config_.region;
    options.agent_id = config_.agent_id;
    options.token = config_.control_plane.token;
    options.resync_interval = config_.resync_interval;
    options.last_full_sync_unix_ms = store_->snapshot().full_sync_unix_ms;
    options.epoch = store_->feedEpoch();
    options.on_epoch = [this](uint64_t epoch) {
      std::lock_guard lock(persist_mutex_);
      store_->setFeedEpoch(epoch);
    };
    options.reconnect = {config_.reconnect_min, 2.0, config_.reconnect_max, 0.8};
    watcher_ = std::make_unique<Watcher>(watch_channel_, options, *dispatcher,
                                         [this] { return tracker_->watermark(); });
    if (listener_channel_) watcher_->preferChannel(listener_channel_, listener_address_);
    watcher_->start();
    spdlog::info("agent: {} applies region {} from version={}", config_.agent_id, config_.region,
                 tracker_->watermark());
    if (reporter_) reporter_->beatNow();
  } else if (!leader) {
    // Another agent may take over once the lease runs out: stop applying now. The dispatcher
    // first (it returns once no plugin call is under way, and unblocks a watcher waiting on it),
    // then the watcher that feeds it. What was queued is dropped unacknowledged: the next term
    // (here or on another agent) delivers it again from the watermark.
    std::shared_ptr<Dispatcher> dispatcher;
    {
      std::lock_guard d(dispatcher_mutex_);
      dispatcher = std::move(dispatcher_);
    }
    // A call under way may finish within a sixth of the lease duration (the renew deadline
    // leaves a third); then the plugin hosts are killed, well before another agent may lead.
    if (dispatcher) {
      dispatcher->stop(
          std::chrono::milliseconds(0),
          std::chrono::duration_cast<std::chrono::milliseconds>(config_.leader.lease_duration) / 6);
    }
    if (watcher_) {
      watcher_->stop();
      watcher_.reset();
    }
    dispatcher.reset();
    if (tracker_) tracker_->forgetPending();
    if (!stopping_) {
      spdlog::warn("agent: {} is no longer the leader of region {}; stopped applying at version={}",
                   config_.agent_id, config_.region, tracker_ ? tracker_->watermark() : 0);
    }
    if (reporter_) reporter_->beatNow();
  }
}

void Agent::stop() {
  if (stopping_.exchange(true)) return;
  // Still the leader: applies what is queued for a moment, then stops: a change retried for a
  // transient error (or a full sync waiting for one) must not hold the shutdown, and stays
  // unacknowledged. Leadership lost meanwhile stops it at once.
  if (auto dispatcher = this->dispatcher()) dispatcher->stop(std::chrono::seconds(5));
  {
    std::lock_guard lock(watcher_mutex_);
    if (watcher_) watcher_->stop();
    watcher_.reset();
  }
  // Only now is leadership given up (a Lease handed back): nothing applies any more.
  if (leader_) leader_->stop();
  persistWatermark();
  {
    std::lock_guard lock(dispatcher_mutex_);
    dispatcher_.reset();
  }
  if (reporter_) reporter_->stop();
  for (auto& h : hosts_) h->stop();
  if (persister_.joinable()) persister_.join();
  if (store_) (void)store_->flush();
}

}  // namespace krane::agent
