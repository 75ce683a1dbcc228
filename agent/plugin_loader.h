// Loads resource plugins through the C ABI of plugins/abi/krane_plugin.h and wraps them in C++.
//
// `loadPlugin` dlopens a `lib<name>.so`, checks its ABI table field by field and creates an
// instance; every refusal says what is wrong and with which file (a missing file, a dlopen
// error, no entry symbol, a table too small, an ABI version this agent does not speak, an init
// failure with the plugin's own message). `LoadedPlugin::fromApi` does the same for a table
// that is already in the process (a statically linked plugin, or a hand-built one in tests).
//
// Error codes coming back from the plugin become absl::Status codes the dispatcher understands:
//   KRANE_RETRYABLE -> UNAVAILABLE        (redelivered with backoff)
//   KRANE_INVALID   -> INVALID_ARGUMENT   (this version can never succeed)
//   KRANE_FATAL     -> INTERNAL           (so does an unknown code)
// each with the plugin's message.
//
// Threads: follow the ABI's rules. apply, remove and observe may be called concurrently for
// different resources; loading, syncBegin, syncEnd and shutdown must not overlap another call.
// HostCallbacks run on whatever thread the plugin calls them from, possibly several at once.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "krane/cluster/v1/cluster.pb.h"
#include "krane/plugin/v1/plugin.pb.h"
#include "plugins/abi/krane_plugin.h"

namespace krane::agent {

// The plugin ABI versions this agent accepts: `major` exactly, minors from `oldest_minor` up
// (newer minors too; fields they appended are ignored).
struct PluginAbi {
  uint16_t major = KRANE_PLUGIN_ABI_MAJOR;
  uint16_t minor = KRANE_PLUGIN_ABI_MINOR;
  uint16_t oldest_minor = 0;
};

// FAILED_PRECONDITION naming both versions ("<who> speaks plugin ABI 2.0, this agent speaks
// 1.0") unless `major`.`minor` is one `abi` accepts. Used for plugins and plugin hosts alike.
absl::Status checkAbiVersion(std::string_view who, uint32_t major, uint32_t minor,
                             const PluginAbi& abi = {});

enum class PluginLogLevel { kDebug, kInfo, kWarn, kError };

// What the plugin may call back. Either may be empty: logs then go to spdlog, reports are
// dropped with a warning. Called from any thread, possibly concurrently, until shutdown
// returns; they must not call into the plugin. A report that does not parse is logged and
// dropped before reaching `report_status`.
struct HostCallbacks {
  std::function<void(PluginLogLevel level, std::string_view message)> log;
  std::function<void(const plugin::v1::StatusReport& report)> report_status;
};

class LoadedPlugin;

// dlopen(RTLD_NOW | RTLD_LOCAL) `path`, check its ABI and initialize it with `config_bytes`.
absl::StatusOr<std::unique_ptr<LoadedPlugin>> loadPlugin(const std::string& path,
                                                         const std::string& config_bytes,
                                                         HostCallbacks callbacks,
                                                         const PluginAbi& abi = {});

// One initialized plugin instance. Owns the library it came from.
class LoadedPlugin {
 public:
  // Validates `api` (from a plugin linked into this process) and initializes an instance.
  // `origin` names the plugin in messages, e.g. the file it came from.
  static absl::StatusOr<std::unique_ptr<LoadedPlugin>> fromApi(const krane_plugin_api* api,
                                                               std::string origin,
                                                               const std::string& config_bytes,
                                                               HostCallbacks callbacks,
                                                               const PluginAbi& abi = {});

  // Shuts the instance down, then unloads the library (if it came from loadPlugin).
  ~LoadedPlugin();
  LoadedPlugin(const LoadedPlugin&) = delete;
  LoadedPlugin& operator=(const LoadedPlugin&) = delete;

  const std::string& name() const { return name_; }
  const std::string& version() const { return version_; }
  // Where the plugin came from: the .so path, or the origin given to fromApi.
  const std::string& origin() const { return origin_; }
  uint16_t abiMajor() const { return abi_major_; }
  uint16_t abiMinor() const { return abi_minor_; }
  const std::vector<std::string>& resourceTypes() const { return resource_types_; }

  absl::Status apply(const cluster::v1::Change& change);
  absl::Status remove(const cluster::v1::Change& change);
  absl::Status syncBegin(uint64_t snapshot_version);
  absl::Status syncEnd(const plugin::v1::SyncEnd& sync_end);
  absl::Status observe();
  // Idempotent; later calls of the methods above fail with FAILED_PRECONDITION.
  void shutdown();

 private:
  struct HostState;
  struct Library;

  LoadedPlugin() = default;
  static absl::StatusOr<std::unique_ptr<LoadedPlugin>> create(
      std::unique_ptr<Library> library, const krane_plugin_api* api, std::string origin,
      const std::string& config_bytes, HostCallbacks callbacks, const PluginAbi& abi);
  friend absl::StatusOr<std::unique_ptr<LoadedPlugin>> loadPlugin(const std::string&,
                                                                  const std::string&, HostCallbacks,
                                                                  const PluginAbi&);

  template <typename Call>
  absl::Status call(std::string_view what, Call&& call);
  absl::Status changeCall(std::string_view what, const cluster::v1::Change& change,
                          krane_status (*fn)(void*, const uint8_t*, size_t, krane_error*));

  std::unique_ptr<Library> library_;  // null for fromApi
  const krane_plugin_api* api_ = nullptr;
  std::unique_ptr<HostState> host_;
  void* instance_ = nullptr;
  bool live_ = false;

  std::string name_;
  std::string version_;
  std::string origin_;
  uint16_t abi_major_ = 0;
  uint16_t abi_minor_ = 0;
  std::vector<std::string> resource_types_;
};

// The plugins of one agent, each resource type with exactly one owner. Filled at start-up on
// one thread; afterwards read-only and safe to share. Unloads in reverse order of loading.
class PluginRegistry {
 public:
  PluginRegistry() = default;
  ~PluginRegistry();
  PluginRegistry(const PluginRegistry&) = delete;
  PluginRegistry& operator=(const PluginRegistry&) = delete;

  // loadPlugin + add.
  absl::Status load(const std::string& path, const std::string& config_bytes,
                    HostCallbacks callbacks, const PluginAbi& abi = {});
  // Refuses (and shuts down) a plugin claiming a type another plugin already owns.
  absl::Status add(std::unique_ptr<LoadedPlugin> plugin);

  // The owner of `resource_type`, or null. Owned by the registry.
  LoadedPlugin* owner(const std::string& resource_type) const;
  const std::vector<std::unique_ptr<LoadedPlugin>>& plugins() const { return plugins_; }

 private:
  std::vector<std::unique_ptr<LoadedPlugin>> plugins_;
  std::map<std::string, LoadedPlugin*> owners_;
};

}  // namespace krane::agent
