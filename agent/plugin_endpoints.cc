#include "agent/plugin_endpoints.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "common/files.h"
#include "common/strings.h"
#include "spdlog/spdlog.h"

namespace krane::agent {
namespace {

absl::Status nackStatus(const plugin::v1::Nack& nack) {
  return absl::Status(static_cast<absl::StatusCode>(nack.code()), nack.message());
}

plugin::v1::SyncEnd syncEndFrame(uint64_t version, const std::string& region,
                                 const std::map<std::string, std::set<std::string>>& ids) {
  plugin::v1::SyncEnd end;
  end.set_snapshot_version(version);
  end.set_region(region);
  for (const auto& [type, set] : ids) {
    auto* r = end.add_resources();
    r->set_resource_type(type);
    for (const auto& id : set) r->add_ids(id);
  }
  return end;
}

std::string lastLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::string last;
  while (std::getline(in, line)) {
    if (!line.empty()) last = line;
  }
  return last;
}

}  // namespace

absl::Status InProcessEndpoint::handle(const cluster::v1::Change& change) {
  absl::Status status = change.op() == cluster::v1::CHANGE_OP_DELETE ? plugin_->remove(change)
                                                                     : plugin_->apply(change);
  if (on_outcome_) on_outcome_(change, status);
  return status;
}

absl::Status InProcessEndpoint::syncEnd(uint64_t version, const std::string& region,
                                        const std::map<std::string, std::set<std::string>>& ids) {
  return plugin_->syncEnd(syncEndFrame(version, region, ids));
}

HostEndpoint::HostEndpoint(HostOptions options, StatusSink on_status)
    : options_(std::move(options)), on_status_(std::move(on_status)), name_(options_.name) {}

HostEndpoint::~HostEndpoint() { stop(); }

absl::Status HostEndpoint::start() {
  if (auto st = launch(); !st.ok()) return st;
  supervisor_ = std::thread([this] { supervise(); });
  return absl::OkStatus();
}

absl::Status HostEndpoint::launch() {
  std::unique_lock lock(mutex_);
  ++incarnation_;
  hello_ = false;
  hello_error_.clear();
  const std::string socket =
      strCat(options_.state_dir, "/host-", options_.name, "-", incarnation_, ".sock");
  ::unlink(socket.c_str());
  const std::string config_file = strCat(options_.state_dir, "/host-", options_.name, ".json");
  const std::string log = strCat(options_.state_dir, "/host-", options_.name, ".log");
  // The configuration may hold credentials: only the agent's user may read it.
  if (auto st = writePrivateFile(config_file, options_.config_json); !st.ok()) return st;
  channel_ =
      std::make_unique<FrameChannel>(strCat("ipc://", socket), FrameChannel::Mode::kBind,
                                     [this](plugin::v1::Frame&& f) { onFrame(std::move(f)); });
  if (auto st = channel_->start(); !st.ok()) return st;
  // ZeroMQ creates the socket with the process umask; only the agent's user may connect.
  if (::chmod(socket.c_str(), S_IRUSR | S_IWUSR) != 0) {
    return absl::UnavailableError(
        strCat("cannot make ", socket, " private: ", std::strerror(errno)));
  }

  std::vector<std::string> argv = {options_.host_binary,
                                   "--plugin",
                                   options_.plugin_path,
                                   "--endpoint",
                                   strCat("ipc://", socket),
                                   "--config-file",
                                   config_file,
                                   "--workers",
                                   strCat(options_.workers),
                                   "--heartbeat-ms",
                                   strCat(options_.heartbeat.count())};
  if (!options_.store_dir.empty() && options_.store_slot >= 0) {
    argv.insert(argv.end(),
                {"--store-dir", options_.store_dir, "--store-slot", strCat(options_.store_slot)});
  }
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(1);
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    std::fprintf(stderr, "krane-plugin-host: error: cannot run %s\n", args[0]);
    ::_exit(127);
  }
  pid_ = pid;
  stats_.pid = pid;
  last_heartbeat_ = std::chrono::steady_clock::now();
  // Wait for the hello, noticing at once a host that exits instead (a refused plugin).
  const auto deadline = std::chrono::steady_clock::now() + options_.start_timeout;
  bool exited = false;
  while (!hello_ && hello_error_.empty() && !exited &&
         std::chrono::steady_clock::now() < deadline) {
    changed_.wait_for(lock, std::chrono::milliseconds(50),
                      [&] { return hello_ || !hello_error_.empty(); });
    int status = 0;
    if (!hello_ && ::waitpid(pid_, &status, WNOHANG) == pid_) {
      exited = true;
      pid_ = -1;
    }
  }
  const bool up = exited;
  if (hello_) {
    spdlog::info("agent: plugin host {} up pid={} types={}", name_, pid_, types_.size());
    return absl::OkStatus();
  }
  const std::string refused = hello_error_;
  lock.unlock();
  killHost();
  if (!refused.empty()) {
    spdlog::error("agent: plugin host {} refused: {}", options_.name, refused);
    return absl::FailedPreconditionError(
        strCat("plugin ", options_.name, " (", options_.plugin_path, ") did not start: ", refused));
  }
  const std::string reason = lastLine(log);
  return absl::FailedPreconditionError(
      strCat("plugin ", options_.name, " (", options_.plugin_path, ") did not start",
             up ? "" : strCat(" within ", options_.start_timeout.count(), " ms"),
             reason.empty() ? "" : ": ", reason));
}

void HostEndpoint::onFrame(plugin::v1::Frame&& frame) {
  std::lock_guard lock(mutex_);
  switch (frame.body_case()) {
    case plugin::v1::Frame::kHello:
      // A host built against another plugin ABI would misread what the agent sends it.
      if (auto st = checkAbiVersion(strCat("plugin host ", options_.host_binary),
                                    frame.hello().abi_major(), frame.hello().abi_minor());
          !st.ok()) {
        hello_error_ =
            strCat(toStd(st.message()), ": use the krane-plugin-host of this agent's build");
        changed_.notify_all();
        break;
      }
      name_ = options_.name;
      types_.assign(frame.hello().resource_types().begin(), frame.hello().resource_types().end());
      hello_ = true;
      last_heartbeat_ = std::chrono::steady_clock::now();
      changed_.notify_all();
      break;
    case plugin::v1::Frame::kHeartbeat:
      last_heartbeat_ = std::chrono::steady_clock::now();
      break;
    case plugin::v1::Frame::kAck:
      answerLocked(frame.ack().sequence(), absl::OkStatus());
      break;
    case plugin::v1::Frame::kNack:
      answerLocked(frame.nack().sequence(), nackStatus(frame.nack()));
      break;
    case plugin::v1::Frame::kAnswers:
      for (const auto& ack : frame.answers().acks()) answerLocked(ack.sequence(), absl::OkStatus());
      for (const auto& nack : frame.answers().nacks())
        answerLocked(nack.sequence(), nackStatus(nack));
      break;
    case plugin::v1::Frame::kStatusReport:
      if (on_status_) on_status_(frame.status_report());
      break;
    default:
      spdlog::warn("agent: unexpected frame {} from plugin host {}",
                   static_cast<int>(frame.body_case()), name_);
  }
}

void HostEndpoint::answerLocked(uint64_t sequence, absl::Status status) {
  auto it = pending_.find(sequence);
  if (it != pending_.end()) {
    it->second.set_value(std::move(status));
    pending_.erase(it);
  }
  last_heartbeat_ = std::chrono::steady_clock::now();
}

absl::Status HostEndpoint::call(plugin::v1::Frame frame, uint64_t sequence) {
  std::vector<std::future<absl::Status>> results(1);
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return absl::CancelledError("agent is stopping");
    if (!hello_) return absl::UnavailableError(strCat("plugin host ", name_, " is restarting"));
    results[0] = pending_[sequence].get_future();
    channel_->send(frame);
  }
  return awaitAnswers({sequence}, results)[0];
}

std::vector<absl::Status> HostEndpoint::awaitAnswers(
    const std::vector<uint64_t>& sequences, std::vector<std::future<absl::Status>>& results) {
  const auto deadline = std::chrono::steady_clock::now() + options_.call_timeout;
  std::vector<absl::Status> out(sequences.size());
  std::vector<size_t> late;
  for (size_t i = 0; i < sequences.size(); ++i) {
    if (results[i].wait_until(deadline) == std::future_status::ready) {
      out[i] = results[i].get();
    } else {
      late.push_back(i);
    }
  }
  if (late.empty()) return out;
  // Retrying now could run the call twice at once: first the host must let it go. Its answer
  // (a Nack CANCELLED if it had not started, its result if it was running) says it did; so does
  // a host death, which fails it here.
  {
    std::lock_guard lock(mutex_);
    stats_.cancelled += late.size();
    if (channel_ && hello_) {
      plugin::v1::Frame cancel;
      for (size_t i : late) cancel.mutable_cancel()->add_sequences(sequences[i]);
      channel_->send(cancel);
    }
  }
  spdlog::warn("agent: plugin host {}: {} calls unanswered after {} ms; cancelling them", name_,
               late.size(), options_.call_timeout.count());
  const auto grace = std::chrono::steady_clock::now() + options_.cancel_grace;
  bool confirmed = true;
  std::vector<bool> in_grace(results.size(), false);  // answered before any restart
  for (size_t i : late) {
    in_grace[i] = results[i].wait_until(grace) == std::future_status::ready;
    confirmed = confirmed && in_grace[i];
  }
  if (!confirmed) {
    {
      std::lock_guard lock(mutex_);
      if (restart_reason_.empty()) {
        restart_reason_ =
            strCat("still ran a call ", options_.cancel_grace.count(), " ms after cancelling it");
      }
    }
    // The supervisor's restart (or stop()) fails every pending call.
    for (size_t i : late) results[i].wait();
  }
  for (size_t i : late) {
    const absl::Status ended = results[i].get();
    const std::string late_by =
        strCat("plugin ", name_, " did not answer within ", options_.call_timeout.count(), " ms; ");
    if (in_grace[i] && absl::IsCancelled(ended)) {
      // Never started (it waited behind a slow sibling): an ordinary retry, not a timeout of its
      // own.
      out[i] =
          absl::DeadlineExceededError(strCat(late_by, "the host cancelled it before it started"));
    } else if (in_grace[i]) {
      // It ran to its end, late (its answer may be any code, UNAVAILABLE too): the answer
      // stands. Retried instead, an apply that always takes longer than call_timeout would never
      // count as applied.
      spdlog::warn("agent: plugin host {}: a call answered after its {} ms deadline: {}", name_,
                   options_.call_timeout.count(), ended.ok() ? "OK" : toStd(ended.message()));
      out[i] = ended;
    } else {
      // Only a host restart ended it: this one counts toward parking.
      out[i] = callTimedOut(absl::DeadlineExceededError(
          strCat(late_by, "it ended with the host: ", toStd(ended.message()))));
    }
  }
  return out;
}

absl::Status HostEndpoint::handle(const cluster::v1::Change& change) {
  plugin::v1::Frame frame;
  uint64_t sequence;
  {
    std::lock_guard lock(mutex_);
    sequence = next_sequence_++;
  }
  frame.mutable_event()->set_sequence(sequence);
  *frame.mutable_event()->mutable_change() = change;
  return call(std::move(frame), sequence);
}

std::vector<absl::Status> HostEndpoint::handleBatch(
    const std::vector<const cluster::v1::Change*>& changes) {
  if (changes.size() == 1) return {handle(*changes[0])};
  plugin::v1::Frame frame;
  auto* events = frame.mutable_events();
  std::vector<uint64_t> sequences(changes.size());
  std::vector<std::future<absl::Status>> results(changes.size());
  for (const auto* c : changes) *events->add_events()->mutable_change() = *c;
  {
    std::lock_guard lock(mutex_);
    if (stopping_ || !hello_) {
      const absl::Status why =
          stopping_ ? absl::CancelledError("agent is stopping")
                    : absl::UnavailableError(strCat("plugin host ", name_, " is restarting"));
      return std::vector<absl::Status>(changes.size(), why);
    }
    for (size_t i = 0; i < changes.size(); ++i) {
      sequences[i] = next_sequence_++;
      events->mutable_events(static_cast<int>(i))->set_sequence(sequences[i]);
      results[i] = pending_[sequences[i]].get_future();
    }
    channel_->send(frame);
  }
  return awaitAnswers(sequences, results);
}

absl::Status HostEndpoint::syncBegin(uint64_t snapshot_version) {
  plugin::v1::Frame frame;
  uint64_t sequence;
  {
    std::lock_guard lock(mutex_);
    sequence = next_sequence_++;
  }
  frame.mutable_sync_begin()->set_sequence(sequence);
  frame.mutable_sync_begin()->set_snapshot_version(snapshot_version);
  return call(std::move(frame), sequence);
}

absl::Status HostEndpoint::syncEnd(uint64_t version, const std::string& region,
                                   const std::map<std::string, std::set<std::string>>& ids) {
  plugin::v1::Frame frame;
  uint64_t sequence;
  {
    std::lock_guard lock(mutex_);
    sequence = next_sequence_++;
  }
  *frame.mutable_sync_end() = syncEndFrame(version, region, ids);
  frame.mutable_sync_end()->set_sequence(sequence);
  return call(std::move(frame), sequence);
}

void HostEndpoint::failPending(const std::string& why, bool redeliver) {
  const uint64_t n = pending_.size();
  for (auto& [sequence, promise] : pending_) promise.set_value(absl::UnavailableError(why));
  pending_.clear();
  if (redeliver && n > 0) {
    stats_.redelivered += n;
    if (on_redeliver_) on_redeliver_(n);
  }
}

void HostEndpoint::abandonCalls(const std::string& why) {
  std::lock_guard lock(mutex_);
  if (stopping_ || pending_.empty()) return;
  spdlog::warn("agent: plugin host {}: {}; killing it with {} calls under way", name_, why,
               pending_.size());
  // The supervisor reaps it and starts another; until then calls fail as for a restart.
  if (pid_ > 0) ::kill(pid_, SIGKILL);
  hello_ = false;
  failPending(strCat("plugin host ", name_, ": ", why), /*redeliver=*/false);
}

void HostEndpoint::killHost() {
  int pid;
  {
    std::lock_guard lock(mutex_);
    pid = pid_;
    pid_ = -1;
  }
  if (pid > 0) {
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
  }
  std::unique_ptr<FrameChannel> channel;
  {
    std::lock_guard lock(mutex_);
    channel = std::move(channel_);
  }
  if (channel) channel->stop();
}

void HostEndpoint::supervise() {
  Backoff backoff(options_.restart);
  while (!stopping_) {
    std::this_thread::sleep_for(options_.heartbeat);
    std::string why;
    {
      std::lock_guard lock(mutex_);
      if (stopping_) break;
      int status = 0;
      if (pid_ > 0 && ::waitpid(pid_, &status, WNOHANG) == pid_) {
        why = WIFSIGNALED(status) ? strCat("killed by signal ", WTERMSIG(status))
                                  : strCat("exited with code ", WEXITSTATUS(status));
        pid_ = -1;
      } else if (std::chrono::steady_clock::now() - last_heartbeat_ >
                 options_.heartbeat * options_.missed_heartbeats) {
        why = strCat("missed ", options_.missed_heartbeats, " heartbeats (hung)");
      } else if (!restart_reason_.empty()) {
        why = restart_reason_;
      }
      restart_reason_.clear();
      if (why.empty()) continue;
      hello_ = false;
      failPending(strCat("plugin host ", name_, " ", why, "; it is being restarted"),
                  /*redeliver=*/true);
    }
    spdlog::warn("agent: plugin host {} {}; restarting", name_, why);
    killHost();
    for (;;) {
      if (stopping_) return;
      std::this_thread::sleep_for(backoff.next());
      {
        std::lock_guard lock(mutex_);
        ++stats_.restarts;
      }
      if (on_restart_) on_restart_();
      auto st = launch();
      if (st.ok()) {
        backoff.reset();
        break;
      }
      spdlog::error("agent: restart of plugin host {} failed: {}", name_, st.message());
    }
  }
}

void HostEndpoint::stop() {
  if (stopping_.exchange(true)) return;
  if (supervisor_.joinable()) supervisor_.join();
  {
    std::lock_guard lock(mutex_);
    if (channel_ && hello_) {
      plugin::v1::Frame bye;
      bye.mutable_shutdown()->set_reason("agent stopping");
      channel_->send(bye);
    }
    failPending("agent is stopping", /*redeliver=*/false);
  }
  // Give the host a moment to shut its plugin down, then make sure it is gone.
  for (int i = 0; i < 20; ++i) {
    int status = 0;
    int pid;
    {
      std::lock_guard lock(mutex_);
      pid = pid_;
    }
    if (pid <= 0 || ::waitpid(pid, &status, WNOHANG) == pid) {
      std::lock_guard lock(mutex_);
      pid_ = -1;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  killHost();
}

HostStats HostEndpoint::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

}  // namespace krane::agent
