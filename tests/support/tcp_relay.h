// A TCP relay for tests that need the network to fail the way it does between hosts: it
// forwards each connection it accepts to `target`, both ways, until blackHole(). From then on,
// the connections open at that moment drop whatever either side sends, with no FIN and no RST
// (a partition, or a host that vanished): both ends keep a connection that looks open. New
// connections are relayed as before. loseAnswerTo() cuts one connection right after a request
// of its client, so that the target acts on a request whose answer never arrives.
#pragma once

#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace krane::testing {

class TcpRelay {
 public:
  // Listens on 127.0.0.1 (a free port) and forwards to `target`, "host:port" with an IPv4 host.
  explicit TcpRelay(std::string target);
  ~TcpRelay();
  TcpRelay(const TcpRelay&) = delete;
  TcpRelay& operator=(const TcpRelay&) = delete;

  // "127.0.0.1:<port>": where clients connect.
  std::string address() const;
  // The connections open now go silent for good (see above).
  void blackHole();
  // Once: the first connection whose client sends `marker` (found within one read) and then a
  // read that ends with `request` forwards that request to the target, and its client's end is
  // closed at once. The target's end stays open, so the target acts on the request (a COMMIT), and
  // what it answers is dropped. A client that sends a plain-text protocol (MySQL's statements are
  // sent as text) can so lose the answer to one chosen statement.
  void loseAnswerTo(std::string marker, std::string request);
  // Whether loseAnswerTo() cut its connection.
  bool answerLost() const { return answer_lost_.load(); }
  // Connections accepted so far.
  size_t accepted() const { return accepted_.load(); }

 private:
  struct Pair {
    int client = -1;
    int upstream = -1;
    bool silent = false;  // black-holed: read and dropped, never forwarded
    bool marked = false;  // its client sent loseAnswerTo()'s marker
  };

  void run();
  // Moves what `from` has to `to` (or drops it when silent); false once the pair is over.
  bool relay(Pair& pair, int from, int to);
  void wake();

  std::string target_;
  int listener_ = -1;
  int port_ = 0;
  int wake_[2] = {-1, -1};
  std::atomic<bool> stopping_{false};
  std::atomic<size_t> accepted_{0};
  std::atomic<bool> answer_lost_{false};
  std::string marker_;  // loseAnswerTo()'s, under mutex_; empty when not armed
  std::string request_;
  std::mutex mutex_;
  std::vector<Pair> pairs_;  // touched by the relay's thread, and by blackHole() under mutex_
  std::thread thread_;
};

}  // namespace krane::testing
