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
                           std::chrono::seconds duration, Clock clock)
    : client_(std::move(client)),
      identity_(std::move(identity)),
      duration_(duration),
      clock_(std::move(clock)) {}

LeaseElector::~LeaseElector() { stop(); }

std::chrono::milliseconds LeaseElector::renewDeadline() const {
  return std::chrono::duration_cast<std::chrono::milliseconds>(duration_) * 2 / 3;
}

void LeaseElector::tick() {
  // The start of this round: a renewal that succeeds landed after it, so the holder's deadline
  // counts from here (never later than what others observe).
  const auto started = clock_();
  auto current = client_->get();
  bool renewed = false;
  if (absl::IsNotFound(current.status())) {
    renewed = client_->write({identity_, std::chrono::system_clock::now(), duration_, ""}, "").ok();
  } else if (current.ok()) {
    // Seen after the answer arrived: a candidate counts from no earlier than the change.
    const auto seen = clock_();
    if (!observed_ || observed_->holder != current->holder ||
        observed_->renewed != current->renewed ||
        observed_->resource_version != current->resource_version) {
      observed_ = *current;
      observed_at_ = seen;
    }
    // The record's own duration, on this agent's clock since the record last changed; the
    // renewTime written by another node's clock is never compared with this one's.
    const auto duration =
        std::max<std::chrono::steady_clock::duration>(current->duration, std::chrono::seconds(1));
    const bool mine = current->holder == identity_;
    const bool free = current->holder.empty();  // handed back by its holder
    const bool expired = seen - observed_at_ >= duration;
    if (mine || free || expired) {
      if (!mine) {
        spdlog::info("agent: {} takes the lease from \"{}\" ({})", identity_, current->holder,
                     free ? "handed back" : "unchanged for its lease duration");
      }
      renewed = client_
                    ->write({identity_, std::chrono::system_clock::now(), duration_,
                             current->resource_version},
                            current->resource_version)
                    .ok();
    }
  }
  if (renewed) {
    {
      std::lock_guard lock(mutex_);
      deadline_ = started + renewDeadline();
    }
    wake_.notify_all();
  }
  updateLeadership();
}

void LeaseElector::updateLeadership() {
  std::lock_guard change(change_mutex_);
  if (stopping_) return;  // stop() gives leadership up and hands the lease back
  std::chrono::steady_clock::time_point deadline;
  {
    std::lock_guard lock(mutex_);
    deadline = deadline_;
  }
  // Given up when the renew deadline passed without a successful renewal: that is before the
  // lease duration can pass for others, who count from when they saw the last renewal.
  const bool leader = deadline != std::chrono::steady_clock::time_point{} && clock_() < deadline;
  if (leader == leader_) return;
  leader_ = leader;
  if (leader) {
    spdlog::info("agent: {} holds the lease", identity_);
  } else {
    spdlog::warn("agent: {} gives leadership up: the lease was not renewed within {} ms", identity_,
                 renewDeadline().count());
  }
  if (on_change_) on_change_(leader);
}

void LeaseElector::watchDeadline() {
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    if (deadline_ > clock_()) {
      wake_.wait_until(lock, deadline_);
    } else {
      wake_.wait(lock);  // until a renewal sets a new deadline, or stop()
    }
    if (stopping_) break;
    lock.unlock();
    updateLeadership();
    lock.lock();
  }
}

void LeaseElector::start(std::function<void(bool)> on_change) {
  on_change_ = std::move(on_change);
  watchdog_ = std::thread([this] { watchDeadline(); });
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
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (watchdog_.joinable()) watchdog_.join();
  {
    std::lock_guard change(change_mutex_);
    if (!leader_.exchange(false)) return;
    if (on_change_) on_change_(false);
  }
  // Hand the lease back with no holder, so a standby takes it at its next look instead of
  // waiting out the duration. If this fails, the lease simply expires.
  auto current = client_->get();
  if (current.ok() && current->holder == identity_) {
    const auto released =
        client_->write({"", std::chrono::system_clock::now(), duration_, current->resource_version},
                       current->resource_version);
    if (released.ok()) spdlog::info("agent: {} released the lease", identity_);
  }
}

}  // namespace krane::agent
