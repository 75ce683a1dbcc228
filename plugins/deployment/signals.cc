#include "plugins/deployment/signals.h"

#include <csignal>
#include <map>

#include "common/strings.h"

namespace krane::deployment {
namespace {

const std::map<std::string, int>& signals() {
  static const std::map<std::string, int> table = {
      {"TERM", SIGTERM}, {"INT", SIGINT},   {"QUIT", SIGQUIT}, {"HUP", SIGHUP},
      {"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"KILL", SIGKILL}, {"WINCH", SIGWINCH},
  };
  return table;
}

}  // namespace

absl::StatusOr<std::string> signalName(const std::string& name) {
  if (name.empty()) return std::string("TERM");
  const std::string bare = name.rfind("SIG", 0) == 0 ? name.substr(3) : name;
  if (signals().count(bare) == 0) {
    return absl::InvalidArgumentError(strCat("shutdown_signal: \"", name,
                                             "\" is not one of SIGTERM, SIGINT, SIGQUIT, SIGHUP, "
                                             "SIGUSR1, SIGUSR2, SIGKILL, SIGWINCH"));
  }
  return bare;
}

absl::StatusOr<int> signalNumber(const std::string& name) {
  auto bare = signalName(name);
  if (!bare.ok()) return bare.status();
  return signals().at(*bare);
}

}  // namespace krane::deployment
