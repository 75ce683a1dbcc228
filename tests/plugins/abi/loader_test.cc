// The loader against real shared objects: every call through the ABI, every refusal with its
// message, the registry's one-owner rule, and plugins that fail, throw, crash or take their time.
#include <dlfcn.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include <catch2/catch.hpp>
#include <google/protobuf/util/message_differencer.h>

#include "agent/plugin_loader.h"
#include "common/strings.h"
#include "tests/plugins/abi/test_util.h"
#include "tests/support/matchers.h"
#include "tests/support/process.h"
#include "tests/support/threads.h"

namespace krane::plugin_tests {
namespace {

using agent::LoadedPlugin;
using agent::loadPlugin;
using agent::PluginAbi;
using agent::PluginRegistry;
using google::protobuf::util::MessageDifferencer;

std::string pluginPath(const std::string& name) {
  return krane::testing::runfile(strCat("tests/support/plugins/lib", name, ".so"));
}

// A fresh path under the test's scratch directory, named after the running test.
std::string scratchFile(const std::string& suffix) {
  std::string name = Catch::getResultCapture().getCurrentTestName();
  for (char& c : name) {
    if (std::isalnum(static_cast<unsigned char>(c)) == 0) c = '_';
  }
  return strCat(std::getenv("TEST_TMPDIR"), "/", name, ".", suffix);
}

std::vector<std::string> readLines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) lines.push_back(line);
  return lines;
}

std::string unhex(std::string_view text) {
  if (text == "-") return "";
  std::string out;
  for (size_t i = 0; i + 1 < text.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(std::string(text.substr(i, 2)), nullptr, 16)));
  }
  return out;
}

template <typename Message>
Message parseRecorded(const std::string& line, std::string_view call) {
  CHECK_THAT(line, Catch::StartsWith(strCat(call, " ")));
  Message message;
  INFO(line);
  CHECK(message.ParseFromString(unhex(std::string_view(line).substr(call.size() + 1))));
  return message;
}

// --------------------------------------------------------------------------------------------
// The recording plugin: every entry point, payloads intact both ways.

TEST_CASE("every call arrives with its payload", "[recording-plugin]") {
  const std::string log = scratchFile("calls");
  CapturedHost host;
  auto loaded = loadPlugin(pluginPath("recording"), strCat("log=", log, "\ntypes=widget,gadget\n"),
                           host.callbacks());
  REQUIRE_THAT(loaded, IsOk());
  LoadedPlugin& plugin = **loaded;

  CHECK(plugin.name() == "recording");
  CHECK(plugin.version() == "1.0.0-test");
  CHECK(plugin.abiMajor() == KRANE_PLUGIN_ABI_MAJOR);
  CHECK(plugin.abiMinor() == KRANE_PLUGIN_ABI_MINOR);
  CHECK(plugin.origin() == pluginPath("recording"));
  CHECK(plugin.resourceTypes() == std::vector<std::string>{"widget", "gadget"});
  CHECK(host.logged(strCat("recording calls to ", log)));

  cluster::v1::Change applied = makeChange("widget", "w-1", 7);
  // A well-known payload too, with a map and repeated fields.
  cluster::v1::Change topology;
  topology.set_op(cluster::v1::CHANGE_OP_APPLY);
  topology.set_version(8);
  auto* resource = topology.mutable_resource();
  resource->set_type("gadget");
  resource->set_id("g-1");
  resource->set_region("eu-1");
  resource->set_version(8);
  auto* deployment = resource->mutable_deployment_topology();
  deployment->set_deployment_id("g-1");
  deployment->set_image("registry.example.com/app@sha256:abc");
  deployment->add_command("/bin/app");
  auto* env = deployment->add_env();
  env->set_name("MODE");
  env->set_value("prod");
  (*deployment->mutable_labels())["team"] = "core";
  (*deployment->mutable_labels())["tier"] = "web";
  const cluster::v1::Change removed = makeChange("widget", "w-2", 9, cluster::v1::CHANGE_OP_DELETE);
  plugin::v1::SyncEnd sync_end;
  sync_end.set_snapshot_version(42);
  auto* ids = sync_end.add_resources();
  ids->set_resource_type("widget");
  ids->add_ids("w-1");
  sync_end.add_resources()->set_resource_type("gadget");

  CHECK_THAT(plugin.syncBegin(42), IsOk());
  CHECK_THAT(plugin.apply(applied), IsOk());
  CHECK_THAT(plugin.apply(topology), IsOk());
  CHECK_THAT(plugin.remove(removed), IsOk());
  CHECK_THAT(plugin.syncEnd(sync_end), IsOk());
  CHECK_THAT(plugin.observe(), IsOk());

  // observe() reported what was applied, through the host callback, parsed.
  const auto reports = host.reports();
  REQUIRE(reports.size() == 2u);
  std::map<std::string, cluster::v1::ReportResourceStatusRequest> by_id;
  for (const auto& report : reports) {
    REQUIRE(report.has_resource());
    by_id[report.resource().id()] = report.resource();
  }
  CHECK(by_id["w-1"].type() == "widget");
  CHECK(by_id["w-1"].version() == 7u);
  CHECK(by_id["w-1"].region() == "eu-1");
  CHECK(by_id["w-1"].phase() == cluster::v1::RESOURCE_PHASE_READY);
  CHECK(by_id["w-1"].plugin() == "recording");
  CHECK(by_id["g-1"].version() == 8u);

  plugin.shutdown();
  plugin.shutdown();  // idempotent
  const absl::Status after = plugin.apply(applied);
  CHECK(after.code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(after.message()), Catch::Contains("after shutdown"));

  const auto lines = readLines(log);
  CAPTURE(lines);
  REQUIRE(lines.size() == 9u);
  CHECK(lines[0] == "init host_abi=1.0");
  CHECK(lines[1] == "resource_types");
  CHECK(lines[2] == "sync_begin 42");
  CHECK(MessageDifferencer::Equals(parseRecorded<cluster::v1::Change>(lines[3], "apply"), applied));
  CHECK(
      MessageDifferencer::Equals(parseRecorded<cluster::v1::Change>(lines[4], "apply"), topology));
  CHECK(
      MessageDifferencer::Equals(parseRecorded<cluster::v1::Change>(lines[5], "remove"), removed));
  CHECK(MessageDifferencer::Equals(parseRecorded<plugin::v1::SyncEnd>(lines[6], "sync_end"),
                                   sync_end));
  CHECK(lines[7] == "observe");
  CHECK(lines[8] == "shutdown");
}

TEST_CASE("destruction shuts down once", "[recording-plugin]") {
  const std::string log = scratchFile("calls");
  {
    auto loaded = loadPlugin(pluginPath("recording"), strCat("log=", log), {});
    REQUIRE_THAT(loaded, IsOk());
    CHECK((*loaded)->resourceTypes() == std::vector<std::string>{"recorded"});
  }
  CHECK(readLines(log) ==
        std::vector<std::string>{"init host_abi=1.0", "resource_types", "shutdown"});
}

TEST_CASE("applies from several threads at once", "[recording-plugin]") {
  const std::string log = scratchFile("calls");
  auto loaded = loadPlugin(pluginPath("recording"), strCat("log=", log), {});
  REQUIRE_THAT(loaded, IsOk());
  std::vector<std::thread> threads;
  krane::testing::ThreadFailures failures;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        failures.expectOk((*loaded)->apply(makeChange("recorded", strCat("r-", t, "-", i), i + 1)),
                          strCat("apply r-", t, "-", i));
      }
    });
  }
  for (auto& thread : threads) thread.join();
  CHECK(failures.all() == std::vector<std::string>{});
  loaded->reset();
  size_t applies = 0;
  for (const auto& line : readLines(log)) applies += line.rfind("apply ", 0) == 0;
  CHECK(applies == 200u);
}

TEST_CASE("loaded twice keeps instances apart", "[recording-plugin]") {
  const std::string first_log = scratchFile("first");
  const std::string second_log = scratchFile("second");
  auto first = loadPlugin(pluginPath("recording"), strCat("log=", first_log, "\ntypes=a"), {});
  auto second = loadPlugin(pluginPath("recording"), strCat("log=", second_log, "\ntypes=b"), {});
  REQUIRE((first.ok() && second.ok()));
  CHECK((*first)->resourceTypes() == std::vector<std::string>{"a"});
  CHECK((*second)->resourceTypes() == std::vector<std::string>{"b"});
  CHECK_THAT((*second)->syncBegin(5), IsOk());
  first->reset();
  // The library stays loaded for the second instance.
  CHECK_THAT((*second)->syncBegin(6), IsOk());
  second->reset();
  CHECK(readLines(first_log).size() == 3u);
  CHECK(readLines(second_log) == std::vector<std::string>{"init host_abi=1.0", "resource_types",
                                                          "sync_begin 5", "sync_begin 6",
                                                          "shutdown"});
}

// --------------------------------------------------------------------------------------------
// Refusals, each naming what is wrong.

TEST_CASE("a missing file", "[loader-refuses]") {
  const std::string path = scratchFile("libnowhere.so");
  auto loaded = loadPlugin(path, "", {});
  REQUIRE_FALSE(loaded.ok());
  CHECK(loaded.status().code() == absl::StatusCode::kNotFound);
  CHECK(loaded.status().message() == strCat("plugin file ", path, " does not exist"));
}

TEST_CASE("a file dlopen cannot load", "[loader-refuses]") {
  const std::string path = scratchFile("libgarbage.so");
  std::ofstream(path) << "this is not an ELF object\n";
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  REQUIRE(handle == nullptr);
  const std::string dlerror_text = ::dlerror();

  auto loaded = loadPlugin(path, "", {});
  REQUIRE_FALSE(loaded.ok());
  CHECK(loaded.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(loaded.status().message() == strCat("cannot load plugin ", path, ": ", dlerror_text));
}

TEST_CASE("a library without the entry symbol", "[loader-refuses]") {
  const std::string path = pluginPath("missing_symbol");
  auto loaded = loadPlugin(path, "", {});
  REQUIRE_FALSE(loaded.ok());
  CHECK(loaded.status().code() == absl::StatusCode::kNotFound);
  CHECK_THAT(std::string(loaded.status().message()),
             Catch::StartsWith(strCat("plugin ", path, " does not export krane_plugin_entry")));
}

TEST_CASE("another abi major naming both versions", "[loader-refuses]") {
  auto loaded = loadPlugin(pluginPath("abi_mismatch"), "", {});
  REQUIRE_FALSE(loaded.ok());
  CHECK(loaded.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(loaded.status().message() ==
        "plugin libabi_mismatch.so speaks plugin ABI 99.0, this agent speaks 1.0: rebuild "
        "the plugin against plugins/abi/krane_plugin.h 1.x");
}

TEST_CASE("a plugin older than the agents major", "[loader-refuses]") {
  // As a future agent 2.3 would see today's plugins.
  auto loaded = loadPlugin(pluginPath("recording"), "log=/dev/null", {},
                           PluginAbi{.major = 2, .minor = 3, .oldest_minor = 0});
  REQUIRE_FALSE(loaded.ok());
  CHECK(loaded.status().message() ==
        "plugin librecording.so speaks plugin ABI 1.0, this agent speaks 2.3: rebuild the "
        "plugin against plugins/abi/krane_plugin.h 2.x");
}

TEST_CASE("a minor older than the agent accepts", "[loader-refuses]") {
  auto loaded = loadPlugin(pluginPath("recording"), "log=/dev/null", {},
                           PluginAbi{.major = 1, .minor = 3, .oldest_minor = 2});
  REQUIRE_FALSE(loaded.ok());
  CHECK(loaded.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(loaded.status().message() ==
        "plugin librecording.so speaks plugin ABI 1.0, this agent speaks 1.3 and accepts 1.2 "
        "or newer: rebuild the plugin against plugins/abi/krane_plugin.h 1.3");
}

TEST_CASE("a table smaller than its version defines", "[loader-refuses]") {
  auto loaded = loadPlugin(pluginPath("struct_too_small"), "", {});
  REQUIRE_FALSE(loaded.ok());
  CHECK(loaded.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(loaded.status().message() ==
        strCat("plugin libstruct_too_small.so: its krane_plugin_api table is 16 bytes, but "
               "plugin ABI 1.0 needs at least ",
               static_cast<size_t>(KRANE_PLUGIN_API_SIZE_1_0), " bytes"));
}

TEST_CASE("an init failure with the plugins message", "[loader-refuses]") {
  auto loaded = loadPlugin(pluginPath("recording"), "types=widget", {});
  REQUIRE_FALSE(loaded.ok());
  CHECK(loaded.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(loaded.status().message() ==
        "plugin recording (librecording.so) failed to initialize: INVALID_ARGUMENT: "
        "recording: config has no log=PATH line");

  auto typo = loadPlugin(pluginPath("slow"), "apply_msec=5", {});
  REQUIRE_FALSE(typo.ok());
  CHECK_THAT(std::string(typo.status().message()),
             Catch::Contains("slow: unknown config key \"apply_msec\""));
}

TEST_CASE("a plugin declaring a type twice", "[loader-refuses]") {
  auto loaded = loadPlugin(pluginPath("recording"), "log=/dev/null\ntypes=a,b,a", {});
  REQUIRE_FALSE(loaded.ok());
  CHECK(loaded.status().message() ==
        "plugin recording (librecording.so) declares resource type \"a\" twice");

  auto empty = loadPlugin(pluginPath("recording"), "log=/dev/null\ntypes=a,,b", {});
  REQUIRE_FALSE(empty.ok());
  CHECK(empty.status().message() ==
        "plugin recording (librecording.so) declares an empty resource type");
}

// --------------------------------------------------------------------------------------------
// The registry: one owner per resource type.

TEST_CASE("refuses two plugins claiming one type", "[plugin-registry]") {
  PluginRegistry registry;
  REQUIRE_THAT(registry.load(pluginPath("recording"), "log=/dev/null\ntypes=widget", {}), IsOk());
  const absl::Status clash = registry.load(pluginPath("slow"), "types=gizmo,widget", {});
  CHECK(clash.code() == absl::StatusCode::kAlreadyExists);
  CHECK(clash.message() ==
        "plugins recording (librecording.so) and slow (libslow.so) both claim resource type "
        "\"widget\": each type has exactly one owner; slow is not loaded");
  // Nothing of the refused plugin stays registered.
  CHECK(registry.plugins().size() == 1u);
  CHECK(registry.owner("gizmo") == nullptr);
  REQUIRE(registry.owner("widget") != nullptr);
  CHECK(registry.owner("widget")->name() == "recording");

  REQUIRE_THAT(registry.load(pluginPath("failing"), "types=gizmo", {}), IsOk());
  REQUIRE(registry.owner("gizmo") != nullptr);
  CHECK(registry.owner("gizmo")->name() == "failing");
  CHECK(registry.plugins().size() == 2u);
}

TEST_CASE("passes load errors through", "[plugin-registry]") {
  PluginRegistry registry;
  const absl::Status status = registry.load(pluginPath("abi_mismatch"), "", {});
  CHECK_THAT(std::string(status.message()), Catch::Contains("speaks plugin ABI 99.0"));
  CHECK(registry.plugins().empty());
}

// --------------------------------------------------------------------------------------------
// Failures, exceptions and crashes.

TEST_CASE("codes map to status codes with the plugins message", "[failing-plugin]") {
  auto loaded = loadPlugin(pluginPath("failing"),
                           "retryable_prefix=retry-\ninvalid_prefix=bad-\nfatal_prefix=fatal-", {});
  REQUIRE_THAT(loaded, IsOk());
  LoadedPlugin& plugin = **loaded;

  CHECK_THAT(plugin.apply(makeChange("failing", "fine-1", 1)), IsOk());

  const absl::Status retryable = plugin.apply(makeChange("failing", "retry-1", 2));
  CHECK(retryable.code() == absl::StatusCode::kUnavailable);
  CHECK(retryable.message() ==
        "plugin failing: apply failing/retry-1 version 2: UNAVAILABLE: retry-1 is not ready "
        "yet");

  const absl::Status invalid =
      plugin.remove(makeChange("failing", "bad-1", 3, cluster::v1::CHANGE_OP_DELETE));
  CHECK(invalid.code() == absl::StatusCode::kInvalidArgument);
  CHECK(invalid.message() ==
        "plugin failing: remove failing/bad-1 version 3: INVALID_ARGUMENT: bad-1 can never "
        "be applied");

  const absl::Status fatal = plugin.apply(makeChange("failing", "fatal-1", 4));
  CHECK(fatal.code() == absl::StatusCode::kInternal);
  CHECK_THAT(std::string(fatal.message()), Catch::Contains("INTERNAL: fatal-1 broke the plugin"));

  // A failure does not poison the instance.
  CHECK_THAT(plugin.apply(makeChange("failing", "fine-2", 5)), IsOk());
}

TEST_CASE("exceptions become errors and the process survives", "[throwing-plugin]") {
  auto loaded = loadPlugin(pluginPath("throwing"), "", {});
  REQUIRE_THAT(loaded, IsOk());
  LoadedPlugin& plugin = **loaded;

  const absl::Status thrown = plugin.apply(makeChange("throwing", "boom-1", 1));
  CHECK(thrown.code() == absl::StatusCode::kInternal);
  CHECK(thrown.message() ==
        "plugin throwing: apply throwing/boom-1 version 1: apply threw an exception: apply "
        "of boom-1 blew up");

  const absl::Status not_std =
      plugin.remove(makeChange("throwing", "boom-2", 2, cluster::v1::CHANGE_OP_DELETE));
  CHECK(not_std.code() == absl::StatusCode::kInternal);
  CHECK_THAT(std::string(not_std.message()),
             Catch::Contains("remove threw an exception: (not a std::exception)"));

  // Still alive and callable.
  CHECK_THAT(plugin.syncBegin(3), IsOk());
  CHECK_THAT(plugin.observe(), IsOk());
  CHECK(plugin.apply(makeChange("throwing", "boom-3", 4)).code() == absl::StatusCode::kInternal);
}

TEST_CASE("abort takes the process down", "[crashing-plugin-death]") {
  auto loaded = loadPlugin(pluginPath("crashing"), "", {});
  REQUIRE_THAT(loaded, IsOk());
  CHECK_THAT((*loaded)->apply(makeChange("crashable", "calm-1", 1)), IsOk());
  // This is why plugins run in their own host process: nothing in-process can survive it.
  const auto death = krane::testing::runInChild(
      [&] { (void)(*loaded)->apply(makeChange("crashable", "crash-1", 2)); });
  CHECK(death.died);
  CHECK_THAT((*loaded)->apply(makeChange("crashable", "calm-2", 3)), IsOk());
}

TEST_CASE("takes its time per apply", "[slow-plugin]") {
  auto loaded = loadPlugin(pluginPath("slow"), "apply_ms=60\ntypes=slow_thing", {});
  REQUIRE_THAT(loaded, IsOk());
  CHECK((*loaded)->resourceTypes() == std::vector<std::string>{"slow_thing"});
  const auto start = std::chrono::steady_clock::now();
  CHECK_THAT((*loaded)->apply(makeChange("slow_thing", "s-1", 1)), IsOk());
  CHECK((std::chrono::steady_clock::now() - start) >= std::chrono::milliseconds(60));
}

}  // namespace
}  // namespace krane::plugin_tests
