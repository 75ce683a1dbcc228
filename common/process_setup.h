// Process-wide settings every Krane binary makes before it starts threads.
#pragma once

namespace krane {

// Turns off Abseil's mutex deadlock detection. The Debian build of Abseil is compiled as a
// debug build, so every absl::Mutex lock (gRPC takes several per message) also updates a
// process-wide lock graph under a global lock: a few percent of krane-ctrl's CPU on a busy
// change feed, and contention between its threads. Krane's own locks are std::mutex, and the
// tests run the same binaries, so nothing Krane relies on is lost.
void setUpProcess();

}  // namespace krane
