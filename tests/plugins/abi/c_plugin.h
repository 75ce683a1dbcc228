/* The C test plugin of c_plugin.c, linked into tests and loaded in process. */
#ifndef KRANE_TESTS_PLUGINS_ABI_C_PLUGIN_H_
#define KRANE_TESTS_PLUGINS_ABI_C_PLUGIN_H_

#include "plugins/abi/krane_plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

const krane_plugin_api* krane_c_plugin_api(void);
/* How many changes the instance applied. */
unsigned krane_c_plugin_applied(void);

#ifdef __cplusplus
}
#endif

#endif /* KRANE_TESTS_PLUGINS_ABI_C_PLUGIN_H_ */
