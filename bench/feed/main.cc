// The change feed benchmark: a real krane-ctrl (separate process) on a scratch MariaDB, with
// 1 to 1000 agents' Watch streams, against a client of the polling design it replaced.
//
//   ./dev bench feed [--json] [--quick]
//
// See bench/README.md for what each figure means.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_split.h"
#include "bench/feed/baseline.h"
#include "bench/feed/ctrl_process.h"
#include "bench/feed/h2_watch_streams.h"
#include "bench/feed/measure.h"
#include "bench/feed/report.h"
#include "bench/feed/socket_floor.h"
#include "bench/feed/watch_clients.h"
#include "common/process_setup.h"
#include "common/strings.h"
#include "controlplane/api/auth.h"
#include "controlplane/db/migrate.h"
#include "controlplane/db/pool.h"
#include "controlplane/feed/resource_table.h"
#include "controlplane/feed/writer.h"
#include "krane/api/v1/resources.grpc.pb.h"
#include "krane/cluster/v1/cluster.grpc.pb.h"
#include "tests/support/mariadb.h"
#include "tests/support/process.h"

namespace krane::bench {
namespace {

using namespace std::chrono_literals;
using std::chrono::milliseconds;

constexpr const char* kUsage = R"(usage: feed [--json] [--quick] [--ctrl PATH] [--help]

Benchmarks Krane's change feed: a real krane-ctrl (started as a child process) on a scratch
MariaDB (started by this program), with agents' Watch streams on their own connections, against
a client of the design it replaced (every agent polls the change table once a second).

Measures, for 1, 100 and 1000 streams: commit-to-receive latency (p50, p99) under 50 puts/s, and
database statements per second idle and under that load; the same for 10,000 streams served by
two krane-ctrl replicas on the same database (5,000 each, 50 streams per client connection);
krane-ctrl's CPU per delivered event; the same at 100 and 1000 streams, and the memory per
idle stream, on krane-ctrl's own HTTP/2 listener for Watch (feed.watch_listen); the socket
floor at 100 and 1000 streams (the same fan-out as one write per stream and change on plain
loopback TCP connections, with no HTTP/2, gRPC or database: what the kernel alone costs on this
machine); then the time of a full sync of 100,000 resources, krane-ctrl's peak memory during
it, and krane-ctrl's memory per idle stream.

  --json    print one JSON object {"figures": [...]} on stdout; the table and progress go to stderr
  --quick   a smoke run: 1 and 100 streams (2,000 on two replicas), 20,000 resources to sync,
            shorter windows (~1.5 min)
  --ctrl PATH  run this krane-ctrl binary instead of the one built with the benchmark
  --replica-streams N  streams of the replicated phase (10,000)
  --only PHASES         run only these phases (comma-separated; for investigation):
                       streams (1, 100 and 1000 streams on one replica), replicas (the
                       replicated phase, with 1 stream on one replica as its reference),
                       listener (100 and 1000 streams, with replicas the replicated phase,
                       and the memory per idle stream, on the watch listener,
                       feed.watch_listen; then the memory per idle stream with TLS on the
                       listener and on the gRPC port), floor (the socket floor at
                       100 and 1000 streams), baseline, memory, sync
  --no-batches         streams that do not accept batches (one event per message, as agents
                       before WatchRequest.accept_batches had)
  --grpc-clients       read the measured streams with gRPC's own client instead of the lean
                       HTTP/2 one (it costs about as much CPU per message as krane-ctrl, on the
                       same cores)
  --no-peer-hints      replicas without feed.peer_hints: each sees the other's commits at its
                       next poll (50 ms), as before hints existed
  --help    this text

krane-ctrl's configuration and log go to a directory under /tmp, removed after a successful run
(kept when KRANE_BENCH_KEEP is set, or when the run fails).

Run it with `./dev bench feed [--json] [--quick]` (an optimised build). Takes about 6 minutes.
)";

constexpr const char* kRegion = "bench-1";     // the write load and the streams
constexpr const char* kSyncRegion = "sync-1";  // the resources of the full sync

struct Options {
  bool json = false;
  bool quick = false;
  std::vector<size_t> stream_counts{1, 100, 1000};
  size_t memory_streams = 1000;
  size_t sync_resources = 100000;
  double puts_per_s = 50;
  milliseconds idle_window = 5s;
  milliseconds warmup = 1s;
  milliseconds load_window = 10s;
  milliseconds drain = 2s;
  size_t baseline_connections = 8;
  // The replicated phase: this many streams split between `replicas` krane-ctrl processes on
  // the same database, `per_connection` streams sharing each client connection.
  size_t replica_streams = 10000;
  size_t replicas = 2;
  size_t per_connection = 50;
  std::string ctrl_binary;     // --ctrl: another krane-ctrl binary (to compare builds)
  std::set<std::string> only;  // --only: these phases (for investigation); empty: all
  bool batches = true;         // --no-batches: streams read one event per message
  bool grpc_clients = false;   // --grpc-clients: gRPC's client reads the measured streams
  bool peer_hints = true;      // --no-peer-hints: replicas see each other's commits by polling

  bool runs(const std::string& phase) const { return only.empty() || only.count(phase) > 0; }
};

// Progress, on stderr, with the time since start.
const auto g_start = std::chrono::steady_clock::now();
template <typename... Args>
void say(fmt::format_string<Args...> format, Args&&... args) {
  const double t =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - g_start).count();
  fmt::print(stderr, "[{:6.1f}s] {}\n", t, fmt::format(format, std::forward<Args>(args)...));
  std::fflush(stderr);
}

template <typename T>
T check(absl::StatusOr<T> value, std::string_view what) {
  if (!value.ok()) throw std::runtime_error(strCat(what, ": ", value.status().message()));
  return *std::move(value);
}
void check(const absl::Status& status, std::string_view what) {
  if (!status.ok()) throw std::runtime_error(strCat(what, ": ", status.message()));
}

void raiseFileLimit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  const rlim_t before = limit.rlim_cur;
  limit.rlim_cur = limit.rlim_max;
  if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) {
    say("warning: cannot raise the open-file limit from {}: {}", before, std::strerror(errno));
    return;
  }
  say("open-file limit {} (was {})", limit.rlim_cur, before);
}

uint64_t regionHead(db::Pool& pool, const std::string& region) {
  auto conn = check(pool.acquire(), "database");
  auto rows =
      check(conn->query("SELECT version FROM region_versions WHERE region_id = ?", {region}),
            "reading the region's version");
  return rows.empty() ? 0 : rows.rows[0].u64(0);
}

// The 1-minute load average, from /proc/loadavg.
std::string loadAverage() {
  std::FILE* f = std::fopen("/proc/loadavg", "r");
  if (f == nullptr) return "?";
  char buf[64] = {0};
  const bool ok = std::fscanf(f, "%63s", buf) == 1;
  std::fclose(f);
  return ok ? buf : "?";
}

// The pid of this process's child running `name` (e.g. the scratch mariadbd); -1 if none.
int findChild(const std::string& name) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string pid = entry.path().filename().string();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::FILE* f = std::fopen(strCat("/proc/", pid, "/stat").c_str(), "r");
    if (f == nullptr) continue;
    char buf[512] = {0};
    const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
    std::fclose(f);
    const char* open = std::strchr(buf, '(');
    const char* close = std::strrchr(buf, ')');
    if (n == 0 || open == nullptr || close == nullptr) continue;
    const std::string comm(open + 1, close);
    int ppid = 0;
    if (std::sscanf(close + 2, "%*c %d", &ppid) != 1) continue;
    if (comm == name && ppid == ::getpid()) return std::atoi(pid.c_str());
  }
  return -1;
}

// CPU used by each party between two points in time, in cores (-1: unknown).
struct CpuUse {
  double seconds = 0;
  double ctrl = -1, db = -1, self = -1, machine = -1;
  double ctrl_system = -1;  // the kernel's share of krane-ctrl's
  unsigned cpus = std::thread::hardware_concurrency();

  bool saturated() const { return machine >= 0.9 * cpus; }
  std::string describe() const {
    std::string out = "CPU in the load window, in cores: ";
    if (ctrl >= 0) {
      strAppend(&out, fmt::format("krane-ctrl {:.2f} (kernel {:.2f}), ", ctrl, ctrl_system));
    }
    const double ours = std::max(ctrl, 0.0) + std::max(db, 0.0) + std::max(self, 0.0);
    strAppend(&out,
              fmt::format(
                  "MariaDB {:.2f}, benchmark clients {:.2f}, other processes {:.2f}; whole machine "
                  "{:.2f} of {}",
                  db, self, std::max(machine - ours, 0.0), machine, cpus));
    if (saturated())
      strAppend(&out, " (CPU-bound: the latency figures measure this machine, not only the feed)");
    return out;
  }
};

class CpuWindow {
 public:
  // `ctrl_pids`: every krane-ctrl replica, counted together.
  CpuWindow(std::vector<int> ctrl_pids, int db_pid)
      : ctrl_pids_(std::move(ctrl_pids)), db_pid_(db_pid) {
    mark(&start_);
  }
  CpuUse finish() const {
    Point end;
    mark(&end);
    CpuUse use;
    use.seconds = std::chrono::duration<double>(end.at - start_.at).count();
    auto cores = [&](double a, double b) { return a < 0 || b < 0 ? -1.0 : (b - a) / use.seconds; };
    use.ctrl = cores(start_.ctrl, end.ctrl);
    use.ctrl_system = cores(start_.ctrl_system, end.ctrl_system);
    use.db = cores(start_.db, end.db);
    use.self = cores(start_.self, end.self);
    use.machine = (end.machine.busy - start_.machine.busy) / use.seconds;
    return use;
  }

 private:
  struct Point {
    std::chrono::steady_clock::time_point at;
    double ctrl = -1, db = -1, self = -1;
    double ctrl_system = -1;
    MachineCpu machine;
  };
  void mark(Point* p) const {
    p->at = std::chrono::steady_clock::now();
    for (int pid : ctrl_pids_) {
      if (pid <= 0) continue;
      p->ctrl = std::max(p->ctrl, 0.0) + processCpuSeconds(pid);
      p->ctrl_system = std::max(p->ctrl_system, 0.0) + processCpuSeconds(pid, true);
    }
    if (db_pid_ > 0) p->db = processCpuSeconds(db_pid_);
    p->self = processCpuSeconds(::getpid());
    p->machine = machineCpu();
  }
  std::vector<int> ctrl_pids_;
  int db_pid_;
  Point start_;
};

// Everything the phases share.
struct Bench {
  Options options;
  std::string ctrl_binary;
  std::string fanout_binary;  // the gRPC floor's server
  std::string work_dir;
  db::Dsn dsn;
  std::shared_ptr<db::Pool> pool;
  std::shared_ptr<feed::Writer> writer;  // in-process, for the baseline's load and the sync data
  std::unique_ptr<QueryCounter> counter;
  std::string agent_token;
  std::string sync_token;
  std::string operator_token;
  Report report;
  int ctrl_count = 0;
  int db_pid = -1;

  std::string tls_dir;  // a CA and a server certificate for 127.0.0.1, once made

  std::unique_ptr<CtrlProcess> startCtrl(bool watch_listener = false, bool tls = false) {
    CtrlOptions o;
    o.watch_listener = watch_listener;
    if (tls) {
      o.tls_cert_file = tls_dir + "/server.crt";
      o.tls_key_file = tls_dir + "/server.key";
    }
    o.binary = ctrl_binary;
    o.work_dir = work_dir;
    o.name = strCat("krane-ctrl-", ++ctrl_count);
    o.dsn = dsn;
    o.operator_token = operator_token;
    o.peer_hints = options.peer_hints;
    auto ctrl = std::make_unique<CtrlProcess>(o);
    say("krane-ctrl started: pid {}, grpc {}{}, log {}", ctrl->pid(), ctrl->grpcTarget(),
        watch_listener ? strCat(", watch listener ", ctrl->watchTarget()) : "", ctrl->logPath());
    return ctrl;
  }

  void stopCtrl(std::unique_ptr<CtrlProcess>& ctrl) {
    const int code = ctrl->stop();
    if (code != 0) say("warning: krane-ctrl exited with {} (log: {})", code, ctrl->logPath());
    ctrl.reset();
  }
};

void setup(Bench& b, const char* argv0) {
  b.ctrl_binary = b.options.ctrl_binary.empty() ? findRunfile("controlplane/krane-ctrl", argv0)
                                                : b.options.ctrl_binary;
  say("krane-ctrl binary: {}", b.ctrl_binary);
  b.fanout_binary = findRunfile("bench/feed/fanout_server", argv0);
  char dir[] = "/tmp/krane-bench-feed-XXXXXX";
  if (::mkdtemp(dir) == nullptr) throw std::runtime_error("mkdtemp failed");
  b.work_dir = dir;

  say("starting a scratch MariaDB");
  auto& mariadb = testing::ScratchMariaDb::instance();
  b.dsn = mariadb.freshDatabase();
  b.pool =
      check(db::Pool::create(b.dsn, {.max_connections = 12}), "connecting to the scratch database");
  check(db::Migrator(b.pool, check(db::builtinMigrations(), "migrations")).migrate(), "migrating");
  {
    auto conn = check(b.pool->acquire(), "database");
    for (const char* region : {kRegion, kSyncRegion}) {
      check(conn->exec("INSERT INTO regions (id, display_name, created_at) VALUES (?, ?, 1)",
                       {region, region}),
            "registering a region");
    }
  }
  api::AgentTokens tokens(b.pool);
  b.agent_token = check(tokens.create(kRegion, "bench agents"), "creating an agent token").secret;
  b.sync_token = check(tokens.create(kSyncRegion, "bench sync"), "creating an agent token").secret;
  b.operator_token = api::newSecret("bench-operator-");
  b.writer = std::make_shared<feed::Writer>(b.pool, std::make_shared<feed::ResourceTables>());
  b.counter = std::make_unique<QueryCounter>(
      check(db::Connection::open(mariadb.adminDsn()), "admin connection"));
  b.counter->calibrate();
  b.db_pid = findChild("mariadbd");
  say("database {} on 127.0.0.1:{} ready; reading the statement counter costs {} statement(s)",
      b.dsn.database, b.dsn.port, b.counter->selfCost());
}

struct PhaseResult {
  double idle_qps = 0;
  double load_qps = 0;
  LatencySummary latency;
  FanOutSummary fan_out;
  std::string note;
  CpuUse cpu;
  double achieved_rate = 0;       // puts/s sent in the load window
  size_t delivered = 0;           // (stream, change) pairs received for the window's puts
  double events_per_message = 0;  // changes the streams read per message, from load to drain
};

// krane-ctrl's CPU (every replica) per change a stream received, in microseconds; -1: unknown.
double cpuUsPerEvent(const PhaseResult& r) {
  if (r.cpu.ctrl < 0 || r.delivered == 0) return -1;
  return r.cpu.ctrl * r.cpu.seconds * 1e6 / static_cast<double>(r.delivered);
}

std::string cpuPerEventText(const PhaseResult& r) {
  const double us = cpuUsPerEvent(r);
  if (us < 0) return "krane-ctrl CPU per delivered event unknown";
  return fmt::format("krane-ctrl CPU per delivered event {:.2f} us ({} delivered)", us,
                     r.delivered);
}

std::string putSummary(const WriteLoad& load) {
  auto ms = load.putMillis();
  const size_t n = ms.size();
  const double p50 = quantile(ms, 0.5);
  const double p99 = quantile(ms, 0.99);
  return fmt::format("{} puts ({} failed, {} skipped), put round trip p50 {:.2f} ms p99 {:.2f} ms",
                     n, load.errors(), load.skipped(), p50, p99);
}

// Puts per second sent inside the window.
double achievedRate(const WriteLoad& load, int64_t from, int64_t to) {
  size_t n = 0;
  for (const auto& s : load.sent()) n += s.send_ns >= from && s.send_ns < to ? 1 : 0;
  return static_cast<double>(n) / (static_cast<double>(to - from) / 1e9);
}

void addNote(std::string* notes, const std::string& note) {
  if (note.empty()) return;
  if (!notes->empty()) notes->append("; ");
  notes->append(note);
}

// krane-ctrl's CPU for all the work of one put: the API call, the transaction, the tailer and
// the delivery to every stream.
std::string ctrlCpuPerPut(const PhaseResult& r, size_t streams) {
  if (r.cpu.ctrl < 0 || r.achieved_rate <= 0) return "krane-ctrl CPU per put unknown";
  const double ms = r.cpu.ctrl / r.achieved_rate * 1e3;
  return fmt::format("krane-ctrl used {:.2f} ms of CPU per put ({:.1f} us per put and stream)", ms,
                     ms * 1e3 / static_cast<double>(streams));
}

// Statements the write load caused per put: (load - idle) / puts per second.
double statementsPerPut(const PhaseResult& r) {
  return r.achieved_rate > 0 ? (r.load_qps - r.idle_qps) / r.achieved_rate : 0;
}

std::string missingNote(const LatencySummary& s) {
  if (s.missing == 0) return "";
  return fmt::format(
      "{} of {} (receiver, change) pairs not received by the end of the run ({:.2f}%); the "
      "percentiles cover received changes only",
      s.missing, s.receivers * s.changes,
      100.0 * static_cast<double>(s.missing) / static_cast<double>(s.receivers * s.changes));
}

// N Watch streams on running krane-ctrl replicas (split evenly between them, `per_connection`
// streams sharing a connection): idle database load, then latency and database load under the
// write load, which goes through the first replica.
PhaseResult measureKrane(Bench& b, const std::vector<CtrlProcess*>& ctrls, size_t n,
                         size_t per_connection = 1) {
  const Options& o = b.options;
  PhaseResult result;
  const uint64_t head = regionHead(*b.pool, kRegion);
  const std::string what = ctrls.size() == 1
                               ? fmt::format("Krane, {} stream(s)", n)
                               : fmt::format("Krane, {} replicas, {} stream(s)", ctrls.size(), n);
  say("{}: opening, resuming after version {}, {} per connection", what, head, per_connection);
  const auto opening = std::chrono::steady_clock::now();
  std::vector<std::unique_ptr<WatchStreams>> groups;
  for (size_t i = 0; i < ctrls.size(); ++i) {
    const size_t count = n / ctrls.size() + (i < n % ctrls.size() ? 1 : 0);
    if (o.grpc_clients) {
      groups.push_back(std::make_unique<GrpcWatchStreams>(
          ctrls[i]->watchTarget(), b.agent_token, kRegion, head, count, per_connection, o.batches));
    } else {
      groups.push_back(std::make_unique<H2WatchStreams>(
          ctrls[i]->watchTarget(), b.agent_token, kRegion, head, count, per_connection, o.batches));
    }
  }
  for (auto& streams : groups) {
    if (!streams->waitLive(300s)) {
      throw std::runtime_error(
          fmt::format("{}: only {} Watch streams of a replica went live ({} "
                      "ended; {})",
                      what, streams->live(), streams->ended(), streams->firstError()));
    }
  }
  const double open_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - opening).count();
  double open_gauge = 0;
  for (auto* ctrl : ctrls) open_gauge += ctrl->metric("krane_feed_streams").value_or(0);
  say("{}: all live after {:.2f} s (servers report {:.0f} open)", what, open_s, open_gauge);
  std::this_thread::sleep_for(1s);

  result.idle_qps = b.counter->rate(o.idle_window);
  say("{}: idle: {:.1f} statements/s", what, result.idle_qps);

  CtrlProcess& ctrl = *ctrls.front();
  auto stub = api::v1::ResourceService::NewStub(ownChannel(ctrl.grpcTarget()));
  WriteLoad load(
      [&](const cluster::v1::Resource& resource) -> absl::StatusOr<uint64_t> {
        grpc::ClientContext context;
        context.AddMetadata("authorization", "Bearer " + b.operator_token);
        context.set_deadline(std::chrono::system_clock::now() + 10s);
        api::v1::PutResourceRequest request;
        *request.mutable_resource() = resource;
        api::v1::PutResourceResponse response;
        grpc::Status status = stub->Put(&context, request, &response);
        if (!status.ok()) return absl::UnavailableError(strCat("Put: ", status.error_message()));
        return response.version();
      },
      kRegion, o.puts_per_s);
  const uint64_t polls_before = ctrl.metric("krane_feed_tailer_polls_total").value_or(0);
  uint64_t messages_before = 0;
  uint64_t changes_before = 0;
  for (auto& streams : groups) {
    messages_before += streams->messages();
    changes_before += streams->changes();
    streams->setRecording(true);
  }
  load.start();
  std::this_thread::sleep_for(o.warmup);
  std::vector<int> pids;
  for (auto* c : ctrls) pids.push_back(c->pid());
  CpuWindow cpu(pids, b.db_pid);
  const int64_t from = nowNs();
  result.load_qps = b.counter->rate(o.load_window);
  const int64_t to = nowNs();
  result.cpu = cpu.finish();
  load.stop();
  const uint64_t polls_after = ctrl.metric("krane_feed_tailer_polls_total").value_or(0);
  std::this_thread::sleep_for(o.drain);
  std::vector<std::vector<Sample>> samples;
  uint64_t expired = 0;
  size_t ended = 0;
  std::string first_error;
  uint64_t messages = 0;
  uint64_t changes = 0;
  for (auto& streams : groups) {
    messages += streams->messages();
    changes += streams->changes();
    streams->setRecording(false);
    for (auto& s : streams->takeSamples()) samples.push_back(std::move(s));
    expired += streams->expired();
    ended += streams->ended();
    if (first_error.empty()) first_error = streams->firstError();
  }
  result.latency = summarizeLatency(samples, load.sent(), from, to);
  result.fan_out = summarizeFanOut(samples, load.sent(), from, to);
  samples.clear();
  say("{}: load: {:.1f} statements/s; {}; tailer polls {:.1f}/s", what, result.load_qps,
      putSummary(load),
      static_cast<double>(polls_after - polls_before) /
          (std::chrono::duration<double>(o.warmup + o.load_window).count()));
  say("{}: latency p50 {:.2f} ms, p99 {:.2f} ms, max {:.2f} ms over {} samples ({} changes)", what,
      result.latency.p50_ms, result.latency.p99_ms, result.latency.max_ms, result.latency.samples,
      result.latency.changes);
  result.events_per_message =
      static_cast<double>(changes - changes_before) /
      static_cast<double>(std::max<uint64_t>(messages - messages_before, 1));
  say("{}: {} changes in {} messages ({:.2f} per message{})", what, changes - changes_before,
      messages - messages_before, result.events_per_message,
      o.batches ? ", batches accepted" : ", no batches");
  say("{}: first stream to get a change: p50 {:.2f} ms, p99 {:.2f} ms after the put was sent; "
      "first to last stream: p50 {:.2f} ms, p99 {:.2f} ms",
      what, result.fan_out.first_p50_ms, result.fan_out.first_p99_ms, result.fan_out.spread_p50_ms,
      result.fan_out.spread_p99_ms);
  result.achieved_rate = achievedRate(load, from, to);
  result.delivered = result.latency.samples;
  say("{}: {}; {}; {}", what, result.cpu.describe(), ctrlCpuPerPut(result, n),
      cpuPerEventText(result));
  result.note = missingNote(result.latency);
  const double rate = result.achieved_rate;
  if (rate < 0.95 * o.puts_per_s)
    addNote(&result.note, fmt::format("the write load reached only {:.1f} puts/s", rate));
  if (expired > 0) {
    addNote(&result.note, strCat(expired, " stream(s) were told to resync (cursor expired)"));
  }
  if (ended > 0) addNote(&result.note, strCat(ended, " stream(s) ended early: ", first_error));
  if (!result.note.empty()) say("{}: {}", what, result.note);
  for (auto& streams : groups) streams->close();
  return result;
}

// N polling clients of the original design; the write load goes through the same Writer::put
// in this process (krane-ctrl is not running).
PhaseResult measureBaseline(Bench& b, size_t n) {
  const Options& o = b.options;
  PhaseResult result;
  const uint64_t head = regionHead(*b.pool, kRegion);
  say("baseline, {} poller(s): starting after version {} on {} connections", n, head,
      std::min(n, o.baseline_connections));
  BaselinePollers pollers(b.dsn, kRegion, n, head, std::min(n, o.baseline_connections));
  std::this_thread::sleep_for(1500ms);

  const uint64_t idle_polls_before = pollers.polls();
  const auto idle_start = std::chrono::steady_clock::now();
  result.idle_qps = b.counter->rate(o.idle_window);
  const double idle_poll_rate =
      static_cast<double>(pollers.polls() - idle_polls_before) /
      std::chrono::duration<double>(std::chrono::steady_clock::now() - idle_start).count();
  say("baseline, {} poller(s): idle: {:.1f} statements/s ({:.1f} polls/s)", n, result.idle_qps,
      idle_poll_rate);

  WriteLoad load(
      [&](const cluster::v1::Resource& resource) -> absl::StatusOr<uint64_t> {
        auto written = b.writer->put(resource);
        if (!written.ok()) return written.status();
        return written->version;
      },
      kRegion, o.puts_per_s);
  pollers.setRecording(true);
  load.start();
  std::this_thread::sleep_for(o.warmup);
  pollers.takeMaxLateMs();
  const uint64_t polls_before = pollers.polls();
  const uint64_t skipped_before = pollers.skippedSlots();
  const auto load_start = std::chrono::steady_clock::now();
  CpuWindow cpu({}, b.db_pid);
  const int64_t from = nowNs();
  result.load_qps = b.counter->rate(o.load_window);
  const int64_t to = nowNs();
  result.cpu = cpu.finish();
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
  const double poll_rate = static_cast<double>(pollers.polls() - polls_before) / load_s;
  const uint64_t skipped = pollers.skippedSlots() - skipped_before;
  const double max_late = pollers.takeMaxLateMs();
  load.stop();
  std::this_thread::sleep_for(o.drain + 500ms);  // one more poll of every poller
  pollers.setRecording(false);
  pollers.stop();
  result.latency = summarizeLatency(pollers.takeSamples(), load.sent(), from, to);
  say("baseline, {} poller(s): load: {:.1f} statements/s, {:.1f} polls/s ({:.2f} per poller per "
      "s), {} slots "
      "skipped, polls started up to {:.0f} ms late; {}",
      n, result.load_qps, poll_rate, poll_rate / static_cast<double>(n), skipped, max_late,
      putSummary(load));
  say("baseline, {} poller(s): latency p50 {:.2f} ms, p99 {:.2f} ms, max {:.2f} ms over {} samples",
      n, result.latency.p50_ms, result.latency.p99_ms, result.latency.max_ms,
      result.latency.samples);
  say("baseline, {} poller(s): {}", n, result.cpu.describe());
  result.achieved_rate = achievedRate(load, from, to);
  result.note = missingNote(result.latency);
  if (poll_rate < 0.95 * static_cast<double>(n)) {
    addNote(
        &result.note,
        fmt::format("the database kept up with only {:.2f} polls per poller per second under load "
                    "({} slots skipped)",
                    poll_rate / static_cast<double>(n), skipped));
  }
  const double rate = result.achieved_rate;
  if (rate < 0.95 * o.puts_per_s)
    addNote(&result.note, fmt::format("the write load reached only {:.1f} puts/s", rate));
  if (pollers.errors() > 0) addNote(&result.note, strCat(pollers.errors(), " poll errors"));
  if (!result.note.empty()) say("baseline, {} poller(s): {}", n, result.note);
  return result;
}

// The bytes of one change's Watch message on the wire: an HTTP/2 DATA frame header (9), gRPC's
// length prefix (5) and a WatchEvent of a change of the write load's resource.
size_t watchMessageBytes() {
  cluster::v1::WatchEvent event;
  auto* change = event.mutable_change();
  change->set_op(cluster::v1::CHANGE_OP_APPLY);
  change->set_version(1000000);
  *change->mutable_resource() = timedResource(kRegion, "item-0000", nowNs());
  change->mutable_resource()->set_version(1000000);
  return 9 + 5 + event.ByteSizeLong();
}

// The socket floor (socket_floor.h) for n streams, under the write load's rate and windows.
SocketFloorResult measureSocketFloor(Bench& b, size_t n) {
  const Options& o = b.options;
  SocketFloorOptions f;
  f.streams = n;
  f.changes_per_s = o.puts_per_s;
  f.message_bytes = watchMessageBytes();
  f.threads = std::max(1u, std::thread::hardware_concurrency());
  f.warmup = o.warmup;
  f.window = o.load_window;
  say("socket floor, {} streams: one {}-byte write per stream per change, {} sender threads", n,
      f.message_bytes, f.threads);
  SocketFloorResult r = runSocketFloor(f);
  say("socket floor, {} streams: latency p50 {:.2f} ms, p99 {:.2f} ms over {} deliveries of {} "
      "changes; CPU per delivered event: senders {:.2f} us, receivers {:.2f} us",
      n, r.p50_ms, r.p99_ms, r.delivered, r.changes, r.sender_cpu_us_per_event,
      r.receiver_cpu_us_per_event);
  if (r.delivered < r.changes * n) {
    say("socket floor, {} streams: {} deliveries missing", n, r.changes * n - r.delivered);
  }
  return r;
}

// The gRPC floor: fanout_server (bench/feed/fanout_server.cc) in `mode` with n streams read by
// the lean client, under the write load's rate and windows.
struct GrpcFloorResult {
  double p50_ms = 0;
  double p99_ms = 0;
  double cpu_us_per_event = -1;
  size_t delivered = 0;
  size_t missing = 0;
};

// fanout_server in `mode`, making `rate` changes a second (0: none), and the port it serves on.
struct FanoutServer {
  std::unique_ptr<testing::ChildProcess> process;
  int port = 0;
};

FanoutServer startFanoutServer(Bench& b, const std::string& mode, double rate,
                               const std::string& log) {
  FanoutServer server;
  server.process = std::make_unique<testing::ChildProcess>(
      std::vector<std::string>{b.fanout_binary, "--mode", mode, "--rate", fmt::format("{}", rate)},
      log);
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (server.port == 0) {
    const std::string out = testing::slurp(log);
    if (out.rfind("listening on ", 0) == 0) server.port = std::atoi(out.c_str() + 13);
    if (server.port == 0 &&
        (!server.process->running() || std::chrono::steady_clock::now() > deadline)) {
      throw std::runtime_error(strCat("fanout_server --mode ", mode, " did not start: ", out));
    }
    if (server.port == 0) std::this_thread::sleep_for(20ms);
  }
  return server;
}

// What the figures of a floor server are called: gRPC's two APIs, or nghttp2.
std::string floorPrefix(const std::string& mode) {
  return mode == "nghttp2" ? std::string("nghttp2_floor_") : strCat("grpc_floor_", mode, "_");
}

std::string floorTitle(const std::string& mode) {
  return mode == "nghttp2" ? std::string("nghttp2 floor") : strCat("gRPC floor (", mode, " API)");
}

GrpcFloorResult measureGrpcFloor(Bench& b, const std::string& mode, size_t n) {
  const Options& o = b.options;
  FanoutServer fanout = startFanoutServer(b, mode, o.puts_per_s,
                                          strCat(b.work_dir, "/fanout-", mode, "-", n, ".log"));
  testing::ChildProcess& server = *fanout.process;
  GrpcFloorResult r;
  H2WatchStreams streams(strCat("127.0.0.1:", fanout.port), "", kRegion, 0, n);
  if (!streams.waitLive(120s)) {
    throw std::runtime_error(fmt::format("{}: only {} of {} streams went live; {}",
                                         floorTitle(mode), streams.live(), n,
                                         streams.firstError()));
  }
  std::this_thread::sleep_for(o.warmup);
  streams.setRecording(true);
  const double cpu_before = processCpuSeconds(server.pid());
  const int64_t from = nowNs();
  std::this_thread::sleep_for(o.load_window);
  const int64_t to = nowNs();
  const double cpu = processCpuSeconds(server.pid()) - cpu_before;
  std::this_thread::sleep_for(o.drain);
  streams.setRecording(false);
  std::vector<double> ms;
  std::set<uint64_t> changes;
  for (const auto& per_stream : streams.takeSamples()) {
    for (const Sample& s : per_stream) {
      if (s.send_ns < from || s.send_ns >= to) continue;
      ms.push_back(static_cast<double>(s.receive_ns - s.send_ns) / 1e6);
      changes.insert(s.version);
    }
  }
  streams.close();
  server.signal(SIGKILL);
  server.wait();
  r.delivered = ms.size();
  r.missing = changes.size() * n - r.delivered;
  r.p50_ms = quantile(ms, 0.5);
  r.p99_ms = quantile(ms, 0.99);
  if (r.delivered > 0 && cpu_before >= 0) {
    r.cpu_us_per_event = cpu * 1e6 / static_cast<double>(r.delivered);
  }
  say("{}, {} streams: latency p50 {:.2f} ms, p99 {:.2f} ms over {} deliveries "
      "of {} changes{}; server CPU per delivered event {:.2f} us",
      floorTitle(mode), n, r.p50_ms, r.p99_ms, r.delivered, changes.size(),
      r.missing > 0 ? fmt::format(" ({} missing)", r.missing) : std::string(), r.cpu_us_per_event);
  return r;
}

void addGrpcFloorFigures(Report& report,
                         std::map<std::string, std::map<size_t, GrpcFloorResult>>& floors) {
  for (auto& [mode, by_streams] : floors) {
    for (auto& [n, f] : by_streams) {
      report.add(strCat(floorPrefix(mode), "latency_p99_ms_streams_", n), f.p99_ms, "ms");
    }
    if (by_streams.empty()) continue;
    auto& [at, f] = *by_streams.rbegin();
    report.add(strCat(floorPrefix(mode), "cpu_us_per_delivered_event_streams_", at),
               f.cpu_us_per_event, "us");
  }
}

void addFloorFigures(Report& report, std::map<size_t, SocketFloorResult>& floor,
                     std::map<size_t, PhaseResult>& krane) {
  for (auto& [n, f] : floor) {
    report.add(strCat("floor_latency_p99_ms_streams_", n), f.p99_ms, "ms");
  }
  if (floor.empty()) return;
  auto& [at, f] = *floor.rbegin();
  report.add(strCat("floor_cpu_us_per_delivered_event_streams_", at), f.sender_cpu_us_per_event,
             "us");
  if (floor.count(100) > 0 && at > 100 && floor[100].p99_ms > 0) {
    report.add(strCat("floor_p99_ratio_streams_", at, "_to_100"), f.p99_ms / floor[100].p99_ms, "");
  }
  if (krane.count(at) > 0 && f.sender_cpu_us_per_event > 0) {
    const double k = cpuUsPerEvent(krane[at]);
    if (k > 0) {
      report.notes.push_back(fmt::format(
          "socket floor, {} streams: krane-ctrl spends {:.1f}x the floor's CPU per delivered "
          "event ({:.2f} us against {:.2f} us); the floor's receivers {:.2f} us",
          at, k / f.sender_cpu_us_per_event, k, f.sender_cpu_us_per_event,
          f.receiver_cpu_us_per_event));
    }
  }
}

// A CA and a certificate for 127.0.0.1 signed by it, made with openssl in the work directory;
// false (and a note) when openssl is missing.
bool makeCertificates(Bench& b) {
  if (!b.tls_dir.empty()) return true;
  const std::string d = b.work_dir;
  auto openssl = [&](std::vector<std::string> args) {
    args.insert(args.begin(), "/usr/bin/openssl");
    const auto r = testing::runCommand(args);
    if (r.exit_code != 0) say("openssl failed ({}): {}", r.exit_code, r.err);
    return r.exit_code == 0;
  };
  std::ofstream(d + "/server.ext") << "subjectAltName=IP:127.0.0.1\n";
  const bool ok = openssl({"req", "-x509", "-newkey", "ec", "-pkeyopt",
                           "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1", "-subj",
                           "/CN=bench-ca", "-keyout", d + "/ca.key", "-out", d + "/ca.crt"}) &&
                  openssl({"req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                           "-nodes", "-subj", "/CN=bench-ctrl", "-keyout", d + "/server.key",
                           "-out", d + "/server.csr"}) &&
                  openssl({"x509", "-req", "-in", d + "/server.csr", "-CA", d + "/ca.crt", "-CAkey",
                           d + "/ca.key", "-CAcreateserial", "-days", "1", "-extfile",
                           d + "/server.ext", "-out", d + "/server.crt"});
  if (ok) b.tls_dir = d;
  return ok;
}

std::shared_ptr<grpc::ChannelCredentials> trustingBenchCa(const Bench& b) {
  std::ifstream in(b.tls_dir + "/ca.crt");
  std::stringstream pem;
  pem << in.rdbuf();
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = pem.str();
  return grpc::SslCredentials(options);
}

// krane-ctrl's resident memory per idle stream, on a fresh process (on the watch listener, with
// TLS, when told); `per_connection` streams share a client connection.
void measureMemory(Bench& b, size_t n, size_t per_connection, const std::string& name,
                   bool watch_listener = false, bool tls = false) {
  auto ctrl = b.startCtrl(watch_listener, tls);
  std::this_thread::sleep_for(1s);
  const ProcessMemory before = ctrl->memory();
  const uint64_t head = regionHead(*b.pool, kRegion);
  say("memory: krane-ctrl VmRSS {} KiB with no stream; opening {} idle streams", before.rss_kib, n);
  ProcessMemory after;
  {
    GrpcWatchStreams streams(ctrl->watchTarget(), b.agent_token, kRegion, head, n, per_connection,
                             /*accept_batches=*/true, tls ? trustingBenchCa(b) : nullptr);
    if (!streams.waitLive(300s)) {
      throw std::runtime_error(fmt::format("only {} of {} Watch streams went live ({} ended; {})",
                                           streams.live(), n, streams.ended(),
                                           streams.firstError()));
    }
    std::this_thread::sleep_for(2s);
    after = ctrl->memory();
    say("memory: VmRSS {} KiB with {} live idle streams (server reports {} open)", after.rss_kib, n,
        ctrl->metric("krane_feed_streams").value_or(-1));
    streams.close();
  }
  b.stopCtrl(ctrl);
  const double per_stream =
      (static_cast<double>(after.rss_kib) - static_cast<double>(before.rss_kib)) /
      static_cast<double>(n);
  auto& f = b.report.add(name, per_stream, "KiB");
  f.atMost(16, "<= 16 KiB");
  b.report.notes.push_back(fmt::format(
      "{}: fresh krane-ctrl, VmRSS {} KiB with no stream, {} KiB with {} idle streams ({}{}{}) "
      "after their first bookmark",
      name, before.rss_kib, after.rss_kib, n, watch_listener ? "on the watch listener, " : "",
      tls ? "TLS, " : "",
      per_connection <= 1 ? std::string("each on its own connection")
                          : fmt::format("{} per connection", per_connection)));
}

// A floor server's resident memory per idle stream, each on its own connection: what gRPC alone
// (the completion-queue API, as krane-ctrl uses it) and an nghttp2 server spend on one agent.
void measureFloorMemory(Bench& b, const std::string& mode, size_t n) {
  FanoutServer fanout =
      startFanoutServer(b, mode, 0, strCat(b.work_dir, "/fanout-memory-", mode, ".log"));
  std::this_thread::sleep_for(1s);
  const ProcessMemory before = readProcessMemory(fanout.process->pid());
  ProcessMemory after;
  {
    GrpcWatchStreams streams(strCat("127.0.0.1:", fanout.port), b.agent_token, kRegion, 0, n, 1);
    if (!streams.waitLive(300s)) {
      throw std::runtime_error(fmt::format("{}: only {} of {} idle streams went live; {}",
                                           floorTitle(mode), streams.live(), n,
                                           streams.firstError()));
    }
    std::this_thread::sleep_for(2s);
    after = readProcessMemory(fanout.process->pid());
    streams.close();
  }
  fanout.process->signal(SIGKILL);
  fanout.process->wait();
  const double per_stream =
      (static_cast<double>(after.rss_kib) - static_cast<double>(before.rss_kib)) /
      static_cast<double>(n);
  say("memory: {}: VmRSS {} KiB with no stream, {} KiB with {} idle streams: {:.1f} KiB each",
      floorTitle(mode), before.rss_kib, after.rss_kib, n, per_stream);
  b.report.add(strCat(floorPrefix(mode), "memory_per_idle_stream_kib"), per_stream, "KiB");
}

void insertSyncData(Bench& b) {
  const size_t total = b.options.sync_resources;
  constexpr size_t kBatch = 1000;
  say("sync: writing {} resources to region {} (in-process Writer, {} per transaction)", total,
      kSyncRegion, kBatch);
  const auto start = std::chrono::steady_clock::now();
  for (size_t first = 0; first < total; first += kBatch) {
    const size_t last = std::min(total, first + kBatch);
    check(b.writer
              ->transact("bench-sync-data",
                         [&](feed::WriteTx& tx) -> absl::Status {
                           for (size_t i = first; i < last; ++i) {
                             char id[32];
                             std::snprintf(id, sizeof(id), "item-%06zu", i);
                             cluster::v1::Resource r;
                             r.set_type(kBenchType);
                             r.set_id(id);
                             r.set_region(kSyncRegion);
                             auto* g = r.mutable_generic();
                             g->set_content_type("application/json");
                             g->set_spec(fmt::format(
                                 R"({{"name":"{}","replicas":{},"labels":{{"team":"bench",)"
                                 R"("tier":"standard"}},"size":"small"}})",
                                 id, 1 + i % 5));
                             if (auto st = tx.put(r); !st.ok()) return st;
                           }
                           return absl::OkStatus();
                         })
              .status(),
          "writing the sync data");
  }
  say("sync: written in {:.1f} s",
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

// Time of a full sync (Watch at version 0 until SyncEnd), and krane-ctrl's peak memory for it.
void measureFullSync(Bench& b) {
  const size_t total = b.options.sync_resources;
  insertSyncData(b);
  auto ctrl = b.startCtrl();
  std::this_thread::sleep_for(1s);
  const ProcessMemory before = ctrl->memory();
  auto channel = ownChannel(ctrl->grpcTarget());
  if (!channel->WaitForConnected(std::chrono::system_clock::now() + 10s)) {
    throw std::runtime_error("cannot connect to krane-ctrl for the full sync");
  }
  auto stub = cluster::v1::ClusterService::NewStub(channel);
  grpc::ClientContext context;
  context.AddMetadata("authorization", "Bearer " + b.sync_token);
  cluster::v1::WatchRequest request;
  request.set_region(kSyncRegion);
  request.set_version(0);
  request.set_agent_id("bench-sync");
  request.set_accept_batches(b.options.batches);
  say("sync: Watch from version 0 (krane-ctrl VmRSS {} KiB before)", before.rss_kib);
  const auto start = std::chrono::steady_clock::now();
  auto reader = stub->Watch(&context, request);
  cluster::v1::WatchEvent message;
  size_t changes = 0;
  size_t messages = 0;
  bool began = false;
  bool ended = false;
  uint64_t announced = 0;
  auto take = [&](const cluster::v1::WatchEvent& event) {
    if (event.has_sync_begin()) {
      began = true;
    } else if (event.has_change()) {
      ++changes;
    } else if (event.has_sync_end()) {
      ended = true;
      announced = event.sync_end().resource_count();
    } else if (event.has_cursor_expired()) {
      throw std::runtime_error(strCat("full sync refused: ", event.cursor_expired().message()));
    }
  };
  while (!ended && reader->Read(&message)) {
    ++messages;
    if (message.has_batch()) {
      for (const auto& event : message.batch().events()) take(event);
    } else {
      take(message);
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  context.TryCancel();
  (void)reader->Finish();
  if (!began || !ended) throw std::runtime_error("the full sync stream ended before SyncEnd");
  if (changes != total) {
    throw std::runtime_error(
        fmt::format("the full sync sent {} resources, expected {}", changes, total));
  }
  const ProcessMemory after = ctrl->memory();
  b.stopCtrl(ctrl);
  say("sync: {} resources in {:.2f} s ({:.0f}/s) in {} messages; SyncEnd.resource_count {}; "
      "krane-ctrl VmHWM {} KiB",
      changes, seconds, static_cast<double>(changes) / seconds, messages, announced, after.hwm_kib);

  const std::string name = fmt::format("full_sync_{}k_s", total / 1000);
  auto& f = b.report.add(name, seconds, "s");
  if (total == 100000) {
    f.atMost(3, "<= 3 s");
  }
  b.report.add("ctrl_peak_rss_mib_full_sync", static_cast<double>(after.hwm_kib) / 1024.0, "MiB");
  b.report.notes.push_back(
      fmt::format("{}: Watch at version 0 on a fresh krane-ctrl until SyncEnd, {} generic "
                  "resources of ~100 bytes, the client "
                  "only counts events; ctrl_peak_rss_mib_full_sync is krane-ctrl's VmHWM after it "
                  "(VmRSS before: {} KiB)",
                  name, total, before.rss_kib));
}

// "Database load does not grow with the number of streams": each figure against the one with
// the fewest streams. A load figure is only judged when the write load got its full rate at both
// (a saturated machine that put less would pass for the wrong reason).
void flatTarget(Report& report, const std::string& prefix, const std::vector<size_t>& counts,
                std::map<size_t, PhaseResult>& results, double rate, bool under_load) {
  if (counts.empty()) return;
  Figure* first = report.find(strCat(prefix, counts.front()));
  if (first == nullptr) return;
  const double limit = first->value * 1.25 + 5;
  const auto full_rate = [&](size_t n) {
    return !under_load || results[n].achieved_rate >= 0.95 * rate;
  };
  for (size_t i = 1; i < counts.size(); ++i) {
    Figure* f = report.find(strCat(prefix, counts[i]));
    if (f == nullptr) continue;
    if (!full_rate(counts.front()) || !full_rate(counts[i])) {
      f->target = "flat: not judged, write load short";
      continue;
    }
    f->atMost(limit, fmt::format("flat: <= {:.0f} (1.25x {} stream + 5)", limit, counts.front()));
  }
}

int run(int argc, char** argv) {
  Bench b;
  Options& o = b.options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--json") {
      o.json = true;
    } else if (arg == "--quick") {
      o.quick = true;
    } else if (arg == "--ctrl" && i + 1 < argc) {
      o.ctrl_binary = argv[++i];
    } else if (arg == "--replica-streams" && i + 1 < argc) {
      o.replica_streams = std::stoul(argv[++i]);
    } else if (arg == "--only" && i + 1 < argc) {
      for (const auto& phase : absl::StrSplit(argv[++i], ',')) {
        static const std::set<std::string> kPhases = {"streams",  "replicas", "listener", "floor",
                                                      "baseline", "memory",   "sync"};
        if (kPhases.count(std::string(phase)) == 0) {
          fmt::print(stderr, "feed: --only: unknown phase \"{}\"\n\n{}", phase, kUsage);
          return 2;
        }
        o.only.insert(std::string(phase));
      }
    } else if (arg == "--no-batches") {
      o.batches = false;
    } else if (arg == "--grpc-clients") {
      o.grpc_clients = true;
    } else if (arg == "--no-peer-hints") {
      o.peer_hints = false;
    } else if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else {
      fmt::print(stderr, "feed: unknown argument \"{}\"\n\n{}", arg, kUsage);
      return 2;
    }
  }
  if (o.quick) {
    o.stream_counts = {1, 100};
    o.replica_streams = 2000;
    o.memory_streams = 100;
    o.sync_resources = 20000;
    o.idle_window = 3s;
    o.load_window = 4s;
    o.drain = 1500ms;
  }
  raiseFileLimit();
  const std::string load_at_start = loadAverage();
  setup(b, argv[0]);

  std::map<size_t, PhaseResult> krane;
  std::map<size_t, PhaseResult> baseline;
  PhaseResult replicated;
  double replicas_idle_no_streams = 0;
  // The floors and the baseline measure the same stream counts, whether krane-ctrl's phase runs
  // or not.
  const std::vector<size_t> all_counts = o.stream_counts;
  if (!o.runs("streams")) {
    o.stream_counts = o.runs("replicas") ? std::vector<size_t>{1} : std::vector<size_t>{};
  }
  if (!o.stream_counts.empty()) {
    auto ctrl = b.startCtrl();
    for (size_t n : o.stream_counts) krane[n] = measureKrane(b, {ctrl.get()}, n);
    if (o.runs("replicas")) {
      std::vector<std::unique_ptr<CtrlProcess>> others;
      std::vector<CtrlProcess*> all{ctrl.get()};
      for (size_t i = 1; i < o.replicas; ++i) {
        others.push_back(b.startCtrl());
        all.push_back(others.back().get());
      }
      std::this_thread::sleep_for(1s);
      replicas_idle_no_streams = b.counter->rate(o.idle_window);
      say("{} replicas, no stream: idle: {:.1f} statements/s", o.replicas,
          replicas_idle_no_streams);
      replicated = measureKrane(b, all, o.replica_streams, o.per_connection);
      for (auto& other : others) b.stopCtrl(other);
    }
    b.stopCtrl(ctrl);
  }
  // The watch listener: the same streams on feed.watch_listen instead of the gRPC port.
  std::map<size_t, PhaseResult> listener;
  PhaseResult listener_replicated;
  if (o.runs("listener")) {
    auto ctrl = b.startCtrl(/*watch_listener=*/true);
    for (size_t n : all_counts) {
      if (n >= 100) listener[n] = measureKrane(b, {ctrl.get()}, n);
    }
    if (o.runs("replicas")) {
      std::vector<std::unique_ptr<CtrlProcess>> others;
      std::vector<CtrlProcess*> all{ctrl.get()};
      for (size_t i = 1; i < o.replicas; ++i) {
        others.push_back(b.startCtrl(/*watch_listener=*/true));
        all.push_back(others.back().get());
      }
      std::this_thread::sleep_for(1s);
      listener_replicated = measureKrane(b, all, o.replica_streams, o.per_connection);
      for (auto& other : others) b.stopCtrl(other);
    }
    b.stopCtrl(ctrl);
    measureMemory(b, o.memory_streams, 1, "watch_listener_memory_per_idle_stream_kib",
                  /*watch_listener=*/true);
    measureMemory(b, o.replica_streams / o.replicas, o.per_connection,
                  "watch_listener_memory_per_idle_stream_kib_shared_connections",
                  /*watch_listener=*/true);
    // With TLS (an agent's connection across regions): the listener, and the gRPC port.
    if (makeCertificates(b)) {
      measureMemory(b, o.memory_streams, 1, "watch_listener_tls_memory_per_idle_stream_kib",
                    /*watch_listener=*/true, /*tls=*/true);
      measureMemory(b, o.memory_streams, 1, "tls_memory_per_idle_stream_kib",
                    /*watch_listener=*/false, /*tls=*/true);
    }
  }
  std::map<size_t, SocketFloorResult> floor;
  std::map<std::string, std::map<size_t, GrpcFloorResult>> grpc_floors;
  if (o.runs("floor")) {
    for (size_t n : all_counts) {
      if (n < 100) continue;
      floor[n] = measureSocketFloor(b, n);
      for (const char* mode : {"callback", "async", "nghttp2"})
        grpc_floors[mode][n] = measureGrpcFloor(b, mode, n);
    }
  }
  if (o.runs("baseline")) {
    for (size_t n : all_counts) baseline[n] = measureBaseline(b, n);
  }
  if (o.runs("memory")) {
    measureMemory(b, o.memory_streams, 1, "memory_per_idle_stream_kib");
    for (const char* mode : {"async", "nghttp2"}) measureFloorMemory(b, mode, o.memory_streams);
    measureMemory(b, o.replica_streams / o.replicas, o.per_connection,
                  "memory_per_idle_stream_kib_shared_connections");
  }
  if (o.runs("sync")) measureFullSync(b);

  // Figures in a fixed order: Krane per N, baseline per N, then the rest as measured.
  Report& r = b.report;
  std::vector<Figure> rest = r.figures();
  Report ordered;
  for (const char* prefix : {"", "baseline_"}) {
    auto& results = std::string(prefix).empty() ? krane : baseline;
    if (!std::string(prefix).empty() && !o.runs("baseline")) continue;
    for (size_t n : o.stream_counts) {
      const auto& p = results[n];
      ordered.add(strCat(prefix, "latency_p50_ms_streams_", n), p.latency.p50_ms, "ms");
      auto& p99 = ordered.add(strCat(prefix, "latency_p99_ms_streams_", n), p.latency.p99_ms, "ms");
      if (std::string(prefix).empty() && n == 100) {
        p99.atMost(25, "<= 25 ms");
      }
      ordered.add(strCat(prefix, "db_queries_per_s_idle_streams_", n), p.idle_qps, "q/s");
      ordered.add(strCat(prefix, "db_queries_per_s_load_streams_", n), p.load_qps, "q/s");
    }
  }
  if (krane.count(100) > 0 && krane.count(1000) > 0) {
    Figure* p99 = ordered.find("latency_p99_ms_streams_1000");
    const double limit = 4 * krane[100].latency.p99_ms;
    p99->atMost(limit, fmt::format("<= {:.1f} ms (4x p99 at 100 streams)", limit));
  }
  if (o.runs("replicas")) {
    const size_t n = o.replica_streams;
    ordered.add(strCat("latency_p50_ms_streams_", n), replicated.latency.p50_ms, "ms");
    auto& p99 = ordered.add(strCat("latency_p99_ms_streams_", n), replicated.latency.p99_ms, "ms");
    p99.atMost(250, "<= 250 ms");
    auto& idle = ordered.add(strCat("db_queries_per_s_idle_replicas_", o.replicas),
                             replicated.idle_qps, "q/s");
    const double one = krane[o.stream_counts.front()].idle_qps;
    const double limit = static_cast<double>(o.replicas) * one + 5;
    idle.atMost(limit, fmt::format("<= {:.0f} ({}x one replica's + 5)", limit, o.replicas));
    ordered.add(strCat("db_queries_per_s_load_replicas_", o.replicas), replicated.load_qps, "q/s");
  }
  if (!o.stream_counts.empty()) {
    const size_t at = krane.count(1000) > 0 ? 1000 : o.stream_counts.back();
    auto& cpu = ordered.add("cpu_us_per_delivered_event", cpuUsPerEvent(krane[at]), "us");
    cpu.atMost(5, fmt::format("<= 5 us (at {} streams)", at));
    ordered.add(strCat("events_per_message_streams_", at), krane[at].events_per_message, "");
  }
  if (o.runs("replicas")) {
    const size_t n = o.replica_streams;
    auto& cpu_r = ordered.add(strCat("cpu_us_per_delivered_event_streams_", n),
                              cpuUsPerEvent(replicated), "us");
    cpu_r.atMost(5, "<= 5 us");
    ordered.add(strCat("events_per_message_streams_", n), replicated.events_per_message, "");
  }
  if (!listener.empty()) {
    for (const auto& [n, p] : listener) {
      ordered.add(strCat("watch_listener_latency_p50_ms_streams_", n), p.latency.p50_ms, "ms");
      auto& p99 =
          ordered.add(strCat("watch_listener_latency_p99_ms_streams_", n), p.latency.p99_ms, "ms");
      if (n == 1000 && listener.count(100) > 0) {
        const double limit = 4 * listener[100].latency.p99_ms;
        p99.atMost(limit, fmt::format("<= {:.1f} ms (4x its p99 at 100 streams)", limit));
      }
    }
    const size_t at = listener.count(1000) > 0 ? 1000 : listener.rbegin()->first;
    auto& cpu =
        ordered.add("watch_listener_cpu_us_per_delivered_event", cpuUsPerEvent(listener[at]), "us");
    cpu.atMost(5, fmt::format("<= 5 us (at {} streams)", at));
    if (o.runs("replicas")) {
      const size_t n = o.replica_streams;
      ordered.add(strCat("watch_listener_latency_p50_ms_streams_", n),
                  listener_replicated.latency.p50_ms, "ms");
      auto& p99 = ordered.add(strCat("watch_listener_latency_p99_ms_streams_", n),
                              listener_replicated.latency.p99_ms, "ms");
      p99.atMost(250, "<= 250 ms");
      auto& cpu_r = ordered.add(strCat("watch_listener_cpu_us_per_delivered_event_streams_", n),
                                cpuUsPerEvent(listener_replicated), "us");
      cpu_r.atMost(5, "<= 5 us");
    }
  }
  addFloorFigures(ordered, floor, krane);
  addGrpcFloorFigures(ordered, grpc_floors);
  flatTarget(ordered, "db_queries_per_s_idle_streams_", o.stream_counts, krane, o.puts_per_s,
             false);
  flatTarget(ordered, "db_queries_per_s_load_streams_", o.stream_counts, krane, o.puts_per_s, true);
  for (auto& f : rest) ordered.add(f.name, f.value, f.unit) = f;
  ordered.notes = r.notes;

  for (size_t n : o.stream_counts) {
    StreamRow row;
    row.streams = n;
    const auto& k = krane[n];
    const auto& p = baseline[n];
    row.krane_p50 = k.latency.p50_ms;
    row.krane_p99 = k.latency.p99_ms;
    row.krane_idle_qps = k.idle_qps;
    row.krane_load_qps = k.load_qps;
    row.krane_note = k.note;
    row.base_p50 = p.latency.p50_ms;
    row.base_p99 = p.latency.p99_ms;
    row.base_idle_qps = p.idle_qps;
    row.base_load_qps = p.load_qps;
    row.base_note = p.note;
    ordered.rows.push_back(row);
  }
  const unsigned cpus = std::thread::hardware_concurrency();
  ordered.header = {
      fmt::format("Krane change feed benchmark{}",
                  o.quick ? " (--quick: a smoke run, not for comparison)" : ""),
      fmt::format("  krane-ctrl: the real binary in its own process (poll_interval_ms 50, {}, "
                  "default config); scratch "
                  "MariaDB; {} CPUs shared by the database, krane-ctrl and the clients",
                  o.peer_hints ? "peer hints on" : "peer hints off", cpus),
      fmt::format("  write load: {:.0f} puts/s of a small generic resource; Krane: through "
                  "ResourceService.Put of "
                  "krane-ctrl; baseline: the same feed::Writer::put in the benchmark (krane-ctrl "
                  "not running)",
                  o.puts_per_s),
      fmt::format(
          "  latency: commit-to-receive at every stream for every change, {} s windows after {} s "
          "of "
          "warm-up; db q/s: the server's Questions counter over {} s (idle) and {} s (load)",
          o.load_window.count() / 1000.0, o.warmup.count() / 1000.0, o.idle_window.count() / 1000.0,
          o.load_window.count() / 1000.0),
  };
  ordered.notes.insert(ordered.notes.begin(),
                       {"db q/s count every statement the server ran minus the benchmark's own "
                        "counter reads; the write load's own "
                        "statements (one transaction per put) are included in both the Krane and "
                        "the baseline figures.",
                        fmt::format("Krane streams resume from the region's current version and "
                                    "each runs on its own connection; "
                                    "baseline pollers run `SELECT ... FROM resource_changes WHERE "
                                    "region_id = ? AND version > ? "
                                    "ORDER BY version LIMIT 100` once a second each, then one "
                                    "lookup in `resources` per row, on a "
                                    "pool of {} connections.",
                                    o.baseline_connections),
                        "Targets: p99 <= 25 ms at 100 streams; p99 at 1000 streams <= 4x p99 at "
                        "100; p99 <= 250 ms at 10,000 streams on two replicas; db q/s not growing "
                        "with streams, and with two replicas <= twice one replica's; krane-ctrl "
                        "CPU <= 5 us per delivered event; full sync of 100k <= 3 s; "
                        "<= 16 KiB per idle stream."});
  for (size_t n : o.stream_counts) {
    const auto& k = krane[n];
    ordered.notes.push_back(
        fmt::format("Krane, {} stream(s): {}; {}", n, k.cpu.describe(), ctrlCpuPerPut(k, n)));
  }
  for (size_t n : o.stream_counts) {
    ordered.notes.push_back(fmt::format("Krane, {} stream(s): {}", n, cpuPerEventText(krane[n])));
  }
  for (const auto& [n, p] : listener) {
    ordered.notes.push_back(fmt::format("Krane on the watch listener, {} streams: {}; {}", n,
                                        p.cpu.describe(), cpuPerEventText(p)));
  }
  if (!listener.empty() && o.runs("replicas")) {
    ordered.notes.push_back(fmt::format(
        "Krane on the watch listener, {} replicas, {} streams ({} per client connection): {}; {}{}",
        o.replicas, o.replica_streams, o.per_connection, listener_replicated.cpu.describe(),
        cpuPerEventText(listener_replicated),
        listener_replicated.note.empty() ? "" : strCat("; ", listener_replicated.note)));
  }
  if (o.runs("replicas"))
    ordered.notes.push_back(fmt::format(
        "Krane, {} replicas, {} streams ({} per client connection, half on each replica; the "
        "puts go to the first replica, the second sees them {}): {}; {}; "
        "statements/s idle with the replicas and no stream {:.1f}, with the streams {:.1f}{}",
        o.replicas, o.replica_streams, o.per_connection,
        o.peer_hints ? "through its peer hints" : "by polling every 50 ms",
        replicated.cpu.describe(), cpuPerEventText(replicated), replicas_idle_no_streams,
        replicated.idle_qps, replicated.note.empty() ? "" : strCat("; ", replicated.note)));
  for (size_t n : o.runs("baseline") ? all_counts : std::vector<size_t>{}) {
    ordered.notes.push_back(
        fmt::format("baseline, {} poller(s): {}", n, baseline[n].cpu.describe()));
  }
  for (size_t n : o.stream_counts) {
    ordered.notes.push_back(
        fmt::format("{} stream(s): statements per put under load ((load - idle) / puts per "
                    "second): Krane {:.1f} at "
                    "{:.1f} puts/s, baseline {:.1f} at {:.1f} puts/s",
                    n, statementsPerPut(krane[n]), krane[n].achieved_rate,
                    statementsPerPut(baseline[n]), baseline[n].achieved_rate));
  }
  for (size_t n : o.stream_counts) {
    if (n < 2) continue;
    const auto& f = krane[n].fan_out;
    ordered.notes.push_back(
        fmt::format("Krane fan-out at {} streams: the first stream got a change {:.2f} ms (p50) / "
                    "{:.2f} ms (p99) after the put "
                    "was sent, the last one {:.2f} ms (p50) / {:.2f} ms (p99) after the first",
                    n, f.first_p50_ms, f.first_p99_ms, f.spread_p50_ms, f.spread_p99_ms));
  }
  ordered.header.push_back(
      fmt::format("  load average (1 min) at start {}, at end {} (other work on the machine "
                  "disturbs the latency figures)",
                  load_at_start, loadAverage()));
  if (o.quick) {
    ordered.notes.push_back(
        fmt::format("--quick: memory per stream measured with {} streams, sync of {} resources",
                    o.memory_streams, o.sync_resources));
  }

  // The logs only matter when something went wrong (then the directory is kept).
  std::error_code ec;
  if (std::getenv("KRANE_BENCH_KEEP") == nullptr) std::filesystem::remove_all(b.work_dir, ec);

  std::FILE* table_out = o.json ? stderr : stdout;
  fmt::print(table_out, "\n");
  ordered.printTable(table_out);
  if (o.json) ordered.printJson(stdout);
  return 0;
}

}  // namespace
}  // namespace krane::bench

int main(int argc, char** argv) {
  krane::setUpProcess();  // the load generator's gRPC costs less, as krane-ctrl's does
  try {
    return krane::bench::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "feed: error: %s\n", e.what());
    return 1;
  }
}
