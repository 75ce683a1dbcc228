#include "plugins/runtime/process/process_runtime.h"

#include <fcntl.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "common/files.h"
#include "common/strings.h"
#include "controlplane/strategy/rolling.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace krane::runtime {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

namespace {

constexpr size_t kOutputLines = 10;

uint64_t fnv1a(std::string_view bytes) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string hex(uint64_t v, int digits) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(static_cast<size_t>(digits), '0');
  for (int i = digits - 1; i >= 0; --i, v >>= 4) out[static_cast<size_t>(i)] = kDigits[v & 15];
  return out;
}

// A file-name-safe form of a workload id, unique thanks to the hash suffix.
std::string safeName(const std::string& id) {
  std::string out;
  for (char c : id)
    out.push_back(
        std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_' ? c : '_');
  if (out.size() > 48) out.resize(48);
  return strCat(out, "-", hex(fnv1a(id), 8));
}

json probeJson(const HttpProbe& p) {
  return {{"path", p.path},
          {"initial_delay_ms", p.initial_delay.count()},
          {"interval_ms", p.interval.count()},
          {"timeout_ms", p.timeout.count()},
          {"failure_threshold", p.failure_threshold}};
}

HttpProbe probeFrom(const json& j) {
  HttpProbe p;
  p.path = j.value("path", "");
  p.initial_delay = std::chrono::milliseconds(j.value("initial_delay_ms", 0));
  p.interval = std::chrono::milliseconds(j.value("interval_ms", 1000));
  p.timeout = std::chrono::milliseconds(j.value("timeout_ms", 1000));
  p.failure_threshold = j.value("failure_threshold", 3);
  return p;
}

json specJson(const WorkloadSpec& s) {
  json j = {{"id", s.id},
            {"image", s.image},
            {"command", s.command},
            {"args", s.args},
            {"env", s.env},
            {"replicas", s.replicas},
            {"liveness", probeJson(s.liveness)},
            {"readiness", probeJson(s.readiness)},
            {"shutdown_signal", s.shutdown_signal},
            {"grace_ms", s.grace.count()},
            {"max_surge", s.max_surge},
            {"max_unavailable", s.max_unavailable},
            {"min_ready_ms", s.min_ready.count()},
            {"labels", s.labels}};
  // Only when set: a spec without one hashes to the revision it had before the field existed,
  // so that instances adopted across an upgrade are not replaced.
  if (!s.health_port_env.empty()) j["health_port_env"] = s.health_port_env;
  return j;
}

WorkloadSpec specFrom(const json& j) {
  WorkloadSpec s;
  s.id = j.at("id").get<std::string>();
  s.image = j.value("image", "");
  s.command = j.value("command", std::vector<std::string>{});
  s.args = j.value("args", std::vector<std::string>{});
  s.env = j.value("env", std::map<std::string, std::string>{});
  s.replicas = j.value("replicas", 1);
  s.liveness = probeFrom(j.value("liveness", json::object()));
  s.readiness = probeFrom(j.value("readiness", json::object()));
  s.health_port_env = j.value("health_port_env", "");
  s.shutdown_signal = j.value("shutdown_signal", SIGTERM);
  s.grace = std::chrono::milliseconds(j.value("grace_ms", 10000));
  s.max_surge = j.value("max_surge", 1);
  s.max_unavailable = j.value("max_unavailable", 0);
  s.min_ready = std::chrono::milliseconds(j.value("min_ready_ms", 0));
  s.labels = j.value("labels", std::map<std::string, std::string>{});
  return s;
}

// Field 22 of /proc/PID/stat (start time in clock ticks), and whether the process is a zombie.
// nullopt when there is no such process.
std::optional<std::pair<uint64_t, bool>> procStart(int64_t pid) {
  std::ifstream in(strCat("/proc/", pid, "/stat"));
  std::string stat;
  if (!in || !std::getline(in, stat)) return std::nullopt;
  const auto close = stat.rfind(')');  // the command name may hold spaces and parentheses
  if (close == std::string::npos) return std::nullopt;
  std::istringstream rest(stat.substr(close + 2));
  std::string state;
  rest >> state;
  std::string field;
  for (int i = 4; i < 22; ++i) rest >> field;  // fields 4..21
  uint64_t start = 0;
  rest >> start;
  return std::make_pair(start, state == "Z");
}

// Processes whose environment holds KRANE_INSTANCE=<name>: an instance started by an owner that
// died before it could write the pid in the instance's record.
std::vector<pid_t> processesOfInstance(const std::string& name) {
  const std::string needle = strCat("KRANE_INSTANCE=", name);
  std::vector<pid_t> found;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string pid = entry.path().filename().string();
    if (pid.empty() || !std::all_of(pid.begin(), pid.end(), ::isdigit)) continue;
    std::ifstream in(entry.path() / "environ", std::ios::binary);
    std::string var;
    while (std::getline(in, var, '\0')) {
      if (var == needle) {
        found.push_back(static_cast<pid_t>(std::stoll(pid)));
        break;
      }
    }
  }
  return found;
}

std::string describeExit(int status) {
  if (WIFEXITED(status)) return strCat("exited with code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return strCat("killed by signal ", WTERMSIG(status), " (", ::strsignal(WTERMSIG(status)), ")");
  }
  return "stopped";
}

std::vector<std::string> lastLines(const std::string& path, size_t n) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  const std::streamoff from = std::max<std::streamoff>(0, size - 8192);
  in.seekg(from);
  std::string tail((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> lines;
  std::istringstream s(tail);
  // An instance prints what it likes; reports carry UTF-8 only (protobuf strings).
  for (std::string line; std::getline(s, line);) lines.push_back(clampUtf8(line));
  if (from > 0 && !lines.empty()) lines.erase(lines.begin());  // probably cut in the middle
  if (lines.size() > n) lines.erase(lines.begin(), lines.end() - static_cast<long>(n));
  return lines;
}

bool portFree(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return ok;
}

bool probeOk(int port, const HttpProbe& probe) {
  httplib::Client client("127.0.0.1", port);
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(probe.timeout);
  const auto micros =
      std::chrono::duration_cast<std::chrono::microseconds>(probe.timeout - seconds);
  client.set_connection_timeout(seconds.count(), static_cast<time_t>(micros.count()));
  client.set_read_timeout(seconds.count(), static_cast<time_t>(micros.count()));
  auto res = client.Get(probe.path);
  return res && res->status >= 200 && res->status < 400;
}

}  // namespace

std::string toJson(const WorkloadSpec& spec) { return specJson(spec).dump(); }

std::string revisionOf(const WorkloadSpec& spec) {
  json j = specJson(spec);
  for (const char* how :
       {"replicas", "id", "max_surge", "max_unavailable", "min_ready_ms", "labels"}) {
    j.erase(how);
  }
  return hex(fnv1a(j.dump()), 16);
}

const char* phaseName(InstancePhase phase) {
  switch (phase) {
    case InstancePhase::kPending:
      return "pending";
    case InstancePhase::kRunning:
      return "running";
    case InstancePhase::kFailed:
      return "failed";
    case InstancePhase::kTerminating:
      return "terminating";
  }
  return "unknown";
}

struct ProcessRuntime::Instance {
  explicit Instance(const BackoffPolicy& policy) : backoff(policy) {}
  std::string workload;
  std::string name;
  std::string revision;
  std::string dir;
  int index = 0;
  int port = 0;
  int health_port = 0;  // with the spec's health_port_env: where the probes go
  int64_t pid = 0;
  uint64_t start_ticks = 0;
  bool child = false;  // ours to waitpid (adopted ones are not)
  bool adopted = false;
  InstancePhase phase = InstancePhase::kPending;
  bool ready = false;
  Clock::time_point ready_since{};  // when `ready` last became true
  int restarts = 0;
  std::deque<Clock::time_point> restart_times;
  Backoff backoff;
  Clock::time_point restart_at{};
  Clock::time_point started{};
  Clock::time_point next_live{};
  Clock::time_point next_ready{};
  int live_failures = 0;
  std::string reason;
  std::vector<std::string> last_output;
  bool terminating = false;
  int probePort() const { return health_port != 0 ? health_port : port; }
  int pending_signal = 0;  // sent at signal_at (the deregistration delay)
  Clock::time_point signal_at{};
  Clock::time_point kill_at{};

  // Sends the stop signal once the deregistration delay has passed.
  void signalIfDue(Clock::time_point now) {
    if (pid > 0 && pending_signal != 0 && now >= signal_at) {
      ::kill(static_cast<pid_t>(-pid), pending_signal);
      pending_signal = 0;
    }
  }
};

struct ProcessRuntime::Workload {
  WorkloadSpec spec;
  std::string revision;
  int next_index = 0;
  std::vector<std::unique_ptr<Instance>> instances;
};

ProcessRuntime::ProcessRuntime(ProcessRuntimeOptions options) : options_(std::move(options)) {
  if (options_.base_env.empty()) {
    const char* path = std::getenv("PATH");
    options_.base_env["PATH"] = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
  }
}

absl::StatusOr<std::unique_ptr<ProcessRuntime>> ProcessRuntime::start(
    ProcessRuntimeOptions options) {
  if (options.state_dir.empty()) return absl::InvalidArgumentError("runtime state_dir: required");
  if (options.port_from <= 0 || options.port_to > 65535 || options.port_from > options.port_to) {
    return absl::InvalidArgumentError(strCat("runtime ports: ", options.port_from, "-",
                                             options.port_to, " is not a valid port range"));
  }
  std::error_code ec;
  for (const char* sub : {"/instances", "/workloads", "/endpoints"}) {
    fs::create_directories(options.state_dir + sub, ec);
    if (ec) {
      return absl::FailedPreconditionError(
          strCat("cannot create ", options.state_dir, sub, ": ", ec.message()));
    }
  }
  std::unique_ptr<ProcessRuntime> runtime(new ProcessRuntime(std::move(options)));
  runtime->adopt();
  // Endpoints of workloads that are gone (those of adopted ones are rewritten on the first tick).
  for (const auto& entry : fs::directory_iterator(runtime->options_.state_dir + "/endpoints", ec)) {
    bool known = false;
    for (const auto& [id, _] : runtime->workloads_) {
      known = known || entry.path() == endpointsFile(runtime->options_.state_dir, id);
    }
    if (!known) fs::remove(entry.path(), ec);
  }
  runtime->thread_ = std::thread([r = runtime.get()] { r->loop(); });
  return runtime;
}

ProcessRuntime::~ProcessRuntime() { shutdown(false); }

std::string endpointsFile(const std::string& state_dir, const std::string& workload_id) {
  return strCat(state_dir, "/endpoints/", safeName(workload_id), ".json");
}

void ProcessRuntime::publishEndpointsLocked(const Workload& w) {
  json endpoints = json::array();
  for (const auto& i : w.instances) {
    if (!i->terminating && i->pid > 0 && i->ready) {
      endpoints.push_back(strCat("127.0.0.1:", i->port));
    }
  }
  std::string text = json{{"workload", w.spec.id}, {"endpoints", endpoints}}.dump();
  std::string& published = published_endpoints_[w.spec.id];
  if (published == text) return;
  if (auto st = replaceFile(endpointsFile(options_.state_dir, w.spec.id), text); !st.ok()) {
    spdlog::error("process runtime: cannot publish the endpoints of {}: {}", w.spec.id,
                  std::string(st.message()));
    return;  // tried again next tick
  }
  published = std::move(text);
}

std::string ProcessRuntime::workloadDir(const std::string& id) const {
  return strCat(options_.state_dir, "/instances/", safeName(id));
}

absl::StatusOr<std::vector<std::string>> ProcessRuntime::commandLine(
    const WorkloadSpec& spec) const {
  std::vector<std::string> argv;
  if (!spec.command.empty()) {
    argv = spec.command;
  } else if (!spec.image.empty() && spec.image[0] == '/') {
    argv = {spec.image};
  } else {
    const auto colon = spec.image.rfind(':');
    const bool has_tag =
        colon != std::string::npos && spec.image.find('/', colon) == std::string::npos;
    const std::string name = has_tag ? spec.image.substr(0, colon) : spec.image;
    const std::string tag = has_tag ? spec.image.substr(colon + 1) : "latest";
    auto it = options_.images.find(name);
    if (it == options_.images.end()) {
      std::string known;
      for (const auto& [n, _] : options_.images) strAppend(&known, known.empty() ? "" : ", ", n);
      return absl::InvalidArgumentError(
          strCat("image: \"", spec.image, "\" has no rule in the process runtime's images table",
                 known.empty() ? " (the table is empty)" : strCat(" (known: ", known, ")"),
                 "; give it a rule, an absolute path, or a command"));
    }
    for (std::string part : it->second) {
      for (size_t at; (at = part.find("{tag}")) != std::string::npos;) part.replace(at, 5, tag);
      argv.push_back(part);
    }
  }
  argv.insert(argv.end(), spec.args.begin(), spec.args.end());
  if (argv.empty() || argv[0].empty()) {
    return absl::InvalidArgumentError("command: empty; nothing to run");
  }
  if (argv[0][0] != '/') {
    return absl::InvalidArgumentError(
        strCat("command: \"", argv[0], "\" must be an absolute path on the process runtime"));
  }
  return argv;
}

absl::Status ProcessRuntime::apply(const WorkloadSpec& spec) {
  if (spec.id.empty()) return absl::InvalidArgumentError("id: required");
  if (spec.replicas < 0 || spec.replicas > 1000) {
    return absl::InvalidArgumentError(
        strCat("replicas: must be between 0 and 1000, got ", spec.replicas));
  }
  for (const auto* probe : {&spec.liveness, &spec.readiness}) {
    if (!probe->path.empty() && probe->path[0] != '/') {
      return absl::InvalidArgumentError(strCat(probe == &spec.liveness ? "liveness" : "readiness",
                                               ".path: \"", probe->path, "\" must start with /"));
    }
  }
  if (!spec.health_port_env.empty()) {
    const std::string& name = spec.health_port_env;
    const bool valid = !std::isdigit(static_cast<unsigned char>(name[0])) &&
                       std::all_of(name.begin(), name.end(), [](char c) {
                         return std::isupper(static_cast<unsigned char>(c)) ||
                                std::isdigit(static_cast<unsigned char>(c)) || c == '_';
                       });
    if (!valid || name == "PORT" || name == "KRANE_INSTANCE" || name == "KRANE_WORKLOAD") {
      return absl::InvalidArgumentError(
          strCat("health_port_env: \"", name,
                 "\" must be an environment variable name of capitals, digits and '_', other"
                 " than PORT, KRANE_INSTANCE and KRANE_WORKLOAD"));
    }
  }
  if (spec.shutdown_signal <= 0 || spec.shutdown_signal >= NSIG) {
    return absl::InvalidArgumentError(
        strCat("shutdown_signal: ", spec.shutdown_signal, " is not a signal"));
  }
  if (auto argv = commandLine(spec); !argv.ok()) return argv.status();
  std::lock_guard lock(mutex_);
  auto& w = workloads_[spec.id];
  const bool created = !w;
  if (created) w = std::make_unique<Workload>();
  WorkloadSpec previous = std::move(w->spec);
  w->spec = spec;
  if (auto stored = persistSpecLocked(*w); !stored.ok()) {
    // Not stored, not applied: the agent retries the change.
    if (created) {
      workloads_.erase(spec.id);
    } else {
      w->spec = std::move(previous);
    }
    return stored;
  }
  w->revision = revisionOf(spec);
  return absl::OkStatus();
}

absl::Status ProcessRuntime::persistSpecLocked(const Workload& w) {
  // Checked, and in one step: a spec cut short (a full disk) would make the next runtime stop
  // the workload's instances as belonging to no workload.
  absl::Status stored =
      replaceFile(strCat(options_.state_dir, "/workloads/", safeName(w.spec.id), ".json"),
                  json{{"spec", specJson(w.spec)}, {"next_index", w.next_index}}.dump());
  if (!stored.ok()) {
    spdlog::error("process runtime: cannot store the spec of {}: {}", w.spec.id, stored.message());
  }
  return stored;
}

absl::Status ProcessRuntime::remove(const std::string& id) {
  std::lock_guard lock(mutex_);
  auto it = workloads_.find(id);
  if (it == workloads_.end()) return absl::OkStatus();
  Workload& w = *it->second;
  for (auto& i : w.instances) {
    stopLocked(*i, w.spec.shutdown_signal, w.spec.grace, "workload deleted");
    orphans_.push_back(std::move(i));
  }
  std::error_code ec;
  fs::remove(strCat(options_.state_dir, "/workloads/", safeName(id), ".json"), ec);
  fs::remove(endpointsFile(options_.state_dir, id), ec);
  published_endpoints_.erase(id);
  workloads_.erase(it);
  last_reported_.erase(id);
  return absl::OkStatus();
}

std::vector<std::string> ProcessRuntime::workloads() const {
  std::lock_guard lock(mutex_);
  std::vector<std::string> out;
  for (const auto& [id, _] : workloads_) out.push_back(id);
  return out;
}

std::optional<WorkloadStatus> ProcessRuntime::status(const std::string& id) const {
  std::lock_guard lock(mutex_);
  auto it = workloads_.find(id);
  if (it == workloads_.end()) return std::nullopt;
  return statusLocked(*it->second);
}

WorkloadStatus ProcessRuntime::statusLocked(const Workload& w) const {
  WorkloadStatus s;
  s.id = w.spec.id;
  s.revision = w.revision;
  s.image = w.spec.image;
  s.replicas = w.spec.replicas;
  s.labels = w.spec.labels;
  int live = 0;
  for (const auto& i : w.instances) {
    InstanceStatus is;
    is.name = i->name;
    is.revision = i->revision;
    is.pid = i->pid;
    is.port = i->port;
    is.health_port = i->health_port;
    is.address = strCat("127.0.0.1:", i->port);
    is.phase = i->terminating ? InstancePhase::kTerminating : i->phase;
    is.ready = i->ready;
    is.restarts = i->restarts;
    is.reason = i->reason;
    is.last_output = i->last_output;
    is.adopted = i->adopted;
    s.instances.push_back(std::move(is));
    if (i->terminating) continue;
    ++live;
    if (i->ready) ++s.ready;
    if (i->revision == w.revision) {
      ++s.updated;
      if (i->ready) ++s.updated_ready;
    }
  }
  s.converged = live == w.spec.replicas && s.updated == live && s.updated_ready == live;
  return s;
}

// ---- Starting and stopping instances ---------------------------------------------------------

int ProcessRuntime::allocatePortLocked(int taken) {
  std::set<int> used{taken};
  for (const auto& [_, w] : workloads_) {
    for (const auto& i : w->instances) used.insert({i->port, i->health_port});
  }
  for (const auto& i : orphans_) used.insert({i->port, i->health_port});
  for (int port = options_.port_from; port <= options_.port_to; ++port) {
    if (used.count(port) == 0 && portFree(port)) return port;
  }
  return 0;
}

std::unique_ptr<ProcessRuntime::Instance> ProcessRuntime::newInstanceLocked(Workload& w) {
  auto i = std::make_unique<Instance>(options_.restart);
  i->workload = w.spec.id;
  i->index = w.next_index++;
  i->revision = w.revision;
  i->name = strCat(safeName(w.spec.id).substr(0, 40), "-", w.revision.substr(0, 6), "-", i->index);
  i->dir = strCat(workloadDir(w.spec.id), "/", i->name);
  (void)persistSpecLocked(w);  // next_index moved: names are never reused (logged if not)
  return i;
}

absl::Status ProcessRuntime::launchLocked(Workload& w, Instance& i) {
  auto argv = commandLine(w.spec);
  if (!argv.ok()) return argv.status();
  if (i.port == 0) i.port = allocatePortLocked();
  // A restart under a spec without one (a roll that drops it) probes PORT again.
  if (w.spec.health_port_env.empty()) i.health_port = 0;
  if (!w.spec.health_port_env.empty() && i.health_port == 0 && i.port != 0) {
    i.health_port = allocatePortLocked(i.port);
  }
  if (i.port == 0 || (!w.spec.health_port_env.empty() && i.health_port == 0)) {
    return absl::ResourceExhaustedError(strCat("no free port in ", options_.port_from, "-",
                                               options_.port_to,
                                               " (raise the runtime's port range)"));
  }
  std::error_code ec;
  fs::create_directories(i.dir + "/work", ec);
  if (ec) return absl::InternalError(strCat("cannot create ", i.dir, ": ", ec.message()));
  std::map<std::string, std::string> env = options_.base_env;
  for (const auto& [k, v] : w.spec.env) env[k] = v;
  env["PORT"] = std::to_string(i.port);
  if (!w.spec.health_port_env.empty()) env[w.spec.health_port_env] = std::to_string(i.health_port);
  env["KRANE_INSTANCE"] = i.name;
  env["KRANE_WORKLOAD"] = w.spec.id;
  // Everything the child needs is prepared before fork: only async-signal-safe calls after it.
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : env) env_strings.push_back(strCat(k, "=", v));
  std::vector<char*> args;
  for (auto& a : *argv) args.push_back(a.data());
  args.push_back(nullptr);
  std::vector<char*> envp;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  const std::string work = i.dir + "/work";
  const std::string log = i.dir + "/output.log";
  const int log_fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0)
    return absl::InternalError(strCat("cannot open ", log, ": ", std::strerror(errno)));
  // The record exists before the child does (pid 0: starting), so an owner killed at any moment
  // leaves a record that adopt() can act on: a starting record's child is found by its
  // KRANE_INSTANCE and stopped, never leaked.
  const auto writeRecord = [&](pid_t pid, uint64_t start_ticks) {
    const json record = {{"workload", w.spec.id},
                         {"name", i.name},
                         {"index", i.index},
                         {"revision", i.revision},
                         {"pid", pid},
                         {"start_ticks", start_ticks},
                         {"port", i.port},
                         {"health_port", i.health_port},
                         {"restarts", i.restarts}};
    return replaceFile(i.dir + "/instance.json", record.dump());
  };
  // Without its record, nothing would find the process again after a restart: not started.
  if (auto recorded = writeRecord(0, 0); !recorded.ok()) {
    ::close(log_fd);
    return recorded;
  }
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(log_fd);
    return absl::InternalError(strCat("fork: ", std::strerror(errno)));
  }
  if (pid == 0) {
    ::setsid();  // own session and process group: outlives the agent, stopped as a group
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    for (int sig = 1; sig < NSIG; ++sig) ::signal(sig, SIG_DFL);
    if (::chdir(work.c_str()) != 0) ::_exit(126);
    ::dup2(log_fd, 1);
    ::dup2(log_fd, 2);
    ::close_range(3, ~0U, 0);
    ::execve(args[0], args.data(), envp.data());
    const char prefix[] = "krane process runtime: cannot run ";
    (void)!::write(2, prefix, sizeof(prefix) - 1);
    (void)!::write(2, args[0], std::strlen(args[0]));
    const char* err = std::strerror(errno);
    (void)!::write(2, ": ", 2);
    (void)!::write(2, err, std::strlen(err));
    (void)!::write(2, "\n", 1);
    ::_exit(127);
  }
  ::close(log_fd);
  i.pid = pid;
  i.child = true;
  i.adopted = false;
  i.start_ticks = procStart(pid).value_or(std::make_pair(0ull, false)).first;
  i.started = Clock::now();
  i.ready = false;
  i.live_failures = 0;
  i.next_live = i.started + w.spec.liveness.initial_delay;
  i.next_ready = i.started + w.spec.readiness.initial_delay;
  if (i.phase != InstancePhase::kFailed) i.phase = InstancePhase::kPending;
  if (auto recorded = writeRecord(pid, i.start_ticks); !recorded.ok()) {
    // The starting record (pid 0) stays: a next runtime finds the process by its KRANE_INSTANCE
    // and stops it rather than leaving it untracked.
    spdlog::error("process runtime: cannot record pid={} of {}: {}", pid, i.name,
                  recorded.message());
  }
  spdlog::info("process runtime: started {} pid={} port={}", i.name, pid, i.port);
  return absl::OkStatus();
}

void ProcessRuntime::stopLocked(Instance& i, int sig, std::chrono::milliseconds grace,
                                const std::string& why) {
  if (i.terminating) return;
  i.terminating = true;
  i.ready = false;  // out of the endpoints published at the end of this tick
  const auto delay = draining_ ? std::chrono::milliseconds(0) : options_.deregistration_delay;
  i.signal_at = Clock::now() + delay;
  i.kill_at = i.signal_at + grace;
  if (i.pid > 0) {
    spdlog::info("process runtime: stopping {} pid={} ({}) with signal {} in {} ms", i.name, i.pid,
                 why, sig, delay.count());
    if (delay.count() == 0) {
      ::kill(static_cast<pid_t>(-i.pid), sig);
    } else {
      i.pending_signal = sig;
    }
  }
}

// ---- Re-adoption ------------------------------------------------------------------------------

void ProcessRuntime::adopt() {
  std::lock_guard lock(mutex_);
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(options_.state_dir + "/workloads", ec)) {
    if (entry.path().extension() != ".json") continue;
    auto text = readFile(entry.path().string(), "workload spec");
    if (!text.ok()) {
      spdlog::error("process runtime: ignoring {}", text.status().message());
      continue;
    }
    try {
      const json j = json::parse(*text);
      auto w = std::make_unique<Workload>();
      w->spec = specFrom(j.at("spec"));
      w->revision = revisionOf(w->spec);
      w->next_index = j.value("next_index", 0);
      workloads_[w->spec.id] = std::move(w);
    } catch (const std::exception& e) {
      spdlog::error("process runtime: ignoring unreadable spec {}: {}", entry.path().string(),
                    e.what());
    }
  }
  for (const auto& wdir : fs::directory_iterator(options_.state_dir + "/instances", ec)) {
    for (const auto& idir : fs::directory_iterator(wdir.path(), ec)) {
      const std::string dir = idir.path().string();
      // No record: the owner died before writing it, before the fork; nothing runs from it.
      auto text = readFile(dir + "/instance.json", "instance record");
      const json record = text.ok() ? json::parse(*text, nullptr, false) : json();
      if (!record.is_object()) {
        fs::remove_all(dir, ec);
        continue;
      }
      if (record.value("pid", 0) == 0) {
        // Started by an owner that died before writing the pid: stop what it started.
        for (const pid_t pid : processesOfInstance(record.value("name", ""))) {
          spdlog::info(
              "process runtime: stopping pid={} of {}, started by a previous owner "
              "that died before recording it",
              pid, record.value("name", ""));
          ::kill(-pid, SIGKILL);
          ::kill(pid, SIGKILL);
        }
        fs::remove_all(dir, ec);
        continue;
      }
      auto i = std::make_unique<Instance>(options_.restart);
      i->workload = record.value("workload", "");
      i->name = record.value("name", "");
      i->index = record.value("index", 0);
      i->revision = record.value("revision", "");
      i->pid = record.value("pid", 0);
      i->start_ticks = record.value("start_ticks", 0ull);
      i->port = record.value("port", 0);
      i->health_port = record.value("health_port", 0);
      i->restarts = record.value("restarts", 0);
      i->dir = dir;
      const auto proc = procStart(i->pid);
      const bool alive = i->pid > 0 && proc && !proc->second && proc->first == i->start_ticks;
      auto w = workloads_.find(i->workload);
      if (!alive) {
        spdlog::info("process runtime: {} is gone; removing its leftovers", i->name);
        fs::remove_all(dir, ec);
        continue;
      }
      if (w == workloads_.end()) {
        spdlog::info("process runtime: {} pid={} belongs to no workload; stopping it", i->name,
                     i->pid);
        stopLocked(*i, SIGTERM, std::chrono::milliseconds(10000), "no workload");
        orphans_.push_back(std::move(i));
        continue;
      }
      spdlog::info("process runtime: adopted {} pid={} port={}", i->name, i->pid, i->port);
      i->adopted = true;
      i->phase = InstancePhase::kRunning;
      i->started = Clock::now();
      i->next_live = i->started;
      i->next_ready = i->started;
      w->second->instances.push_back(std::move(i));
    }
  }
}

// ---- Supervision ------------------------------------------------------------------------------

void ProcessRuntime::loop() {
  for (;;) {
    {
      std::lock_guard lock(mutex_);
      if (stopping_) return;
    }
    tick();
    std::this_thread::sleep_for(options_.tick);
  }
}

void ProcessRuntime::tick() {
  std::vector<WorkloadStatus> changed;
  {
    std::lock_guard lock(mutex_);
    const auto now = Clock::now();
    for (auto& [id, w] : workloads_) superviseLocked(*w, now);
    // Orphans: stopping instances of deleted workloads; gone once dead.
    for (auto it = orphans_.begin(); it != orphans_.end();) {
      Instance& i = **it;
      bool dead = i.pid <= 0;
      if (!dead && i.child) {
        int status = 0;
        dead = ::waitpid(static_cast<pid_t>(i.pid), &status, WNOHANG) == i.pid;
      } else if (!dead) {
        const auto proc = procStart(i.pid);
        dead = !proc || proc->second || proc->first != i.start_ticks;
      }
      if (!dead) i.signalIfDue(now);
      if (!dead && now >= i.kill_at) ::kill(static_cast<pid_t>(-i.pid), SIGKILL);
      if (dead) {
        std::error_code ec;
        fs::remove_all(i.dir, ec);
        it = orphans_.erase(it);
      } else {
        ++it;
      }
    }
    for (const auto& [id, w] : workloads_) publishEndpointsLocked(*w);
    if (options_.on_change) {
      for (const auto& [id, w] : workloads_) {
        WorkloadStatus s = statusLocked(*w);
        json fp = json::array();
        for (const auto& i : s.instances)
          fp.push_back({i.name, i.pid, phaseName(i.phase), i.ready, i.restarts, i.reason});
        std::string key = strCat(s.revision, s.replicas, fp.dump());
        if (last_reported_[id] != key) {
          last_reported_[id] = std::move(key);
          changed.push_back(std::move(s));
        }
      }
    }
  }
  for (const auto& s : changed) options_.on_change(s);
}

void ProcessRuntime::superviseLocked(Workload& w, Clock::time_point now) {
  // 1. Deaths, restarts, kills past their grace, probes.
  for (auto it = w.instances.begin(); it != w.instances.end();) {
    Instance& i = **it;
    if (i.pid > 0) {
      std::optional<std::string> died;
      if (i.child) {
        int status = 0;
        if (::waitpid(static_cast<pid_t>(i.pid), &status, WNOHANG) == i.pid)
          died = describeExit(status);
      } else {
        const auto proc = procStart(i.pid);
        if (!proc || proc->second || proc->first != i.start_ticks)
          died = "exited (started by an earlier agent: exit code unknown)";
      }
      if (died) {
        if (i.terminating) {
          spdlog::info("process runtime: {} pid={} stopped: {}", i.name, i.pid, *died);
        } else {
          spdlog::warn("process runtime: {} pid={} {}", i.name, i.pid, *died);
        }
        i.pid = 0;
        i.ready = false;
        if (!i.terminating) {
          ++i.restarts;
          i.restart_times.push_back(now);
          while (!i.restart_times.empty() &&
                 now - i.restart_times.front() > options_.crash_loop_window)
            i.restart_times.pop_front();
          i.last_output = lastLines(i.dir + "/output.log", kOutputLines);
          if (static_cast<int>(i.restart_times.size()) >= options_.crash_loop_restarts) {
            i.phase = InstancePhase::kFailed;
            i.reason =
                strCat("crash loop: ", *died, " (", i.restart_times.size(), " restarts within ",
                       options_.crash_loop_window.count() / 1000, " s)");
          } else {
            i.phase = InstancePhase::kPending;
            i.reason = *died;
          }
          i.restart_at = now + i.backoff.next();
        }
      }
    }
    if (i.terminating) {
      i.signalIfDue(now);
      if (i.pid > 0 && now >= i.kill_at) {
        spdlog::warn("process runtime: {} did not stop within its grace period; SIGKILL", i.name);
        ::kill(static_cast<pid_t>(-i.pid), SIGKILL);
        i.kill_at = now + std::chrono::seconds(5);
      }
      if (i.pid <= 0) {
        std::error_code ec;
        fs::remove_all(i.dir, ec);
        it = w.instances.erase(it);
        continue;
      }
    } else if (i.pid <= 0 && now >= i.restart_at && !draining_) {
      if (auto st = launchLocked(w, i); !st.ok()) {
        i.phase = InstancePhase::kFailed;
        i.reason = std::string(toStd(st.message()));
        i.restart_at = now + i.backoff.next();
      }
    } else if (i.pid > 0) {
      probeLocked(w, i, now);
    }
    ++it;
  }

  // 2. Replicas and rollout, within the spec's surge and unavailable. Not while everything is
  // being stopped.
  if (draining_) return;
  const int n = w.spec.replicas;
  std::vector<Instance*> current;
  std::vector<Instance*> old;
  for (auto& i : w.instances) {
    if (i->terminating) continue;
    (i->revision == w.revision ? current : old).push_back(i.get());
  }
  const auto stop = [&](Instance* i, const char* why) {
    stopLocked(*i, w.spec.shutdown_signal, w.spec.grace, why);
  };
  const auto launch = [&] {
    w.instances.push_back(newInstanceLocked(w));
    if (auto st = launchLocked(w, *w.instances.back()); !st.ok()) {
      w.instances.back()->phase = InstancePhase::kFailed;
      w.instances.back()->reason = std::string(toStd(st.message()));
      w.instances.back()->restart_at = now + w.instances.back()->backoff.next();
    }
  };
  if (old.empty()) {
    // Scaling: all at once. Extra instances go newest first.
    for (int k = static_cast<int>(current.size()); k < n; ++k) launch();
    for (int k = static_cast<int>(current.size()); k > n; --k) stop(current[k - 1], "scaled down");
    return;
  }
  // Rolling replacement: one cycle of the rolling-update evaluator (seed 002). A new instance
  // counts once ready for min_ready; one that failed restarts by itself and holds its place
  // (unhealthy), so the roll never starts more instances than the surge allows. A new revision
  // that never gets ready stalls the roll while the old instances keep serving.
  std::vector<strategy::Instance> view;
  for (const Instance* i : old) {
    view.push_back(
        {i->name, false,
         i->ready ? strategy::InstanceState::kHealthy : strategy::InstanceState::kUnhealthy});
  }
  for (const Instance* i : current) {
    strategy::InstanceState state = strategy::InstanceState::kProvisioning;
    if (i->phase == InstancePhase::kFailed) {
      state = strategy::InstanceState::kUnhealthy;
    } else if (i->ready && now - i->ready_since >= w.spec.min_ready) {
      state = strategy::InstanceState::kHealthy;
    }
    view.push_back({i->name, true, state});
  }
  const strategy::ResolvedSpec spec{static_cast<uint32_t>(std::max(0, w.spec.max_surge)),
                                    static_cast<uint32_t>(std::max(0, w.spec.max_unavailable))};
  const strategy::Evaluation e = strategy::evaluate(view, static_cast<uint32_t>(n), spec);
  for (const auto& name : e.drain_ids) {
    auto victim =
        std::find_if(old.begin(), old.end(), [&](Instance* i) { return i->name == name; });
    if (victim != old.end()) stop(*victim, "replaced by a new revision");
  }
  for (uint32_t k = 0; k < e.to_create; ++k) launch();
}

void ProcessRuntime::probeLocked(Workload& w, Instance& i, Clock::time_point now) {
  const auto& spec = w.spec;
  const bool was_ready = i.ready;
  if (spec.readiness.path.empty()) {
    i.ready = true;
  } else if (now >= i.next_ready) {
    i.next_ready = now + spec.readiness.interval;
    i.ready = probeOk(i.probePort(), spec.readiness);
  }
  if (i.ready && !was_ready) i.ready_since = now;
  if (!spec.liveness.path.empty() && now >= i.next_live) {
    i.next_live = now + spec.liveness.interval;
    if (probeOk(i.probePort(), spec.liveness)) {
      i.live_failures = 0;
    } else if (++i.live_failures >= spec.liveness.failure_threshold) {
      i.reason = strCat("liveness probe GET ", spec.liveness.path, " failed ", i.live_failures,
                        " times; restarting");
      spdlog::warn("process runtime: {}: {}", i.name, i.reason);
      i.live_failures = 0;
      ::kill(static_cast<pid_t>(-i.pid), SIGKILL);  // the death is noticed next tick: a restart
    }
  }
  if (i.ready && i.phase != InstancePhase::kRunning) {
    i.phase = InstancePhase::kRunning;
    i.reason.clear();
    i.last_output.clear();
  }
  // A run that lasted a whole crash-loop window starts the backoff over.
  if (i.ready && now - i.started > options_.crash_loop_window) {
    i.backoff.reset();
    i.restart_times.clear();
  }
}

void ProcessRuntime::shutdown(bool stop_instances) {
  if (stop_instances) {
    std::chrono::milliseconds longest{0};
    {
      std::lock_guard lock(mutex_);
      draining_ = true;
      for (auto& [id, w] : workloads_) {
        for (auto& i : w->instances) {
          stopLocked(*i, w->spec.shutdown_signal, w->spec.grace, "runtime stopping");
          longest = std::max(longest, w->spec.grace);
        }
      }
    }
    // The supervision loop reaps them and kills the ones past their grace.
    const auto deadline = Clock::now() + longest + std::chrono::seconds(5);
    while (Clock::now() < deadline) {
      {
        std::lock_guard lock(mutex_);
        if (!thread_.joinable()) break;
        bool any = !orphans_.empty();
        for (auto& [id, w] : workloads_) any = any || !w->instances.empty();
        if (!any) break;
      }
      std::this_thread::sleep_for(options_.tick);
    }
  }
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

}  // namespace krane::runtime
