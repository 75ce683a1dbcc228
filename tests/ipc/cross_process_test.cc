// A plugin host in another process and the agent see each other's writes through the mapping:
// the host's heartbeat and acknowledgements reach the agent, the agent's recorded versions reach
// the host.
#include <signal.h>

#include <chrono>
#include <functional>
#include <thread>

#include <catch2/catch.hpp>

#include "ipc/cursor_store.h"
#include "tests/ipc/temp_dir.h"
#include "tests/support/matchers.h"
#include "tests/support/process.h"

namespace krane::ipc {
namespace {

using ::krane::ipc::testing::TempDir;
using ::krane::testing::ChildProcess;
using ::krane::testing::runfile;

bool waitFor(const std::function<bool()>& condition,
             std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return condition();
}

TEST_CASE("host and agent see each others writes", "[cursor-store-cross-process]") {
  TempDir dir;
  auto opened = CursorStore::open(dir.path(), {});
  REQUIRE_THAT(opened, IsOk());
  CursorStore& agent = **opened;
  const int slot = agent.registerPlugin("echo").value();
  REQUIRE_THAT(agent.recordApplied("echo", "probe", 100), IsOk());

  ChildProcess host({runfile("tests/ipc/store_child"), "host", "--state-dir", dir.path(),
                     "--plugin", "echo", "--seconds", "30"},
                    dir.file("host.log"));
  INFO("the host never wrote its pid");
  REQUIRE(waitFor([&] { return agent.plugin(slot)->pid == host.pid(); }));

  // Its heartbeat moves, on both clocks.
  uint64_t last = agent.plugin(slot)->heartbeat_mono_ns;
  for (int i = 0; i < 3; ++i) {
    REQUIRE(waitFor([&] { return agent.plugin(slot)->heartbeat_mono_ns > last; }));
    last = agent.plugin(slot)->heartbeat_mono_ns;
  }
  CHECK(agent.plugin(slot)->heartbeat_unix_ms > 0);
  CHECK(agent.plugin(slot)->applied > 0u);

  // The host reads what the agent records and acknowledges it.
  REQUIRE(waitFor([&] { return agent.plugin(slot)->acked_version == 100; }));
  REQUIRE_THAT(agent.recordApplied("echo", "probe", 200), IsOk());
  REQUIRE(waitFor([&] { return agent.plugin(slot)->acked_version == 200; }));

  // Killed, it stops heartbeating; its slot keeps the last values for the agent to judge.
  host.signal(SIGKILL);
  host.wait();
  const uint64_t final_beat = agent.plugin(slot)->heartbeat_mono_ns;
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(agent.plugin(slot)->heartbeat_mono_ns == final_beat);
  CHECK(agent.plugin(slot)->acked_version == 200u);
}

}  // namespace
}  // namespace krane::ipc
