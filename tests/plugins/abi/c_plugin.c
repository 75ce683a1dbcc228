/* A plugin written in C99, compiled as C: proves that krane_plugin.h is plain C and that the
 * loader works with a hand-filled table. It owns type "c_thing", rejects an empty payload as
 * KRANE_INVALID and accepts anything else. Exposed under its own name (not
 * krane_plugin_entry) so that tests link it into the test binary and load it in process. */
#include "tests/plugins/abi/c_plugin.h"

#include <stdio.h>
#include <string.h>

#include "plugins/abi/krane_plugin.h"

/* The 1.0 layout: the header fields first, at fixed offsets, on every platform. */
typedef char krane_check_struct_size_first[offsetof(krane_plugin_api, struct_size) == 0 ? 1 : -1];
typedef char krane_check_major_second[offsetof(krane_plugin_api, abi_major) == 4 ? 1 : -1];
typedef char krane_check_minor_third[offsetof(krane_plugin_api, abi_minor) == 6 ? 1 : -1];
typedef char krane_check_host_size_first[offsetof(krane_host, struct_size) == 0 ? 1 : -1];
typedef char krane_check_status_is_32_bits[sizeof(krane_status) == 4 ? 1 : -1];

typedef struct c_instance {
  const krane_host* host;
  unsigned applied;
} c_instance;

static c_instance the_instance;
static const char* const c_types[] = {"c_thing", NULL};

static krane_status c_init(const krane_host* host, const uint8_t* config, size_t config_len,
                           void** instance, krane_error* err) {
  (void)config;
  if (config_len > 0) {
    err->code = KRANE_INVALID;
    snprintf(err->message, sizeof(err->message), "c_plugin takes no config (got %u bytes)",
             (unsigned)config_len);
    return KRANE_INVALID;
  }
  the_instance.host = host;
  the_instance.applied = 0;
  *instance = &the_instance;
  host->log(host->context, KRANE_LOG_INFO, "c_plugin ready");
  return KRANE_OK;
}

static const char* const* c_resource_types(void* instance) {
  (void)instance;
  return c_types;
}

static krane_status c_apply(void* instance, const uint8_t* change, size_t len, krane_error* err) {
  (void)change;
  if (len == 0) {
    err->code = KRANE_INVALID;
    strncpy(err->message, "c_plugin: empty change", sizeof(err->message) - 1);
    return KRANE_INVALID;
  }
  ((c_instance*)instance)->applied++;
  return KRANE_OK;
}

static krane_status c_sync_begin(void* instance, uint64_t snapshot_version, krane_error* err) {
  (void)instance;
  (void)snapshot_version;
  (void)err;
  return KRANE_OK;
}

static krane_status c_sync_end(void* instance, const uint8_t* ids, size_t len, krane_error* err) {
  (void)instance;
  (void)ids;
  (void)len;
  (void)err;
  return KRANE_OK;
}

static krane_status c_observe(void* instance, krane_error* err) {
  (void)instance;
  /* Not a StatusReport: the host must drop it without crashing. */
  static const uint8_t garbage[] = {0xff, 0xff, 0xff};
  (void)err;
  the_instance.host->report_status(the_instance.host->context, garbage, sizeof(garbage));
  return KRANE_OK;
}

static void c_shutdown(void* instance) { ((c_instance*)instance)->host = NULL; }

static const krane_plugin_api c_api = {
    sizeof(krane_plugin_api),
    KRANE_PLUGIN_ABI_MAJOR,
    KRANE_PLUGIN_ABI_MINOR,
    "c_plugin",
    "0.1.0",
    c_init,
    c_resource_types,
    c_apply,
    c_apply,
    c_sync_begin,
    c_sync_end,
    c_observe,
    c_shutdown,
};

const krane_plugin_api* krane_c_plugin_api(void) { return &c_api; }

unsigned krane_c_plugin_applied(void) { return the_instance.applied; }
