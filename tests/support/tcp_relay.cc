#include "tests/support/tcp_relay.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string_view>

#include "common/strings.h"

namespace krane::testing {
namespace {

[[noreturn]] void fail(const std::string& what) {
  throw std::runtime_error(strCat("tcp relay: ", what, ": ", std::strerror(errno)));
}

sockaddr_in ipv4(const std::string& host, int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    throw std::runtime_error(strCat("tcp relay: \"", host, "\" is not an IPv4 address"));
  }
  return addr;
}

// Writes all of `data` to a blocking socket; false when the peer is gone.
bool sendAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = ::send(fd, data, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

TcpRelay::TcpRelay(std::string target) : target_(std::move(target)) {
  const size_t colon = target_.rfind(':');
  if (colon == std::string::npos) throw std::runtime_error("tcp relay: target is not host:port");
  ipv4(target_.substr(0, colon), std::stoi(target_.substr(colon + 1)));  // checks the form
  listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listener_ < 0) fail("socket");
  const int one = 1;
  ::setsockopt(listener_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr = ipv4("127.0.0.1", 0);
  if (::bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) fail("bind");
  if (::listen(listener_, 64) != 0) fail("listen");
  socklen_t len = sizeof(addr);
  ::getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  if (::pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) fail("pipe");
  thread_ = std::thread([this] { run(); });
}

TcpRelay::~TcpRelay() {
  stopping_ = true;
  wake();
  thread_.join();
  for (const Pair& p : pairs_) {
    if (p.client >= 0) ::close(p.client);
    if (p.upstream >= 0) ::close(p.upstream);
  }
  ::close(listener_);
  ::close(wake_[0]);
  ::close(wake_[1]);
}

std::string TcpRelay::address() const { return strCat("127.0.0.1:", port_); }

void TcpRelay::blackHole() {
  {
    std::lock_guard lock(mutex_);
    for (Pair& p : pairs_) p.silent = true;
  }
  wake();
}

void TcpRelay::loseAnswerTo(std::string marker, std::string request) {
  std::lock_guard lock(mutex_);
  marker_ = std::move(marker);
  request_ = std::move(request);
}

void TcpRelay::wake() {
  const char byte = 0;
  [[maybe_unused]] ssize_t n = ::write(wake_[1], &byte, 1);
}

bool TcpRelay::relay(Pair& pair, int from, int to) {
  char buffer[64 * 1024];
  const ssize_t n = ::recv(from, buffer, sizeof(buffer), MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return true;
  if (pair.silent) {
    // Dropped; an end that closes is closed here alone, and the other end is never told.
    if (n <= 0) {
      ::close(from);
      (from == pair.client ? pair.client : pair.upstream) = -1;
    }
    return pair.client >= 0 || pair.upstream >= 0;
  }
  if (n <= 0 || !sendAll(to, buffer, static_cast<size_t>(n))) {
    ::close(pair.client);
    ::close(pair.upstream);
    pair.client = pair.upstream = -1;
    return false;
  }
  if (from == pair.client && !marker_.empty()) {
    const std::string_view sent(buffer, static_cast<size_t>(n));
    if (pair.marked && sent.ends_with(request_)) {
      // The request is on its way to the target; its answer will find no client.
      ::close(pair.client);
      pair.client = -1;
      pair.silent = true;
      marker_.clear();
      answer_lost_ = true;
    } else if (sent.find(marker_) != std::string_view::npos) {
      pair.marked = true;
    }
  }
  return true;
}

void TcpRelay::run() {
  const size_t colon = target_.rfind(':');
  const sockaddr_in upstream_addr =
      ipv4(target_.substr(0, colon), std::stoi(target_.substr(colon + 1)));
  while (!stopping_) {
    std::vector<pollfd> fds{{listener_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    {
      std::lock_guard lock(mutex_);
      for (const Pair& p : pairs_) {
        fds.push_back({p.client, POLLIN, 0});  // a closed end (-1) is skipped by poll
        fds.push_back({p.upstream, POLLIN, 0});
      }
    }
    if (::poll(fds.data(), fds.size(), 1000) < 0 && errno != EINTR) fail("poll");
    if (fds[1].revents & POLLIN) {
      char drain[64];
      while (::read(wake_[0], drain, sizeof(drain)) > 0) {
      }
    }
    std::lock_guard lock(mutex_);
    for (size_t i = 0; i < pairs_.size(); ++i) {
      Pair& p = pairs_[i];
      if (p.client >= 0 && fds[2 + 2 * i].revents != 0) relay(p, p.client, p.upstream);
      if (p.upstream >= 0 && fds[3 + 2 * i].revents != 0) relay(p, p.upstream, p.client);
    }
    if (fds[0].revents & POLLIN) {
      const int client = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
      if (client < 0) continue;
      const int upstream = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (upstream < 0 || ::connect(upstream, reinterpret_cast<const sockaddr*>(&upstream_addr),
                                    sizeof(upstream_addr)) != 0) {
        if (upstream >= 0) ::close(upstream);
        ::close(client);  // the target is down: refused, as a direct connection would be
        continue;
      }
      const int one = 1;
      ::setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      ::setsockopt(upstream, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      pairs_.push_back({client, upstream, false, false});
      ++accepted_;
    }
  }
}

}  // namespace krane::testing
