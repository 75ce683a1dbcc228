#include "plugins/sentinel/proxy/proxy.h"

#include <httplib.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <condition_variable>
#include <cstdlib>
#include <functional>
#include <map>
#include <utility>

#include <spdlog/spdlog.h>

#include "absl/strings/str_join.h"
#include "common/files.h"
#include "common/http_serve.h"
#include "common/strings.h"

namespace krane::sentinel {

// One version of the routes. Requests hold it while they run, so a replaced set lives on (and
// its endpoints keep being used by those requests) until its last request completed.
struct RoutingProxy::RouteSet {
  explicit RouteSet(Routes r) : routes(std::move(r)) {}
  ~RouteSet() {
    if (replaced) {
      spdlog::info("sentinel proxy: drained routes of deployment={} ({} endpoints)",
                   routes.deployment_id, routes.endpoints.size());
    }
  }
  const Routes routes;
  std::atomic<size_t> next{0};
  std::atomic<bool> replaced{false};
};

// Runs what it is given at a set time, on a thread of its own. A request's exchange with its
// instances ends at its deadline whatever it waits for then (a connection, the answer's headers
// or body, the request's body going out): each read's own timeout restarts with every byte.
class RoutingProxy::Watchdog {
 public:
  using Clock = std::chrono::steady_clock;
  using Key = std::pair<Clock::time_point, uint64_t>;

  Watchdog() : thread_([this] { run(); }) {}
  ~Watchdog() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }

  // `fire` runs at `when` unless cancel() came first.
  Key arm(Clock::time_point when, std::function<void()> fire) {
    std::lock_guard lock(mutex_);
    const Key key(when, ++next_);
    timers_.emplace(key, std::move(fire));
    wake_.notify_all();
    return key;
  }
  // On return the timer's `fire` is not running, and will not run.
  void cancel(const Key& key) {
    std::unique_lock lock(mutex_);
    timers_.erase(key);
    fired_.wait(lock, [&] { return firing_ != key; });
  }

 private:
  void run() {
    std::unique_lock lock(mutex_);
    while (!stopping_) {
      if (timers_.empty()) {
        wake_.wait(lock);
      } else if (Clock::now() < timers_.begin()->first.first) {
        wake_.wait_until(lock, timers_.begin()->first.first);
      } else {
        // Outside the lock: a `fire` that blocks a moment (a client's stop() waits for its
        // connect) holds up no other request's cancel().
        firing_ = timers_.begin()->first;
        auto fire = std::move(timers_.begin()->second);
        timers_.erase(timers_.begin());
        lock.unlock();
        fire();
        lock.lock();
        firing_ = Key();
        fired_.notify_all();
      }
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable fired_;
  std::map<Key, std::function<void()>> timers_;
  Key firing_;  // the timer whose `fire` runs; keys start at 1
  uint64_t next_ = 0;
  bool stopping_ = false;
  std::thread thread_;
};

namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// Headers that describe one connection, not the request (RFC 9110 7.6.1), those httplib sets
// itself, and the ones httplib's server adds to describe the client socket.
bool hopByHop(const std::string& name) {
  // Host is kept: the app sees the name its users asked for (absolute links, host checks).
  static const char* const kNames[] = {
      "connection",  "keep-alive",  "proxy-connection", "transfer-encoding",
      "te",          "trailer",     "upgrade",          "content-length",
      "remote_addr", "remote_port", "local_addr",       "local_port"};
  const std::string n = lower(name);
  return std::any_of(std::begin(kNames), std::end(kNames), [&](const char* k) { return n == k; });
}

// The encodings the upstream client (cpp-httplib) decodes as the body arrives: exactly its own
// test of the header's value, so that a body it left encoded keeps its header.
bool decodedOnReceipt(const std::string& encoding) {
  return encoding == "gzip" || encoding == "deflate" || encoding.find("br") != std::string::npos;
}

bool idempotent(const std::string& method) {
  return method == "GET" || method == "HEAD" || method == "OPTIONS" || method == "PUT" ||
         method == "DELETE";
}

}  // namespace

RoutingProxy::RoutingProxy(ProxyOptions options)
    : options_(std::move(options)), server_(std::make_unique<httplib::Server>()) {}

RoutingProxy::~RoutingProxy() { stop(); }

class RoutingProxy::CountingQueue : public httplib::TaskQueue {
 public:
  CountingQueue(size_t threads, std::atomic<CountingQueue*>* registered)
      : pool_(threads), registered_(registered) {
    registered_->store(this);
  }
  ~CountingQueue() override { registered_->store(nullptr); }
  void enqueue(std::function<void()> fn) override {
    ++waiting_;
    pool_.enqueue([this, fn = std::move(fn)] {
      --waiting_;
      fn();
    });
  }
  void shutdown() override { pool_.shutdown(); }
  size_t waiting() const { return waiting_.load(); }

 private:
  httplib::ThreadPool pool_;
  std::atomic<CountingQueue*>* registered_;
  std::atomic<size_t> waiting_{0};
};

absl::Status RoutingProxy::start() {
  reload();
  watchdog_ = std::make_unique<Watchdog>();
  const auto handler = [this](const httplib::Request& req, httplib::Response& res) {
    handle(req, res);
  };
  const size_t threads = static_cast<size_t>(std::max(options_.threads, 1));
  server_->new_task_queue = [this, threads] { return new CountingQueue(threads, &queue_); };
  server_->Get(".*", handler);
  server_->Post(".*", handler);
  server_->Put(".*", handler);
  server_->Patch(".*", handler);
  server_->Delete(".*", handler);
  server_->Options(".*", handler);
  // Reading from the client only: the instances' answers have their own timeouts (forward). A
  // kept-alive connection holds its thread while it waits for its next request too.
  const time_t client_s = std::max<time_t>(options_.client_timeout.count(), 1);
  server_->set_read_timeout(client_s);
  server_->set_keep_alive_timeout(std::min<time_t>(client_s, 5));
  server_->set_payload_max_length(options_.max_body_bytes);
  if (options_.port == 0) {
    port_ = server_->bind_to_any_port(options_.host);
  } else {
    port_ = server_->bind_to_port(options_.host, options_.port) ? options_.port : -1;
  }
  if (port_ <= 0) {
    return absl::UnavailableError(
        strCat("sentinel proxy: cannot listen on ", options_.host, ":", options_.port));
  }
  if (options_.health_port) {
    // Threads of its own, which requests never take; short timeouts and one request per
    // connection, so that no client of this port holds one for long either.
    health_server_ = std::make_unique<httplib::Server>();
    health_server_->new_task_queue = [] { return new httplib::ThreadPool(4); };
    health_server_->Get(".*", [this](const httplib::Request& req, httplib::Response& res) {
      if (!health(req, res)) res.status = 404;
    });
    health_server_->set_read_timeout(2);
    health_server_->set_write_timeout(2);
    health_server_->set_keep_alive_timeout(2);  // also the wait for a connection's first request
    health_server_->set_keep_alive_max_count(1);
    const int wanted = *options_.health_port;
    if (wanted == 0) {
      health_port_ = health_server_->bind_to_any_port(options_.host);
    } else {
      health_port_ = health_server_->bind_to_port(options_.host, wanted) ? wanted : -1;
    }
    if (health_port_ <= 0) {
      return absl::UnavailableError(strCat("sentinel proxy: cannot listen for health probes on ",
                                           options_.host, ":", wanted));
    }
    health_thread_ = serveInBackground(*health_server_);
  }
  serve_thread_ = serveInBackground(*server_);
  if (!options_.routes_file.empty()) watch_thread_ = std::thread([this] { watch(); });
  spdlog::info(
      "sentinel proxy: listening on {}:{} health_port={} routes_file={} liveness={} readiness={}",
      options_.host, port_, health_port_, options_.routes_file, options_.liveness_path,
      options_.readiness_path);
  return absl::OkStatus();
}

void RoutingProxy::drain() {
  if (!draining_.exchange(true)) {
    spdlog::info("sentinel proxy: draining: readiness answers 503, requests are still served");
  }
}

void RoutingProxy::stop() {
  draining_ = true;  // not ready while the requests in flight complete
  if (serve_thread_.joinable()) {
    // Connections accepted while every thread was busy wait in the queue with their requests
    // sent: httplib's stop() would close them unread. They get a thread first (the queue is
    // the server's own, alive while it serves), for up to the client timeout.
    const auto give_up = std::chrono::steady_clock::now() + options_.client_timeout;
    bool waited = false;
    while (std::chrono::steady_clock::now() < give_up) {
      CountingQueue* queue = queue_.load();
      if (queue == nullptr || queue->waiting() == 0) break;
      waited = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    // A connection just taken by a thread checks that the server still runs before it reads
    // its request: a moment for the last of them to get past that.
    if (waited) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    server_->stop();  // returns once the requests in flight completed
    serve_thread_.join();
  }
  watchdog_.reset();  // no request uses it any more
  // Probes are answered until then: a proxy finishing its requests is alive. The routes are
  // followed until then too: a request served meanwhile goes where they point now.
  if (health_thread_.joinable()) {
    health_server_->stop();
    health_thread_.join();
  }
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  if (watch_thread_.joinable()) watch_thread_.join();
}

void RoutingProxy::setRoutes(Routes routes) {
  auto next = std::make_shared<RouteSet>(std::move(routes));
  std::shared_ptr<RouteSet> previous;
  {
    std::lock_guard lock(mutex_);
    previous = std::exchange(routes_, next);
  }
  if (previous != nullptr && previous->routes == next->routes) return;
  std::vector<std::string> addresses;
  for (const auto& e : next->routes.endpoints) addresses.push_back(e.address());
  spdlog::info("sentinel proxy: routing to deployment={} endpoints=[{}]",
               next->routes.deployment_id, absl::StrJoin(addresses, ", "));
  // Requests still running on the previous set keep it; it goes (and says so) with the last.
  if (previous != nullptr) previous->replaced = true;
}

std::shared_ptr<RoutingProxy::RouteSet> RoutingProxy::current() const {
  std::lock_guard lock(mutex_);
  return routes_;
}

bool RoutingProxy::ready() const {
  if (draining_) return false;
  auto set = current();
  if (set == nullptr) return false;  // no routes handed over yet
  // With no live deployment there is nothing to route yet: ready (a sentinel is created before
  // its environment's first deployment goes live, and that deploy waits for it).
  return !set->routes.endpoints.empty() || set->routes.deployment_id.empty();
}

Routes RoutingProxy::routes() const {
  auto set = current();
  return set != nullptr ? set->routes : Routes();
}

bool RoutingProxy::health(const httplib::Request& req, httplib::Response& res) const {
  if (req.method != "GET") return false;
  if (req.path == options_.liveness_path) {
    res.set_content("alive\n", "text/plain");
    return true;
  }
  if (req.path != options_.readiness_path) return false;
  if (ready()) {
    res.set_content("ready\n", "text/plain");
  } else {
    res.status = 503;
    res.set_content(draining_ ? "not ready: draining, the proxy is stopping\n"
                              : "not ready: no route to a ready instance of the live deployment\n",
                    "text/plain");
  }
  return true;
}

void RoutingProxy::handle(const httplib::Request& req, httplib::Response& res) {
  if (health(req, res)) return;
  forward(req, res);
  // The client's next request should find a proxy that is staying.
  if (draining_) res.set_header("Connection", "close");
}

void RoutingProxy::forward(const httplib::Request& req, httplib::Response& res) {
  const std::shared_ptr<RouteSet> set = current();  // held until this request completes
  if (set == nullptr || set->routes.endpoints.empty()) {
    res.status = 503;
    res.set_content(set != nullptr && set->routes.deployment_id.empty()
                        ? "no route: the environment has no live deployment\n"
                        : "no route: the sentinel knows no ready instance of the live deployment\n",
                    "text/plain");
    return;
  }
  httplib::Request out;
  out.method = req.method;
  out.path = req.target.empty() ? req.path : req.target;
  out.body = req.body;
  for (const auto& [name, value] : req.headers) {
    // The answer is decompressed on its way in and compressed for the client on its way out (as
    // its Accept-Encoding says): the app need not compress it in between. And the server cuts
    // the client's Range from the whole body: a range of the app's would be cut again.
    const std::string n = lower(name);
    if (!hopByHop(name) && n != "accept-encoding" && n != "range" && n != "if-range") {
      out.headers.emplace(name, value);
    }
  }
  // The peer's address as the server saw it (a REMOTE_ADDR header the client sent is dropped
  // above, with the other names the server uses for itself: it would forge the last hop).
  const std::string client = req.remote_addr;
  const std::string forwarded = req.get_header_value("X-Forwarded-For");
  out.headers.erase("X-Forwarded-For");
  out.headers.emplace("X-Forwarded-For",
                      forwarded.empty() ? client : strCat(forwarded, ", ", client));
  if (!req.has_header("X-Forwarded-Host") && req.has_header("Host")) {
    out.headers.emplace("X-Forwarded-Host", req.get_header_value("Host"));
  }

  // The whole exchange, every attempt and the last byte of the answer included, ends within the
  // upstream timeout: each read waiting that long on its own let an instance that trickles its
  // answer (or endpoints that time out one after another) hold the request past the sentinel's
  // termination grace.
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + options_.upstream_timeout;
  const auto& endpoints = set->routes.endpoints;
  const size_t first = set->next.fetch_add(1);
  std::string last_error;
  for (size_t attempt = 0; attempt < endpoints.size(); ++attempt) {
    const auto left = deadline - Clock::now();
    if (left <= Clock::duration::zero()) break;
    const Endpoint& e = endpoints[(first + attempt) % endpoints.size()];
    httplib::Client upstream(e.host, e.port);
    upstream.set_url_encode(false);
    upstream.set_keep_alive(false);
    // Whole milliseconds, at least one: a timeout of 0 would give up at once.
    const auto left_ms = std::max(std::chrono::duration_cast<std::chrono::milliseconds>(left),
                                  std::chrono::milliseconds(1));
    upstream.set_connection_timeout(std::min(options_.connect_timeout, left_ms));
    upstream.set_read_timeout(left_ms);
    upstream.set_write_timeout(left_ms);
    // At the deadline the socket is shut down, and whatever the attempt waits for fails.
    std::atomic<bool> timed_out{false};
    const Watchdog::Key timer = watchdog_->arm(deadline, [&] {
      timed_out = true;
      upstream.stop();
    });
    struct Disarm {
      Watchdog& watchdog;
      const Watchdog::Key& key;
      ~Disarm() { watchdog.cancel(key); }
    } disarm{*watchdog_, timer};
    httplib::Response answer;
    httplib::Error error = httplib::Error::Success;
    httplib::Request attempt_req = out;
    // The answer is held in memory until it is complete: bounded in size here, in time by the
    // watchdog.
    enum class Cut { kNo, kTooLarge, kTooSlow } cut = Cut::kNo;
    std::string body;
    attempt_req.response_handler = [&](const httplib::Response& head) {
      // Refused at once when it says it is too large (a body sent encoded may grow as it is
      // decoded: those are counted as they arrive).
      if (head.has_header("Content-Length") && !head.has_header("Content-Encoding") &&
          std::strtoull(head.get_header_value("Content-Length").c_str(), nullptr, 10) >
              options_.max_answer_bytes) {
        cut = Cut::kTooLarge;
        return false;
      }
      return true;
    };
    attempt_req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      if (body.size() + n > options_.max_answer_bytes) {
        cut = Cut::kTooLarge;
        return false;
      }
      body.append(data, n);
      return true;
    };
    const bool answered = upstream.send(attempt_req, answer, error) && !timed_out;
    if (cut == Cut::kNo && timed_out) cut = Cut::kTooSlow;
    if (cut != Cut::kNo) {
      // Not retried elsewhere: the next instance would give the same answer, or use time the
      // client no longer has.
      const bool large = cut == Cut::kTooLarge;
      spdlog::warn("sentinel proxy: answer cut deployment={} endpoint={} {} {}: {}",
                   set->routes.deployment_id, e.address(), req.method, req.path,
                   large ? strCat("larger than ", options_.max_answer_bytes, " bytes")
                         : "not complete within the upstream timeout");
      res.status = large ? 502 : 504;
      res.set_content(
          large
              ? strCat("bad gateway: the answer of ", e.address(), " is larger than ",
                       options_.max_answer_bytes >> 20, " MiB (krane-sentinel --max-answer-mib)\n")
              : strCat("gateway timeout: ", e.address(), " did not complete its answer within ",
                       std::chrono::duration_cast<std::chrono::seconds>(options_.upstream_timeout)
                           .count(),
                       " s\n"),
          "text/plain");
      return;
    }
    if (answered) {
      res.status = answer.status;
      // The whole body, of which the server sends the client's range.
      if (!req.ranges.empty() && answer.status == 200) res.status = 206;
      std::string content_type = "application/octet-stream";
      for (const auto& [name, value] : answer.headers) {
        const std::string n = lower(name);
        if (n == "content-type") {
          content_type = value;
        } else if (n == "content-encoding" && decodedOnReceipt(value)) {
          // The body was decoded when it arrived; the server encodes it again for the client.
        } else if (!hopByHop(name)) {
          res.headers.emplace(name, value);
        }
      }
      res.set_header("X-Krane-Deployment", set->routes.deployment_id);
      // Not set_content(): this httplib's takes a copy.
      res.body = std::move(body);
      res.set_header("Content-Type", content_type);
      return;
    }
    last_error = strCat(e.address(), ": ", httplib::to_string(error));
    // A connection refused, or not made within the connect timeout, sent nothing: safe to try
    // the next endpoint whatever the method.
    const bool nothing_sent =
        error == httplib::Error::Connection || error == httplib::Error::ConnectionTimeout;
    if (!nothing_sent && !idempotent(req.method)) break;
  }
  if (Clock::now() >= deadline) {
    // Its last read waited for the time left, or the time ran out between attempts.
    spdlog::warn("sentinel proxy: no endpoint answered in time deployment={} {} {}: {}",
                 set->routes.deployment_id, req.method, req.path, last_error);
    res.status = 504;
    res.set_content(
        strCat("gateway timeout: no endpoint answered within ",
               std::chrono::duration_cast<std::chrono::seconds>(options_.upstream_timeout).count(),
               " s (", last_error, ")\n"),
        "text/plain");
    return;
  }
  spdlog::warn("sentinel proxy: no endpoint answered deployment={} {} {}: {}",
               set->routes.deployment_id, req.method, req.path, last_error);
  res.status = 502;
  res.set_content(strCat("bad gateway: ", last_error, "\n"), "text/plain");
}

void RoutingProxy::reload() {
  struct stat st {};
  if (::stat(options_.routes_file.c_str(), &st) != 0) return;  // keep what we have
  const int64_t mtime = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
  {
    std::lock_guard lock(mutex_);
    if (st.st_ino == seen_inode_ && st.st_size == seen_size_ && mtime == seen_mtime_ns_) return;
  }
  // Recorded as seen only once read: a read that failed (out of descriptors, say) is tried again
  // at the next poll, or a promote would wait for the file's next change.
  auto text = readFile(options_.routes_file, "routes file");
  if (!text.ok()) return;
  {
    std::lock_guard lock(mutex_);
    seen_inode_ = st.st_ino;
    seen_size_ = st.st_size;
    seen_mtime_ns_ = mtime;
  }
  auto routes = parseRoutes(*text);
  if (!routes.ok()) {
    spdlog::warn("sentinel proxy: ignoring routes file {}: {}", options_.routes_file,
                 std::string(routes.status().message()));
    return;
  }
  setRoutes(*std::move(routes));
}

void RoutingProxy::watch() {
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    stop_cv_.wait_for(lock, options_.poll, [this] { return stopping_; });
    if (stopping_) break;
    lock.unlock();
    reload();
    lock.lock();
  }
}

}  // namespace krane::sentinel
