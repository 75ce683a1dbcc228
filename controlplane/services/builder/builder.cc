#include "controlplane/services/builder/builder.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <deque>
#include <fstream>
#include <thread>
#include <vector>

#include "common/strings.h"
#include "controlplane/workflow/service.h"

extern char** environ;

namespace krane::services::builder {
namespace {

using workflow::terminalError;

absl::Status invalid(std::string_view message) {
  return terminalError(absl::StatusCode::kInvalidArgument, message);
}

// An image reference as the schema stores it: 1-512 printable characters, no spaces.
absl::Status checkReference(std::string_view ref, std::string_view field) {
  if (ref.empty()) return invalid(strCat(field, ": required"));
  if (ref.size() > 512) return invalid(strCat(field, ": ", ref.size(), " characters, at most 512"));
  for (char c : ref) {
    if (c <= ' ' || c == 0x7f) return invalid(strCat(field, ": must not contain spaces"));
  }
  return absl::OkStatus();
}

// Used in a file name: letters, digits, '_' and '-'.
absl::Status checkId(std::string_view id, std::string_view field) {
  if (id.empty() || id.size() > 64) return invalid(strCat(field, ": required, 1-64 characters"));
  for (char c : id) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-') {
      return invalid(strCat(field, ": use letters, digits, '_' or '-'"));
    }
  }
  return absl::OkStatus();
}

// posix_spawn's attributes and file actions, released on every path.
struct Spawn {
  posix_spawnattr_t attr;
  posix_spawn_file_actions_t actions;
  Spawn() {
    posix_spawnattr_init(&attr);
    posix_spawn_file_actions_init(&actions);
  }
  ~Spawn() {
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
  }
  Spawn(const Spawn&) = delete;
  Spawn& operator=(const Spawn&) = delete;
};

}  // namespace

std::string tailOf(const std::filesystem::path& file, int lines) {
  std::ifstream in(file);
  std::deque<std::string> last;
  std::string line;
  while (std::getline(in, line)) {
    last.push_back(line);
    if (static_cast<int>(last.size()) > lines) last.pop_front();
  }
  std::string out;
  for (const auto& l : last) out += l + "\n";
  return out;
}

absl::StatusOr<BuildResult> PrebuiltBuilder::build(const BuildRequest& request) {
  if (absl::Status s = checkReference(request.image(), "image"); !s.ok()) return s;
  BuildResult result;
  result.set_image(request.image());
  result.set_builder("prebuilt");
  return result;
}

absl::StatusOr<BuildResult> CommandBuilder::build(const BuildRequest& request) {
  const services::v1::CommandBuild& spec = request.command();
  if (absl::Status s = checkId(request.deployment_id(), "deployment_id"); !s.ok()) return s;
  if (spec.argv().empty() || spec.argv(0).empty()) {
    return invalid("command.argv: required, the build command and its arguments");
  }
  const std::string tag =
      request.commit_sha().empty() ? request.deployment_id() : request.commit_sha();
  const std::string image = strCat(spec.image_name(), ":", tag);
  if (spec.image_name().empty()) return invalid("command.image_name: required");
  if (absl::Status s = checkReference(image, "command.image_name"); !s.ok()) return s;
  if (!spec.working_dir().empty() && !std::filesystem::is_directory(spec.working_dir())) {
    return invalid(strCat("command.working_dir: '", spec.working_dir(), "' is not a directory"));
  }
  std::error_code ec;
  std::filesystem::create_directories(options_.log_dir, ec);
  const std::filesystem::path log_path = options_.log_dir / strCat(request.deployment_id(), ".log");
  const int log_fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log_fd < 0) {
    // The control plane's own disk, not the build: worth retrying.
    return absl::UnavailableError(
        strCat("cannot write the build log ", log_path.string(), ": ", std::strerror(errno)));
  }

  std::vector<std::string> env_strings = {strCat("KRANE_DEPLOYMENT_ID=", request.deployment_id()),
                                          strCat("KRANE_COMMIT_SHA=", request.commit_sha()),
                                          strCat("KRANE_IMAGE=", image)};
  std::vector<char*> envp;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "KRANE_", 6) != 0) envp.push_back(*e);
  }
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args(spec.argv().begin(), spec.argv().end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  pid_t pid = 0;
  int spawned = 0;
  {
    Spawn spawn;
    posix_spawn_file_actions_adddup2(&spawn.actions, log_fd, STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&spawn.actions, log_fd, STDERR_FILENO);
    posix_spawn_file_actions_addopen(&spawn.actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    if (!spec.working_dir().empty()) {
      posix_spawn_file_actions_addchdir_np(&spawn.actions, spec.working_dir().c_str());
    }
    // Its own process group, so a timeout stops everything it started.
    posix_spawnattr_setpgroup(&spawn.attr, 0);
    sigset_t none;
    sigemptyset(&none);
    posix_spawnattr_setsigmask(&spawn.attr, &none);
    posix_spawnattr_setflags(&spawn.attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK);
    spawned = posix_spawnp(&pid, argv[0], &spawn.actions, &spawn.attr, argv.data(), envp.data());
  }
  if (spawned != 0) {
    const std::string error =
        strCat("command.argv[0]: cannot run '", args[0], "': ", std::strerror(spawned));
    (void)!::write(log_fd, (error + "\n").data(), error.size() + 1);
    ::close(log_fd);
    return invalid(error);
  }
  ::close(log_fd);

  const auto timeout = spec.timeout_seconds() > 0 ? std::chrono::seconds(spec.timeout_seconds())
                                                  : options_.default_timeout;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  bool timed_out = false;
  for (;;) {
    const pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (done < 0 && errno != EINTR) return absl::InternalError("waitpid failed");
    if (!timed_out && std::chrono::steady_clock::now() > deadline) {
      timed_out = true;
      ::killpg(pid, SIGTERM);
      std::this_thread::sleep_for(options_.kill_grace);
      ::killpg(pid, SIGKILL);
      continue;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // Anything the build left running in its group goes with it.
  ::killpg(pid, SIGKILL);

  const std::string tail = tailOf(log_path, options_.tail_lines);
  const std::string log_note =
      strCat("; last lines of ", log_path.string(), ":\n", tail.empty() ? "(no output)\n" : tail);
  if (timed_out) {
    return terminalError(absl::StatusCode::kDeadlineExceeded,
                         strCat("build of ", request.deployment_id(), " timed out after ",
                                timeout.count(), " s and was stopped", log_note));
  }
  if (WIFSIGNALED(status)) {
    return terminalError(absl::StatusCode::kFailedPrecondition,
                         strCat("build of ", request.deployment_id(), " failed: '", args[0],
                                "' was killed by signal ", WTERMSIG(status), log_note));
  }
  if (WEXITSTATUS(status) != 0) {
    return terminalError(absl::StatusCode::kFailedPrecondition,
                         strCat("build of ", request.deployment_id(), " failed: '", args[0],
                                "' exited with status ", WEXITSTATUS(status), log_note));
  }
  BuildResult result;
  result.set_image(image);
  result.set_log_path(log_path.string());
  result.set_builder("command");
  return result;
}

absl::StatusOr<Builder*> builderFor(const BuildRequest& request, PrebuiltBuilder& prebuilt,
                                    CommandBuilder& command) {
  switch (request.source_case()) {
    case BuildRequest::kImage:
      return &prebuilt;
    case BuildRequest::kCommand:
      return &command;
    case BuildRequest::SOURCE_NOT_SET:
      break;
  }
  return invalid("source: an image, or a build command");
}

}  // namespace krane::services::builder
