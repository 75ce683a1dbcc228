/*
 * krane_plugin.h: the binary interface between Krane and a resource plugin.
 *
 * README
 * ======
 *
 * A plugin is a shared object (`lib<name>.so`) that exports exactly one function,
 *
 *     const krane_plugin_api* krane_plugin_entry(void);
 *
 * (its name is KRANE_PLUGIN_ENTRY_SYMBOL). It returns a pointer to a constant table that lives
 * as long as the library stays loaded: a small header (size, ABI version), the plugin's name and
 * version, then function pointers. The entry point is a function rather than an exported data
 * symbol because dlsym is only guaranteed to work for functions.
 *
 * This header is pure C (C99 or later, or C++), includes nothing beyond <stdint.h> and
 * <stddef.h>, and depends on nothing else in Krane. C++ plugins normally use plugins/sdk, which
 * fills the table from a small class; plugins in other languages fill it by hand.
 *
 * Versions
 * --------
 * The ABI is versioned major.minor (KRANE_PLUGIN_ABI_MAJOR / _MINOR below).
 *  - The loader refuses a plugin whose major differs from its own, and one whose minor is older
 *    than the oldest minor it still accepts, with a message naming both versions.
 *  - Fields of krane_plugin_api and krane_host are ONLY EVER APPENDED. A field is never removed,
 *    reordered, resized or given another meaning within one major version; doing so is a major
 *    bump. Appending a field is a minor bump.
 *  - `struct_size` is the sizeof() the other side was compiled with. A reader never touches a
 *    field that does not lie entirely within `struct_size` bytes: a newer loader treats a field
 *    an older plugin does not have as absent, and an older loader simply ignores fields appended
 *    after its time. The same holds for the plugin reading krane_host.
 *  - krane_error is fixed for the whole major version.
 *
 * Payloads
 * --------
 * Structured data crosses as serialized protobuf bytes (proto/krane/...):
 *  - apply, remove: one krane.cluster.v1.Change (op APPLY for apply, DELETE for remove);
 *  - sync_end:      one krane.plugin.v1.SyncEnd listing, per resource type of the plugin, the ids
 *                   the full sync contained (the plugin deletes what it manages and is not listed);
 *  - report_status: one krane.plugin.v1.StatusReport;
 *  - init:          the plugin's configuration, in whatever format the plugin documents.
 * Byte buffers are owned by the caller and valid only for the duration of the call.
 *
 * Errors
 * ------
 * Every call that can fail returns a krane_status and, when it is not KRANE_OK, fills the
 * krane_error the host passed in (zero-initialized by the host) with the same code and a
 * NUL-terminated message, truncated to fit. The return value is authoritative. A plugin never
 * lets a C++ exception, a longjmp or any other non-local exit leave one of these functions.
 *
 *   KRANE_OK         done.
 *   KRANE_RETRYABLE  not done now, may succeed later unchanged (the cluster is unreachable, a
 *                    conflict, a timeout); the host redelivers with backoff.
 *   KRANE_INVALID    this payload can never succeed (malformed, unsupported); only a newer
 *                    version of the resource can fix it. The host parks it and reports it.
 *   KRANE_FATAL      the plugin instance is broken (or failed in a way it cannot classify);
 *                   the host treats the call as failed and may restart the plugin.
 * Values the host does not know count as KRANE_FATAL.
 *
 * Threads and lifetime
 * --------------------
 *  - init is called once per instance, before anything else; shutdown once, last. After
 *    shutdown returns the instance pointer is dead and the host callbacks must not be used.
 *  - apply, remove and observe may be called concurrently from several threads, never for the
 *    same resource (type, id) at once. init, sync_begin, sync_end and shutdown are called with
 *    no other call of the same instance in flight.
 *  - One library may be loaded once and hold several instances; keep state in the instance.
 *  - The array returned by resource_types and the strings in it belong to the instance and stay
 *    valid and unchanged until shutdown. name and version belong to the library.
 *  - The host callbacks may be called from any thread, during any call or between calls, from
 *    the start of init until shutdown returns. The krane_host passed to init stays valid that
 *    long. Callbacks copy what they need and return quickly; they never call back into the
 *    plugin.
 *
 * Version history
 * ---------------
 *   1.0  first version.
 */
#ifndef KRANE_PLUGINS_ABI_KRANE_PLUGIN_H_
#define KRANE_PLUGINS_ABI_KRANE_PLUGIN_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KRANE_PLUGIN_ABI_MAJOR 1
#define KRANE_PLUGIN_ABI_MINOR 0

/* The name of the one symbol a plugin exports. */
#define KRANE_PLUGIN_ENTRY_SYMBOL "krane_plugin_entry"

/* Size of krane_error.message, including the terminating NUL. */
#define KRANE_ERROR_MESSAGE_SIZE 1024

/* Marks the entry point as exported when the plugin is built with -fvisibility=hidden. */
#if defined(__GNUC__) || defined(__clang__)
#define KRANE_PLUGIN_EXPORT __attribute__((visibility("default")))
#else
#define KRANE_PLUGIN_EXPORT
#endif

/* Return codes; see "Errors" above. The values are part of the ABI. */
typedef enum krane_status {
  KRANE_OK = 0,
  KRANE_RETRYABLE = 1,
  KRANE_INVALID = 2,
  KRANE_FATAL = 3,
  /* Keeps the enum 32 bits wide on every compiler. */
  KRANE_STATUS_MAX_ = 0x7fffffff
} krane_status;

typedef enum krane_log_level {
  KRANE_LOG_DEBUG = 0,
  KRANE_LOG_INFO = 1,
  KRANE_LOG_WARN = 2,
  KRANE_LOG_ERROR = 3,
  KRANE_LOG_LEVEL_MAX_ = 0x7fffffff
} krane_log_level;

/* Filled by the plugin when a call fails. Allocated and zeroed by the host. */
typedef struct krane_error {
  int32_t code; /* the krane_status the call returned */
  char message[KRANE_ERROR_MESSAGE_SIZE];
} krane_error;

/* What the host offers the plugin. Fields are only ever appended (see "Versions"). */
typedef struct krane_host {
  /* sizeof(krane_host) as the host was compiled. */
  uint32_t struct_size;
  /* The ABI version the host speaks. */
  uint16_t abi_major;
  uint16_t abi_minor;

  /* Passed back unchanged as the first argument of every callback. */
  void* context;

  /* One log line; `msg` is NUL-terminated and only valid during the call. */
  void (*log)(void* context, krane_log_level level, const char* msg);

  /* What the plugin observed: one serialized krane.plugin.v1.StatusReport. The host copies it
   * and forwards it to the control plane (coalesced, retried); a report it cannot parse is
   * logged and dropped. */
  void (*report_status)(void* context, const uint8_t* report, size_t report_len);

  /* ABI 1.0 ends here; append new fields below this line only. */
} krane_host;

/* What the plugin offers the host. Fields are only ever appended (see "Versions"). */
typedef struct krane_plugin_api {
  /* sizeof(krane_plugin_api) as the plugin was compiled. */
  uint32_t struct_size;
  /* The ABI version the plugin was built against: KRANE_PLUGIN_ABI_MAJOR / _MINOR. */
  uint16_t abi_major;
  uint16_t abi_minor;

  /* e.g. "deployment" and "1.4.2"; NUL-terminated, owned by the library. */
  const char* name;
  const char* version;

  /* Creates an instance from `config` (config_len bytes, not NUL-terminated) and stores it in
   * *instance. On failure, returns non-OK, fills *err and leaves nothing to shut down. */
  krane_status (*init)(const krane_host* host, const uint8_t* config, size_t config_len,
                       void** instance, krane_error* err);

  /* The resource types this instance owns, as a NULL-terminated array. Each type has exactly
   * one owner among the plugins an agent loads. */
  const char* const* (*resource_types)(void* instance);

  /* Make the cluster match one serialized krane.cluster.v1.Change (op APPLY). Idempotent: the
   * same change may be delivered more than once. */
  krane_status (*apply)(void* instance, const uint8_t* change, size_t change_len, krane_error* err);

  /* Remove everything made for the resource of one serialized krane.cluster.v1.Change (op
   * DELETE; only type, id and region are set). Removing something absent is OK. */
  krane_status (*remove)(void* instance, const uint8_t* change, size_t change_len,
                         krane_error* err);

  /* A full sync starts: apply calls up to sync_end carry the whole desired state read from one
   * snapshot at `snapshot_version`. */
  krane_status (*sync_begin)(void* instance, uint64_t snapshot_version, krane_error* err);

  /* The full sync ended: one serialized krane.plugin.v1.SyncEnd with the ids of each of the
   * plugin's types that the sync contained. The plugin deletes what it manages that is not
   * listed (garbage collection). */
  krane_status (*sync_end)(void* instance, const uint8_t* sync_end_ids, size_t len,
                           krane_error* err);

  /* Report the status of what the plugin manages now, through host->report_status (during the
   * call or shortly after, from any thread). */
  krane_status (*observe)(void* instance, krane_error* err);

  /* Stops background work and frees the instance. Cannot fail. */
  void (*shutdown)(void* instance);

  /* ABI 1.0 ends here; append new fields below this line only. */
} krane_plugin_api;

/* Bytes of krane_plugin_api and krane_host that ABI 1.0 defines. A 1.x peer is at least this
 * large; a reader uses these, not sizeof, to check the peer's struct_size. */
#define KRANE_PLUGIN_API_SIZE_1_0 (offsetof(krane_plugin_api, shutdown) + sizeof(void (*)(void*)))
#define KRANE_HOST_SIZE_1_0 \
  (offsetof(krane_host, report_status) + sizeof(void (*)(void*, const uint8_t*, size_t)))

/* The one exported function of a plugin; see KRANE_PLUGIN_ENTRY_SYMBOL. */
typedef const krane_plugin_api* (*krane_plugin_entry_fn)(void);
KRANE_PLUGIN_EXPORT const krane_plugin_api* krane_plugin_entry(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KRANE_PLUGINS_ABI_KRANE_PLUGIN_H_ */
