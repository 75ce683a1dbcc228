// Test helper: takes the leader lock of a state directory and holds it until killed.
#include <cstdio>
#include <thread>

#include "agent/leader.h"

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  krane::agent::FileLockElector elector(argv[1], "holder", std::chrono::milliseconds(20));
  elector.start([](bool leader) {
    if (leader) {
      std::printf("leader\n");
      std::fflush(stdout);
    }
  });
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}
