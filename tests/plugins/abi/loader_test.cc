// The loader against real shared objects: every call through the ABI, every refusal with its
// message, the registry's one-owner rule, and plugins that fail, throw, crash or take their time.
#include <dlfcn.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include <gmock/gmock.h>
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include "agent/plugin_loader.h"
#include "common/strings.h"
#include "tests/plugins/abi/test_util.h"
#include "tests/support/process.h"

namespace krane::plugin_tests {
namespace {

using agent::LoadedPlugin;
using agent::loadPlugin;
using agent::PluginAbi;
using agent::PluginRegistry;
using google::protobuf::util::MessageDifferencer;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string pluginPath(const std::string& name) {
  return krane::testing::runfile(strCat("tests/support/plugins/lib", name, ".so"));
}

// A fresh path under the test's scratch directory, named after the running test.
std::string scratchFile(const std::string& suffix) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return strCat(std::getenv("TEST_TMPDIR"), "/", info->test_suite_name(), ".", info->name(), ".",
                suffix);
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
  EXPECT_THAT(line, StartsWith(strCat(call, " ")));
  Message message;
  EXPECT_TRUE(message.ParseFromString(unhex(std::string_view(line).substr(call.size() + 1))))
      << line;
  return message;
}

// --------------------------------------------------------------------------------------------
// The recording plugin: every entry point, payloads intact both ways.

TEST(RecordingPlugin, EveryCallArrivesWithItsPayload) {
  const std::string log = scratchFile("calls");
  CapturedHost host;
  auto loaded = loadPlugin(pluginPath("recording"), strCat("log=", log, "\ntypes=widget,gadget\n"),
                           host.callbacks());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  LoadedPlugin& plugin = **loaded;

  EXPECT_EQ(plugin.name(), "recording");
  EXPECT_EQ(plugin.version(), "1.0.0-test");
  EXPECT_EQ(plugin.abiMajor(), KRANE_PLUGIN_ABI_MAJOR);
  EXPECT_EQ(plugin.abiMinor(), KRANE_PLUGIN_ABI_MINOR);
  EXPECT_EQ(plugin.origin(), pluginPath("recording"));
  EXPECT_THAT(plugin.resourceTypes(), ElementsAre("widget", "gadget"));
  EXPECT_TRUE(host.logged(strCat("recording calls to ", log)));

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

  EXPECT_TRUE(plugin.syncBegin(42).ok());
  EXPECT_TRUE(plugin.apply(applied).ok());
  EXPECT_TRUE(plugin.apply(topology).ok());
  EXPECT_TRUE(plugin.remove(removed).ok());
  EXPECT_TRUE(plugin.syncEnd(sync_end).ok());
  EXPECT_TRUE(plugin.observe().ok());

  // observe() reported what was applied, through the host callback, parsed.
  const auto reports = host.reports();
  ASSERT_EQ(reports.size(), 2u);
  std::map<std::string, cluster::v1::ReportResourceStatusRequest> by_id;
  for (const auto& report : reports) {
    ASSERT_TRUE(report.has_resource());
    by_id[report.resource().id()] = report.resource();
  }
  EXPECT_EQ(by_id["w-1"].type(), "widget");
  EXPECT_EQ(by_id["w-1"].version(), 7u);
  EXPECT_EQ(by_id["w-1"].region(), "eu-1");
  EXPECT_EQ(by_id["w-1"].phase(), cluster::v1::RESOURCE_PHASE_READY);
  EXPECT_EQ(by_id["w-1"].plugin(), "recording");
  EXPECT_EQ(by_id["g-1"].version(), 8u);

  plugin.shutdown();
  plugin.shutdown();  // idempotent
  const absl::Status after = plugin.apply(applied);
  EXPECT_EQ(after.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(after.message()), HasSubstr("after shutdown"));

  const auto lines = readLines(log);
  ASSERT_EQ(lines.size(), 9u) << ::testing::PrintToString(lines);
  EXPECT_EQ(lines[0], "init host_abi=1.0");
  EXPECT_EQ(lines[1], "resource_types");
  EXPECT_EQ(lines[2], "sync_begin 42");
  EXPECT_TRUE(
      MessageDifferencer::Equals(parseRecorded<cluster::v1::Change>(lines[3], "apply"), applied));
  EXPECT_TRUE(
      MessageDifferencer::Equals(parseRecorded<cluster::v1::Change>(lines[4], "apply"), topology));
  EXPECT_TRUE(
      MessageDifferencer::Equals(parseRecorded<cluster::v1::Change>(lines[5], "remove"), removed));
  EXPECT_TRUE(MessageDifferencer::Equals(parseRecorded<plugin::v1::SyncEnd>(lines[6], "sync_end"),
                                         sync_end));
  EXPECT_EQ(lines[7], "observe");
  EXPECT_EQ(lines[8], "shutdown");
}

TEST(RecordingPlugin, DestructionShutsDownOnce) {
  const std::string log = scratchFile("calls");
  {
    auto loaded = loadPlugin(pluginPath("recording"), strCat("log=", log), {});
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_THAT((*loaded)->resourceTypes(), ElementsAre("recorded"));
  }
  EXPECT_THAT(readLines(log), ElementsAre("init host_abi=1.0", "resource_types", "shutdown"));
}

TEST(RecordingPlugin, AppliesFromSeveralThreadsAtOnce) {
  const std::string log = scratchFile("calls");
  auto loaded = loadPlugin(pluginPath("recording"), strCat("log=", log), {});
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        EXPECT_TRUE((*loaded)->apply(makeChange("recorded", strCat("r-", t, "-", i), i + 1)).ok());
      }
    });
  }
  for (auto& thread : threads) thread.join();
  loaded->reset();
  size_t applies = 0;
  for (const auto& line : readLines(log)) applies += line.rfind("apply ", 0) == 0;
  EXPECT_EQ(applies, 200u);
}

TEST(RecordingPlugin, LoadedTwiceKeepsInstancesApart) {
  const std::string first_log = scratchFile("first");
  const std::string second_log = scratchFile("second");
  auto first = loadPlugin(pluginPath("recording"), strCat("log=", first_log, "\ntypes=a"), {});
  auto second = loadPlugin(pluginPath("recording"), strCat("log=", second_log, "\ntypes=b"), {});
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_THAT((*first)->resourceTypes(), ElementsAre("a"));
  EXPECT_THAT((*second)->resourceTypes(), ElementsAre("b"));
  EXPECT_TRUE((*second)->syncBegin(5).ok());
  first->reset();
  // The library stays loaded for the second instance.
  EXPECT_TRUE((*second)->syncBegin(6).ok());
  second->reset();
  EXPECT_EQ(readLines(first_log).size(), 3u);
  EXPECT_THAT(readLines(second_log), ElementsAre("init host_abi=1.0", "resource_types",
                                                 "sync_begin 5", "sync_begin 6", "shutdown"));
}

// --------------------------------------------------------------------------------------------
// Refusals, each naming what is wrong.

TEST(LoaderRefuses, AMissingFile) {
  const std::string path = scratchFile("libnowhere.so");
  auto loaded = loadPlugin(path, "", {});
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(loaded.status().message(), strCat("plugin file ", path, " does not exist"));
}

TEST(LoaderRefuses, AFileDlopenCannotLoad) {
  const std::string path = scratchFile("libgarbage.so");
  std::ofstream(path) << "this is not an ELF object\n";
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_EQ(handle, nullptr);
  const std::string dlerror_text = ::dlerror();

  auto loaded = loadPlugin(path, "", {});
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(loaded.status().message(), strCat("cannot load plugin ", path, ": ", dlerror_text));
}

TEST(LoaderRefuses, ALibraryWithoutTheEntrySymbol) {
  const std::string path = pluginPath("missing_symbol");
  auto loaded = loadPlugin(path, "", {});
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(loaded.status().message()),
              StartsWith(strCat("plugin ", path, " does not export krane_plugin_entry")));
}

TEST(LoaderRefuses, AnotherAbiMajorNamingBothVersions) {
  auto loaded = loadPlugin(pluginPath("abi_mismatch"), "", {});
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(loaded.status().message(),
            "plugin libabi_mismatch.so speaks plugin ABI 99.0, this agent speaks 1.0: rebuild "
            "the plugin against plugins/abi/krane_plugin.h 1.x");
}

TEST(LoaderRefuses, APluginOlderThanTheAgentsMajor) {
  // As a future agent 2.3 would see today's plugins.
  auto loaded = loadPlugin(pluginPath("recording"), "log=/dev/null", {},
                           PluginAbi{.major = 2, .minor = 3, .oldest_minor = 0});
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().message(),
            "plugin librecording.so speaks plugin ABI 1.0, this agent speaks 2.3: rebuild the "
            "plugin against plugins/abi/krane_plugin.h 2.x");
}

TEST(LoaderRefuses, AMinorOlderThanTheAgentAccepts) {
  auto loaded = loadPlugin(pluginPath("recording"), "log=/dev/null", {},
                           PluginAbi{.major = 1, .minor = 3, .oldest_minor = 2});
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(loaded.status().message(),
            "plugin librecording.so speaks plugin ABI 1.0, this agent speaks 1.3 and accepts 1.2 "
            "or newer: rebuild the plugin against plugins/abi/krane_plugin.h 1.3");
}

TEST(LoaderRefuses, ATableSmallerThanItsVersionDefines) {
  auto loaded = loadPlugin(pluginPath("struct_too_small"), "", {});
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(loaded.status().message(),
            strCat("plugin libstruct_too_small.so: its krane_plugin_api table is 16 bytes, but "
                   "plugin ABI 1.0 needs at least ",
                   static_cast<size_t>(KRANE_PLUGIN_API_SIZE_1_0), " bytes"));
}

TEST(LoaderRefuses, AnInitFailureWithThePluginsMessage) {
  auto loaded = loadPlugin(pluginPath("recording"), "types=widget", {});
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(loaded.status().message(),
            "plugin recording (librecording.so) failed to initialize: INVALID_ARGUMENT: "
            "recording: config has no log=PATH line");

  auto typo = loadPlugin(pluginPath("slow"), "apply_msec=5", {});
  ASSERT_FALSE(typo.ok());
  EXPECT_THAT(std::string(typo.status().message()),
              HasSubstr("slow: unknown config key \"apply_msec\""));
}

TEST(LoaderRefuses, APluginDeclaringATypeTwice) {
  auto loaded = loadPlugin(pluginPath("recording"), "log=/dev/null\ntypes=a,b,a", {});
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().message(),
            "plugin recording (librecording.so) declares resource type \"a\" twice");

  auto empty = loadPlugin(pluginPath("recording"), "log=/dev/null\ntypes=a,,b", {});
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.status().message(),
            "plugin recording (librecording.so) declares an empty resource type");
}

// --------------------------------------------------------------------------------------------
// The registry: one owner per resource type.

TEST(PluginRegistry, RefusesTwoPluginsClaimingOneType) {
  PluginRegistry registry;
  ASSERT_TRUE(registry.load(pluginPath("recording"), "log=/dev/null\ntypes=widget", {}).ok());
  const absl::Status clash = registry.load(pluginPath("slow"), "types=gizmo,widget", {});
  EXPECT_EQ(clash.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(clash.message(),
            "plugins recording (librecording.so) and slow (libslow.so) both claim resource type "
            "\"widget\": each type has exactly one owner; slow is not loaded");
  // Nothing of the refused plugin stays registered.
  EXPECT_EQ(registry.plugins().size(), 1u);
  EXPECT_EQ(registry.owner("gizmo"), nullptr);
  ASSERT_NE(registry.owner("widget"), nullptr);
  EXPECT_EQ(registry.owner("widget")->name(), "recording");

  ASSERT_TRUE(registry.load(pluginPath("failing"), "types=gizmo", {}).ok());
  ASSERT_NE(registry.owner("gizmo"), nullptr);
  EXPECT_EQ(registry.owner("gizmo")->name(), "failing");
  EXPECT_EQ(registry.plugins().size(), 2u);
}

TEST(PluginRegistry, PassesLoadErrorsThrough) {
  PluginRegistry registry;
  const absl::Status status = registry.load(pluginPath("abi_mismatch"), "", {});
  EXPECT_THAT(std::string(status.message()), HasSubstr("speaks plugin ABI 99.0"));
  EXPECT_TRUE(registry.plugins().empty());
}

// --------------------------------------------------------------------------------------------
// Failures, exceptions and crashes.

TEST(FailingPlugin, CodesMapToStatusCodesWithThePluginsMessage) {
  auto loaded = loadPlugin(pluginPath("failing"),
                           "retryable_prefix=retry-\ninvalid_prefix=bad-\nfatal_prefix=fatal-", {});
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  LoadedPlugin& plugin = **loaded;

  EXPECT_TRUE(plugin.apply(makeChange("failing", "fine-1", 1)).ok());

  const absl::Status retryable = plugin.apply(makeChange("failing", "retry-1", 2));
  EXPECT_EQ(retryable.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(retryable.message(),
            "plugin failing: apply failing/retry-1 version 2: UNAVAILABLE: retry-1 is not ready "
            "yet");

  const absl::Status invalid =
      plugin.remove(makeChange("failing", "bad-1", 3, cluster::v1::CHANGE_OP_DELETE));
  EXPECT_EQ(invalid.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(invalid.message(),
            "plugin failing: remove failing/bad-1 version 3: INVALID_ARGUMENT: bad-1 can never "
            "be applied");

  const absl::Status fatal = plugin.apply(makeChange("failing", "fatal-1", 4));
  EXPECT_EQ(fatal.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(fatal.message()), HasSubstr("INTERNAL: fatal-1 broke the plugin"));

  // A failure does not poison the instance.
  EXPECT_TRUE(plugin.apply(makeChange("failing", "fine-2", 5)).ok());
}

TEST(ThrowingPlugin, ExceptionsBecomeErrorsAndTheProcessSurvives) {
  auto loaded = loadPlugin(pluginPath("throwing"), "", {});
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  LoadedPlugin& plugin = **loaded;

  const absl::Status thrown = plugin.apply(makeChange("throwing", "boom-1", 1));
  EXPECT_EQ(thrown.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(thrown.message(),
            "plugin throwing: apply throwing/boom-1 version 1: apply threw an exception: apply "
            "of boom-1 blew up");

  const absl::Status not_std =
      plugin.remove(makeChange("throwing", "boom-2", 2, cluster::v1::CHANGE_OP_DELETE));
  EXPECT_EQ(not_std.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(not_std.message()),
              HasSubstr("remove threw an exception: (not a std::exception)"));

  // Still alive and callable.
  EXPECT_TRUE(plugin.syncBegin(3).ok());
  EXPECT_TRUE(plugin.observe().ok());
  EXPECT_EQ(plugin.apply(makeChange("throwing", "boom-3", 4)).code(), absl::StatusCode::kInternal);
}

TEST(CrashingPluginDeathTest, AbortTakesTheProcessDown) {
  auto loaded = loadPlugin(pluginPath("crashing"), "", {});
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE((*loaded)->apply(makeChange("crashable", "calm-1", 1)).ok());
  // This is why plugins run in their own host process: nothing in-process can survive it.
  EXPECT_DEATH((void)(*loaded)->apply(makeChange("crashable", "crash-1", 2)), "");
  EXPECT_TRUE((*loaded)->apply(makeChange("crashable", "calm-2", 3)).ok());
}

TEST(SlowPlugin, TakesItsTimePerApply) {
  auto loaded = loadPlugin(pluginPath("slow"), "apply_ms=60\ntypes=slow_thing", {});
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_THAT((*loaded)->resourceTypes(), ElementsAre("slow_thing"));
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE((*loaded)->apply(makeChange("slow_thing", "s-1", 1)).ok());
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(60));
}

}  // namespace
}  // namespace krane::plugin_tests
