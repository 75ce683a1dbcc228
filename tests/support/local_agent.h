// A real `krane` agent's configuration for end-to-end tests on the process runtime: the
// deployment plugin runs the demo app (krane.dev/demo-app:<tag>) and the sentinel plugin runs
// krane-sentinel (krane.dev/sentinel:<tag>), routing to the deployments' published endpoints. And
// where a sentinel of that agent listens.
#pragma once

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/strings.h"
#include "nlohmann/json.hpp"
#include "tests/support/process.h"
#include "tests/support/wait.h"

namespace krane::testing {

// `state` is the agent's state directory; instances take ports from `ports_from` (50 for the
// deployments, the next 50 for the sentinels).
inline std::string localAgentConfig(const std::string& region, const std::string& state,
                                    int grpc_port, int ports_from) {
  return strCat("region: ", region, "\nstate_dir: ", state,
                "\nreconnect_min_ms: 50\nreconnect_max_ms: 200\n"
                "control_plane:\n  address: 127.0.0.1:",
                grpc_port,
                "\nreporter:\n  heartbeat_interval_ms: 200\n"
                "plugins:\n"
                "  - name: deployment\n    path: ",
                runfile("plugins/deployment/libdeployment.so"),
                "\n    config:\n      runtime: process\n      process:\n        state_dir: ", state,
                "/deployments\n        ports: {from: ", ports_from, ", to: ", ports_from + 49,
                "}\n        stop_instances_on_shutdown: true\n"
                "        images:\n          krane.dev/demo-app: [",
                runfile("tests/support/demo_app/krane-demo-app"),
                ", --version, \"{tag}\"]\n"
                "  - name: sentinel\n    path: ",
                runfile("plugins/sentinel/libsentinel.so"),
                "\n    config:\n      runtime: process\n      process:\n        state_dir: ", state,
                "/sentinels\n        ports: {from: ", ports_from + 50, ", to: ", ports_from + 99,
                "}\n        stop_instances_on_shutdown: true\n"
                "        routes: {deployment_state_dir: ",
                state, "/deployments, poll_ms: 50}\n",
                "        images:\n          krane.dev/sentinel: [",
                runfile("plugins/sentinel/krane-sentinel"),
                ", --version, \"{tag}\", --host, 127.0.0.1, --poll-ms, \"50\"]\n");
}

// The address of a sentinel of the agent with state directory `state`, from what its runtime
// publishes about its instances; "" when none is published within `timeout`.
inline std::string localSentinelAddress(const std::string& state,
                                        std::chrono::seconds timeout = std::chrono::seconds(60)) {
  std::string address;
  eventually(
      [&] {
        std::error_code ec;
        for (const auto& e :
             std::filesystem::directory_iterator(state + "/sentinels/endpoints", ec)) {
          std::ifstream in(e.path());
          auto doc = nlohmann::json::parse(in, nullptr, false);
          if (doc.is_discarded() || doc.value("endpoints", nlohmann::json()).empty()) continue;
          address = doc["endpoints"][0].get<std::string>();
          return true;
        }
        return false;
      },
      timeout);
  return address;
}

}  // namespace krane::testing
