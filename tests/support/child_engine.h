// The start of a crash test's child process (a krane-ctrl stand-in that serves workflow
// services until it is killed): a pool on the test's database, engine options of one worker.
#pragma once

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "common/strings.h"
#include "controlplane/db/pool.h"
#include "controlplane/workflow/engine.h"

namespace krane::testing {

// The DSN text a test gives its child (mysql://user@host:port/db).
inline std::string childDsn(const db::Dsn& dsn) {
  return strCat("mysql://", dsn.user, "@", dsn.host, ":", dsn.port, "/", dsn.database);
}

// A pool on `dsn_text` (mysql://user@host:port/db); nullptr, with the reason on stderr, when
// there is none.
inline std::shared_ptr<db::Pool> childPool(const std::string& dsn_text) {
  auto dsn = db::parseDsn(dsn_text);
  if (!dsn.ok()) {
    std::fprintf(stderr, "dsn: %s\n", std::string(toStd(dsn.status().message())).c_str());
    return nullptr;
  }
  auto pool = db::Pool::create(*dsn);
  if (!pool.ok()) {
    std::fprintf(stderr, "pool: %s\n", std::string(toStd(pool.status().message())).c_str());
    return nullptr;
  }
  return *pool;
}

// Worker `worker`, a short lease (so that another child takes over soon after a kill), fast polls.
inline workflow::EngineOptions childEngineOptions(const std::string& worker, int lease_ms) {
  workflow::EngineOptions options;
  options.worker_id = worker;
  options.lease = std::chrono::milliseconds(lease_ms);
  options.poll_interval = std::chrono::milliseconds(20);
  return options;
}

}  // namespace krane::testing
