// krane-sentinel, the sentinel's routing proxy, as a real process in front of real instance
// processes (the demo app): readiness only with routes, liveness on its own path, and switching
// the live deployment back and forth while a steady stream of requests runs, with no failed
// request and a request in flight during the switch completing on the old deployment; probes
// answered on the health port while every request thread waits, slow clients cut off, the drain
// on SIGTERM; and, as on Kubernetes, routes followed from a ConfigMap through the API server (the
// fake one).
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include <catch2/catch.hpp>

#include "common/files.h"
#include "common/http_serve.h"
#include "common/strings.h"
#include "plugins/sentinel/proxy/routes.h"
#include "tests/support/fake_kube_api.h"
#include "tests/support/matchers.h"
#include "tests/support/process.h"
#include "tests/support/traffic.h"
#include "tests/support/wait.h"

namespace krane::sentinel {
namespace {

using krane::testing::ChildProcess;
using krane::testing::eventually;
using krane::testing::runfile;
using namespace std::chrono_literals;

// A port nothing listens on right now (the kernel's next ephemeral one).
int freePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

using Answer = krane::testing::HttpAnswer;

Answer get(int port, const std::string& path, std::chrono::seconds timeout = 5s) {
  return krane::testing::httpGet(strCat("127.0.0.1:", port), path, timeout);
}

// A demo app instance answering "krane-demo-app <version> ...".
struct Instance {
  Instance(const std::string& version, const std::string& log)
      : port(freePort()),
        process({runfile("tests/support/demo_app/krane-demo-app"), "--version", version, "--port",
                 std::to_string(port)},
                log) {
    REQUIRE(eventually([&] { return get(port, "/healthz/ready").status == 200; }, 20s));
  }
  std::string address() const { return strCat("127.0.0.1:", port); }
  int port;
  ChildProcess process;
};

// Requests an app holds until the test lets them go.
class Holding {
 public:
  void hold() {
    std::unique_lock lock(mutex_);
    ++held_;
    cv_.wait(lock, [this] { return released_; });
  }
  void release() {
    {
      std::lock_guard lock(mutex_);
      released_ = true;
    }
    cv_.notify_all();
  }
  int held() {
    std::lock_guard lock(mutex_);
    return held_;
  }
  // Answers GET `path` on `app` with "released", each request held until release().
  void answerOn(httplib::Server& app, const std::string& path = "/hang") {
    app.Get(path, [this](const httplib::Request&, httplib::Response& res) {
      hold();
      res.set_content("released", "text/plain");
    });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  int held_ = 0;
  bool released_ = false;
};

// Answers GET / with "hello".
void answerHello(httplib::Server& app) {
  app.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("hello", "text/plain");
  });
}

// A port nothing listens on now, other than `other`.
int freePortBut(int other) {
  int port = freePort();
  while (port == other) port = freePort();
  return port;
}

class ProxyTest {
 protected:
  ProxyTest() {
    char pattern[] = "/tmp/krane-px-XXXXXX";
    dir_ = ::mkdtemp(pattern);
    routes_file_ = dir_ + "/routes.json";
    port_ = freePort();
    proxy_ = std::make_unique<ChildProcess>(
        std::vector<std::string>{runfile("plugins/sentinel/krane-sentinel"), "--port",
                                 std::to_string(port_), "--host", "127.0.0.1", "--poll-ms", "50"},
        dir_ + "/proxy.log",
        std::map<std::string, std::string>{{"KRANE_ROUTES_FILE", routes_file_}});
    REQUIRE(eventually([&] { return get(port_, "/healthz/live").status == 200; }, 20s));
  }
  ~ProxyTest() {
    proxy_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  void route(const std::string& deployment, const std::vector<const Instance*>& instances) {
    Routes r;
    r.deployment_id = deployment;
    for (const Instance* i : instances) r.endpoints.push_back(*parseEndpoint(i->address()));
    REQUIRE_THAT(replaceFile(routes_file_, routesJson(r)), IsOk());
  }

  // An app of the test's own (`server` with its handlers), served until it goes out of scope.
  class App {
   public:
    explicit App(httplib::Server& server)
        : server_(server),
          port_(server.bind_to_any_port("127.0.0.1")),
          serving_(serveInBackground(server)) {}
    ~App() {
      server_.stop();
      serving_.join();
    }
    std::string address() const { return strCat("127.0.0.1:", port_); }

   private:
    httplib::Server& server_;
    int port_;
    std::thread serving_;
  };
  // The proxies' routes file: `app`'s one endpoint as deployment dep_1.
  void routeTo(const App& app) {
    Routes r;
    r.deployment_id = "dep_1";
    r.endpoints.push_back(*parseEndpoint(app.address()));
    REQUIRE_THAT(replaceFile(routes_file_, routesJson(r)), IsOk());
  }

  // An app that holds its GET /hang requests until `holding` lets them go (and answers GET /
  // with "hello" when asked), served and routed to until it goes out of scope.
  struct HoldingApp {
    HoldingApp(ProxyTest& test, Holding& holding, bool hello = false) {
      holding.answerOn(server);
      if (hello) answerHello(server);
      running.emplace(server);
      test.routeTo(*running);
    }
    httplib::Server server;
    std::optional<App> running;
  };

  // Another proxy of the routes file on `port`, with `args` and `env` besides; live on return.
  std::unique_ptr<ChildProcess> startProxy(int port, const std::vector<std::string>& args,
                                           std::map<std::string, std::string> env,
                                           const std::string& log) {
    std::vector<std::string> argv = {runfile("plugins/sentinel/krane-sentinel"),
                                     "--port",
                                     std::to_string(port),
                                     "--host",
                                     "127.0.0.1",
                                     "--poll-ms",
                                     "50"};
    argv.insert(argv.end(), args.begin(), args.end());
    env["KRANE_ROUTES_FILE"] = routes_file_;
    auto proxy = std::make_unique<ChildProcess>(argv, dir_ + "/" + log, env);
    REQUIRE(eventually([&] { return get(port, "/healthz/live").status == 200; }, 20s));
    return proxy;
  }

  std::string dir_;
  std::string routes_file_;
  int port_ = 0;
  std::unique_ptr<ChildProcess> proxy_;
};

// Client threads, joined (after `holding` let its requests go) when it goes out of scope, a
// failed check included.
class Clients {
 public:
  explicit Clients(Holding& holding) : holding_(holding) {}
  ~Clients() {
    holding_.release();
    for (auto& t : threads_) t.join();
  }
  void run(std::function<void()> body) { threads_.emplace_back(std::move(body)); }

 private:
  Holding& holding_;
  std::vector<std::thread> threads_;
};

TEST_CASE_METHOD(ProxyTest, "readiness only with routes, liveness on its own path",
                 "[sentinel-proxy]") {
  // No routes file yet: alive, not ready, and requests are refused rather than hung.
  CHECK(get(port_, "/healthz/live").status == 200);
  CHECK(get(port_, "/healthz/ready").status == 503);
  CHECK(get(port_, "/").status == 503);

  Instance v1("v1", dir_ + "/v1.log");
  route("dep_1", {&v1});
  REQUIRE(eventually([&] { return get(port_, "/healthz/ready").status == 200; }, 5s));
  const Answer a = get(port_, "/");
  CHECK(a.status == 200);
  CHECK_THAT(a.body, Catch::Contains("krane-demo-app v1 "));
  CHECK(a.deployment == "dep_1");

  // The live deployment has no ready instance: not ready, though alive.
  route("dep_2", {});
  REQUIRE(eventually([&] { return get(port_, "/healthz/ready").status == 503; }, 5s));
  CHECK(get(port_, "/healthz/live").status == 200);
  CHECK(get(port_, "/").status == 503);

  // No live deployment at all (a new environment): nothing to route, ready.
  route("", {});
  REQUIRE(eventually([&] { return get(port_, "/healthz/ready").status == 200; }, 5s));
  CHECK(get(port_, "/").status == 503);
}

// An app that compresses its answers (here always, whatever the request asks): what reaches the
// client must decode to the app's body, with one Content-Encoding at most.
TEST_CASE_METHOD(ProxyTest, "compressed answers reach the client intact", "[sentinel-proxy]") {
  static const unsigned char kGzipped[] = {31, 139, 8,   0,   0,   0,  0,  0,   2,   255, 203,
                                           72, 205, 201, 201, 215, 81, 72, 206, 207, 45,  40,
                                           74, 45,  46,  78,  77,  81, 40, 207, 47,  202, 73,
                                           1,  0,   8,   158, 52,  53, 23, 0,   0,   0};
  httplib::Server app;
  const std::string gzipped(reinterpret_cast<const char*>(kGzipped), sizeof(kGzipped));
  app.Get("/z", [&](const httplib::Request&, httplib::Response& res) {
    res.set_header("Content-Encoding", "gzip");
    res.set_content(gzipped, "text/plain");
  });
  // An encoding name the proxy's client does not decode: the body must keep its header.
  app.Get("/x", [&](const httplib::Request&, httplib::Response& res) {
    res.set_header("Content-Encoding", "x-gzip");
    res.set_content(gzipped, "application/octet-stream");
  });
  App running(app);
  routeTo(running);
  REQUIRE(eventually([&] { return get(port_, "/healthz/ready").status == 200; }, 5s));
  for (const char* accepts : {"", "gzip, deflate, br"}) {
    INFO("Accept-Encoding: " << accepts);
    httplib::Client client("127.0.0.1", port_);
    httplib::Headers headers;
    if (*accepts != '\0') headers.emplace("Accept-Encoding", accepts);
    auto answer = client.Get("/z", headers);
    REQUIRE(answer);
    CHECK(answer->status == 200);
    CHECK(answer->body == "hello, compressed world");
    CHECK(answer->get_header_value_count("Content-Encoding") <= 1u);
  }
  httplib::Client client("127.0.0.1", port_);
  auto passed = client.Get("/x");
  REQUIRE(passed);
  CHECK(passed->get_header_value("Content-Encoding") == "x-gzip");
  CHECK(passed->body == gzipped);
}

// A range request (a video seek, a resumed download) gets the range of the app's body once.
TEST_CASE_METHOD(ProxyTest, "a range request gets its range once", "[sentinel-proxy]") {
  httplib::Server app;
  app.Get("/file", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("0123456789abcdefghij", "application/octet-stream");
  });
  App running(app);
  routeTo(running);
  REQUIRE(eventually([&] { return get(port_, "/healthz/ready").status == 200; }, 5s));
  httplib::Client client("127.0.0.1", port_);
  auto answer = client.Get("/file", {{"Range", "bytes=10-14"}});
  REQUIRE(answer);
  CHECK(answer->status == 206);
  CHECK(answer->body == "abcde");
  CHECK(answer->get_header_value("Content-Range") == "bytes 10-14/20");
  INFO("without a range, the whole body");
  auto whole = client.Get("/file");
  REQUIRE(whole);
  CHECK(whole->status == 200);
  CHECK(whole->body == "0123456789abcdefghij");
}

// Bodies are held in memory: a larger one than --max-body-mib is refused before it is read, and
// never reaches the app.
TEST_CASE_METHOD(ProxyTest, "a request body over the limit is refused", "[sentinel-proxy]") {
  std::atomic<int> posts{0};
  httplib::Server app;
  app.Post("/upload", [&](const httplib::Request& req, httplib::Response& res) {
    ++posts;
    res.set_content(std::to_string(req.body.size()), "text/plain");
  });
  App running(app);
  routeTo(running);
  const int port = freePort();
  ChildProcess small({runfile("plugins/sentinel/krane-sentinel"), "--port", std::to_string(port),
                      "--host", "127.0.0.1", "--poll-ms", "50", "--max-body-mib", "1"},
                     dir_ + "/small.log", {{"KRANE_ROUTES_FILE", routes_file_}});
  REQUIRE(eventually([&] { return get(port, "/healthz/ready").status == 200; }, 20s));
  httplib::Client client("127.0.0.1", port);
  auto fits = client.Post("/upload", std::string(512 * 1024, 'x'), "application/octet-stream");
  REQUIRE(fits);
  CHECK(fits->status == 200);
  CHECK(fits->body == "524288");
  auto over = client.Post("/upload", std::string(2 * 1024 * 1024, 'x'), "application/octet-stream");
  REQUIRE(over);
  CHECK(over->status == 413);
  CHECK(posts.load() == 1);
}

// Answers are held in memory until complete: one larger than --max-answer-mib, an endless one
// included, is cut off with 502, and the proxy serves on.
TEST_CASE_METHOD(ProxyTest, "an answer over the limit is cut off, and the proxy serves on",
                 "[sentinel-proxy]") {
  httplib::Server app;
  app.Get("/fits", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(std::string(512 * 1024, 'x'), "application/octet-stream");
  });
  app.Get("/big", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(std::string(2 * 1024 * 1024, 'x'), "application/octet-stream");
  });
  // Chunks for as long as anyone reads them.
  app.Get("/endless", [](const httplib::Request&, httplib::Response& res) {
    res.set_chunked_content_provider("application/octet-stream",
                                     [](size_t, httplib::DataSink& sink) {
                                       const std::string chunk(64 * 1024, 'y');
                                       return sink.write(chunk.data(), chunk.size());
                                     });
  });
  App running(app);
  routeTo(running);
  const int port = freePort();
  auto proxy = startProxy(port, {"--max-answer-mib", "1"}, {}, "small.log");
  REQUIRE(eventually([&] { return get(port, "/healthz/ready").status == 200; }, 20s));
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(20s);
  for (const char* path : {"/big", "/endless"}) {
    INFO(path);
    auto cut = client.Get(path);
    REQUIRE(cut);
    CHECK(cut->status == 502);
    const std::string said = cut->body.substr(0, 200);  // not 2 MiB of it when this fails
    CHECK_THAT(said,
               Catch::Contains("is larger than 1 MiB") && Catch::Contains("--max-answer-mib"));
  }
  auto fits = client.Get("/fits");
  REQUIRE(fits);
  CHECK(fits->status == 200);
  CHECK(fits->body.size() == 512u * 1024);
}

// A socket listening on a free port of 127.0.0.1, closed when it goes out of scope.
struct LoopbackListener {
  explicit LoopbackListener(int backlog) {
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    REQUIRE(::listen(fd, backlog) == 0);
    socklen_t len = sizeof addr;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    port = ntohs(addr.sin_port);
  }
  ~LoopbackListener() { ::close(fd); }
  std::string address() const { return strCat("127.0.0.1:", port); }

  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  int port = 0;
};

// An address whose connections are never made: a listener with a backlog of 0 that accepts
// nothing, its one place in the queue taken. The kernel drops further connection requests, and a
// connect waits for its timeout.
class Blackhole {
 public:
  Blackhole() {
    REQUIRE(::connect(filler_, reinterpret_cast<const sockaddr*>(&listener_.addr),
                      sizeof listener_.addr) == 0);
  }
  ~Blackhole() { ::close(filler_); }
  std::string address() const { return listener_.address(); }

 private:
  LoopbackListener listener_{0};
  int filler_ = ::socket(AF_INET, SOCK_STREAM, 0);
};

// Nothing was sent to an instance whose connection was not made in time: the request goes to the
// next one whatever its method, as after a refused connection.
TEST_CASE_METHOD(ProxyTest, "a request goes on to the next instance when a connection times out",
                 "[sentinel-proxy]") {
  Blackhole blackhole;
  std::atomic<int> posts{0};
  httplib::Server app;
  app.Post("/order", [&](const httplib::Request& req, httplib::Response& res) {
    ++posts;
    res.set_content("ordered " + req.body, "text/plain");
  });
  App running(app);
  // The first request of a route set starts with its first endpoint.
  Routes r;
  r.deployment_id = "dep_1";
  r.endpoints.push_back(*parseEndpoint(blackhole.address()));
  r.endpoints.push_back(*parseEndpoint(running.address()));
  REQUIRE_THAT(replaceFile(routes_file_, routesJson(r)), IsOk());
  const int port = freePort();
  auto proxy = startProxy(port, {}, {}, "blackhole.log");
  REQUIRE(eventually([&] { return get(port, "/healthz/ready").status == 200; }, 20s));
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(20s);
  auto answer = client.Post("/order", "one", "text/plain");
  REQUIRE(answer);
  INFO(answer->body);
  CHECK(answer->status == 200);
  CHECK(answer->body == "ordered one");
  CHECK(posts.load() == 1);
}

// An instance on a raw socket, for answers no HTTP library would send: for each connection it
// reads the request's head, then runs `script` on the socket until it returns.
class ScriptedInstance {
 public:
  using Script = std::function<void(int fd, const std::atomic<bool>& stopping)>;
  explicit ScriptedInstance(Script script)
      : script_(std::move(script)), thread_([this] { serve(); }) {}
  ~ScriptedInstance() {
    stopping_ = true;
    thread_.join();
  }
  std::string address() const { return listener_.address(); }

  // Whether all of `bytes` went out (false once the proxy hung up).
  static bool send(int fd, std::string_view bytes) {
    return ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
           static_cast<ssize_t>(bytes.size());
  }

 private:
  void serve() {
    while (!stopping_) {
      pollfd p{listener_.fd, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      const int fd = ::accept(listener_.fd, nullptr, nullptr);
      if (fd < 0) continue;
      std::string head;
      char buf[4096];
      while (head.find("\r\n\r\n") == std::string::npos) {
        const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
        if (n <= 0) break;
        head.append(buf, static_cast<size_t>(n));
      }
      script_(fd, stopping_);
      ::close(fd);
    }
  }

  Script script_;
  LoopbackListener listener_{16};
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

// The upstream timeout bounds a request's whole exchange with the instances, not each read (each
// read's own timeout restarts with every byte): an instance that sends a byte now and then would
// otherwise hold the request, and its thread, for as long as it likes, past the sentinel's
// termination grace.
TEST_CASE_METHOD(ProxyTest, "an answer not complete within the upstream timeout gets 504 then",
                 "[sentinel-proxy]") {
  using ScriptClock = std::chrono::steady_clock;
  // Sends `bytes` every 100 ms until `until` has passed since the answer began (or for good),
  // then stays silent until the proxy hangs up or the test ends.
  const auto trickle = [](std::string head, std::string bytes, std::chrono::milliseconds until) {
    return [=](int fd, const std::atomic<bool>& stopping) {
      const auto began = ScriptClock::now();
      if (!ScriptedInstance::send(fd, head)) return;
      while (!stopping && (until.count() == 0 || ScriptClock::now() - began < until)) {
        std::this_thread::sleep_for(100ms);
        if (!ScriptedInstance::send(fd, bytes)) return;
      }
      while (!stopping) {
        pollfd p{fd, POLLRDHUP, 0};
        if (::poll(&p, 1, 50) > 0) return;
      }
    };
  };
  std::optional<ScriptedInstance> instance;
  SECTION("its headers trickle in") {
    instance.emplace(trickle("HTTP/1.1 200 OK\r\n", "X-Slow: 1\r\n", 0ms));
  }
  SECTION("its body trickles in") {
    instance.emplace(trickle("HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n", "x", 0ms));
  }
  SECTION("its last byte comes just before the timeout, then nothing") {
    // Each read waiting for the time left when the attempt began would end at about 5.7 s.
    instance.emplace(trickle("HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n", "x", 2700ms));
  }
  Routes r;
  r.deployment_id = "dep_1";
  r.endpoints.push_back(*parseEndpoint(instance->address()));
  REQUIRE_THAT(replaceFile(routes_file_, routesJson(r)), IsOk());
  const int port = freePort();
  auto proxy = startProxy(port, {"--upstream-timeout-s", "3"}, {}, "short.log");
  REQUIRE(eventually([&] { return get(port, "/healthz/ready").status == 200; }, 20s));
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(20s);
  const auto started = ScriptClock::now();
  auto cut = client.Get("/slow");
  const auto took = ScriptClock::now() - started;
  REQUIRE(cut);
  CHECK(cut->status == 504);
  CHECK_THAT(cut->body, Catch::Contains("did not complete its answer within 3 s"));
  INFO("took " << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms");
  CHECK(took >= 3s);
  CHECK(took < 4500ms);
  CHECK(get(port, "/healthz/live").status == 200);
}

// What the app learns of its client: the Host asked for, and a last X-Forwarded-For hop the
// client cannot forge.
TEST_CASE_METHOD(ProxyTest, "the app sees the client's host and address", "[sentinel-proxy]") {
  httplib::Server app;
  app.Get("/who", [](const httplib::Request& req, httplib::Response& res) {
    res.set_content(
        strCat(req.get_header_value("Host"), "|", req.get_header_value("X-Forwarded-For"), "|",
               req.get_header_value("X-Forwarded-Host")),
        "text/plain");
  });
  App running(app);
  routeTo(running);
  REQUIRE(eventually([&] { return get(port_, "/healthz/ready").status == 200; }, 5s));
  httplib::Client client("127.0.0.1", port_);
  auto answer = client.Get(
      "/who",
      {{"Host", "shop.example.com"}, {"REMOTE_ADDR", "6.6.6.6"}, {"X-Forwarded-For", "10.1.1.1"}});
  REQUIRE(answer);
  CHECK(answer->body == "shop.example.com|10.1.1.1, 127.0.0.1|shop.example.com");
}

TEST_CASE_METHOD(ProxyTest, "promote and rollback switch traffic with no failed request",
                 "[sentinel-proxy]") {
  Instance v1a("v1", dir_ + "/v1a.log");
  Instance v1b("v1", dir_ + "/v1b.log");
  Instance v2a("v2", dir_ + "/v2a.log");
  Instance v2b("v2", dir_ + "/v2b.log");
  route("dep_1", {&v1a, &v1b});
  REQUIRE(eventually([&] { return get(port_, "/healthz/ready").status == 200; }, 5s));

  // A steady stream of requests from a few clients for the whole test.
  krane::testing::SteadyTraffic traffic(strCat("127.0.0.1:", port_), 3, " v2 ");
  const auto servedBy = [&](const std::string& version) {
    return eventually(
        [&] {
          const Answer a = get(port_, "/");
          return a.status == 200 && a.body.find(" " + version + " ") != std::string::npos;
        },
        5s);
  };
  REQUIRE(servedBy("v1"));
  std::this_thread::sleep_for(300ms);

  // Promote: a slow request started on dep_1 completes there, the next ones go to dep_2.
  Answer slow;
  std::thread in_flight([&] { slow = get(port_, "/slow?ms=1500", 10s); });
  std::this_thread::sleep_for(300ms);
  const auto switched_at = std::chrono::steady_clock::now();
  route("dep_2", {&v2a, &v2b});
  REQUIRE(servedBy("v2"));
  CHECK(std::chrono::steady_clock::now() - switched_at < 3s);
  // Once switched, every answer is v2's.
  for (int i = 0; i < 20; ++i) {
    const Answer a = get(port_, "/");
    CHECK(a.deployment == "dep_2");
    CHECK_THAT(a.body, Catch::Contains(" v2 "));
  }
  in_flight.join();
  CHECK(slow.status == 200);
  CHECK_THAT(slow.body, Catch::Contains(" v1 "));
  CHECK(slow.deployment == "dep_1");
  std::this_thread::sleep_for(300ms);

  // Rollback: back to dep_1 within seconds.
  route("dep_1", {&v1a, &v1b});
  REQUIRE(servedBy("v1"));
  std::this_thread::sleep_for(300ms);

  // An instance that dies is skipped (its connection is refused) until the routes drop it.
  v1a.process.signal(SIGKILL);
  v1a.process.wait();
  std::this_thread::sleep_for(300ms);

  traffic.stop();
  INFO("last failure: " << traffic.lastFailure());
  CHECK(traffic.failed() == 0);
  CHECK(traffic.ok() > 50);
  CHECK(traffic.marked() > 0);
}

// One slow instance must not get a working proxy restarted: with every request thread waiting on
// the instance, the health port answers at once.
TEST_CASE_METHOD(ProxyTest, "the health port answers while every request thread is busy",
                 "[sentinel-proxy]") {
  Holding holding;
  HoldingApp app(*this, holding);
  const int port = freePort();
  const int health = freePortBut(port);
  auto proxy = startProxy(port, {"--threads", "2"}, {{"KRANE_HEALTH_PORT", std::to_string(health)}},
                          "busy.log");
  REQUIRE(eventually([&] { return get(port, "/healthz/ready").status == 200; }, 5s));
  Clients clients(holding);
  std::atomic<int> answered{0};
  for (int i = 0; i < 2; ++i) {
    clients.run([&, port] {
      if (get(port, "/hang", 30s).status == 200) ++answered;
    });
  }
  REQUIRE(eventually([&] { return holding.held() == 2; }, 10s));

  INFO("both request threads wait on the instance");
  const auto asked = std::chrono::steady_clock::now();
  CHECK(get(health, "/healthz/live", 1s).status == 200);
  CHECK(std::chrono::steady_clock::now() - asked < 1s);
  CHECK(get(health, "/healthz/ready", 1s).status == 200);
  INFO("the health port serves the probes only");
  CHECK(get(health, "/hang", 1s).status == 404);

  holding.release();
  REQUIRE(eventually([&] { return answered == 2; }, 10s));
  CHECK(get(port, "/healthz/live").status == 200);
}

// A health port that is taken would leave the probes unanswered on it: the proxy does not start,
// and says which address it could not listen on.
TEST_CASE_METHOD(ProxyTest, "a health port in use stops the proxy at its start, naming it",
                 "[sentinel-proxy]") {
  LoopbackListener taken(16);
  const std::string port = std::to_string(taken.port);
  ChildProcess proxy({runfile("plugins/sentinel/krane-sentinel"), "--port", "0", "--host",
                      "127.0.0.1", "--health-port", port},
                     dir_ + "/taken.log", {{"KRANE_ROUTES_FILE", routes_file_}});
  REQUIRE(eventually([&] { return !proxy.running(); }, 10s));
  CHECK(proxy.wait() == 1);
  CHECK_THAT(krane::testing::slurp(dir_ + "/taken.log"),
             Catch::Contains("cannot listen for health probes on 127.0.0.1:" + port));
}

// A client that stops sending in the middle of its request gives its thread back after
// --client-timeout-s, not after the instances' (much longer) timeout.
TEST_CASE_METHOD(ProxyTest, "a client that stops sending is cut off", "[sentinel-proxy]") {
  const int port = freePort();
  auto proxy = startProxy(port, {"--threads", "1", "--client-timeout-s", "1"}, {}, "slow.log");
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  const std::string partial = "GET / HTTP/1.1\r\nHost: slow\r\n";
  REQUIRE(::send(fd, partial.data(), partial.size(), MSG_NOSIGNAL) ==
          static_cast<ssize_t>(partial.size()));

  INFO("the only request thread reads the slow client's request; the next one waits for it");
  const auto asked = std::chrono::steady_clock::now();
  CHECK(get(port, "/healthz/live", 10s).status == 200);
  CHECK(std::chrono::steady_clock::now() - asked < 5s);
  INFO("the slow client's connection is closed");
  timeval wait{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait);
  char buf[512];
  ssize_t n = 0;
  while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) {
  }
  CHECK(n == 0);
  ::close(fd);
}

// A connection accepted while every request thread is busy waits in the queue with its request
// sent: when the proxy stops, it gets its thread and its answer, not a closed connection.
TEST_CASE_METHOD(ProxyTest, "a request waiting for a thread when the proxy stops is answered",
                 "[sentinel-proxy]") {
  Holding holding;
  HoldingApp app(*this, holding, /*hello=*/true);
  const int port = freePort();
  auto proxy = startProxy(port, {"--threads", "1"}, {{"KRANE_DRAIN_SECONDS", "0"}}, "queued.log");
  REQUIRE(eventually([&] { return get(port, "/healthz/ready").status == 200; }, 5s));
  Clients clients(holding);
  Answer held;
  Answer queued;
  std::atomic<bool> queued_done{false};
  clients.run([&, port] { held = get(port, "/hang", 30s); });
  REQUIRE(eventually([&] { return holding.held() == 1; }, 10s));
  clients.run([&, port] {
    queued = get(port, "/", 30s);
    queued_done = true;
  });
  std::this_thread::sleep_for(300ms);  // accepted, its request sent, it waits for the thread
  proxy->signal(SIGTERM);
  std::this_thread::sleep_for(300ms);  // the stop is under way
  holding.release();
  CHECK(proxy->wait() == 0);
  REQUIRE(eventually([&] { return queued_done.load(); }, 10s));
  CHECK(held.status == 200);
  CHECK(queued.status == 200);
  CHECK(queued.body == "hello");
}

// Kubernetes sends a pod traffic for a moment after SIGTERM: the proxy turns not ready and goes
// on serving for the drain period, then stops accepting and lets the requests in flight finish.
TEST_CASE_METHOD(ProxyTest, "on SIGTERM the proxy drains before it stops", "[sentinel-proxy]") {
  Holding holding;
  HoldingApp app(*this, holding, /*hello=*/true);
  const int port = freePort();
  const int health = freePortBut(port);
  auto proxy = startProxy(
      port, {}, {{"KRANE_HEALTH_PORT", std::to_string(health)}, {"KRANE_DRAIN_SECONDS", "3"}},
      "drain.log");
  REQUIRE(eventually([&] { return get(port, "/healthz/ready").status == 200; }, 5s));
  CHECK(get(health, "/healthz/ready").status == 200);
  Clients clients(holding);
  Answer in_flight;
  std::atomic<bool> answered{false};
  clients.run([&, port] {
    in_flight = get(port, "/hang", 30s);
    answered = true;
  });
  REQUIRE(eventually([&] { return holding.held() == 1; }, 10s));

  const auto signalled = std::chrono::steady_clock::now();
  proxy->signal(SIGTERM);
  INFO("not ready at once, on both ports; alive");
  REQUIRE(eventually([&] { return get(port, "/healthz/ready").status == 503; }, 1s));
  CHECK(get(health, "/healthz/ready").status == 503);
  CHECK(get(health, "/healthz/live").status == 200);
  INFO("a new request during the drain is still forwarded, and told to reconnect");
  httplib::Client client("127.0.0.1", port);
  client.set_keep_alive(true);  // else the request itself asks to close
  auto late = client.Get("/");
  REQUIRE(late);
  CHECK(late->status == 200);
  CHECK(late->body == "hello");
  CHECK(late->get_header_value("Connection") == "close");
  CHECK(std::chrono::steady_clock::now() - signalled < 3s);

  INFO("after the drain the port refuses, while the request in flight goes on");
  REQUIRE(eventually([&] { return get(port, "/healthz/live", 1s).status == -1; }, 10s));
  CHECK(std::chrono::steady_clock::now() - signalled >= 3s);
  CHECK(proxy->running());
  CHECK(get(health, "/healthz/live").status == 200);
  holding.release();
  CHECK(proxy->wait() == 0);
  REQUIRE(eventually([&] { return answered.load(); }, 5s));
  CHECK(in_flight.status == 200);
  CHECK(in_flight.body == "released");
  CHECK(get(health, "/healthz/live", 1s).status == -1);
}

TEST_CASE_METHOD(ProxyTest, "a second signal ends the drain, a third exits at once",
                 "[sentinel-proxy]") {
  Holding holding;
  HoldingApp app(*this, holding);
  const int port = freePort();
  auto proxy = startProxy(port, {}, {{"KRANE_DRAIN_SECONDS", "600"}}, "signals.log");
  REQUIRE(eventually([&] { return get(port, "/healthz/ready").status == 200; }, 5s));
  Clients clients(holding);
  clients.run([&, port] { get(port, "/hang", 30s); });
  REQUIRE(eventually([&] { return holding.held() == 1; }, 10s));

  proxy->signal(SIGTERM);
  REQUIRE(eventually([&] { return get(port, "/healthz/ready").status == 503; }, 1s));
  INFO("the second signal: no more drain, the port refuses; the request in flight goes on");
  proxy->signal(SIGINT);
  REQUIRE(eventually([&] { return get(port, "/healthz/live", 1s).status == -1; }, 5s));
  CHECK(proxy->running());
  INFO("the third: gone without waiting for it");
  proxy->signal(SIGTERM);
  REQUIRE(eventually([&] { return !proxy->running(); }, 5s));
  CHECK(proxy->wait() == 1);
}

TEST_CASE("on Kubernetes the proxy follows its routes ConfigMap through the API server",
          "[sentinel-proxy]") {
  char pattern[] = "/tmp/krane-pxk-XXXXXX";
  const std::string dir = ::mkdtemp(pattern);
  krane::testing::FakeKubeApi api;
  api.put({{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", "sentinel"}}}});
  const std::string kubeconfig = dir + "/kubeconfig";
  std::ofstream(kubeconfig) << api.kubeconfigYaml();
  const auto putRoutes = [&](const std::string& document) {
    api.put({{"apiVersion", "v1"},
             {"kind", "ConfigMap"},
             {"metadata", {{"name", "sentinel-routes-s1"}, {"namespace", "sentinel"}}},
             {"data", {{"routes.json", document}}}});
  };
  const auto routesTo = [](const std::string& deployment, const Instance& instance) {
    Routes r;
    r.deployment_id = deployment;
    r.endpoints.push_back(*parseEndpoint(instance.address()));
    return routesJson(r);
  };
  Instance v1("v1", dir + "/v1.log");
  Instance v2("v2", dir + "/v2.log");
  // Another sentinel's ConfigMap: not this proxy's.
  api.put({{"apiVersion", "v1"},
           {"kind", "ConfigMap"},
           {"metadata", {{"name", "sentinel-routes-s2"}, {"namespace", "sentinel"}}},
           {"data", {{"routes.json", routesTo("dep_other", v2)}}}});
  // The API server refuses the proxy at first (its token is not the one required).
  api.requireToken("a-token-the-proxy-does-not-have");
  const int port = freePort();
  auto proxy = std::make_unique<ChildProcess>(
      std::vector<std::string>{runfile("plugins/sentinel/krane-sentinel"), "--port",
                               std::to_string(port), "--host", "127.0.0.1", "--kubeconfig",
                               kubeconfig},
      dir + "/proxy.log",
      std::map<std::string, std::string>{
          {"KRANE_ROUTES_CONFIGMAP", "sentinel/sentinel-routes-s1"}});
  REQUIRE(eventually([&] { return get(port, "/healthz/live").status == 200; }, 20s));
  INFO("no ConfigMap yet: alive, not ready");
  std::this_thread::sleep_for(300ms);
  CHECK(get(port, "/healthz/ready").status == 503);

  putRoutes(routesTo("dep_1", v1));
  INFO("the API server refuses it: still not ready, and it keeps trying");
  std::this_thread::sleep_for(500ms);
  CHECK(get(port, "/healthz/ready").status == 503);
  api.requireToken("");
  REQUIRE(eventually([&] { return get(port, "/healthz/ready").status == 200; }, 20s));
  CHECK(get(port, "/").deployment == "dep_1");

  INFO("a promote written to the ConfigMap reaches the proxy within seconds, no request fails");
  krane::testing::SteadyTraffic traffic(strCat("127.0.0.1:", port), 2, " v2 ");
  std::this_thread::sleep_for(300ms);
  const auto switched_at = std::chrono::steady_clock::now();
  putRoutes(routesTo("dep_2", v2));
  REQUIRE(eventually([&] { return get(port, "/").deployment == "dep_2"; }, 5s));
  CHECK(std::chrono::steady_clock::now() - switched_at < 3s);

  INFO(
      "a ConfigMap without the routes key, then a document that is not routes: the routes"
      " there were stay");
  api.put({{"apiVersion", "v1"},
           {"kind", "ConfigMap"},
           {"metadata", {{"name", "sentinel-routes-s1"}, {"namespace", "sentinel"}}},
           {"data", {{"other.json", "{}"}}}});
  std::this_thread::sleep_for(300ms);
  CHECK(get(port, "/").deployment == "dep_2");
  putRoutes("{\"endpoints\": [\"no port\"]}");
  std::this_thread::sleep_for(300ms);
  REQUIRE(api.object("v1", "ConfigMap", "sentinel", "sentinel-routes-s1"));
  CHECK(get(port, "/").deployment == "dep_2");
  traffic.stop();
  INFO("last failure: " << traffic.lastFailure());
  CHECK(traffic.failed() == 0);
  CHECK(traffic.marked() > 0);

  INFO("a bad reference is refused at start, naming the flag");
  ChildProcess bad({runfile("plugins/sentinel/krane-sentinel"), "--port", "0", "--kubeconfig",
                    kubeconfig, "--routes-configmap", "no-slash"},
                   dir + "/bad.log");
  CHECK(bad.wait() == 2);
  CHECK_THAT(krane::testing::slurp(dir + "/bad.log"), Catch::Contains("--routes-configmap"));
  proxy.reset();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

}  // namespace
}  // namespace krane::sentinel
