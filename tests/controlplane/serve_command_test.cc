// `krane-ctrl serve`, `region` and `token` as an operator runs them (the real binary).
#include <httplib.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/strings.h"
#include "tests/support/mariadb.h"
#include "tests/support/process.h"

namespace krane {
namespace {

using krane::testing::ChildProcess;
using krane::testing::runCommand;
using krane::testing::runfile;
using krane::testing::ScratchMariaDb;
using ::testing::HasSubstr;

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

TEST(ServeCommand, StartsServesHealthAndStopsCleanlyOnSigterm) {
  const auto dsn = dsnText(ScratchMariaDb::instance().freshDatabase());
  ASSERT_EQ(ctrl({"migrate", "--dsn", dsn}).exit_code, 0);
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
  ASSERT_GT(http_port, 0) << "krane-ctrl did not start";
  httplib::Client http("127.0.0.1", http_port);
  auto ready = http.Get("/readyz");
  ASSERT_TRUE(ready);
  EXPECT_EQ(ready->status, 200);
  serve.signal(SIGTERM);
  EXPECT_EQ(serve.wait(), 0);
}

TEST(ServeCommand, RefusesAnUnmigratedDatabase) {
  const auto dsn = dsnText(ScratchMariaDb::instance().freshDatabase());
  auto r = ctrl({"serve", "--dsn", dsn, "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("start-up step \"database\" failed"));
  EXPECT_THAT(r.err, HasSubstr("run `krane-ctrl migrate`"));
}

TEST(ServeCommand, ConfigErrorsNameTheKey) {
  auto unknown = ctrl({"serve", "--config", writeFile("a.yaml", "feed:\n  pol_interval_ms: 5\n")});
  EXPECT_EQ(unknown.exit_code, 1);
  EXPECT_THAT(unknown.err, HasSubstr("a.yaml: feed.pol_interval_ms: unknown key"));
  auto range = ctrl({"serve", "--config", writeFile("b.yaml", "feed:\n  poll_interval_ms: 0\n")});
  EXPECT_THAT(range.err, HasSubstr("feed.poll_interval_ms: must be between 1 and 60000, got 0"));
  auto type =
      ctrl({"serve", "--config", writeFile("c.yaml", "database:\n  max_connections: lots\n")});
  EXPECT_THAT(type.err, HasSubstr("database.max_connections: must be a whole number"));
  auto yaml = ctrl({"serve", "--config", writeFile("d.yaml", "listen: [\n")});
  EXPECT_THAT(yaml.err, HasSubstr("not valid YAML"));
  auto address = ctrl({"serve", "--config", writeFile("e.yaml", "listen: nowhere\n")});
  EXPECT_THAT(address.err, HasSubstr("listen: \"nowhere\" is not host:port"));
  auto no_db = ctrl({"serve", "--config", writeFile("f.yaml", "listen: 127.0.0.1:0\n")});
  EXPECT_THAT(no_db.err, HasSubstr("database.dsn: required"));
  auto tls = ctrl({"serve", "--dsn", "mysql://u@h/d", "--config",
                   writeFile("g.yaml", "tls:\n  cert_file: x.pem\n")});
  EXPECT_THAT(tls.err, HasSubstr("tls: cert_file and key_file go together"));
  auto workflow = ctrl({"serve", "--config", writeFile("h.yaml", "workflow:\n  threads: 0\n")});
  EXPECT_THAT(workflow.err, HasSubstr("workflow.threads: must be between 1 and 1024, got 0"));
  auto missing = ctrl({"serve", "--config", "/nonexistent/ctrl.yaml"});
  EXPECT_THAT(missing.err, HasSubstr("cannot read config file /nonexistent/ctrl.yaml"));
}

TEST(RegionAndTokenCommands, CreateListRevoke) {
  const auto dsn = dsnText(ScratchMariaDb::instance().freshDatabase());
  ASSERT_EQ(ctrl({"migrate", "--dsn", dsn}).exit_code, 0);
  auto no_region = ctrl({"token", "create", "--dsn", dsn, "--region", "eu-1"});
  EXPECT_EQ(no_region.exit_code, 1);
  EXPECT_THAT(no_region.err, HasSubstr("region \"eu-1\" is not registered"));
  ASSERT_EQ(ctrl({"region", "add", "eu-1", "--dsn", dsn}).exit_code, 0);
  ASSERT_EQ(ctrl({"region", "add", "eu-1", "--dsn", dsn, "--name", "Europe"}).exit_code,
            0);  // idempotent
  auto regions = ctrl({"region", "list", "--dsn", dsn});
  EXPECT_THAT(regions.out, HasSubstr("Europe"));
  EXPECT_THAT(ctrl({"region", "add", "bad id", "--dsn", dsn}).err,
              HasSubstr("id: \"bad id\" may only contain"));

  auto created = ctrl({"token", "create", "--dsn", dsn, "--region", "eu-1", "--name", "ci"});
  ASSERT_EQ(created.exit_code, 0) << created.err;
  EXPECT_THAT(created.out, ::testing::StartsWith("krane_agent_"));  // stdout holds only the secret
  EXPECT_THAT(created.err, HasSubstr("not shown again"));
  auto listed = ctrl({"token", "list", "--dsn", dsn});
  EXPECT_THAT(listed.out, HasSubstr("active"));
  EXPECT_THAT(listed.out, Not(HasSubstr(created.out.substr(0, 20))));  // never the secret
  std::smatch m;
  ASSERT_TRUE(std::regex_search(listed.out, m, std::regex("(tok_[A-Za-z0-9_-]+)")));
  EXPECT_EQ(ctrl({"token", "revoke", m[1], "--dsn", dsn}).exit_code, 0);
  EXPECT_THAT(ctrl({"token", "list", "--dsn", dsn}).out, HasSubstr("revoked"));
  EXPECT_EQ(ctrl({"token", "revoke", m[1], "--dsn", dsn}).exit_code, 1);
}

}  // namespace
}  // namespace krane
