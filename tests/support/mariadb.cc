#include "tests/support/mariadb.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include "common/strings.h"
#include "controlplane/db/connection.h"
#include "tests/support/process.h"

namespace krane::testing {
namespace {

[[noreturn]] void die(const std::string& what, const std::string& log_path = "") {
  std::string tail;
  if (!log_path.empty()) {
    std::ifstream log(log_path);
    std::stringstream all;
    all << log.rdbuf();
    tail = all.str();
    if (tail.size() > 4000) tail = tail.substr(tail.size() - 4000);
  }
  std::fprintf(stderr, "scratch MariaDB: %s\n%s\n", what.c_str(), tail.c_str());
  std::fflush(stderr);
  std::abort();
}

std::string binary(const char* env, const char* fallback) {
  const char* value = std::getenv(env);
  return value != nullptr && *value != '\0' ? value : fallback;
}

unsigned freePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t length = sizeof(addr);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length) != 0) {
    die("cannot find a free TCP port");
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

std::string makeTemp(const std::string& pattern) {
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr) die("mkdtemp " + pattern + " failed");
  return buf.data();
}

ScratchMariaDb* g_instance = nullptr;
ScratchMariaDb::Sizing g_sizing = ScratchMariaDb::Sizing::kTest;

// The server's options for `sizing` (none: the server's defaults).
std::vector<std::string> sizingOptions(ScratchMariaDb::Sizing sizing) {
  if (sizing == ScratchMariaDb::Sizing::kServerDefaults) return {};
  return {"--innodb-log-file-size=8M", "--innodb-buffer-pool-size=64M"};
}

}  // namespace

void ScratchMariaDb::setSizing(Sizing sizing) {
  if (g_instance != nullptr && sizing != g_sizing) die("ScratchMariaDb::setSizing after the start");
  g_sizing = sizing;
}

ScratchMariaDb& ScratchMariaDb::instance() {
  if (g_instance == nullptr) {
    g_instance = new ScratchMariaDb();
    std::atexit([] {
      delete g_instance;
      g_instance = nullptr;
    });
  }
  return *g_instance;
}

ScratchMariaDb::ScratchMariaDb() {
  const char* test_tmp = std::getenv("TEST_TMPDIR");
  data_root_ = makeTemp(strCat(test_tmp != nullptr ? test_tmp : "/tmp", "/mariadb-XXXXXX"));
  socket_dir_ = makeTemp("/tmp/krane-db-XXXXXX");
  const std::string log = data_root_ + "/install.log";
  // A private tmpdir: sandboxed tests share /tmp, and their servers can have equal PIDs (each
  // sandbox has its own PID namespace), which makes MariaDB's temporary file names collide.
  std::filesystem::create_directories(data_root_ + "/tmp");
  std::vector<std::string> install_argv = {
      binary("KRANE_MARIADB_INSTALL_DB", "/usr/bin/mariadb-install-db"),
      "--no-defaults",
      "--user=root",
      "--datadir=" + data_root_ + "/data",
      "--auth-root-authentication-method=normal",
      "--skip-test-db",
      "--tmpdir=" + data_root_ + "/tmp"};
  for (std::string& option : sizingOptions(g_sizing)) install_argv.push_back(std::move(option));
  ChildProcess install(install_argv, log);
  if (install.wait() != 0) {
    die("mariadb-install-db failed (is mariadb-server-core installed? run ./dev setup)", log);
  }
  port_ = freePort();
  start();
}

ScratchMariaDb::~ScratchMariaDb() {
  kill();
  std::error_code ec;
  if (std::getenv("KRANE_TEST_KEEP") == nullptr) std::filesystem::remove_all(data_root_, ec);
  std::filesystem::remove_all(socket_dir_, ec);
}

void ScratchMariaDb::start() {
  if (server_) return;
  std::vector<std::string> argv = {binary("KRANE_MARIADBD", "/usr/sbin/mariadbd"),
                                   "--no-defaults",
                                   "--user=root",
                                   "--datadir=" + data_root_ + "/data",
                                   "--socket=" + socket_dir_ + "/mysqld.sock",
                                   strCat("--port=", port_),
                                   "--bind-address=127.0.0.1",
                                   "--pid-file=" + data_root_ + "/mysqld.pid",
                                   "--log-error=" + data_root_ + "/mysqld.err",
                                   "--skip-name-resolve",
                                   "--tmpdir=" + data_root_ + "/tmp",
                                   "--innodb-flush-log-at-trx-commit=2",
                                   "--max-connections=1000",
                                   "--skip-log-bin",
                                   "--performance-schema=OFF"};
  for (std::string& option : sizingOptions(g_sizing)) argv.push_back(std::move(option));
  server_ = std::make_unique<ChildProcess>(argv, data_root_ + "/mysqld.out");
  waitReady();
}

void ScratchMariaDb::waitReady() {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  db::Dsn admin = adminDsn();
  admin.connect_timeout = std::chrono::seconds(1);
  for (;;) {
    if (!server_->running()) {
      server_.reset();
      die("mariadbd exited during start-up", data_root_ + "/mysqld.err");
    }
    if (db::Connection::open(admin).ok()) return;
    if (std::chrono::steady_clock::now() > deadline) {
      die("mariadbd did not accept connections within 60 s", data_root_ + "/mysqld.err");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void ScratchMariaDb::stop() {
  if (!server_) return;
  server_->signal(SIGTERM);
  server_->wait();
  server_.reset();
}

void ScratchMariaDb::kill() { server_.reset(); }

db::Dsn ScratchMariaDb::adminDsn() const {
  db::Dsn dsn;
  dsn.user = "root";
  dsn.host = "127.0.0.1";
  dsn.port = port_;
  dsn.database = "mysql";
  return dsn;
}

db::Dsn ScratchMariaDb::freshDatabase() {
  if (!server_) start();
  auto admin = db::Connection::open(adminDsn());
  if (!admin.ok()) die(strCat("cannot connect as admin: ", admin.status().message()));
  static std::mt19937 rng(std::random_device{}());
  const std::string name = strCat("t", ::getpid(), "_", next_database_++, "_", rng() % 100000);
  // The name is generated here from digits and letters only; identifiers cannot be bound.
  if (auto st = (*admin)->execText("CREATE DATABASE `" + name + "` CHARACTER SET utf8mb4");
      !st.ok()) {
    die(strCat("CREATE DATABASE failed: ", st.message()));
  }
  db::Dsn dsn = adminDsn();
  dsn.database = name;
  return dsn;
}

void ScratchMariaDb::copyDatabase(const std::string& from, const std::string& to) {
  auto admin = db::Connection::open(adminDsn());
  if (!admin.ok()) die(strCat("cannot connect as admin: ", admin.status().message()));
  auto& c = **admin;
  const auto run = [&](const std::string& sql) {
    if (auto st = c.execText(sql); !st.ok()) die(strCat(sql, ": ", st.message()));
  };
  // Identifiers cannot be bound; test database names are generated (letters, digits, '_').
  run(strCat("CREATE DATABASE IF NOT EXISTS `", to, "` CHARACTER SET utf8mb4"));
  run("SET FOREIGN_KEY_CHECKS = 0");
  auto existing = c.query("SELECT table_name FROM information_schema.tables WHERE table_schema = ?",
                          {db::Value(to)});
  if (!existing.ok()) die(strCat("listing tables of ", to, ": ", existing.status().message()));
  for (const auto& row : existing->rows) run(strCat("DROP TABLE `", to, "`.`", row.str(0), "`"));
  auto tables = c.query("SELECT table_name FROM information_schema.tables WHERE table_schema = ?",
                        {db::Value(from)});
  if (!tables.ok()) die(strCat("listing tables of ", from, ": ", tables.status().message()));
  for (const auto& row : tables->rows) {
    const std::string& t = row.str(0);
    run(strCat("CREATE TABLE `", to, "`.`", t, "` LIKE `", from, "`.`", t, "`"));
    run(strCat("INSERT INTO `", to, "`.`", t, "` SELECT * FROM `", from, "`.`", t, "`"));
  }
  run("SET FOREIGN_KEY_CHECKS = 1");
}

}  // namespace krane::testing
