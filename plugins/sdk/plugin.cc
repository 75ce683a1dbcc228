#include "plugins/sdk/plugin.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>

namespace krane::sdk {

namespace {

// What the host's `void* instance` points to.
struct Instance {
  explicit Instance(const krane_host* h) : host(h) {}
  Host host;
  std::unique_ptr<Plugin> plugin;
  // resource_types() hands out pointers into these; they never change after init.
  std::vector<std::string> types;
  std::vector<const char*> type_ptrs;
};

Instance* asInstance(void* instance) { return static_cast<Instance*>(instance); }

// Writes "<prefix><text>" into err, truncated, without allocating (it also runs in catch blocks
// after std::bad_alloc).
krane_status fail(krane_error* err, krane_status code, const char* prefix, const char* text,
                  size_t text_len) noexcept {
  if (err == nullptr) return code;
  err->code = code;
  std::snprintf(err->message, sizeof(err->message), "%s%.*s", prefix,
                static_cast<int>(std::min<size_t>(text_len, sizeof(err->message))), text);
  return code;
}

krane_status fail(krane_error* err, krane_status code, const char* prefix,
                  const char* text) noexcept {
  return fail(err, code, prefix, text, std::strlen(text));
}

krane_status fromStatus(krane_error* err, const absl::Status& status) {
  const krane_status code = toKraneStatus(status);
  if (code == KRANE_OK) return KRANE_OK;
  const std::string code_name = absl::StatusCodeToString(status.code());
  const absl::string_view message = status.message();
  std::string text = code_name;
  if (!message.empty()) {
    text += ": ";
    text.append(message.data(), message.size());
  }
  return fail(err, code, "", text.data(), text.size());
}

// Runs one call of the class; whatever it throws becomes KRANE_FATAL with the exception's text.
template <typename F>
krane_status guarded(const char* call, krane_error* err, F&& body) noexcept {
  char prefix[64];
  try {
    return body();
  } catch (const std::exception& e) {
    std::snprintf(prefix, sizeof(prefix), "%s threw an exception: ", call);
    return fail(err, KRANE_FATAL, prefix, e.what());
  } catch (...) {
    std::snprintf(prefix, sizeof(prefix), "%s threw an exception: ", call);
    return fail(err, KRANE_FATAL, prefix, "(not a std::exception)");
  }
}

template <typename Message>
krane_status parse(Message& message, const uint8_t* data, size_t len, const char* call,
                   krane_error* err) {
  if ((data == nullptr && len > 0) || len > static_cast<size_t>(INT32_MAX) ||
      !message.ParseFromArray(data, static_cast<int>(len))) {
    char text[256];
    std::snprintf(text, sizeof(text), "%s: the payload (%zu bytes) is not a serialized %s", call,
                  len, Message::descriptor()->full_name().c_str());
    return fail(err, KRANE_INVALID, "", text);
  }
  return KRANE_OK;
}

krane_status noInstance(const char* call, krane_error* err) {
  char text[128];
  std::snprintf(text, sizeof(text), "%s called without an instance (init failed or not run)", call);
  return fail(err, KRANE_FATAL, "", text);
}

krane_status changeCall(const char* call, void* instance, const uint8_t* data, size_t len,
                        krane_error* err,
                        absl::Status (Plugin::*method)(const cluster::v1::Change&)) {
  return guarded(call, err, [&]() -> krane_status {
    if (instance == nullptr) return noInstance(call, err);
    cluster::v1::Change change;
    if (const krane_status rc = parse(change, data, len, call, err); rc != KRANE_OK) return rc;
    return fromStatus(err, (asInstance(instance)->plugin.get()->*method)(change));
  });
}

}  // namespace

krane_status toKraneStatus(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return KRANE_OK;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kResourceExhausted:
      return KRANE_RETRYABLE;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kUnimplemented:
      return KRANE_INVALID;
    default:
      return KRANE_FATAL;
  }
}

void Host::log(LogLevel level, std::string_view message) const {
  krane_log_level c_level = KRANE_LOG_INFO;
  switch (level) {
    case LogLevel::kDebug:
      c_level = KRANE_LOG_DEBUG;
      break;
    case LogLevel::kInfo:
      c_level = KRANE_LOG_INFO;
      break;
    case LogLevel::kWarn:
      c_level = KRANE_LOG_WARN;
      break;
    case LogLevel::kError:
      c_level = KRANE_LOG_ERROR;
      break;
  }
  if (host_->log == nullptr) return;
  const std::string text(message);  // NUL-terminated copy
  host_->log(host_->context, c_level, text.c_str());
}

void Host::reportStatus(const plugin::v1::StatusReport& report) const {
  if (host_->report_status == nullptr) return;
  const std::string bytes = report.SerializeAsString();
  host_->report_status(host_->context, reinterpret_cast<const uint8_t*>(bytes.data()),
                       bytes.size());
}

void Host::reportResourceStatus(const cluster::v1::ReportResourceStatusRequest& status) const {
  plugin::v1::StatusReport report;
  *report.mutable_resource() = status;
  reportStatus(report);
}

namespace internal {

krane_status initInstance(PluginFactory factory, const krane_host* host, const uint8_t* config,
                          size_t config_len, void** instance, krane_error* err) {
  return guarded("init", err, [&]() -> krane_status {
    if (instance == nullptr) return fail(err, KRANE_FATAL, "", "init: no place for the instance");
    *instance = nullptr;
    if (host == nullptr || host->struct_size < KRANE_HOST_SIZE_1_0) {
      return fail(err, KRANE_FATAL, "",
                  "init: the host's krane_host table is missing or smaller than ABI 1.0");
    }
    if (host->abi_major != KRANE_PLUGIN_ABI_MAJOR) {
      char text[160];
      std::snprintf(text, sizeof(text), "init: the host speaks plugin ABI %u.%u, this plugin %d.%d",
                    host->abi_major, host->abi_minor, KRANE_PLUGIN_ABI_MAJOR,
                    KRANE_PLUGIN_ABI_MINOR);
      return fail(err, KRANE_FATAL, "", text);
    }
    auto state = std::make_unique<Instance>(host);
    state->plugin = factory();
    const std::string_view config_text(reinterpret_cast<const char*>(config),
                                       config == nullptr ? 0 : config_len);
    if (const krane_status rc = fromStatus(err, state->plugin->init(state->host, config_text));
        rc != KRANE_OK) {
      return rc;
    }
    state->types = state->plugin->resourceTypes();
    for (const auto& type : state->types) state->type_ptrs.push_back(type.c_str());
    state->type_ptrs.push_back(nullptr);
    *instance = state.release();
    return KRANE_OK;
  });
}

const char* const* resourceTypes(void* instance) {
  static const char* const kNone[] = {nullptr};
  if (instance == nullptr) return kNone;
  return asInstance(instance)->type_ptrs.data();
}

krane_status apply(void* instance, const uint8_t* change, size_t len, krane_error* err) {
  return changeCall("apply", instance, change, len, err, &Plugin::apply);
}

krane_status remove(void* instance, const uint8_t* change, size_t len, krane_error* err) {
  return changeCall("remove", instance, change, len, err, &Plugin::remove);
}

krane_status syncBegin(void* instance, uint64_t snapshot_version, krane_error* err) {
  return guarded("sync_begin", err, [&]() -> krane_status {
    if (instance == nullptr) return noInstance("sync_begin", err);
    return fromStatus(err, asInstance(instance)->plugin->syncBegin(snapshot_version));
  });
}

krane_status syncEnd(void* instance, const uint8_t* ids, size_t len, krane_error* err) {
  return guarded("sync_end", err, [&]() -> krane_status {
    if (instance == nullptr) return noInstance("sync_end", err);
    plugin::v1::SyncEnd sync_end;
    if (const krane_status rc = parse(sync_end, ids, len, "sync_end", err); rc != KRANE_OK) {
      return rc;
    }
    return fromStatus(err, asInstance(instance)->plugin->syncEnd(sync_end));
  });
}

krane_status observe(void* instance, krane_error* err) {
  return guarded("observe", err, [&]() -> krane_status {
    if (instance == nullptr) return noInstance("observe", err);
    return fromStatus(err, asInstance(instance)->plugin->observe());
  });
}

void shutdown(void* instance) {
  std::unique_ptr<Instance> state(asInstance(instance));
  if (state == nullptr) return;
  // shutdown cannot fail: what the class throws is logged and goes no further.
  try {
    state->plugin->shutdown();
  } catch (const std::exception& e) {
    try {
      state->host.log(LogLevel::kError, std::string("shutdown threw an exception: ") + e.what());
    } catch (...) {
    }
  } catch (...) {
    try {
      state->host.log(LogLevel::kError, "shutdown threw an exception (not a std::exception)");
    } catch (...) {
    }
  }
}

}  // namespace internal

}  // namespace krane::sdk
