#include "bench/feed/socket_floor.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "bench/feed/measure.h"

namespace krane::bench {
namespace {

[[noreturn]] void fail(const std::string& what) {
  throw std::runtime_error("socket floor: " + what + ": " + std::strerror(errno));
}

void noDelay(int fd) {
  const int one = 1;
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0) fail("TCP_NODELAY");
}

// `streams` connected pairs on loopback: first the sending ends, then the receiving ends.
std::pair<std::vector<int>, std::vector<int>> connectPairs(size_t streams) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  if (listener < 0) fail("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(listener, SOMAXCONN) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(listener);
    fail("listening on loopback");
  }
  std::vector<int> senders, receivers;
  for (size_t i = 0; i < streams; ++i) {
    const int client = socket(AF_INET, SOCK_STREAM, 0);
    if (client < 0 || connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      fail("connecting stream " + std::to_string(i));
    }
    const int server = accept(listener, nullptr, nullptr);
    if (server < 0) fail("accepting stream " + std::to_string(i));
    noDelay(client);
    noDelay(server);
    senders.push_back(server);
    receivers.push_back(client);
  }
  close(listener);
  return {senders, receivers};
}

double threadCpuSeconds(std::thread& t) {
  clockid_t clock;
  timespec ts{};
  if (pthread_getcpuclockid(t.native_handle(), &clock) != 0 || clock_gettime(clock, &ts) != 0) {
    return 0;
  }
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

double cpuOf(std::vector<std::thread>& threads) {
  double sum = 0;
  for (auto& t : threads) sum += threadCpuSeconds(t);
  return sum;
}

struct Delivery {
  int64_t send_ns;
  int64_t receive_ns;
};

}  // namespace

SocketFloorResult runSocketFloor(const SocketFloorOptions& o) {
  if (o.message_bytes < sizeof(int64_t)) throw std::runtime_error("socket floor: message < 8 B");
  auto [send_fds, receive_fds] = connectPairs(o.streams);
  const size_t threads = std::max<size_t>(1, o.threads);
  std::atomic<bool> stopping{false};

  // The changes: their send times, published by the ticker in order.
  const auto total = o.warmup + o.window;
  const size_t max_ticks =
      static_cast<size_t>(o.changes_per_s * std::chrono::duration<double>(total).count()) + 2;
  std::vector<int64_t> tick_ns(max_ticks);
  std::mutex mutex;
  std::condition_variable ticked;
  size_t ticks = 0;

  std::vector<std::thread> senders;
  std::atomic<uint64_t> dropped{0};
  for (size_t t = 0; t < threads; ++t) {
    senders.emplace_back([&, t] {
      std::vector<char> message(o.message_bytes, 'x');
      size_t done = 0;
      for (;;) {
        size_t upto;
        {
          std::unique_lock lock(mutex);
          ticked.wait(lock, [&] { return ticks > done || stopping.load(); });
          if (stopping.load()) return;
          upto = ticks;
        }
        for (; done < upto; ++done) {
          std::memcpy(message.data(), &tick_ns[done], sizeof(int64_t));
          for (size_t i = t; i < send_fds.size(); i += threads) {
            const ssize_t n =
                send(send_fds[i], message.data(), message.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
            if (n != static_cast<ssize_t>(message.size())) ++dropped;
          }
        }
      }
    });
  }

  std::vector<std::vector<Delivery>> deliveries(threads);
  std::vector<std::thread> receivers;
  for (size_t t = 0; t < threads; ++t) {
    deliveries[t].reserve(max_ticks * (o.streams / threads + 1));
    receivers.emplace_back([&, t] {
      const int ep = epoll_create1(0);
      struct Conn {
        int fd;
        size_t have = 0;
        std::vector<char> partial;
      };
      std::vector<Conn> conns;
      for (size_t i = t; i < receive_fds.size(); i += threads) {
        conns.push_back({receive_fds[i], 0, std::vector<char>(o.message_bytes)});
      }
      for (size_t c = 0; c < conns.size(); ++c) {
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.u64 = c;
        epoll_ctl(ep, EPOLL_CTL_ADD, conns[c].fd, &ev);
      }
      std::vector<char> buffer(64 * 1024);
      std::vector<epoll_event> events(256);
      while (!stopping.load()) {
        const int n = epoll_wait(ep, events.data(), static_cast<int>(events.size()), 100);
        for (int e = 0; e < n; ++e) {
          Conn& c = conns[events[e].data.u64];
          const ssize_t got = recv(c.fd, buffer.data(), buffer.size(), MSG_DONTWAIT);
          if (got <= 0) continue;
          const int64_t now = nowNs();
          for (ssize_t at = 0; at < got;) {
            const size_t take = std::min(o.message_bytes - c.have, static_cast<size_t>(got - at));
            std::memcpy(c.partial.data() + c.have, buffer.data() + at, take);
            c.have += take;
            at += static_cast<ssize_t>(take);
            if (c.have == o.message_bytes) {
              int64_t send_ns;
              std::memcpy(&send_ns, c.partial.data(), sizeof(send_ns));
              deliveries[t].push_back({send_ns, now});
              c.have = 0;
            }
          }
        }
      }
      close(ep);
    });
  }

  const auto period = std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::duration<double>(1.0 / o.changes_per_s));
  const auto start = std::chrono::steady_clock::now();
  const int64_t window_from = nowNs() + std::chrono::nanoseconds(o.warmup).count();
  const int64_t window_to = window_from + std::chrono::nanoseconds(o.window).count();
  double sender_cpu = 0, receiver_cpu = 0;
  bool window_open = false;
  for (size_t k = 0; k + 1 < max_ticks; ++k) {
    std::this_thread::sleep_until(start + k * period);
    const int64_t now = nowNs();
    if (!window_open && now >= window_from) {
      window_open = true;
      sender_cpu = -cpuOf(senders);
      receiver_cpu = -cpuOf(receivers);
    }
    if (now >= window_to) break;
    {
      std::lock_guard lock(mutex);
      tick_ns[k] = now;
      ticks = k + 1;
    }
    ticked.notify_all();
  }
  // Whatever was sent before the window closed has a moment to arrive.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  sender_cpu += cpuOf(senders);
  receiver_cpu += cpuOf(receivers);
  stopping = true;
  ticked.notify_all();
  for (auto& t : senders) t.join();
  for (auto& t : receivers) t.join();
  for (int fd : send_fds) close(fd);
  for (int fd : receive_fds) close(fd);

  SocketFloorResult r;
  r.streams = o.streams;
  for (size_t k = 0; k < ticks; ++k) {
    if (tick_ns[k] >= window_from && tick_ns[k] < window_to) ++r.changes;
  }
  std::vector<double> ms;
  for (const auto& per_thread : deliveries) {
    for (const Delivery& d : per_thread) {
      if (d.send_ns < window_from || d.send_ns >= window_to) continue;
      ms.push_back(static_cast<double>(d.receive_ns - d.send_ns) / 1e6);
    }
  }
  r.delivered = ms.size();
  r.p50_ms = quantile(ms, 0.5);
  r.p99_ms = quantile(ms, 0.99);
  if (r.delivered > 0) {
    r.sender_cpu_us_per_event = sender_cpu * 1e6 / static_cast<double>(r.delivered);
    r.receiver_cpu_us_per_event = receiver_cpu * 1e6 / static_cast<double>(r.delivered);
  }
  if (dropped.load() > 0) {
    throw std::runtime_error("socket floor: " + std::to_string(dropped.load()) +
                             " writes did not fit the socket buffers");
  }
  return r;
}

}  // namespace krane::bench
