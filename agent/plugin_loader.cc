#include "agent/plugin_loader.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <set>
#include <utility>

#include <spdlog/spdlog.h>

#include "common/strings.h"

namespace krane::agent {

namespace {

constexpr std::string_view kHeaderPath = "plugins/abi/krane_plugin.h";

std::string baseName(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string abiText(uint16_t major, uint16_t minor) { return strCat(major, ".", minor); }

// The plugin's message, made safe to read: NUL-terminated within the buffer.
std::string errorMessage(krane_error& err) {
  err.message[sizeof(err.message) - 1] = '\0';
  return err.message[0] == '\0' ? std::string("(no message)") : std::string(err.message);
}

absl::StatusCode codeFor(int32_t rc) {
  switch (rc) {
    case KRANE_RETRYABLE:
      return absl::StatusCode::kUnavailable;
    case KRANE_INVALID:
      return absl::StatusCode::kInvalidArgument;
    default:
      return absl::StatusCode::kInternal;
  }
}

// Checks the table field by field, reading nothing that lies outside what the plugin says it has.
absl::Status validateApi(const krane_plugin_api* api, const std::string& label,
                         const PluginAbi& abi) {
  if (api == nullptr) {
    return absl::FailedPreconditionError(
        strCat("plugin ", label, ": ", KRANE_PLUGIN_ENTRY_SYMBOL, " returned NULL"));
  }
  constexpr size_t kVersionEnd = offsetof(krane_plugin_api, abi_minor) + sizeof(uint16_t);
  if (api->struct_size < kVersionEnd) {
    return absl::FailedPreconditionError(
        strCat("plugin ", label, ": its krane_plugin_api table is ", api->struct_size,
               " bytes, too small to hold even the ABI version (", kVersionEnd, " bytes)"));
  }
  const std::string theirs = abiText(api->abi_major, api->abi_minor);
  if (auto st = checkAbiVersion(strCat("plugin ", label), api->abi_major, api->abi_minor, abi);
      !st.ok()) {
    const std::string wanted =
        api->abi_major != abi.major ? strCat(abi.major, ".x") : abiText(abi.major, abi.minor);
    return absl::FailedPreconditionError(
        strCat(toStd(st.message()), ": rebuild the plugin against ", kHeaderPath, " ", wanted));
  }
  if (api->struct_size < KRANE_PLUGIN_API_SIZE_1_0) {
    return absl::FailedPreconditionError(
        strCat("plugin ", label, ": its krane_plugin_api table is ", api->struct_size,
               " bytes, but plugin ABI ", theirs, " needs at least ",
               static_cast<size_t>(KRANE_PLUGIN_API_SIZE_1_0), " bytes"));
  }
  const std::pair<const char*, bool> required[] = {
      {"name", api->name != nullptr},
      {"init", api->init != nullptr},
      {"resource_types", api->resource_types != nullptr},
      {"apply", api->apply != nullptr},
      {"remove", api->remove != nullptr},
      {"sync_begin", api->sync_begin != nullptr},
      {"sync_end", api->sync_end != nullptr},
      {"observe", api->observe != nullptr},
      {"shutdown", api->shutdown != nullptr},
  };
  for (const auto& [field, present] : required) {
    if (!present) {
      return absl::FailedPreconditionError(
          strCat("plugin ", label, ": krane_plugin_api.", field, " is NULL"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status checkAbiVersion(std::string_view who, uint32_t major, uint32_t minor,
                             const PluginAbi& abi) {
  const std::string theirs = strCat(major, ".", minor);
  const std::string ours = abiText(abi.major, abi.minor);
  if (major != abi.major) {
    return absl::FailedPreconditionError(
        strCat(who, " speaks plugin ABI ", theirs, ", this agent speaks ", ours));
  }
  if (minor < abi.oldest_minor) {
    return absl::FailedPreconditionError(strCat(who, " speaks plugin ABI ", theirs,
                                                ", this agent speaks ", ours, " and accepts ",
                                                abiText(abi.major, abi.oldest_minor), " or newer"));
  }
  return absl::OkStatus();
}

// The krane_host handed to the plugin and what its callbacks need. Heap-allocated so that its
// address stays put for the plugin.
struct LoadedPlugin::HostState {
  krane_host c{};
  HostCallbacks callbacks;
  std::string plugin_name;

  static void log(void* context, krane_log_level level, const char* msg) {
    // Called from plugin code: nothing may escape.
    try {
      auto* self = static_cast<HostState*>(context);
      const std::string_view text = msg == nullptr ? std::string_view() : std::string_view(msg);
      PluginLogLevel ours = PluginLogLevel::kInfo;
      switch (level) {
        case KRANE_LOG_DEBUG:
          ours = PluginLogLevel::kDebug;
          break;
        case KRANE_LOG_WARN:
          ours = PluginLogLevel::kWarn;
          break;
        case KRANE_LOG_ERROR:
          ours = PluginLogLevel::kError;
          break;
        default:
          break;
      }
      self->emit(ours, text);
    } catch (...) {
    }
  }

  static void reportStatus(void* context, const uint8_t* report, size_t report_len) {
    try {
      auto* self = static_cast<HostState*>(context);
      plugin::v1::StatusReport parsed;
      if ((report == nullptr && report_len > 0) || report_len > INT32_MAX ||
          !parsed.ParseFromArray(report, static_cast<int>(report_len))) {
        self->emit(PluginLogLevel::kError,
                   strCat("status report dropped: ", report_len,
                          " bytes that are not a serialized krane.plugin.v1.StatusReport"));
        return;
      }
      if (!self->callbacks.report_status) {
        self->emit(PluginLogLevel::kWarn, "status report dropped: the host takes no reports");
        return;
      }
      self->callbacks.report_status(parsed);
    } catch (const std::exception& e) {
      spdlog::error("plugin={} status report callback failed: {}",
                    static_cast<HostState*>(context)->plugin_name, e.what());
    } catch (...) {
    }
  }

  void emit(PluginLogLevel level, std::string_view text) {
    if (callbacks.log) {
      callbacks.log(level, text);
      return;
    }
    switch (level) {
      case PluginLogLevel::kDebug:
        spdlog::debug("plugin={} {}", plugin_name, text);
        break;
      case PluginLogLevel::kInfo:
        spdlog::info("plugin={} {}", plugin_name, text);
        break;
      case PluginLogLevel::kWarn:
        spdlog::warn("plugin={} {}", plugin_name, text);
        break;
      case PluginLogLevel::kError:
        spdlog::error("plugin={} {}", plugin_name, text);
        break;
    }
  }
};

struct LoadedPlugin::Library {
  explicit Library(void* h) : handle(h) {}
  ~Library() {
    if (handle != nullptr) ::dlclose(handle);
  }
  void* handle;
};

absl::StatusOr<std::unique_ptr<LoadedPlugin>> LoadedPlugin::fromApi(const krane_plugin_api* api,
                                                                    std::string origin,
                                                                    const std::string& config_bytes,
                                                                    HostCallbacks callbacks,
                                                                    const PluginAbi& abi) {
  return create(nullptr, api, std::move(origin), config_bytes, std::move(callbacks), abi);
}

absl::StatusOr<std::unique_ptr<LoadedPlugin>> LoadedPlugin::create(
    std::unique_ptr<Library> library, const krane_plugin_api* api, std::string origin,
    const std::string& config_bytes, HostCallbacks callbacks, const PluginAbi& abi) {
  const std::string label = baseName(origin);
  if (auto status = validateApi(api, label, abi); !status.ok()) return status;

  std::unique_ptr<LoadedPlugin> plugin(new LoadedPlugin());
  plugin->api_ = api;
  plugin->origin_ = std::move(origin);
  plugin->name_ = api->name;
  plugin->version_ = api->version == nullptr ? "" : api->version;
  plugin->abi_major_ = api->abi_major;
  plugin->abi_minor_ = api->abi_minor;

  plugin->host_ = std::make_unique<HostState>();
  HostState& host = *plugin->host_;
  host.callbacks = std::move(callbacks);
  host.plugin_name = plugin->name_;
  host.c.struct_size = sizeof(krane_host);
  host.c.abi_major = abi.major;
  host.c.abi_minor = abi.minor;
  host.c.context = &host;
  host.c.log = &HostState::log;
  host.c.report_status = &HostState::reportStatus;

  const std::string who = strCat("plugin ", plugin->name_, " (", label, ")");
  krane_error err{};
  krane_status rc = KRANE_FATAL;
  try {
    rc = api->init(&host.c, reinterpret_cast<const uint8_t*>(config_bytes.data()),
                   config_bytes.size(), &plugin->instance_, &err);
  } catch (...) {
    return absl::InternalError(
        strCat(who, " let a C++ exception escape from init, which the plugin ABI forbids"));
  }
  if (rc != KRANE_OK) {
    return absl::Status(codeFor(rc), strCat(who, " failed to initialize: ", errorMessage(err)));
  }
  plugin->live_ = true;
  // From here on the destructor shuts the instance down (before unloading the library).
  plugin->library_ = std::move(library);

  const char* const* types = nullptr;
  try {
    types = api->resource_types(plugin->instance_);
  } catch (...) {
    return absl::InternalError(strCat(
        who, " let a C++ exception escape from resource_types, which the plugin ABI forbids"));
  }
  std::set<std::string> seen;
  for (size_t i = 0; types != nullptr && types[i] != nullptr; ++i) {
    std::string type = types[i];
    if (type.empty()) {
      return absl::FailedPreconditionError(strCat(who, " declares an empty resource type"));
    }
    if (!seen.insert(type).second) {
      return absl::FailedPreconditionError(
          strCat(who, " declares resource type \"", type, "\" twice"));
    }
    plugin->resource_types_.push_back(std::move(type));
  }
  return plugin;
}

absl::StatusOr<std::unique_ptr<LoadedPlugin>> loadPlugin(const std::string& path,
                                                         const std::string& config_bytes,
                                                         HostCallbacks callbacks,
                                                         const PluginAbi& abi) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) {
    const int error = errno;
    if (error == ENOENT) {
      return absl::NotFoundError(strCat("plugin file ", path, " does not exist"));
    }
    return absl::FailedPreconditionError(
        strCat("cannot read plugin file ", path, ": ", std::strerror(error)));
  }
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* error = ::dlerror();
    return absl::FailedPreconditionError(strCat("cannot load plugin ", path, ": ",
                                                error == nullptr ? "unknown dlopen error" : error));
  }
  auto library = std::make_unique<LoadedPlugin::Library>(handle);
  ::dlerror();
  void* symbol = ::dlsym(handle, KRANE_PLUGIN_ENTRY_SYMBOL);
  if (symbol == nullptr) {
    return absl::NotFoundError(strCat("plugin ", path, " does not export ",
                                      KRANE_PLUGIN_ENTRY_SYMBOL,
                                      ": it is not a Krane plugin, or its entry point is not "
                                      "exported (KRANE_DEFINE_PLUGIN or KRANE_PLUGIN_EXPORT)"));
  }
  const auto entry = reinterpret_cast<krane_plugin_entry_fn>(symbol);
  const krane_plugin_api* api = nullptr;
  try {
    api = entry();
  } catch (...) {
    return absl::InternalError(
        strCat("plugin ", path, " let a C++ exception escape from ", KRANE_PLUGIN_ENTRY_SYMBOL));
  }
  return LoadedPlugin::create(std::move(library), api, path, config_bytes, std::move(callbacks),
                              abi);
}

LoadedPlugin::~LoadedPlugin() {
  shutdown();
  // library_ is released after this body, once the instance is gone.
}

void LoadedPlugin::shutdown() {
  if (!live_) return;
  live_ = false;
  try {
    api_->shutdown(instance_);
  } catch (...) {
    spdlog::error("plugin={} let a C++ exception escape from shutdown", name_);
  }
  instance_ = nullptr;
}

template <typename Call>
absl::Status LoadedPlugin::call(std::string_view what, Call&& fn) {
  if (!live_) {
    return absl::FailedPreconditionError(strCat("plugin ", name_, ": ", what, " after shutdown"));
  }
  krane_error err{};
  krane_status rc = KRANE_FATAL;
  try {
    rc = fn(&err);
  } catch (...) {
    return absl::InternalError(strCat("plugin ", name_, " let a C++ exception escape from ", what,
                                      ", which the plugin ABI forbids"));
  }
  if (rc == KRANE_OK) return absl::OkStatus();
  std::string message = strCat("plugin ", name_, ": ", what, ": ", errorMessage(err));
  if (rc != KRANE_RETRYABLE && rc != KRANE_INVALID && rc != KRANE_FATAL) {
    strAppend(&message, " (unknown status code ", static_cast<int32_t>(rc), ")");
  }
  return absl::Status(codeFor(rc), message);
}

absl::Status LoadedPlugin::changeCall(std::string_view what, const cluster::v1::Change& change,
                                      krane_status (*fn)(void*, const uint8_t*, size_t,
                                                         krane_error*)) {
  const std::string bytes = change.SerializeAsString();
  const auto& resource = change.resource();
  return call(strCat(what, " ", resource.type(), "/", resource.id(), " version ", change.version()),
              [&](krane_error* err) {
                return fn(instance_, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
                          err);
              });
}

absl::Status LoadedPlugin::apply(const cluster::v1::Change& change) {
  return changeCall("apply", change, api_->apply);
}

absl::Status LoadedPlugin::remove(const cluster::v1::Change& change) {
  return changeCall("remove", change, api_->remove);
}

absl::Status LoadedPlugin::syncBegin(uint64_t snapshot_version) {
  return call(strCat("sync_begin ", snapshot_version),
              [&](krane_error* err) { return api_->sync_begin(instance_, snapshot_version, err); });
}

absl::Status LoadedPlugin::syncEnd(const plugin::v1::SyncEnd& sync_end) {
  const std::string bytes = sync_end.SerializeAsString();
  return call(strCat("sync_end ", sync_end.snapshot_version()), [&](krane_error* err) {
    return api_->sync_end(instance_, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
                          err);
  });
}

absl::Status LoadedPlugin::observe() {
  return call("observe", [&](krane_error* err) { return api_->observe(instance_, err); });
}

PluginRegistry::~PluginRegistry() {
  while (!plugins_.empty()) plugins_.pop_back();
}

absl::Status PluginRegistry::load(const std::string& path, const std::string& config_bytes,
                                  HostCallbacks callbacks, const PluginAbi& abi) {
  auto plugin = loadPlugin(path, config_bytes, std::move(callbacks), abi);
  if (!plugin.ok()) return plugin.status();
  return add(std::move(*plugin));
}

absl::Status PluginRegistry::add(std::unique_ptr<LoadedPlugin> plugin) {
  for (const auto& type : plugin->resourceTypes()) {
    if (auto it = owners_.find(type); it != owners_.end()) {
      const LoadedPlugin& other = *it->second;
      return absl::AlreadyExistsError(
          strCat("plugins ", other.name(), " (", baseName(other.origin()), ") and ", plugin->name(),
                 " (", baseName(plugin->origin()), ") both claim resource type \"", type,
                 "\": each type has exactly one owner; ", plugin->name(), " is not loaded"));
    }
  }
  for (const auto& type : plugin->resourceTypes()) owners_[type] = plugin.get();
  plugins_.push_back(std::move(plugin));
  return absl::OkStatus();
}

LoadedPlugin* PluginRegistry::owner(const std::string& resource_type) const {
  auto it = owners_.find(resource_type);
  return it == owners_.end() ? nullptr : it->second;
}

}  // namespace krane::agent
