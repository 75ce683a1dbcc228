#include "agent/leader.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "common/strings.h"
#include "spdlog/spdlog.h"

namespace krane::agent {

FileLockElector::FileLockElector(std::string state_dir, std::string identity,
                                 std::chrono::milliseconds poll)
    : path_(state_dir + "/leader.lock"), identity_(std::move(identity)), poll_(poll) {}

FileLockElector::~FileLockElector() { stop(); }

std::string FileLockElector::holder(const std::string& state_dir) {
  std::ifstream in(state_dir + "/leader.lock");
  std::string line;
  std::getline(in, line);  // "<agent id> <pid>"
  return line;
}

bool FileLockElector::tryAcquire() {
  if (fd_ < 0) fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd_ < 0) return false;
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) return false;
  const std::string who = strCat(identity_, " ", ::getpid(), "\n");
  if (::ftruncate(fd_, 0) == 0) {
    (void)::pwrite(fd_, who.data(), who.size(), 0);
  }
  return true;
}

void FileLockElector::start(std::function<void(bool)> on_change) {
  thread_ = std::thread([this, on_change = std::move(on_change)] {
    while (!stopping_) {
      if (!leader_ && tryAcquire()) {
        leader_ = true;
        spdlog::info("agent: {} is now the leader (lock {})", identity_, path_);
        on_change(true);
      }
      std::this_thread::sleep_for(poll_);
    }
    if (leader_) {
      leader_ = false;
      on_change(false);
    }
  });
}

void FileLockElector::stop() {
  stopping_ = true;
  if (thread_.joinable()) thread_.join();
  if (fd_ >= 0) {
    ::close(fd_);  // releases the lock
    fd_ = -1;
  }
}

LeaseElector::LeaseElector(std::shared_ptr<LeaseClient> client, std::string identity,
                           std::chrono::seconds duration)
    : client_(std::move(client)), identity_(std::move(identity)), duration_(duration) {}

LeaseElector::~LeaseElector() { stop(); }

void LeaseElector::tick() {
  const auto now = std::chrono::system_clock::now();
  auto current = client_->get();
  bool ok = false;
  if (absl::IsNotFound(current.status())) {
    ok = client_->write({identity_, now, duration_, ""}, "").ok();
  } else if (current.ok()) {
    const bool expired = now - current->renewed > current->duration;
    if (current->holder == identity_ || expired) {
      ok = client_
               ->write({identity_, now, duration_, current->resource_version},
                       current->resource_version)
               .ok();
    }
  }
  const auto steady_now = std::chrono::steady_clock::now();
  if (ok) last_renewal_ = steady_now;
  // Give leadership up before the lease can expire for others (renewals stopped succeeding).
  const bool leader = last_renewal_ != std::chrono::steady_clock::time_point{} &&
                      steady_now - last_renewal_ <
                          std::chrono::duration_cast<std::chrono::milliseconds>(duration_) * 2 / 3;
  if (leader != leader_.exchange(leader)) {
    spdlog::info("agent: {} {} the lease", identity_, leader ? "holds" : "lost");
    if (on_change_) on_change_(leader);
  }
}

void LeaseElector::start(std::function<void(bool)> on_change) {
  on_change_ = std::move(on_change);
  thread_ = std::thread([this] {
    while (!stopping_) {
      tick();
      const auto step = std::chrono::duration_cast<std::chrono::milliseconds>(duration_) / 3;
      for (auto slept = std::chrono::milliseconds(0); slept < step && !stopping_;
           slept += std::chrono::milliseconds(50)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
  });
}

void LeaseElector::stop() {
  stopping_ = true;
  if (thread_.joinable()) thread_.join();
  if (!leader_.exchange(false)) return;
  if (on_change_) on_change_(false);
  // Hand the lease back (renewed long ago: expired), so a standby takes over at its next look
  // instead of waiting out the duration. If this fails, the lease simply expires.
  auto current = client_->get();
  if (current.ok() && current->holder == identity_) {
    const auto released = client_->write(
        {identity_, std::chrono::system_clock::time_point{}, duration_, current->resource_version},
        current->resource_version);
    if (released.ok()) spdlog::info("agent: {} released the lease", identity_);
  }
}

}  // namespace krane::agent
