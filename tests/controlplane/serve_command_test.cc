// `krane-ctrl serve`, `region` and `token` as an operator runs them (the real binary).
#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <thread>

#include <catch2/catch.hpp>

#include "common/strings.h"
#include "tests/support/mariadb.h"
#include "tests/support/process.h"

namespace krane {
namespace {

using krane::testing::ChildProcess;
using krane::testing::runCommand;
using krane::testing::runfile;
using krane::testing::ScratchMariaDb;

std::string dsnText(const db::Dsn& dsn) {
  return strCat("mysql://root@127.0.0.1:", dsn.port, "/", dsn.database);
}

krane::testing::CommandResult ctrl(std::vector<std::string> args) {
  args.insert(args.begin(), runfile("controlplane/krane-ctrl"));
  return runCommand(args);
}

std::string writeFile(const std::string& name, const std::string& text) {
  const std::string path = strCat(std::getenv("TEST_TMPDIR"), "/", name);
  std::ofstream(path) << text;
  return path;
}

TEST_CASE("starts serves health and stops cleanly on sigterm", "[serve-command]") {
  const auto dsn = dsnText(ScratchMariaDb::instance().freshDatabase());
  REQUIRE(ctrl({"migrate", "--dsn", dsn}).exit_code == 0);
  const std::string config =
      writeFile("ctrl.yaml", strCat("listen: 127.0.0.1:0\nhttp_listen: 127.0.0.1:0\n"
                                    "database:\n  dsn: ",
                                    dsn, "\nfeed:\n  poll_interval_ms: 20\n"));
  const std::string log = strCat(std::getenv("TEST_TMPDIR"), "/serve.log");
  ChildProcess serve({runfile("controlplane/krane-ctrl"), "serve", "--config", config}, log);
  int http_port = 0;
  for (int i = 0; i < 200 && http_port == 0; ++i) {
    std::ifstream in(log);
    std::stringstream text;
    text << in.rdbuf();
    std::smatch m;
    const std::string s = text.str();
    if (std::regex_search(s, m, std::regex("http 127\\.0\\.0\\.1:(\\d+)")))
      http_port = std::stoi(m[1]);
    if (http_port == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  INFO("krane-ctrl did not start");
  REQUIRE(http_port > 0);
  httplib::Client http("127.0.0.1", http_port);
  auto ready = http.Get("/readyz");
  REQUIRE(ready);
  CHECK(ready->status == 200);
  serve.signal(SIGTERM);
  CHECK(serve.wait() == 0);
}

TEST_CASE("refuses an unmigrated database", "[serve-command]") {
  const auto dsn = dsnText(ScratchMariaDb::instance().freshDatabase());
  auto r = ctrl({"serve", "--dsn", dsn, "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"});
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Catch::Contains("start-up step \"database\" failed"));
  CHECK_THAT(r.err, Catch::Contains("run `krane-ctrl migrate`"));
}

// A port of 127.0.0.1 held by a listening socket of this process (without SO_REUSEPORT, so
// nobody can share it): its address; `*fd` is the socket.
std::string holdPort(int* fd) {
  *fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(*fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  REQUIRE(::bind(*fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  REQUIRE(::listen(*fd, 1) == 0);
  REQUIRE(::getsockname(*fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  return strCat("127.0.0.1:", ntohs(addr.sin_port));
}

TEST_CASE("an address in use fails the start and the process exits", "[serve-command]") {
  // Something else holds the gRPC port (without SO_REUSEPORT, so gRPC cannot share it). The
  // Watch loops were set up for the server: they must be torn down again, not wait for it.
  int holder = -1;
  const std::string listen = holdPort(&holder);
  const auto dsn = dsnText(ScratchMariaDb::instance().freshDatabase());
  REQUIRE(ctrl({"migrate", "--dsn", dsn}).exit_code == 0);
  auto r = ctrl({"serve", "--dsn", dsn, "--listen", listen, "--http-listen", "127.0.0.1:0"});
  ::close(holder);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Catch::Contains("start-up step \"grpc\" failed"));
  CHECK_THAT(r.err, Catch::Contains(strCat("cannot listen on ", listen)));
}

TEST_CASE("a watch listener address in use fails the start, and nothing stays behind",
          "[serve-command]") {
  int holder = -1;
  const std::string in_use = holdPort(&holder);
  const auto dsn = dsnText(ScratchMariaDb::instance().freshDatabase());
  REQUIRE(ctrl({"migrate", "--dsn", dsn}).exit_code == 0);
  const std::string config =
      writeFile("watch-in-use.yaml",
                strCat("listen: 127.0.0.1:0\nhttp_listen: 127.0.0.1:0\ndatabase:\n  dsn: ", dsn,
                       "\nfeed:\n  watch_listen: ", in_use, "\n"));
  auto r = ctrl({"serve", "--config", config});
  ::close(holder);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Catch::Contains("start-up step \"grpc\" failed"));
  CHECK_THAT(r.err, Catch::Contains(strCat("cannot listen on ", in_use)));
}

TEST_CASE("config errors name the key", "[serve-command]") {
  auto unknown = ctrl({"serve", "--config", writeFile("a.yaml", "feed:\n  pol_interval_ms: 5\n")});
  CHECK(unknown.exit_code == 1);
  CHECK_THAT(unknown.err, Catch::Contains("a.yaml: feed.pol_interval_ms: unknown key"));
  auto range = ctrl({"serve", "--config", writeFile("b.yaml", "feed:\n  poll_interval_ms: 0\n")});
  CHECK_THAT(range.err,
             Catch::Contains("feed.poll_interval_ms: must be between 1 and 60000, got 0"));
  auto type =
      ctrl({"serve", "--config", writeFile("c.yaml", "database:\n  max_connections: lots\n")});
  CHECK_THAT(type.err, Catch::Contains("database.max_connections: must be a whole number"));
  auto yaml = ctrl({"serve", "--config", writeFile("d.yaml", "listen: [\n")});
  CHECK_THAT(yaml.err, Catch::Contains("not valid YAML"));
  auto address = ctrl({"serve", "--config", writeFile("e.yaml", "listen: nowhere\n")});
  CHECK_THAT(address.err, Catch::Contains("listen: \"nowhere\" is not host:port"));
  auto no_db = ctrl({"serve", "--config", writeFile("f.yaml", "listen: 127.0.0.1:0\n")});
  CHECK_THAT(no_db.err, Catch::Contains("database.dsn: required"));
  auto tls = ctrl({"serve", "--dsn", "mysql://u@h/d", "--config",
                   writeFile("g.yaml", "tls:\n  cert_file: x.pem\n")});
  CHECK_THAT(tls.err, Catch::Contains("tls: cert_file and key_file go together"));
  auto workflow = ctrl({"serve", "--config", writeFile("h.yaml", "workflow:\n  threads: 0\n")});
  CHECK_THAT(workflow.err, Catch::Contains("workflow.threads: must be between 1 and 1024, got 0"));
  auto deploy = ctrl({"serve", "--config", writeFile("i.yaml", "deploy:\n  build_timeout_s: 0\n")});
  CHECK_THAT(deploy.err,
             Catch::Contains("deploy.build_timeout_s: must be between 1 and 86400, got 0"));
  auto deploy_key =
      ctrl({"serve", "--config", writeFile("j.yaml", "deploy:\n  build_logs: /tmp\n")});
  CHECK_THAT(deploy_key.err, Catch::Contains("deploy.build_logs: unknown key"));
  auto hints =
      ctrl({"serve", "--config", writeFile("k.yaml", "feed:\n  peer_hints:\n    listen: here\n")});
  CHECK_THAT(hints.err, Catch::Contains("feed.peer_hints.listen: \"here\" is not host:port"));
  auto hints_key =
      ctrl({"serve", "--config", writeFile("l.yaml", "feed:\n  peer_hints:\n    port: 7072\n")});
  CHECK_THAT(hints_key.err, Catch::Contains("feed.peer_hints.port: unknown key"));
  auto everywhere = ctrl({"serve", "--dsn", "mysql://u@h/d", "--config",
                          writeFile("m.yaml", "feed:\n  peer_hints:\n    listen: 0.0.0.0:7072\n")});
  CHECK_THAT(everywhere.err,
             Catch::Contains("feed.peer_hints.advertise: required when feed.peer_hints.listen"));
  auto alone = ctrl({"serve", "--config",
                     writeFile("n.yaml", "feed:\n  peer_hints:\n    advertise: 10.0.0.1:7072\n")});
  CHECK_THAT(alone.err, Catch::Contains("feed.peer_hints.advertise: needs feed.peer_hints.listen"));
  auto watch = ctrl({"serve", "--config", writeFile("o.yaml", "feed:\n  watch_listen: here\n")});
  CHECK_THAT(watch.err, Catch::Contains("feed.watch_listen: \"here\" is not host:port"));
  auto ping =
      ctrl({"serve", "--config", writeFile("p.yaml", "feed:\n  keepalive_timeout_ms: 10\n")});
  CHECK_THAT(ping.err,
             Catch::Contains("feed.keepalive_timeout_ms: must be between 1000 and 600000, got 10"));
  auto stall = ctrl({"serve", "--config", writeFile("q.yaml", "feed:\n  sync_stall_ms: 50\n")});
  CHECK_THAT(stall.err,
             Catch::Contains("feed.sync_stall_ms: must be between 100 and 3600000, got 50"));
  auto watches =
      ctrl({"serve", "--config", writeFile("r.yaml", "deploy:\n  watch_max_streams: 0\n")});
  CHECK_THAT(watches.err,
             Catch::Contains("deploy.watch_max_streams: must be between 1 and 100000, got 0"));
  auto missing = ctrl({"serve", "--config", "/nonexistent/ctrl.yaml"});
  CHECK_THAT(missing.err, Catch::Contains("cannot read config file /nonexistent/ctrl.yaml"));
}

TEST_CASE("create list revoke", "[region-and-token-commands]") {
  const auto dsn = dsnText(ScratchMariaDb::instance().freshDatabase());
  REQUIRE(ctrl({"migrate", "--dsn", dsn}).exit_code == 0);
  auto no_region = ctrl({"token", "create", "--dsn", dsn, "--region", "eu-1"});
  CHECK(no_region.exit_code == 1);
  CHECK_THAT(no_region.err, Catch::Contains("region \"eu-1\" is not registered"));
  REQUIRE(ctrl({"region", "add", "eu-1", "--dsn", dsn}).exit_code == 0);
  REQUIRE(ctrl({"region", "add", "eu-1", "--dsn", dsn, "--name", "Europe"}).exit_code ==
          0);  // idempotent
  auto regions = ctrl({"region", "list", "--dsn", dsn});
  CHECK_THAT(regions.out, Catch::Contains("Europe"));
  CHECK_THAT(ctrl({"region", "add", "bad id", "--dsn", dsn}).err,
             Catch::Contains("id: \"bad id\" may only contain"));

  auto created = ctrl({"token", "create", "--dsn", dsn, "--region", "eu-1", "--name", "ci"});
  INFO(created.err);
  REQUIRE(created.exit_code == 0);
  CHECK_THAT(created.out, Catch::StartsWith("krane_agent_"));  // stdout holds only the secret
  CHECK_THAT(created.err, Catch::Contains("not shown again"));
  auto listed = ctrl({"token", "list", "--dsn", dsn});
  CHECK_THAT(listed.out, Catch::Contains("active"));
  CHECK_THAT(listed.out, !Catch::Contains(created.out.substr(0, 20)));  // never the secret
  std::smatch m;
  REQUIRE(std::regex_search(listed.out, m, std::regex("(tok_[A-Za-z0-9_-]+)")));
  CHECK(ctrl({"token", "revoke", m[1], "--dsn", dsn}).exit_code == 0);
  CHECK_THAT(ctrl({"token", "list", "--dsn", dsn}).out, Catch::Contains("revoked"));
  CHECK(ctrl({"token", "revoke", m[1], "--dsn", dsn}).exit_code == 1);
}

}  // namespace
}  // namespace krane
