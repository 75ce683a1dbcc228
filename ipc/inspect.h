// Renders a cursor store snapshot for people (`krane inspect --state-dir DIR`) and for tools
// (`--json`). Pure functions of the snapshot: no I/O, callable from any thread.
#pragma once

#include <string>

#include "ipc/cursor_store.h"

namespace krane::ipc {

// A few aligned sections: store, watermark, resources, plugin slots, parked events (the oldest
// 50; --json has them all).
std::string renderText(const CursorSnapshot& snapshot);

// One JSON object (2-space indented, newline-terminated); every number as a JSON number, times
// both as Unix milliseconds and as RFC 3339 UTC strings.
std::string renderJson(const CursorSnapshot& snapshot);

}  // namespace krane::ipc
