// `krane-ctrl migrate` as an operator runs it: exit codes and one-line errors that say what to fix.
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include <catch2/catch.hpp>

#include "common/strings.h"
#include "controlplane/db/pool.h"
#include "tests/support/mariadb.h"
#include "tests/support/matchers.h"
#include "tests/support/process.h"

namespace krane {
namespace {

using krane::testing::CommandResult;
using krane::testing::runCommand;
using krane::testing::runfile;
using krane::testing::ScratchMariaDb;

std::string dsnText(const db::Dsn& dsn) {
  return strCat("mysql://", dsn.user, "@127.0.0.1:", dsn.port, "/", dsn.database);
}

CommandResult ctrl(std::vector<std::string> args, std::map<std::string, std::string> env = {}) {
  args.insert(args.begin(), runfile("controlplane/krane-ctrl"));
  return runCommand(args, env);
}

// An error is exactly one line on stderr, starting with the command's name.
void expectOneLineError(const CommandResult& r, const std::string& needle) {
  CHECK(r.exit_code != 0);
  CHECK_THAT(r.err, Catch::StartsWith("krane-ctrl"));
  INFO(r.err);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  CHECK_THAT(r.err, Catch::Contains(needle));
}

TEST_CASE("applies then reports up to date", "[migrate-command]") {
  const auto dsn = dsnText(ScratchMariaDb::instance().freshDatabase());
  auto first = ctrl({"migrate", "--dsn", dsn});
  INFO(first.err);
  REQUIRE(first.exit_code == 0);
  CHECK_THAT(first.out, Catch::Contains("applying 0001_"));
  CHECK_THAT(first.out, Catch::Contains("applied "));
  auto second = ctrl({"migrate"}, {{"KRANE_DSN", dsn}});
  INFO(second.err);
  REQUIRE(second.exit_code == 0);
  CHECK_THAT(second.out, Catch::Contains("is up to date"));
  auto status = ctrl({"migrate", "--status", "--dsn", dsn});
  REQUIRE(status.exit_code == 0);
  CHECK_THAT(status.out, Catch::Contains("0001     0001_"));
  CHECK_THAT(status.out, !Catch::Contains("pending"));
  CHECK(ctrl({"migrate", "--check", "--dsn", dsn}).exit_code == 0);
}

TEST_CASE("check fails on a pending schema", "[migrate-command]") {
  const auto dsn = dsnText(ScratchMariaDb::instance().freshDatabase());
  auto check = ctrl({"migrate", "--check", "--dsn", dsn});
  expectOneLineError(check, "run `krane-ctrl migrate`");
}

TEST_CASE("bad input gets one line errors", "[migrate-command]") {
  expectOneLineError(ctrl({"migrate"}), "no database given");
  expectOneLineError(ctrl({"migrate", "--dsn", "mysql://root@127.0.0.1/"}),
                     "missing database name");
  expectOneLineError(ctrl({"migrate", "--dsn", "postgres://x"}), "must start with mysql://");

  auto& server = ScratchMariaDb::instance();
  const auto fresh = server.freshDatabase();
  expectOneLineError(
      ctrl({"migrate", "--dsn",
            strCat("mysql://root:nope@127.0.0.1:", fresh.port, "/", fresh.database)}),
      "check the user and password");
  expectOneLineError(
      ctrl({"migrate", "--dsn", strCat("mysql://root@127.0.0.1:", fresh.port, "/no_such_db")}),
      "create the database first");

  auto usage = ctrl({"migrate", "--lock-timeout", "0", "--dsn", dsnText(fresh)});
  CHECK(usage.exit_code == 2);
  CHECK_THAT(usage.err, Catch::Contains("--help"));
}

TEST_CASE("malformed and unknown migration files are refused", "[migrate-command]") {
  const auto dsn = dsnText(ScratchMariaDb::instance().freshDatabase());
  const std::string dir = strCat(std::getenv("TEST_TMPDIR"), "/migrations");
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/0001_ok.sql") << "CREATE TABLE ok (x INT);\n";
  std::ofstream(dir + "/2_bad.sql") << "CREATE TABLE bad (x INT);\n";
  expectOneLineError(ctrl({"migrate", "--dsn", dsn, "--migrations-dir", dir}),
                     "2_bad.sql: bad name");
  std::filesystem::remove(dir + "/2_bad.sql");
  std::ofstream(dir + "/0002_broken.sql") << "CREATE TABLE broken (x INT;\n";
  expectOneLineError(ctrl({"migrate", "--dsn", dsn, "--migrations-dir", dir}),
                     "migration 0002_broken.sql, statement 1 (line 1) failed");
  expectOneLineError(ctrl({"migrate", "--dsn", dsn, "--migrations-dir", dir + "/nope"}),
                     "does not exist");
}

TEST_CASE("a server that is down is named", "[migrate-command]") {
  auto& server = ScratchMariaDb::instance();
  const auto dsn = server.freshDatabase();
  server.stop();
  auto down = ctrl({"migrate", "--dsn", dsnText(dsn)});
  server.start();
  expectOneLineError(down, strCat("cannot connect to MySQL at 127.0.0.1:", dsn.port));
  CHECK_THAT(down.err, Catch::Contains("is the server running"));
}

// The worst moment: the process dies between two DDL statements of one migration.
TEST_CASE("killed mid migration is detected and does not hold the lock", "[migrate-command]") {
  const auto dsn = ScratchMariaDb::instance().freshDatabase();
  const std::string dir = strCat(std::getenv("TEST_TMPDIR"), "/slow-migrations");
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/0001_slow.sql") << "CREATE TABLE first (x INT);\n"
                                           "SELECT SLEEP(30);\n"
                                           "CREATE TABLE second (x INT);\n";
  krane::testing::ChildProcess migrate({runfile("controlplane/krane-ctrl"), "migrate", "--dsn",
                                        dsnText(dsn), "--migrations-dir", dir});
  auto pool = db::Pool::create(dsn);
  REQUIRE_THAT(pool, IsOk());
  // Wait until the first statement ran and the second one is in progress.
  bool in_progress = false;
  for (int i = 0; i < 200 && !in_progress; ++i) {
    auto conn = (*pool)->acquire();
    auto rows = (*conn)->query(
        "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = "
        "'first'",
        {dsn.database});
    in_progress = rows.ok() && rows->rows[0].i64(0) == 1;
    if (!in_progress) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  REQUIRE(in_progress);
  migrate.signal(SIGKILL);
  CHECK(migrate.wait() == -SIGKILL);

  // The next run fails at once (the dead session's lock is gone) and explains the repair.
  const auto started = std::chrono::steady_clock::now();
  auto again =
      ctrl({"migrate", "--dsn", dsnText(dsn), "--migrations-dir", dir, "--lock-timeout", "20"});
  CHECK((std::chrono::steady_clock::now() - started) < std::chrono::seconds(15));
  expectOneLineError(again, "migration 0001_slow did not finish");
  auto status = ctrl({"migrate", "--status", "--dsn", dsnText(dsn), "--migrations-dir", dir});
  CHECK_THAT(status.out, Catch::Contains("INTERRUPTED"));
}

TEST_CASE("help and version", "[migrate-command]") {
  auto help = ctrl({"migrate", "--help"});
  CHECK(help.exit_code == 0);
  CHECK_THAT(help.out, Catch::Contains("--dsn"));
  CHECK_THAT(help.out, Catch::Contains("KRANE_DSN"));
  auto version = ctrl({"--version"});
  CHECK(version.exit_code == 0);
  CHECK_THAT(version.out, Catch::Contains("0."));
}

}  // namespace
}  // namespace krane
