#include "tests/support/control_plane.h"

#include <catch2/catch.hpp>

#include "common/strings.h"
#include "controlplane/api/auth.h"
#include "controlplane/db/migrate.h"
#include "tests/support/mariadb.h"
#include "tests/support/matchers.h"
#include "tests/support/sentinel_reports.h"

namespace krane::testing {

TestControlPlane::TestControlPlane(std::vector<std::string> regions) {
  dsn_ = ScratchMariaDb::instance().freshDatabase();
  auto pool = db::Pool::create(dsn_, {.max_connections = 8});
  if (!pool.ok()) throw std::runtime_error(std::string(pool.status().message()));
  pool_ = *pool;
  auto migrated = db::Migrator(pool_, *db::builtinMigrations()).migrate();
  if (!migrated.ok()) throw std::runtime_error(std::string(migrated.status().message()));
  auto conn = pool_->acquire();
  for (const auto& region : regions) {
    auto st = (*conn)->exec("INSERT INTO regions (id, display_name, created_at) VALUES (?, ?, 1)",
                            {region, region});
    if (!st.ok()) throw std::runtime_error(std::string(st.status().message()));
  }
}

TestControlPlane::~TestControlPlane() {
  for (auto& r : replicas_) {
    if (r) r->stop();
  }
}

ctrl::Server& TestControlPlane::startReplica(std::function<void(ctrl::CtrlConfig&)> adjust) {
  ctrl::CtrlConfig config;
  config.listen = "127.0.0.1:0";
  config.http_listen = "127.0.0.1:0";
  config.database.dsn = strCat("mysql://root@127.0.0.1:", dsn_.port, "/", dsn_.database);
  config.auth.operator_tokens = {kOperatorToken};
  config.auth.agent_token_cache = std::chrono::milliseconds(0);
  config.feed.bookmark_interval = std::chrono::milliseconds(500);
  if (watchListener()) config.feed.watch_listen = "127.0.0.1:0";
  if (adjust) adjust(config);
  auto server = std::make_unique<ctrl::Server>(config);
  auto st = server->start();
  if (!st.ok()) throw std::runtime_error(std::string(st.message()));
  replicas_.push_back(std::move(server));
  return *replicas_.back();
}

void TestControlPlane::stopReplica(size_t index) { replicas_.at(index)->stop(); }

void TestControlPlane::seedApp() {
  std::vector<std::string> statements = appTenancySql();
  statements.push_back(
      "INSERT INTO environment_regions (environment_id, region_id, replicas, created_at)"
      " VALUES ('prod', 'eu-1', 1, 1), ('prod', 'us-1', 1, 1)");
  for (const std::string& sql : statements) {
    REQUIRE_THAT((*pool_->acquire())->exec(sql, {}), IsOk());
  }
}

std::string TestControlPlane::agentToken(const std::string& region) {
  auto it = tokens_.find(region);
  if (it != tokens_.end()) return it->second;
  api::AgentTokens tokens(pool_);
  auto created = tokens.create(region, "test");
  if (!created.ok()) throw std::runtime_error(std::string(created.status().message()));
  tokens_[region] = created->secret;
  return created->secret;
}

namespace {

grpc::ChannelArguments channelArgs(bool small_window) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // its own connection, as a real agent has
  if (small_window) {
    // The window stays at 64 KiB: without probing, it does not grow to take in megabytes the
    // application has not read.
    args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 64 * 1024);
  }
  return args;
}

}  // namespace

std::shared_ptr<grpc::Channel> TestControlPlane::channel(size_t replica, bool small_window) {
  return grpc::CreateCustomChannel(strCat("127.0.0.1:", replicas_.at(replica)->grpcPort()),
                                   grpc::InsecureChannelCredentials(), channelArgs(small_window));
}

bool TestControlPlane::watchListener() {
  const char* env = std::getenv("KRANE_TEST_WATCH_LISTENER");
  return env != nullptr && std::string(env) == "1";
}

std::shared_ptr<grpc::Channel> TestControlPlane::watchChannel(size_t replica, bool small_window) {
  const int port = replicas_.at(replica)->watchPort();
  if (!watchListener() || port == 0) return channel(replica, small_window);
  return grpc::CreateCustomChannel(strCat("127.0.0.1:", port), grpc::InsecureChannelCredentials(),
                                   channelArgs(small_window));
}

std::unique_ptr<cluster::v1::ClusterService::Stub> TestControlPlane::watchStub(size_t replica,
                                                                               bool small_window) {
  return cluster::v1::ClusterService::NewStub(watchChannel(replica, small_window));
}

std::unique_ptr<krane::api::v1::ResourceService::Stub> TestControlPlane::resources(size_t replica) {
  return krane::api::v1::ResourceService::NewStub(channel(replica));
}
std::unique_ptr<krane::api::v1::AgentService::Stub> TestControlPlane::agents(size_t replica) {
  return krane::api::v1::AgentService::NewStub(channel(replica));
}
std::unique_ptr<cluster::v1::ClusterService::Stub> TestControlPlane::cluster(size_t replica) {
  return cluster::v1::ClusterService::NewStub(channel(replica));
}

std::unique_ptr<grpc::ClientContext> TestControlPlane::withToken(const std::string& token,
                                                                 std::chrono::seconds deadline) {
  auto context = std::make_unique<grpc::ClientContext>();
  if (!token.empty()) context->AddMetadata("authorization", "Bearer " + token);
  context->set_deadline(std::chrono::system_clock::now() + deadline);
  return context;
}

WatchRecorder::WatchRecorder(std::shared_ptr<grpc::Channel> channel, const std::string& token,
                             const std::string& region, uint64_t version,
                             std::vector<std::string> types, bool accept_batches)
    : stub_(cluster::v1::ClusterService::NewStub(channel)) {
  if (!token.empty()) context_.AddMetadata("authorization", "Bearer " + token);
  cluster::v1::WatchRequest request;
  request.set_region(region);
  request.set_version(version);
  request.set_agent_id("test-agent");
  request.set_accept_batches(accept_batches);
  for (const auto& t : types) request.add_resource_types(t);
  reader_ = std::thread([this, request] {
    auto reader = stub_->Watch(&context_, request);
    cluster::v1::WatchEvent message;
    auto record = [&](const cluster::v1::WatchEvent& event) {
      if (event.has_change()) last_version_ = std::max(last_version_, event.change().version());
      if (event.has_bookmark()) last_version_ = std::max(last_version_, event.bookmark().version());
      if (event.has_sync_end()) last_version_ = std::max(last_version_, event.sync_end().version());
      events_.push_back(event);
    };
    while (reader->Read(&message)) {
      std::lock_guard lock(mutex_);
      ++messages_;
      if (message.has_batch()) {
        ++batches_;
        largest_batch_bytes_ = std::max(largest_batch_bytes_, message.ByteSizeLong());
        for (const auto& event : message.batch().events()) record(event);
      } else {
        record(message);
      }
      changed_.notify_all();
    }
    grpc::Status status = reader->Finish();
    std::lock_guard lock(mutex_);
    status_ = status;
    finished_ = true;
    changed_.notify_all();
  });
}

WatchRecorder::~WatchRecorder() {
  cancel();
  reader_.join();
}

void WatchRecorder::cancel() { context_.TryCancel(); }

bool WatchRecorder::waitFor(
    const std::function<bool(const std::vector<cluster::v1::WatchEvent>&)>& pred,
    std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  return changed_.wait_for(lock, timeout, [&] { return pred(events_) || finished_; }) &&
         pred(events_);
}

bool WatchRecorder::waitForVersion(uint64_t version, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  return changed_.wait_for(lock, timeout, [&] { return last_version_ >= version || finished_; }) &&
         last_version_ >= version;
}

bool WatchRecorder::waitFinished(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  return changed_.wait_for(lock, timeout, [&] { return finished_; });
}

std::vector<cluster::v1::WatchEvent> WatchRecorder::events() {
  std::lock_guard lock(mutex_);
  return events_;
}

uint64_t WatchRecorder::lastVersion() {
  std::lock_guard lock(mutex_);
  return last_version_;
}

size_t WatchRecorder::messages() {
  std::lock_guard lock(mutex_);
  return messages_;
}

size_t WatchRecorder::batches() {
  std::lock_guard lock(mutex_);
  return batches_;
}

size_t WatchRecorder::largestBatchBytes() {
  std::lock_guard lock(mutex_);
  return largest_batch_bytes_;
}

bool WatchRecorder::finished() {
  std::lock_guard lock(mutex_);
  return finished_;
}

grpc::Status WatchRecorder::status() {
  std::lock_guard lock(mutex_);
  return status_;
}

SentinelAgents::SentinelAgents(TestControlPlane& cp, std::set<std::string> failing) {
  // Tokens are made here, on the test's thread (TestControlPlane is not thread-safe).
  std::map<std::string, std::string> tokens;
  auto regions = (*cp.pool()->acquire())->query("SELECT id FROM regions");
  if (!regions.ok()) throw std::runtime_error("cannot read the regions");
  for (const db::Row& row : regions->rows) tokens[row.str(0)] = cp.agentToken(row.str(0));
  thread_ = std::thread([this, pool = cp.pool(), cluster = cp.cluster(), tokens, failing] {
    while (!stop_) {
      for (const auto& id : progressingSentinels(*pool)) {
        auto report = sentinelReport(*pool, id, /*healthy=*/failing.count(id) == 0);
        if (!report || !tokens.count(report->region())) continue;
        cluster::v1::ReportSentinelStatusResponse ignored;
        (void)cluster->ReportSentinelStatus(
            TestControlPlane::withToken(tokens.at(report->region())).get(), *report, &ignored);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
}

SentinelAgents::~SentinelAgents() {
  stop_ = true;
  thread_.join();
}

}  // namespace krane::testing
