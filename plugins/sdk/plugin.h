// C++ helpers for plugin authors: a plugin is a class derived from `krane::sdk::Plugin` plus one
// line, `KRANE_DEFINE_PLUGIN(MyPlugin, "my-plugin", "1.0.0")`, in one of its .cc files.
//
// The macro defines the exported entry point of plugins/abi/krane_plugin.h and fills the ABI
// table with C trampolines that parse the protobuf payloads, call the class and turn its
// absl::Status into a krane_status plus message. No exception leaves a trampoline: an exception
// thrown by the class becomes a KRANE_FATAL error carrying its what().
//
// Status mapping (absl::StatusCode -> krane_status):
//   OK                                                          -> KRANE_OK
//   UNAVAILABLE, ABORTED, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED -> KRANE_RETRYABLE
//   INVALID_ARGUMENT, OUT_OF_RANGE, UNIMPLEMENTED               -> KRANE_INVALID
//   anything else (INTERNAL, UNKNOWN, FAILED_PRECONDITION, ...) -> KRANE_FATAL
// Return UNAVAILABLE for "try again later", INVALID_ARGUMENT for "this version can never work".
// A payload that does not parse is KRANE_INVALID. The message sent to the host is
// "<CODE>: <message>", so the original code survives in logs and reports.
//
// Threads (see krane_plugin.h): apply, remove and observe may run concurrently for different
// resources; init, syncBegin, syncEnd and shutdown never overlap another call. The class is
// created by init and destroyed right after shutdown(); `Host` stays valid in between.
//
// May depend on plugins/abi, the protos and Abseil only; nothing in the agent depends on it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "krane/cluster/v1/cluster.pb.h"
#include "krane/plugin/v1/plugin.pb.h"
#include "plugins/abi/krane_plugin.h"

namespace krane::sdk {

// The version of the resource a change carries: what a plugin reports as applied. It can be
// newer than the change's own version (`change.version()`, the feed position): a catch-up hands
// over a resource's latest state at the position of an earlier change, and the agent then skips
// the later changes whose state the plugin already has.
inline uint64_t resourceVersion(const cluster::v1::Change& change) {
  return change.resource().version() != 0 ? change.resource().version() : change.version();
}

enum class LogLevel { kDebug, kInfo, kWarn, kError };

// The agent's side, as the plugin sees it. Thread-safe: may be used from any thread from init
// until shutdown returns, never after.
class Host {
 public:
  explicit Host(const krane_host* host) : host_(host) {}

  void log(LogLevel level, std::string_view message) const;
  void reportStatus(const plugin::v1::StatusReport& report) const;
  // Shorthand for a StatusReport holding one ReportResourceStatusRequest.
  void reportResourceStatus(const cluster::v1::ReportResourceStatusRequest& status) const;

  uint16_t abiMajor() const { return host_->abi_major; }
  uint16_t abiMinor() const { return host_->abi_minor; }

 private:
  const krane_host* host_;
};

class Plugin {
 public:
  virtual ~Plugin() = default;

  // `config` is the plugin's configuration as the operator wrote it. `host` outlives the
  // instance. A failure here is reported by the loader with its message, and the object is
  // destroyed without shutdown().
  virtual absl::Status init(Host& host, std::string_view config) = 0;
  // Called once, right after a successful init; the answer is fixed for the instance's life.
  virtual std::vector<std::string> resourceTypes() = 0;
  // An APPLY change; idempotent, the same change may arrive more than once.
  virtual absl::Status apply(const cluster::v1::Change& change) = 0;
  // A DELETE change: only type, id and region are set. Deleting something absent is OK.
  virtual absl::Status remove(const cluster::v1::Change& change) = 0;
  virtual absl::Status syncBegin(uint64_t snapshot_version) { return absl::OkStatus(); }
  // Delete what the plugin manages and `sync_end` does not list.
  virtual absl::Status syncEnd(const plugin::v1::SyncEnd& sync_end) { return absl::OkStatus(); }
  // Report the current status through Host::reportStatus.
  virtual absl::Status observe() { return absl::OkStatus(); }
  // Stop background work; the object is destroyed right after.
  virtual void shutdown() {}
};

// The krane_status an absl::Status maps to (see the table above).
krane_status toKraneStatus(const absl::Status& status);

namespace internal {

using PluginFactory = std::unique_ptr<Plugin> (*)();

krane_status initInstance(PluginFactory factory, const krane_host* host, const uint8_t* config,
                          size_t config_len, void** instance, krane_error* err);
const char* const* resourceTypes(void* instance);
krane_status apply(void* instance, const uint8_t* change, size_t len, krane_error* err);
krane_status remove(void* instance, const uint8_t* change, size_t len, krane_error* err);
krane_status syncBegin(void* instance, uint64_t snapshot_version, krane_error* err);
krane_status syncEnd(void* instance, const uint8_t* ids, size_t len, krane_error* err);
krane_status observe(void* instance, krane_error* err);
void shutdown(void* instance);

template <typename T>
std::unique_ptr<Plugin> create() {
  return std::make_unique<T>();
}

template <typename T>
krane_status init(const krane_host* host, const uint8_t* config, size_t config_len, void** instance,
                  krane_error* err) {
  return initInstance(&create<T>, host, config, config_len, instance, err);
}

}  // namespace internal

// The ABI table of plugin class T. KRANE_DEFINE_PLUGIN returns it from the entry point; tests
// can also hand it to the loader in process (LoadedPlugin::fromApi) without a shared object.
template <typename T>
constexpr krane_plugin_api makePluginApi(const char* name, const char* version) {
  static_assert(std::is_base_of_v<Plugin, T>, "a Krane plugin derives from krane::sdk::Plugin");
  static_assert(std::is_default_constructible_v<T>, "a Krane plugin is default-constructible");
  return krane_plugin_api{
      .struct_size = sizeof(krane_plugin_api),
      .abi_major = KRANE_PLUGIN_ABI_MAJOR,
      .abi_minor = KRANE_PLUGIN_ABI_MINOR,
      .name = name,
      .version = version,
      .init = &internal::init<T>,
      .resource_types = &internal::resourceTypes,
      .apply = &internal::apply,
      .remove = &internal::remove,
      .sync_begin = &internal::syncBegin,
      .sync_end = &internal::syncEnd,
      .observe = &internal::observe,
      .shutdown = &internal::shutdown,
  };
}

}  // namespace krane::sdk

// Defines the plugin's exported entry point (the only symbol a plugin exports). Use once per
// shared object, at namespace scope, outside any namespace.
#define KRANE_DEFINE_PLUGIN(ClassName, plugin_name, plugin_version)                 \
  extern "C" KRANE_PLUGIN_EXPORT const krane_plugin_api* krane_plugin_entry(void) { \
    static constexpr krane_plugin_api kApi =                                        \
        ::krane::sdk::makePluginApi<ClassName>(plugin_name, plugin_version);        \
    return &kApi;                                                                   \
  }                                                                                 \
  static_assert(true, "KRANE_DEFINE_PLUGIN is followed by a semicolon")
