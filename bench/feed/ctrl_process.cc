#include "bench/feed/ctrl_process.h"

#include <httplib.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <vector>

#include "common/strings.h"

namespace krane::bench {
namespace {

bool executable(const std::string& path) {
  return !path.empty() && ::access(path.c_str(), X_OK) == 0;
}

std::string readAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream all;
  all << in.rdbuf();
  return all.str();
}

// Parses "krane-ctrl serving: grpc 127.0.0.1:P, http 127.0.0.1:Q[, watch 127.0.0.1:R]" out of
// the log.
bool parseServingLine(const std::string& log, int* grpc_port, int* http_port, int* watch_port) {
  const std::string marker = "krane-ctrl serving: grpc ";
  const auto at = log.find(marker);
  if (at == std::string::npos) return false;
  const auto eol = log.find('\n', at);
  if (eol == std::string::npos) return false;  // not completely written yet
  const std::string line = log.substr(at, eol - at);
  const auto grpc_colon = line.find(':', marker.size());
  const auto http_at = line.find(", http ");
  if (grpc_colon == std::string::npos || http_at == std::string::npos) return false;
  const auto http_colon = line.find(':', http_at + 7);
  if (http_colon == std::string::npos) return false;
  *grpc_port = std::atoi(line.c_str() + grpc_colon + 1);
  *http_port = std::atoi(line.c_str() + http_colon + 1);
  if (const auto watch_at = line.find(", watch "); watch_at != std::string::npos) {
    const auto watch_colon = line.find(':', watch_at + 8);
    if (watch_colon != std::string::npos) *watch_port = std::atoi(line.c_str() + watch_colon + 1);
  }
  return *grpc_port > 0 && *http_port > 0;
}

}  // namespace

std::string findRunfile(std::string_view path_in_workspace, const char* argv0) {
  const std::string rel = strCat("krane/", path_in_workspace);
  std::vector<std::string> candidates;
  for (const char* env : {"RUNFILES_DIR", "TEST_SRCDIR"}) {
    const char* dir = std::getenv(env);
    if (dir != nullptr && *dir != '\0') candidates.push_back(strCat(dir, "/", rel));
  }
  if (argv0 != nullptr && *argv0 != '\0') candidates.push_back(strCat(argv0, ".runfiles/", rel));
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) candidates.push_back(strCat(self.string(), ".runfiles/", rel));
  // `bazel run` starts the binary inside its runfiles tree, at the workspace's directory.
  candidates.push_back(std::string(path_in_workspace));
  for (const auto& c : candidates) {
    if (executable(c)) return std::filesystem::absolute(c).string();
  }
  std::string looked;
  for (const auto& c : candidates) strAppend(&looked, "\n  ", c);
  throw std::runtime_error(
      strCat("cannot find ", path_in_workspace, " in the runfiles; looked at:", looked,
             "\n(run the benchmark with `./dev bench feed` or `bazel run //bench/feed`)"));
}

ProcessMemory readProcessMemory(int pid) {
  std::ifstream in(strCat("/proc/", pid, "/status"));
  if (!in) throw std::runtime_error(strCat("cannot read /proc/", pid, "/status"));
  ProcessMemory memory;
  std::string line;
  while (std::getline(in, line)) {
    auto value = [&](std::string_view key) -> std::optional<uint64_t> {
      if (line.rfind(key, 0) != 0) return std::nullopt;
      return std::strtoull(line.c_str() + key.size(), nullptr, 10);  // "  12345 kB"
    };
    if (auto v = value("VmRSS:")) memory.rss_kib = *v;
    if (auto v = value("VmHWM:")) memory.hwm_kib = *v;
  }
  return memory;
}

CtrlProcess::CtrlProcess(CtrlOptions options) : options_(std::move(options)) {
  config_path_ = strCat(options_.work_dir, "/", options_.name, ".yaml");
  log_path_ = strCat(options_.work_dir, "/", options_.name, ".log");
  {
    std::ofstream config(config_path_);
    config << "listen: 127.0.0.1:0\n"
           << "http_listen: 127.0.0.1:0\n"
           << "database:\n"
           << "  dsn: "
           << strCat("mysql://", options_.dsn.user, "@", options_.dsn.host, ":", options_.dsn.port,
                     "/", options_.dsn.database)
           << "\n"
           << "  max_connections: " << options_.max_connections << "\n"
           << "feed:\n"
           << "  poll_interval_ms: " << options_.poll_interval_ms << "\n";
    if (options_.peer_hints) config << "  peer_hints:\n    listen: 127.0.0.1:0\n";
    if (options_.watch_listener) config << "  watch_listen: 127.0.0.1:0\n";
    if (!options_.tls_cert_file.empty()) {
      config << "tls:\n  cert_file: " << options_.tls_cert_file
             << "\n  key_file: " << options_.tls_key_file << "\n";
    }
    if (!config) throw std::runtime_error(strCat("cannot write ", config_path_));
  }
  std::filesystem::remove(log_path_);
  child_ = std::make_unique<testing::ChildProcess>(
      std::vector<std::string>{options_.binary, "serve", "--config", config_path_}, log_path_,
      std::map<std::string, std::string>{{"KRANE_OPERATOR_TOKEN", options_.operator_token}});
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (;;) {
    if (parseServingLine(readAll(log_path_), &grpc_port_, &http_port_, &watch_port_)) {
      if (options_.watch_listener && watch_port_ == 0) {
        stop(std::chrono::seconds(2));
        throw std::runtime_error(strCat("krane-ctrl serves no watch listener:\n", logTail()));
      }
      return;
    }
    if (!child_->running()) {
      exit_code_ = child_->wait();
      throw std::runtime_error(
          strCat("krane-ctrl exited during start-up (", *exit_code_, "):\n", logTail()));
    }
    if (std::chrono::steady_clock::now() > deadline) {
      stop(std::chrono::seconds(2));
      throw std::runtime_error(strCat("krane-ctrl did not start within 60 s:\n", logTail()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

CtrlProcess::~CtrlProcess() {
  if (child_) stop();
}

std::string CtrlProcess::grpcTarget() const { return strCat("127.0.0.1:", grpc_port_); }

std::string CtrlProcess::watchTarget() const {
  return strCat("127.0.0.1:", watch_port_ != 0 ? watch_port_ : grpc_port_);
}

std::optional<double> CtrlProcess::metric(std::string_view name) const {
  httplib::Client client("127.0.0.1", http_port_);
  client.set_connection_timeout(2);
  client.set_read_timeout(5);
  auto res = client.Get("/metrics");
  if (!res || res->status != 200) return std::nullopt;
  std::istringstream lines(res->body);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] == '#') continue;
    if (line.rfind(name, 0) != 0) continue;
    const char next = line.size() > name.size() ? line[name.size()] : '\0';
    if (next != ' ' && next != '{') continue;
    const auto space = line.rfind(' ');
    return std::strtod(line.c_str() + space + 1, nullptr);
  }
  return std::nullopt;
}

int CtrlProcess::stop(std::chrono::seconds grace) {
  if (exit_code_) return *exit_code_;
  child_->signal(SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + grace;
  while (child_->running() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (child_->running()) {
    std::fprintf(stderr,
                 "bench: krane-ctrl (pid %d) did not stop within %lld s of SIGTERM; killing it\n",
                 child_->pid(), static_cast<long long>(grace.count()));
    child_->signal(SIGKILL);
  }
  exit_code_ = child_->wait();
  return *exit_code_;
}

std::string CtrlProcess::logTail() const {
  std::string log = readAll(log_path_);
  if (log.size() > 4000) log = log.substr(log.size() - 4000);
  return log;
}

}  // namespace krane::bench
