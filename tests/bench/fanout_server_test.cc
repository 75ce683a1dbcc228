// The feed benchmark's floor server, in its three shapes (gRPC's two APIs and nghttp2): Watch
// streams read by the lean client go live at its bookmark and then get every change its ticker
// makes, in order, each with the send time the latency is measured from; gRPC's own client is
// served too, and with no ticker the streams stay idle.
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "bench/feed/h2_watch_streams.h"
#include "bench/feed/measure.h"
#include "bench/feed/watch_clients.h"
#include "tests/support/process.h"
#include "tests/support/wait.h"

namespace krane::bench {
namespace {

using namespace std::chrono_literals;

struct Server {
  std::unique_ptr<testing::ChildProcess> process;
  int port = 0;  // 0 when it printed nothing within 10 s
};

Server startServer(const std::string& mode, const std::string& log,
                   const std::string& rate = "200") {
  Server server;
  server.process = std::make_unique<testing::ChildProcess>(
      std::vector<std::string>{testing::runfile("bench/feed/fanout_server"), "--mode", mode,
                               "--rate", rate},
      log);
  testing::eventually(
      [&] {
        const std::string text = testing::slurp(log);
        if (text.rfind("listening on ", 0) == 0) server.port = std::atoi(text.c_str() + 13);
        return server.port > 0;
      },
      10s);
  return server;
}

TEST_CASE("the floor server sends every stream a bookmark, then every change in order") {
  const std::string mode = GENERATE("callback", "async", "nghttp2");
  // One connection per stream, as agents have, and several streams on one connection.
  const size_t per_connection = GENERATE(1, 3);
  CAPTURE(mode, per_connection);
  const std::string log = std::string(std::getenv("TEST_TMPDIR")) + "/fanout-" + mode + "-" +
                          std::to_string(per_connection) + ".log";
  Server server = startServer(mode, log);
  REQUIRE(server.port > 0);

  H2WatchStreams streams("127.0.0.1:" + std::to_string(server.port), "", "r1", 0, 6,
                         per_connection);
  REQUIRE(streams.waitLive(10s));
  streams.setRecording(true);
  const int64_t from = nowNs();
  std::this_thread::sleep_for(300ms);
  streams.setRecording(false);
  const auto samples = streams.takeSamples();
  streams.close();
  server.process->signal(SIGKILL);
  server.process->wait();

  REQUIRE(samples.size() == 6);
  for (const auto& stream : samples) {
    // 200 changes a second for 0.3 s.
    CHECK(stream.size() >= 40);
    for (size_t i = 1; i < stream.size(); ++i)
      CHECK(stream[i].version == stream[i - 1].version + 1);
    for (const Sample& s : stream) {
      CHECK(s.send_ns >= from - 20'000'000);
      CHECK(s.receive_ns >= s.send_ns);
    }
  }
}

TEST_CASE("the floor server keeps serving its streams while others go away") {
  const std::string mode = GENERATE("callback", "async", "nghttp2");
  CAPTURE(mode);
  const std::string log = std::string(std::getenv("TEST_TMPDIR")) + "/leaving-" + mode + ".log";
  Server server = startServer(mode, log);
  REQUIRE(server.port > 0);
  const std::string target = "127.0.0.1:" + std::to_string(server.port);
  H2WatchStreams staying(target, "", "r1", 0, 4);
  REQUIRE(staying.waitLive(10s));
  // Connections closing while changes are written to them, a few times over.
  for (int round = 0; round < 5; ++round) {
    H2WatchStreams leaving(target, "", "r1", 0, 20, 1 + round % 2);
    REQUIRE(leaving.waitLive(10s));
    std::this_thread::sleep_for(20ms);
    leaving.close();
  }
  staying.setRecording(true);
  std::this_thread::sleep_for(300ms);
  staying.setRecording(false);
  const auto samples = staying.takeSamples();
  CHECK(staying.ended() == 0);
  staying.close();
  CHECK(server.process->running());
  server.process->signal(SIGKILL);
  server.process->wait();
  REQUIRE(samples.size() == 4);
  for (const auto& stream : samples) {
    CHECK(stream.size() >= 40);
    for (size_t i = 1; i < stream.size(); ++i)
      CHECK(stream[i].version == stream[i - 1].version + 1);
  }
}

TEST_CASE("with no ticker the floor server's streams go live and stay idle, for gRPC's client") {
  const std::string mode = GENERATE("async", "nghttp2");
  CAPTURE(mode);
  const std::string log = std::string(std::getenv("TEST_TMPDIR")) + "/idle-" + mode + ".log";
  Server server = startServer(mode, log, "0");
  REQUIRE(server.port > 0);
  GrpcWatchStreams streams("127.0.0.1:" + std::to_string(server.port), "", "r1", 0, 4);
  REQUIRE(streams.waitLive(10s));
  streams.setRecording(true);
  std::this_thread::sleep_for(300ms);
  streams.setRecording(false);
  for (const auto& stream : streams.takeSamples()) CHECK(stream.empty());
  CHECK(streams.ended() == 0);
  streams.close();
  server.process->signal(SIGKILL);
  server.process->wait();
}

TEST_CASE("the floor server refuses an unknown mode") {
  const auto result =
      testing::runCommand({testing::runfile("bench/feed/fanout_server"), "--mode", "threads"});
  CHECK(result.exit_code == 2);
  CHECK(result.err.find("--mode is callback, async or nghttp2") != std::string::npos);
}

}  // namespace
}  // namespace krane::bench
