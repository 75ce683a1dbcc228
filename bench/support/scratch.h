// A scratch database for the benchmarks that drive workflow services in process: fresh,
// migrated, with what deployments and sentinels belong to (workspace 'ws', project 'proj', app
// 'app', production environment 'prod').
#pragma once

#include <memory>

#include "controlplane/db/pool.h"

namespace krane::bench {

// A fresh database on the tests' scratch MariaDB, migrated and seeded; throws on failure.
std::shared_ptr<db::Pool> seededScratchDatabase();

}  // namespace krane::bench
