// A stand-in for a krane-plugin-host of another build: it takes the real host's flags, connects,
// and says hello with plugin ABI (KRANE_PLUGIN_ABI_MAJOR + 1).0, then idles until it is killed.
#include <chrono>
#include <string>
#include <thread>

#include "agent/frame_channel.h"
#include "plugins/abi/krane_plugin.h"

int main(int argc, char** argv) {
  std::string endpoint;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--endpoint") endpoint = argv[i + 1];
  }
  krane::agent::FrameChannel channel(endpoint, krane::agent::FrameChannel::Mode::kConnect,
                                     [](krane::plugin::v1::Frame&&) {});
  if (!channel.start().ok()) return 1;
  krane::plugin::v1::Frame hello;
  hello.mutable_hello()->set_plugin_name("recording");
  hello.mutable_hello()->set_abi_major(KRANE_PLUGIN_ABI_MAJOR + 1);
  hello.mutable_hello()->set_abi_minor(0);
  hello.mutable_hello()->add_resource_types("app");
  channel.send(hello);
  std::this_thread::sleep_for(std::chrono::seconds(60));
  return 0;
}
