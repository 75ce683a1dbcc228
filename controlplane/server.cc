#include "controlplane/server.h"

#include <httplib.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>

#include "common/files.h"
#include "common/host_port.h"
#include "common/http_serve.h"
#include "common/random_id.h"
#include "common/status.h"
#include "common/strings.h"
#include "controlplane/db/migrate.h"
#include "controlplane/services/buildslot/buildslot.h"
#include "controlplane/services/deploy/deploy.h"
#include "controlplane/services/deploy/readiness.h"
#include "controlplane/services/deployment/deployment.h"
#include "controlplane/services/routing/routing.h"
#include "controlplane/services/sentinel/sentinel.h"
#include "controlplane/services/sentinelrollout/rollout.h"
#include "spdlog/spdlog.h"

namespace krane::ctrl {
namespace {

prometheus::MetricFamily family(const std::string& name, const std::string& help,
                                prometheus::MetricType type, double value) {
  prometheus::MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = type;
  prometheus::ClientMetric m;
  if (type == prometheus::MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  f.metric.push_back(m);
  return f;
}

// Ends the open streams whose token was revoked (by any replica, or `krane-ctrl token revoke`)
// since `*since_ms`. One small query, whatever the number of streams.
void endRevokedStreams(api::AgentTokens& tokens,
                       const std::vector<std::shared_ptr<feed::WatchStream>>& streams,
                       int64_t* since_ms) {
  int64_t newest = *since_ms;
  auto revoked = tokens.revokedSince(*since_ms, &newest);
  if (!revoked.ok()) {
    spdlog::warn("ctrl: cannot check for revoked agent tokens: {}", revoked.status().message());
    return;
  }
  // A minute of overlap, for revocations recorded by a clock a little behind the newest one.
  *since_ms = std::max<int64_t>(*since_ms, newest - 60000);
  if (revoked->empty()) return;
  for (const auto& s : streams) {
    if (revoked->count(api::sha256(s->bearer()))) {
      s->endUnauthenticated("the agent token was revoked");
    }
  }
}

}  // namespace

Server::Server(CtrlConfig config) : config_(std::move(config)) {}

Server::~Server() { stop(); }

absl::Status Server::start() {
  const std::vector<std::pair<std::string, absl::Status (Server::*)()>> steps = {
      {"database", &Server::startDatabase}, {"feed", &Server::startFeed},
      {"workflow", &Server::startWorkflow}, {"grpc", &Server::startGrpc},
      {"http", &Server::startHttp},
  };
  for (const auto& [name, step] : steps) {
    absl::Status status = (this->*step)();
    if (!status.ok()) {
      stop();
      return absl::Status(status.code(),
                          strCat("start-up step \"", name, "\" failed: ", status.message()));
    }
    started_.push_back(name);
    spdlog::debug("ctrl: start-up step {} done", name);
  }
  spdlog::info("ctrl: serving grpc=127.0.0.1:{} http=127.0.0.1:{} database={}", grpc_port_,
               http_port_, pool_->dsn().where());
  return absl::OkStatus();
}

absl::Status Server::startDatabase() {
  KRANE_ASSIGN_OR_RETURN(auto dsn, db::parseDsn(config_.database.dsn));
  KRANE_ASSIGN_OR_RETURN(
      pool_, db::Pool::create(dsn, {.max_connections = config_.database.max_connections,
                                    .acquire_timeout = config_.database.acquire_timeout}));
  KRANE_ASSIGN_OR_RETURN(auto migrations, db::builtinMigrations());
  return db::Migrator(pool_, migrations).checkUpToDate();
}

absl::Status Server::startFeed() {
  tables_ = std::make_shared<feed::ResourceTables>();
  hub_ = std::make_shared<feed::Hub>();
  writer_ = std::make_shared<feed::Writer>(pool_, tables_);
  tailer_ = std::make_unique<feed::Tailer>(pool_, tables_, hub_,
                                           feed::TailerOptions{config_.feed.poll_interval});
  if (!config_.feed.peer_hints.listen.empty()) {
    peer_hints_ = std::make_unique<feed::PeerHints>(
        pool_, processInstanceId(),
        feed::PeerHintOptions{.listen = config_.feed.peer_hints.listen,
                              .advertise = config_.feed.peer_hints.advertise},
        [tailer = tailer_.get()] { tailer->notify(); });
    if (absl::Status st = peer_hints_->start(); !st.ok()) {
      return absl::Status(st.code(), strCat("feed.peer_hints: ", st.message()));
    }
  } else {
    spdlog::info(
        "feed: peer hints off (feed.peer_hints.listen): commits of other replicas are"
        " read within {} ms",
        config_.feed.poll_interval.count());
  }
  writer_->onCommit(
      [tailer = tailer_.get(), hints = peer_hints_.get()](const std::vector<std::string>&) {
        tailer->notify();
        if (hints != nullptr) hints->publish();
      });
  tokens_ = std::make_shared<api::AgentTokens>(pool_, config_.auth.agent_token_cache);
  operators_ = std::make_shared<api::OperatorTokens>(config_.auth.operator_tokens);
  if (operators_->empty()) {
    spdlog::warn(
        "ctrl: no operator token configured (auth.operator_tokens_file or $KRANE_OPERATOR_TOKEN):"
        " the public API refuses every call");
  }
  ingestor_ = std::make_shared<ingest::Ingestor>(pool_);

  watch_ = std::make_shared<feed::WatchContext>();
  watch_->pool = pool_;
  watch_->tables = tables_;
  watch_->hub = hub_;
  watch_->setup_pool = std::make_shared<ThreadPool>(config_.feed.sync_workers);
  watch_->options.setup_high_water = config_.feed.sync_high_water;
  watch_->options.max_open_snapshots = config_.feed.sync_snapshots;
  watch_->options.setup_stall = config_.feed.sync_stall;
  watch_->options.catch_up_batch = config_.feed.sync_batch;
  watch_->options.max_queued = config_.feed.stream_max_queued;
  watch_->options.bookmark_interval = config_.feed.bookmark_interval;
  watch_->authorize = [tokens = tokens_](const std::string& bearer) {
    return tokens->regionOf(bearer);
  };

  tailer_->start();
  cleanup_ = std::make_unique<feed::Cleanup>(
      pool_, tables_,
      feed::CleanupOptions{config_.feed.change_ttl, config_.feed.cleanup_interval,
                           config_.feed.cleanup_batch});
  cleanup_->start();
  ticker_ = std::thread([this] {
    int64_t revoked_since = 0;  // every revocation once, then the newer ones
    for (uint64_t tick = 0; !stopping_; ++tick) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      std::vector<std::shared_ptr<feed::WatchStream>> streams;
      {
        std::lock_guard lock(watch_->streams_mutex);
        streams.assign(watch_->streams.begin(), watch_->streams.end());
      }
      const auto now = std::chrono::steady_clock::now();
      for (const auto& s : streams) s->tick(now);
      // A revoked token's streams end within about 2 s.
      if (tick % 10 == 0) endRevokedStreams(*tokens_, streams, &revoked_since);
    }
  });
  return absl::OkStatus();
}

// The workflow engine's workers and its housekeeping. Services written on the engine are
// registered here, before the workers start.
absl::Status Server::startWorkflow() {
  workflow::EngineOptions options;
  options.threads = config_.workflow.threads;
  options.lease = config_.workflow.lease;
  options.poll_interval = config_.workflow.poll_interval;
  options.max_payload_bytes = config_.workflow.max_payload_bytes;
  engine_ = std::make_unique<workflow::Engine>(pool_, options);
  services::builder::CommandBuilderOptions builds;
  builds.log_dir = config_.deploy.build_log_dir.empty()
                       ? std::filesystem::temp_directory_path() / "krane-builds"
                       : std::filesystem::path(config_.deploy.build_log_dir);
  builds.default_timeout = config_.deploy.build_timeout;
  services::deploy::EnvironmentResourceOptions environment;
  environment.sentinel_image = config_.deploy.sentinel_image;
  environment.sentinel_replicas = config_.deploy.sentinel_replicas;
  environment.sentinel_cpu_millicores = config_.deploy.sentinel_cpu_millicores;
  environment.sentinel_memory_mib = config_.deploy.sentinel_memory_mib;
  environment.cilium_policy = config_.deploy.cilium_policy;
  services::routing::RoutingOptions routing{.writer = writer_};
  routing.previous_stop_delay = config_.deploy.previous_stop_delay;
  services::sentinel::SentinelOptions sentinel;
  sentinel.deploy_timeout = config_.deploy.sentinel_timeout;
  for (auto& service : services::deploy::deployServices(
           {pool_, writer_, std::make_shared<services::builder::PrebuiltBuilder>(),
            std::make_shared<services::builder::CommandBuilder>(builds), environment, sentinel,
            config_.deploy.rolling_give_up_per_replica},
           routing)) {
    KRANE_RETURN_IF_ERROR(engine_->registerService(std::move(service)));
  }
  KRANE_RETURN_IF_ERROR(
      engine_->registerService(services::sentinelrollout::sentinelRolloutService(pool_)));
  // Instance reports tell waiting deploys when enough regions are healthy. gRPC (the only
  // caller of the ingestor) stops before the engine does.
  ingestor_->addDeploymentInstancesHook(
      std::make_shared<services::deploy::ReadinessGate>(pool_, *engine_));
  // Sentinel reports tell a waiting SentinelService.Deploy that its sentinel converged.
  ingestor_->addSentinelReadyHook(
      std::make_shared<services::sentinel::ReadyNotifier>(pool_, *engine_));
  engine_->start();
  workflow::MaintenanceOptions maintenance;
  maintenance.interval = config_.workflow.maintenance_interval;
  maintenance.watchdog_threshold = config_.workflow.watchdog_threshold;
  maintenance.retention = config_.workflow.retention;
  maintenance_ = std::make_unique<workflow::Maintenance>(pool_, maintenance);
  maintenance_->start();
  return absl::OkStatus();
}

absl::Status Server::startGrpc() {
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials();
  if (!config_.tls.cert_file.empty()) {
    grpc::SslServerCredentialsOptions options;
    KRANE_ASSIGN_OR_RETURN(auto cert, readFile(config_.tls.cert_file, "tls.cert_file"));
    KRANE_ASSIGN_OR_RETURN(auto key, readFile(config_.tls.key_file, "tls.key_file"));
    options.pem_key_cert_pairs.push_back({key, cert});
    if (!config_.tls.client_ca_file.empty()) {
      KRANE_ASSIGN_OR_RETURN(options.pem_root_certs,
                             readFile(config_.tls.client_ca_file, "tls.client_ca_file"));
      options.client_certificate_request =
          GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
    }
    credentials = grpc::SslServerCredentials(options);
  }
  cluster_service_ = std::make_unique<api::ClusterServiceImpl>(watch_, tokens_, ingestor_);
  resource_service_ = std::make_unique<api::ResourceServiceImpl>(writer_, pool_, operators_, hub_);
  agent_service_ = std::make_unique<api::AgentServiceImpl>(ingestor_, operators_);
  workflow_service_ = std::make_unique<api::WorkflowServiceImpl>(pool_, operators_);
  deployment_service_ = std::make_unique<api::DeploymentServiceImpl>(
      pool_, tables_, *engine_, operators_,
      api::DeploymentWatchLimits{
          .max_streams = config_.deploy.watch_max_streams,
          .max_lifetime = std::chrono::duration_cast<std::chrono::milliseconds>(
              config_.deploy.watch_max_lifetime)});
  tenancy_service_ = std::make_unique<api::TenancyServiceImpl>(pool_, operators_);
  rollout_service_ = std::make_unique<api::RolloutServiceImpl>(pool_, *engine_, operators_);
  sentinel_service_ = std::make_unique<api::SentinelApiImpl>(pool_, operators_);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(config_.listen, credentials, &grpc_port_);
  builder.RegisterService(cluster_service_.get());
  builder.RegisterService(resource_service_.get());
  builder.RegisterService(agent_service_.get());
  builder.RegisterService(workflow_service_.get());
  builder.RegisterService(deployment_service_.get());
  builder.RegisterService(tenancy_service_.get());
  builder.RegisterService(rollout_service_.get());
  builder.RegisterService(sentinel_service_.get());
  builder.SetMaxReceiveMessageSize(16 << 20);
  // Channelz keeps a node and counters per connection and call; with an agent connection per
  // region and thousands of them per replica, that is memory and work nobody reads.
  builder.AddChannelArgument(GRPC_ARG_ENABLE_CHANNELZ, 0);
  // Agents ping to find connections that went silent (control_plane.keepalive_ms, at least
  // every second): allowed at half that, so that timers firing early do not get an agent
  // refused (GOAWAY "too_many_pings"), and while no call is open (between heartbeats).
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 500);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // And pings its clients (feed.keepalive_ms): a connection that stays silent is closed.
  if (config_.feed.keepalive.count() > 0) {
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS,
                               static_cast<int>(config_.feed.keepalive.count()));
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                               static_cast<int>(config_.feed.keepalive_timeout.count()));
  }
  // The loops serving Watch calls, on the gRPC port and on the watch listener alike.
  const size_t watch_threads = config_.feed.write_threads != 0
                                   ? config_.feed.write_threads
                                   : std::max(1U, std::thread::hardware_concurrency());
  watch_loops_ = std::make_unique<feed::WatchLoops>(builder, watch_threads);
  grpc_ = builder.BuildAndStart();
  if (!grpc_ || grpc_port_ == 0) {
    if (grpc_) grpc_->Shutdown();
    watch_loops_.reset();  // its queues are drained before the server goes
    grpc_.reset();
    return absl::UnavailableError(
        strCat("cannot listen on ", config_.listen, " (in use, or not a local address?)"));
  }
  api::ClusterServiceImpl* cluster = cluster_service_.get();
  watch_loops_->start(
      [cluster](grpc::ServerContext* context, grpc::ByteBuffer* request,
                grpc::ServerAsyncWriter<grpc::ByteBuffer>* writer, grpc::ServerCompletionQueue* cq,
                void* tag) { cluster->requestWatch(context, request, writer, cq, tag); },
      [cluster](feed::GrpcWatchCall* call) { cluster->openWatch(call); });
  if (!config_.feed.watch_listen.empty()) {
    feed::H2WatchOptions options;
    options.listen = config_.feed.watch_listen;
    options.tls.cert_file = config_.tls.cert_file;
    options.tls.key_file = config_.tls.key_file;
    options.tls.client_ca_file = config_.tls.client_ca_file;
    options.threads = watch_threads;
    options.keepalive = config_.feed.keepalive;
    options.keepalive_timeout = config_.feed.keepalive_timeout;
    auto h2 = feed::H2WatchServer::start(
        options, [cluster](feed::WatchCall* call, std::string_view request,
                           std::string authorization, std::string peer) {
          cluster->openWatch(call, request, authorization, std::move(peer));
        });
    if (!h2.ok()) {
      grpc_->Shutdown();
      watch_loops_->stop();
      watch_loops_.reset();
      grpc_.reset();
      return h2.status();
    }
    h2_watch_ = std::move(*h2);
    cluster->setWatchListenerPort(static_cast<uint32_t>(h2_watch_->port()));
    spdlog::info("feed: watch listener on port {}", h2_watch_->port());
  }
  return absl::OkStatus();
}

absl::Status Server::startHttp() {
  http_ = std::make_unique<httplib::Server>();
  http_->Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok\n", "text/plain");
  });
  http_->Get("/readyz", [this](const httplib::Request&, httplib::Response& res) {
    absl::Status status = ready();
    res.status = status.ok() ? 200 : 503;
    res.set_content(status.ok() ? "ready\n" : strCat("not ready: ", status.message(), "\n"),
                    "text/plain");
  });
  http_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metricsText(), "text/plain; version=0.0.4");
  });
  const std::string host = splitHostPort(config_.http_listen).first;
  const int port = portOf(config_.http_listen);
  http_port_ =
      port == 0 ? http_->bind_to_any_port(host) : (http_->bind_to_port(host, port) ? port : -1);
  if (http_port_ <= 0)
    return absl::UnavailableError(strCat("cannot listen on ", config_.http_listen));
  http_thread_ = serveInBackground(*http_);
  return absl::OkStatus();
}

void Server::stop() {
  if (stopping_.exchange(true)) return;
  if (http_) http_->stop();
  if (http_thread_.joinable()) http_thread_.join();
  if (h2_watch_) h2_watch_->shutdown();
  if (grpc_) grpc_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  // The Watch calls were cancelled: their streams finish on the loops (and on set-up steps).
  if (watch_loops_) watch_loops_->stop();
  if (h2_watch_) h2_watch_->stop();
  if (ticker_.joinable()) ticker_.join();
  if (maintenance_) maintenance_->stop();
  if (engine_) engine_->stop();
  if (cleanup_) cleanup_->stop();
  if (peer_hints_) peer_hints_->stop();
  if (tailer_) tailer_->stop();
  if (watch_) {
    watch_->setup_pool->join();  // set-up steps still queued release what they hold
  }
  grpc_.reset();
}

absl::Status Server::ready() const {
  if (stopping_) return absl::UnavailableError("shutting down");
  auto conn = pool_->acquire();
  if (!conn.ok()) return conn.status();
  return (*conn)->ping();
}

std::string Server::metricsText() const {
  using prometheus::MetricType;
  std::vector<prometheus::MetricFamily> f;
  const auto& w = watch_->counters;
  f.push_back(
      family("krane_feed_streams", "Watch streams open", MetricType::Gauge, w.streams_open.load()));
  f.push_back(family("krane_feed_streams_total", "Watch streams opened", MetricType::Counter,
                     w.streams_total.load()));
  f.push_back(family("krane_feed_events_sent_total", "Watch events written", MetricType::Counter,
                     w.events_sent.load()));
  f.push_back(family("krane_feed_queued_events",
                     "Events queued on the Watch streams, not yet written (references to bytes the"
                     " streams share)",
                     MetricType::Gauge, static_cast<double>(w.queued_events.load())));
  f.push_back(
      family("krane_feed_write_flushes_total",
             "Watch writes that flushed a stream's queue (the messages before each went with"
             " it)",
             MetricType::Counter, w.flushes.load()));
  f.push_back(family("krane_feed_batches_total",
                     "Watch messages that carried several events (to agents that accept batches)",
                     MetricType::Counter, w.batches_sent.load()));
  f.push_back(family("krane_feed_bookmarks_total", "Bookmarks queued", MetricType::Counter,
                     w.bookmarks_sent.load()));
  f.push_back(family("krane_feed_full_syncs_total", "Full syncs served", MetricType::Counter,
                     w.full_syncs.load()));
  f.push_back(family("krane_feed_full_syncs_waiting",
                     "Full syncs waiting for a snapshot slot (feed.sync_snapshots)",
                     MetricType::Gauge, w.full_syncs_waiting.load()));
  f.push_back(family("krane_feed_resyncs_total", "Streams told to resync", MetricType::Counter,
                     w.resyncs_requested.load()));
  f.push_back(family("krane_feed_setups_stalled_total",
                     "Full syncs and catch-ups ended because the agent read nothing for"
                     " feed.sync_stall_ms",
                     MetricType::Counter, w.setups_stalled.load()));
  f.push_back(family("krane_feed_calls_reset_total",
                     "Watch calls reset: ended, and their agent took nothing of the write in"
                     " flight for feed.sync_stall_ms more",
                     MetricType::Counter, w.calls_reset.load()));
  if (h2_watch_) {
    f.push_back(family("krane_feed_watch_listener_connections",
                       "Connections to the watch listener (feed.watch_listen)", MetricType::Gauge,
                       static_cast<double>(h2_watch_->connections())));
    f.push_back(family("krane_feed_watch_listener_calls",
                       "Watch calls open on the watch listener (feed.watch_listen)",
                       MetricType::Gauge, static_cast<double>(h2_watch_->calls())));
  }
  if (peer_hints_) {
    const auto h = peer_hints_->stats();
    f.push_back(family("krane_feed_peer_hints_sent_total",
                       "Commit hints published to the other replicas", MetricType::Counter,
                       h.sent));
    f.push_back(family("krane_feed_peer_hints_received_total",
                       "Commit hints received from the other replicas", MetricType::Counter,
                       h.received));
    f.push_back(family("krane_feed_peer_hints_wakeups_total",
                       "Tailer wake-ups caused by hints (coalesced)", MetricType::Counter,
                       h.delivered));
    f.push_back(family("krane_feed_peers", "Other replicas whose hint addresses this one dials",
                       MetricType::Gauge, static_cast<double>(h.peers)));
    f.push_back(family("krane_feed_peers_connected",
                       "Of those, the ones with a live hint connection", MetricType::Gauge,
                       static_cast<double>(h.connected)));
    f.push_back(family("krane_feed_peer_hints_refused_total",
                       "Subscribers to the hint socket turned away: no replica in feed_peers has"
                       " their key",
                       MetricType::Counter, static_cast<double>(h.refused)));
    f.push_back(
        family("krane_feed_peer_hints_errors_total",
               "Failed refreshes of feed_peers, failed receives on the hint sockets, and"
               " failed handshakes with other replicas (a wrong key in feed_peers)",
               MetricType::Counter,
               static_cast<double>(h.refresh_errors + h.socket_errors + h.handshake_failures)));
  }
  const auto t = tailer_->stats();
  f.push_back(
      family("krane_feed_tailer_polls_total", "Tailer polls", MetricType::Counter, t.polls));
  f.push_back(family("krane_feed_tailer_changes_total", "Changes read by the tailer",
                     MetricType::Counter, t.changes_read));
  f.push_back(family("krane_feed_tailer_errors_total", "Failed tailer polls", MetricType::Counter,
                     t.errors));
  f.push_back(family("krane_feed_tailer_lag_versions", "Versions not yet read by the tailer",
                     MetricType::Gauge, t.versions_behind));
  const auto& i = ingestor_->counters();
  f.push_back(family("krane_ingest_deployment_reports_total", "Deployment status reports",
                     MetricType::Counter, i.deployment_reports.load()));
  f.push_back(family("krane_ingest_sentinel_reports_total", "Sentinel status reports",
                     MetricType::Counter, i.sentinel_reports.load()));
  f.push_back(family("krane_ingest_resource_reports_total", "Resource status reports",
                     MetricType::Counter, i.resource_reports.load()));
  f.push_back(family("krane_ingest_heartbeats_total", "Agent heartbeats", MetricType::Counter,
                     i.heartbeats.load()));
  f.push_back(family("krane_ingest_reports_dropped_total",
                     "Reports about resources not held, or older than the stored status",
                     MetricType::Counter, i.dropped.load()));
  f.push_back(family("krane_ingest_rejected_total", "Reports refused (invalid or not allowed)",
                     MetricType::Counter, i.rejected.load()));
  f.push_back(family("krane_ingest_errors_total", "Reports that failed in the database",
                     MetricType::Counter, i.errors.load()));
  const auto p = pool_->stats();
  f.push_back(
      family("krane_db_connections_open", "Database sessions open", MetricType::Gauge, p.open));
  f.push_back(family("krane_db_connections_waiting", "Callers waiting for a session",
                     MetricType::Gauge, p.waiting));
  // What each agent's last heartbeat said (one small table, read at each scrape).
  if (auto agents = ingestor_->listAgents(""); agents.ok()) {
    const std::pair<const char*, const char*> gauges[] = {
        {"krane_agent_lag_versions", "Changes of its region the agent has not applied yet"},
        {"krane_agent_retrying_events", "Changes the agent is retrying (its cursor waits)"},
        {"krane_agent_parked_events", "Changes a plugin refused as invalid, parked"},
    };
    for (const auto& [name, help] : gauges) {
      prometheus::MetricFamily g;
      g.name = name;
      g.help = help;
      g.type = MetricType::Gauge;
      for (const auto& a : *agents) {
        prometheus::ClientMetric m;
        m.label = {{"region", a.region}, {"agent_id", a.agent_id}};
        m.gauge.value = static_cast<double>(name == std::string("krane_agent_lag_versions") ? a.lag
                                            : name == std::string("krane_agent_retrying_events")
                                                ? a.retrying_events
                                                : a.parked_events);
        g.metric.push_back(std::move(m));
      }
      f.push_back(std::move(g));
    }
  }
  if (engine_) {
    for (auto& m : engine_->metrics()) f.push_back(std::move(m));
  }
  if (maintenance_) {
    for (auto& m : maintenance_->metrics()) f.push_back(std::move(m));
  }
  return prometheus::TextSerializer().Serialize(f);
}

}  // namespace krane::ctrl
