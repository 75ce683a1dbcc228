// The same ABI table without dlopen: a C plugin and an SDK plugin linked into this binary, the
// SDK's trampolines called directly, and hand-built tables the loader must refuse or accept.
#include <cstring>
#include <stdexcept>

#include <catch2/catch.hpp>

#include "agent/plugin_loader.h"
#include "plugins/sdk/plugin.h"
#include "tests/plugins/abi/c_plugin.h"
#include "tests/plugins/abi/test_util.h"
#include "tests/support/matchers.h"

namespace krane::plugin_tests {
namespace {

using agent::LoadedPlugin;
using agent::PluginAbi;

// --------------------------------------------------------------------------------------------
// A plugin written in C.

TEST_CASE("loads and runs in process", "[c-plugin]") {
  CapturedHost host;
  auto loaded = LoadedPlugin::fromApi(krane_c_plugin_api(), "c_plugin.c", "", host.callbacks());
  REQUIRE_THAT(loaded, IsOk());
  LoadedPlugin& plugin = **loaded;
  CHECK(plugin.name() == "c_plugin");
  CHECK(plugin.version() == "0.1.0");
  CHECK(plugin.resourceTypes() == std::vector<std::string>{"c_thing"});
  CHECK(host.logged("c_plugin ready"));

  CHECK_THAT(plugin.apply(makeChange("c_thing", "c-1", 1)), IsOk());
  CHECK(krane_c_plugin_applied() == 1u);
  // An empty Change serializes to no bytes, which this plugin refuses.
  const absl::Status invalid = plugin.apply(cluster::v1::Change());
  CHECK(invalid.code() == absl::StatusCode::kInvalidArgument);
  CHECK(invalid.message() == "plugin c_plugin: apply / version 0: c_plugin: empty change");

  // It reports bytes that are not a StatusReport: dropped and logged, not forwarded.
  CHECK_THAT(plugin.observe(), IsOk());
  CHECK(host.reports().empty());
  CHECK(
      host.logged("status report dropped: 3 bytes that are not a serialized "
                  "krane.plugin.v1.StatusReport"));
}

TEST_CASE("init failure carries its message", "[c-plugin]") {
  auto loaded = LoadedPlugin::fromApi(krane_c_plugin_api(), "c_plugin.c", "x=1", {});
  REQUIRE_FALSE(loaded.ok());
  CHECK(loaded.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(loaded.status().message() ==
        "plugin c_plugin (c_plugin.c) failed to initialize: c_plugin takes no config (got 3 "
        "bytes)");
}

// --------------------------------------------------------------------------------------------
// An SDK plugin linked into the test.

class EchoPlugin : public sdk::Plugin {
 public:
  absl::Status init(sdk::Host& host, std::string_view config) override {
    host_ = &host;
    if (config == "refuse") return absl::FailedPreconditionError("echo: told to refuse");
    if (config == "throw") throw std::runtime_error("echo: init exploded");
    return absl::OkStatus();
  }
  std::vector<std::string> resourceTypes() override { return {"echo"}; }
  absl::Status apply(const cluster::v1::Change& change) override {
    const std::string& id = change.resource().id();
    if (id == "deadline") return absl::DeadlineExceededError("took too long");
    if (id == "aborted") return absl::AbortedError("conflict");
    if (id == "range") return absl::OutOfRangeError("replicas out of range");
    if (id == "denied") return absl::PermissionDeniedError("rbac");
    if (id == "bad_alloc") throw std::bad_alloc();
    if (id == "long") return absl::InvalidArgumentError(std::string(5000, 'x'));
    cluster::v1::ReportResourceStatusRequest status;
    status.set_type(change.resource().type());
    status.set_id(id);
    status.set_version(change.version());
    status.set_plugin("echo");
    host_->reportResourceStatus(status);
    host_->log(sdk::LogLevel::kWarn, "echoed " + id);
    return absl::OkStatus();
  }
  absl::Status remove(const cluster::v1::Change&) override { return absl::OkStatus(); }
  absl::Status syncEnd(const plugin::v1::SyncEnd& sync_end) override {
    return sync_end.resources_size() == 0 ? absl::InvalidArgumentError("empty sync end")
                                          : absl::OkStatus();
  }
  void shutdown() override { throw std::runtime_error("echo: shutdown exploded"); }

 private:
  sdk::Host* host_ = nullptr;
};

constexpr krane_plugin_api kEchoApi = sdk::makePluginApi<EchoPlugin>("echo", "2.0.0");

TEST_CASE("runs through the loader in process", "[sdk-plugin]") {
  CapturedHost host;
  auto loaded = LoadedPlugin::fromApi(&kEchoApi, "echo (in process)", "", host.callbacks());
  REQUIRE_THAT(loaded, IsOk());
  LoadedPlugin& plugin = **loaded;
  CHECK(plugin.name() == "echo");
  CHECK(plugin.resourceTypes() == std::vector<std::string>{"echo"});

  CHECK_THAT(plugin.apply(makeChange("echo", "e-1", 11)), IsOk());
  REQUIRE(host.reports().size() == 1u);
  CHECK(host.reports()[0].resource().id() == "e-1");
  CHECK(host.reports()[0].resource().version() == 11u);
  const auto logs = host.logs();
  REQUIRE(logs.size() == 1u);
  CHECK(logs[0].first == agent::PluginLogLevel::kWarn);
  CHECK(logs[0].second == "echoed e-1");

  CHECK(plugin.apply(makeChange("echo", "deadline", 1)).code() == absl::StatusCode::kUnavailable);
  CHECK(plugin.apply(makeChange("echo", "aborted", 1)).code() == absl::StatusCode::kUnavailable);
  CHECK(plugin.apply(makeChange("echo", "range", 1)).code() == absl::StatusCode::kInvalidArgument);
  const absl::Status denied = plugin.apply(makeChange("echo", "denied", 1));
  CHECK(denied.code() == absl::StatusCode::kInternal);
  CHECK_THAT(std::string(denied.message()), Catch::Contains("PERMISSION_DENIED: rbac"));
  const absl::Status oom = plugin.apply(makeChange("echo", "bad_alloc", 1));
  CHECK(oom.code() == absl::StatusCode::kInternal);
  CHECK_THAT(std::string(oom.message()),
             Catch::Contains("apply threw an exception: std::bad_alloc"));
  // A message longer than the buffer is cut, not overrun.
  const absl::Status long_message = plugin.apply(makeChange("echo", "long", 1));
  CHECK(long_message.code() == absl::StatusCode::kInvalidArgument);
  CHECK(long_message.message().size() < size_t{KRANE_ERROR_MESSAGE_SIZE + 100});

  CHECK(plugin.syncEnd(plugin::v1::SyncEnd()).code() == absl::StatusCode::kInvalidArgument);
  // shutdown() throws inside the plugin; the SDK keeps it there and logs it.
  plugin.shutdown();
  CHECK(host.logged("shutdown threw an exception: echo: shutdown exploded"));
}

TEST_CASE("init failures and exceptions become load errors", "[sdk-plugin]") {
  auto refused = LoadedPlugin::fromApi(&kEchoApi, "echo.so", "refuse", {});
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().code() == absl::StatusCode::kInternal);
  CHECK(refused.status().message() ==
        "plugin echo (echo.so) failed to initialize: FAILED_PRECONDITION: echo: told to "
        "refuse");

  auto thrown = LoadedPlugin::fromApi(&kEchoApi, "echo.so", "throw", {});
  REQUIRE_FALSE(thrown.ok());
  CHECK(thrown.status().message() ==
        "plugin echo (echo.so) failed to initialize: init threw an exception: echo: init "
        "exploded");
}

// The trampolines as a host written in another language would call them.
void noLog(void*, krane_log_level, const char*) {}
void noReport(void*, const uint8_t*, size_t) {}

TEST_CASE("trampolines refuse bad payloads and bad calls", "[sdk-plugin]") {
  krane_host host{};
  host.struct_size = sizeof(krane_host);
  host.abi_major = KRANE_PLUGIN_ABI_MAJOR;
  host.abi_minor = KRANE_PLUGIN_ABI_MINOR;
  host.log = &noLog;
  host.report_status = &noReport;

  void* instance = nullptr;
  krane_error err{};
  INFO(err.message);
  REQUIRE(kEchoApi.init(&host, nullptr, 0, &instance, &err) == KRANE_OK);
  REQUIRE(instance != nullptr);
  const char* const* types = kEchoApi.resource_types(instance);
  REQUIRE(types != nullptr);
  CHECK(std::string(types[0]) == "echo");
  CHECK(types[1] == nullptr);

  const uint8_t garbage[] = {0xff, 0xff, 0xff};
  err = {};
  CHECK(kEchoApi.apply(instance, garbage, sizeof(garbage), &err) == KRANE_INVALID);
  CHECK(err.code == KRANE_INVALID);
  CHECK(std::string(err.message) ==
        "apply: the payload (3 bytes) is not a serialized krane.cluster.v1.Change");
  err = {};
  CHECK(kEchoApi.sync_end(instance, garbage, sizeof(garbage), &err) == KRANE_INVALID);
  CHECK(std::string(err.message) ==
        "sync_end: the payload (3 bytes) is not a serialized krane.plugin.v1.SyncEnd");
  err = {};
  CHECK(kEchoApi.observe(nullptr, &err) == KRANE_FATAL);
  CHECK_THAT(err.message, Catch::Contains("without an instance"));
  kEchoApi.shutdown(instance);
  kEchoApi.shutdown(nullptr);

  // A host from another major, or with a truncated table, is refused at init.
  krane_host other = host;
  other.abi_major = 2;
  err = {};
  instance = nullptr;
  CHECK(kEchoApi.init(&other, nullptr, 0, &instance, &err) == KRANE_FATAL);
  CHECK(std::string(err.message) == "init: the host speaks plugin ABI 2.0, this plugin 1.0");
  CHECK(instance == nullptr);
  krane_host small = host;
  small.struct_size = 8;
  err = {};
  CHECK(kEchoApi.init(&small, nullptr, 0, &instance, &err) == KRANE_FATAL);
  CHECK_THAT(err.message, Catch::Contains("smaller than ABI 1.0"));
}

TEST_CASE("follows the documented table", "[sdk-status-mapping]") {
  CHECK(sdk::toKraneStatus(absl::OkStatus()) == KRANE_OK);
  for (const auto& status : {absl::UnavailableError(""), absl::AbortedError(""),
                             absl::DeadlineExceededError(""), absl::ResourceExhaustedError("")}) {
    INFO(status);
    CHECK(sdk::toKraneStatus(status) == KRANE_RETRYABLE);
  }
  for (const auto& status :
       {absl::InvalidArgumentError(""), absl::OutOfRangeError(""), absl::UnimplementedError("")}) {
    INFO(status);
    CHECK(sdk::toKraneStatus(status) == KRANE_INVALID);
  }
  for (const auto& status :
       {absl::InternalError(""), absl::UnknownError(""), absl::FailedPreconditionError(""),
        absl::NotFoundError(""), absl::PermissionDeniedError(""), absl::DataLossError("")}) {
    INFO(status);
    CHECK(sdk::toKraneStatus(status) == KRANE_FATAL);
  }
}

// --------------------------------------------------------------------------------------------
// Hand-built tables.

TEST_CASE("refusals name the problem", "[in-process-table]") {
  auto null_api = LoadedPlugin::fromApi(nullptr, "libnull.so", "", {});
  CHECK(null_api.status().message() == "plugin libnull.so: krane_plugin_entry returned NULL");

  krane_plugin_api tiny = kEchoApi;
  tiny.struct_size = 4;
  auto too_tiny = LoadedPlugin::fromApi(&tiny, "/opt/plugins/libtiny.so", "", {});
  CHECK(too_tiny.status().message() ==
        "plugin libtiny.so: its krane_plugin_api table is 4 bytes, too small to hold even "
        "the ABI version (8 bytes)");

  krane_plugin_api no_apply = kEchoApi;
  no_apply.apply = nullptr;
  auto missing = LoadedPlugin::fromApi(&no_apply, "libnoapply.so", "", {});
  CHECK(missing.status().message() == "plugin libnoapply.so: krane_plugin_api.apply is NULL");

  // Versions are checked before anything else, whatever the rest looks like.
  krane_plugin_api future = kEchoApi;
  future.abi_major = 2;
  future.abi_minor = 1;
  future.apply = nullptr;
  auto newer = LoadedPlugin::fromApi(&future, "libfuture.so", "", {});
  CHECK(newer.status().message() ==
        "plugin libfuture.so speaks plugin ABI 2.1, this agent speaks 1.0: rebuild the "
        "plugin against plugins/abi/krane_plugin.h 1.x");

  auto too_old = LoadedPlugin::fromApi(&kEchoApi, "libecho.so", "", {},
                                       PluginAbi{.major = 1, .minor = 4, .oldest_minor = 1});
  CHECK(too_old.status().message() ==
        "plugin libecho.so speaks plugin ABI 1.0, this agent speaks 1.4 and accepts 1.1 or "
        "newer: rebuild the plugin against plugins/abi/krane_plugin.h 1.4");
}

// A plugin built against a later 1.x header: a larger table with fields this agent does not
// know. It loads; the extra fields are ignored.
struct FutureMinorApi {
  krane_plugin_api v1_0;
  void (*appended_in_1_7)(void* instance);
};

TEST_CASE("a newer minor loads", "[in-process-table]") {
  FutureMinorApi api{};
  api.v1_0 = kEchoApi;
  api.v1_0.struct_size = sizeof(FutureMinorApi);
  api.v1_0.abi_minor = 7;
  auto loaded = LoadedPlugin::fromApi(&api.v1_0, "libnewer.so", "", {});
  REQUIRE_THAT(loaded, IsOk());
  CHECK((*loaded)->abiMinor() == 7);
  CHECK_THAT((*loaded)->apply(makeChange("echo", "e-2", 1)), IsOk());
}

krane_status leakException(void*, const uint8_t*, size_t, krane_error*) {
  throw std::runtime_error("not caught by its plugin");
}

TEST_CASE("an exception leaking out of a plugin is stopped at the loader", "[in-process-table]") {
  krane_plugin_api leaky = kEchoApi;
  leaky.apply = &leakException;
  auto loaded = LoadedPlugin::fromApi(&leaky, "libleaky.so", "", {});
  REQUIRE_THAT(loaded, IsOk());
  const absl::Status status = (*loaded)->apply(makeChange("echo", "e-3", 1));
  CHECK(status.code() == absl::StatusCode::kInternal);
  CHECK_THAT(std::string(status.message()),
             Catch::Contains("let a C++ exception escape from apply echo/e-3 version 1"));
}

}  // namespace
}  // namespace krane::plugin_tests
