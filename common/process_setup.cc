#include "common/process_setup.h"

#include <absl/synchronization/mutex.h>

namespace krane {

void setUpProcess() { absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore); }

}  // namespace krane
