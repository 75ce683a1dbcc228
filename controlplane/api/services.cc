#include "controlplane/api/services.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/grpc_status.h"
#include "common/status.h"
#include "common/strings.h"
#include "controlplane/api/resource_watch.h"

namespace krane::api {
namespace {

constexpr uint32_t kDefaultPageSize = 100;
constexpr uint32_t kMaxPageSize = 1000;
constexpr char kSep = '\x1f';

std::string encodeCursor(const feed::ListCursor& c) {
  return strCat(c.type, kSep, c.region, kSep, c.id);
}

absl::StatusOr<feed::ListCursor> decodeCursor(const std::string& token) {
  feed::ListCursor c;
  if (token.empty()) return c;
  const auto a = token.find(kSep);
  const auto b = a == std::string::npos ? a : token.find(kSep, a + 1);
  if (b == std::string::npos)
    return absl::InvalidArgumentError("page_token: not a token this server issued");
  c.type = token.substr(0, a);
  c.region = token.substr(a + 1, b - a - 1);
  c.id = token.substr(b + 1);
  return c;
}

bool before(const cluster::v1::Resource& a, const cluster::v1::Resource& b) {
  return std::tie(a.type(), a.region(), a.id()) < std::tie(b.type(), b.region(), b.id());
}

}  // namespace

absl::Status checkOperator(const grpc::ServerContextBase& context,
                           const OperatorTokens& operators) {
  const std::string token = bearerToken(context);
  if (token.empty())
    return absl::UnauthenticatedError(
        "missing operator token (send `authorization: Bearer <token>`)");
  if (!operators.accepts(token)) return absl::UnauthenticatedError("unknown operator token");
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// ClusterService

ClusterServiceImpl::ClusterServiceImpl(std::shared_ptr<feed::WatchContext> watch,
                                       std::shared_ptr<AgentTokens> tokens,
                                       std::shared_ptr<ingest::Ingestor> ingestor)
    : CheckedRequests("krane.cluster.v1.ClusterService"),
      watch_(std::move(watch)),
      tokens_(std::move(tokens)),
      ingestor_(std::move(ingestor)) {
  checkUnary("ReportDeploymentStatus", this, &ClusterServiceImpl::ReportDeploymentStatus);
  checkUnary("ReportSentinelStatus", this, &ClusterServiceImpl::ReportSentinelStatus);
  checkUnary("ReportResourceStatus", this, &ClusterServiceImpl::ReportResourceStatus);
  checkUnary("Heartbeat", this, &ClusterServiceImpl::Heartbeat);
}

void ClusterServiceImpl::openWatch(feed::GrpcWatchCall* call) {
  cluster::v1::WatchRequest request;
  const absl::Status parsed = parseRequest(call->request(), request);
  // The request's bytes share the connection's read buffer, which they would pin for the
  // stream's whole life (about 8 KiB per idle Watch).
  call->request().Clear();
  if (!parsed.ok()) {
    call->refuse(toGrpc(parsed));
    return;
  }
  feed::WatchStream::start(watch_, request, bearerToken(call->context()), call->context().peer(),
                           call);
}

void ClusterServiceImpl::openWatch(feed::WatchCall* call, std::string_view request_bytes,
                                   std::string_view authorization, std::string peer) {
  cluster::v1::WatchRequest request;
  if (const absl::Status parsed = parseRequest(request_bytes, request); !parsed.ok()) {
    call->refuse(toGrpc(parsed));
    return;
  }
  feed::WatchStream::start(watch_, request, bearerOf(authorization), std::move(peer), call);
}

grpc::Status ClusterServiceImpl::ReportDeploymentStatus(
    grpc::ServerContext* context, const cluster::v1::ReportDeploymentStatusRequest* request,
    cluster::v1::ReportDeploymentStatusResponse*) {
  auto region = tokens_->regionOf(bearerToken(*context));
  if (!region.ok()) return toGrpc(region.status());
  return toGrpc(ingestor_->reportDeploymentStatus(*region, *request));
}

grpc::Status ClusterServiceImpl::ReportSentinelStatus(
    grpc::ServerContext* context, const cluster::v1::ReportSentinelStatusRequest* request,
    cluster::v1::ReportSentinelStatusResponse*) {
  auto region = tokens_->regionOf(bearerToken(*context));
  if (!region.ok()) return toGrpc(region.status());
  return toGrpc(ingestor_->reportSentinelStatus(*region, *request));
}

grpc::Status ClusterServiceImpl::ReportResourceStatus(
    grpc::ServerContext* context, const cluster::v1::ReportResourceStatusRequest* request,
    cluster::v1::ReportResourceStatusResponse*) {
  auto region = tokens_->regionOf(bearerToken(*context));
  if (!region.ok()) return toGrpc(region.status());
  return toGrpc(ingestor_->reportResourceStatus(*region, *request));
}

grpc::Status ClusterServiceImpl::Heartbeat(grpc::ServerContext* context,
                                           const cluster::v1::HeartbeatRequest* request,
                                           cluster::v1::HeartbeatResponse* response) {
  auto region = tokens_->regionOf(bearerToken(*context));
  if (!region.ok()) return toGrpc(region.status());
  auto answer = ingestor_->heartbeat(*region, *request);
  if (!answer.ok()) return toGrpc(answer.status());
  *response = *std::move(answer);
  response->set_watch_listener_port(watch_listener_port_);
  return grpc::Status::OK;
}

// ---------------------------------------------------------------------------------------------
// ResourceService

ResourceServiceImpl::ResourceServiceImpl(std::shared_ptr<feed::Writer> writer,
                                         std::shared_ptr<db::Pool> pool,
                                         std::shared_ptr<const OperatorTokens> operators,
                                         std::shared_ptr<feed::Hub> hub)
    : CheckedRequests("krane.api.v1.ResourceService"),
      writer_(std::move(writer)),
      pool_(std::move(pool)),
      operators_(std::move(operators)),
      hub_(std::move(hub)) {
  checkUnary("Put", this, &ResourceServiceImpl::Put);
  checkUnary("Get", this, &ResourceServiceImpl::Get);
  checkUnary("List", this, &ResourceServiceImpl::List);
  checkUnary("Delete", this, &ResourceServiceImpl::Delete);
  checkUnary("GetStatus", this, &ResourceServiceImpl::GetStatus);
  checkCallbackServerStreaming("Watch", this, &ResourceServiceImpl::Watch);
}

grpc::Status ResourceServiceImpl::Put(grpc::ServerContext* context,
                                      const v1::PutResourceRequest* request,
                                      v1::PutResourceResponse* response) {
  if (auto st = checkOperator(*context, *operators_); !st.ok()) return toGrpc(st);
  if (!request->has_resource()) return toGrpc(absl::InvalidArgumentError("resource: required"));
  auto result = writer_->put(request->resource(), request->expected_version());
  if (!result.ok()) return toGrpc(result.status());
  *response->mutable_resource() = result->resource;
  response->set_version(result->version);
  response->set_created(result->created);
  return grpc::Status::OK;
}

grpc::Status ResourceServiceImpl::Get(grpc::ServerContext* context,
                                      const v1::GetResourceRequest* request,
                                      v1::GetResourceResponse* response) {
  if (auto st = checkOperator(*context, *operators_); !st.ok()) return toGrpc(st);
  const feed::ResourceKey key{request->type(), request->id(), request->region()};
  if (auto st = feed::checkResourceKey("request", key); !st.ok()) return toGrpc(st);
  auto conn = pool_->acquire();
  if (!conn.ok()) return toGrpc(conn.status());
  auto stored = writer_->tables().forType(key.type).load(**conn, key);
  if (!stored.ok()) return toGrpc(stored.status());
  if (!*stored || (*stored)->deleted) {
    return toGrpc(absl::NotFoundError(
        strCat(key.type, " ", quote(key.id), " does not exist in region ", quote(key.region))));
  }
  *response->mutable_resource() = (*stored)->resource;
  response->set_version((*stored)->resource.version());
  return grpc::Status::OK;
}

grpc::Status ResourceServiceImpl::List(grpc::ServerContext* context,
                                       const v1::ListResourcesRequest* request,
                                       v1::ListResourcesResponse* response) {
  if (auto st = checkOperator(*context, *operators_); !st.ok()) return toGrpc(st);
  if (!request->region().empty()) {
    if (auto st = feed::checkId("region", request->region()); !st.ok()) return toGrpc(st);
  }
  if (!request->type().empty()) {
    if (auto st = feed::checkType("type", request->type()); !st.ok()) return toGrpc(st);
  }
  auto cursor = decodeCursor(request->page_token());
  if (!cursor.ok()) return toGrpc(cursor.status());
  const uint32_t page =
      request->page_size() == 0 ? kDefaultPageSize : std::min(request->page_size(), kMaxPageSize);
  auto conn = pool_->acquire();
  if (!conn.ok()) return toGrpc(conn.status());
  // Each table returns its next `page` rows after the cursor; merged, the first `page` are the
  // page.
  std::vector<cluster::v1::Resource> merged;
  for (const auto& table : writer_->tables().all()) {
    if (!request->type().empty() && !table->type().empty() && table->type() != request->type())
      continue;
    if (!request->type().empty() && table->type().empty() &&
        writer_->tables().forType(request->type()).type() != "") {
      continue;  // a core type is never in the generic table
    }
    auto rows = table->list(**conn, request->region(), request->type(), *cursor, page + 1);
    if (!rows.ok()) return toGrpc(rows.status());
    merged.insert(merged.end(), std::make_move_iterator(rows->begin()),
                  std::make_move_iterator(rows->end()));
  }
  std::sort(merged.begin(), merged.end(), before);
  const bool more = merged.size() > page;
  if (more) merged.resize(page);
  for (auto& r : merged) *response->add_resources() = std::move(r);
  if (more && !merged.empty()) {
    const auto& last = response->resources(response->resources_size() - 1);
    response->set_next_page_token(encodeCursor(
        feed::ListCursor{.region = last.region(), .type = last.type(), .id = last.id()}));
  }
  return grpc::Status::OK;
}

grpc::Status ResourceServiceImpl::Delete(grpc::ServerContext* context,
                                         const v1::DeleteResourceRequest* request,
                                         v1::DeleteResourceResponse* response) {
  if (auto st = checkOperator(*context, *operators_); !st.ok()) return toGrpc(st);
  auto result =
      writer_->remove(feed::ResourceKey{request->type(), request->id(), request->region()},
                      request->expected_version());
  if (!result.ok()) return toGrpc(result.status());
  response->set_version(result->version);
  return grpc::Status::OK;
}

grpc::Status ResourceServiceImpl::GetStatus(grpc::ServerContext* context,
                                            const v1::GetResourceStatusRequest* request,
                                            v1::GetResourceStatusResponse* response) {
  if (auto st = checkOperator(*context, *operators_); !st.ok()) return toGrpc(st);
  const feed::ResourceKey key{request->type(), request->id(), request->region()};
  if (auto st = feed::checkResourceKey("request", key); !st.ok()) return toGrpc(st);
  auto conn = pool_->acquire();
  if (!conn.ok()) return toGrpc(conn.status());
  db::Connection& c = **conn;
  auto stored = writer_->tables().forType(key.type).load(c, key);
  if (!stored.ok()) return toGrpc(stored.status());
  if (!*stored || (*stored)->deleted) {
    return toGrpc(absl::NotFoundError(
        strCat(key.type, " ", quote(key.id), " does not exist in region ", quote(key.region))));
  }
  const cluster::v1::Resource& resource = (*stored)->resource;
  response->set_version(resource.version());

  auto status = c.query(
      "SELECT applied_version, phase, message, detail, apply_error, updated_at FROM resource_status"
      " WHERE region_id = ? AND resource_type = ? AND resource_id = ?",
      {key.region, key.type, key.id});
  if (!status.ok()) return toGrpc(status.status());
  if (!status->empty()) {
    const db::Row& row = status->rows.front();
    response->set_applied_version(row.u64("applied_version"));
    response->set_phase(row.str("phase"));
    response->set_message(row.optStr("message").value_or(""));
    response->set_apply_error(row.optStr("apply_error").value_or(""));
    response->set_reported_ms(row.i64("updated_at"));
    if (key.type == "deployment_topology") {
      const auto detail = nlohmann::json::parse(row.optStr("detail").value_or(""), nullptr, false);
      if (detail.is_object()) response->set_current_instances(detail.value("current", 0U));
    }
  }
  if (resource.has_deployment_topology()) {
    response->set_desired_replicas(resource.deployment_topology().replicas());
    auto rows = c.query(
        "SELECT id, address, status, failure_reason FROM instances"
        " WHERE deployment_id = ? AND region_id = ? ORDER BY id",
        {key.id, key.region});
    if (!rows.ok()) return toGrpc(rows.status());
    for (const auto& row : rows->rows) {
      auto* in = response->add_instances();
      in->set_id(row.str(0));
      in->set_address(row.str(1));
      const std::string& st = row.str(2);
      in->set_status(st == "running"  ? cluster::v1::INSTANCE_STATUS_RUNNING
                     : st == "failed" ? cluster::v1::INSTANCE_STATUS_FAILED
                                      : cluster::v1::INSTANCE_STATUS_PENDING);
      in->set_failure_reason(row.optStr(3).value_or(""));
    }
  }
  if (resource.has_sentinel()) {
    auto rows = c.query(
        "SELECT replicas, available_replicas, updated_replicas, ready_replicas, running_image,"
        " health, status_reported_at FROM sentinels WHERE id = ? AND region_id = ?",
        {key.id, key.region});
    if (!rows.ok()) return toGrpc(rows.status());
    if (!rows->empty()) {
      const db::Row& row = rows->rows.front();
      auto* s = response->mutable_sentinel();
      s->set_replicas(static_cast<uint32_t>(row.u64(0)));
      s->set_available_replicas(static_cast<uint32_t>(row.u64(1)));
      s->set_updated_replicas(static_cast<uint32_t>(row.u64(2)));
      s->set_ready_replicas(static_cast<uint32_t>(row.u64(3)));
      s->set_running_image(row.optStr(4).value_or(""));
      s->set_health(row.str(5));
      if (!row.isNull(6)) response->set_reported_ms(std::max(response->reported_ms(), row.i64(6)));
    }
  }
  return grpc::Status::OK;
}

grpc::ServerWriteReactor<v1::ResourceChange>* ResourceServiceImpl::Watch(
    grpc::CallbackServerContext* context, const v1::WatchResourcesRequest* request) {
  if (auto st = checkOperator(*context, *operators_); !st.ok()) {
    return ResourceWatchStream::refuse(toGrpc(st));
  }
  if (!request->region().empty()) {
    if (auto st = feed::checkId("region", request->region()); !st.ok()) {
      return ResourceWatchStream::refuse(toGrpc(st));
    }
  }
  if (!request->type().empty()) {
    if (auto st = feed::checkType("type", request->type()); !st.ok()) {
      return ResourceWatchStream::refuse(toGrpc(st));
    }
  }
  return ResourceWatchStream::start(hub_, *request);
}

// ---------------------------------------------------------------------------------------------
// AgentService

AgentServiceImpl::AgentServiceImpl(std::shared_ptr<ingest::Ingestor> ingestor,
                                   std::shared_ptr<const OperatorTokens> operators)
    : CheckedRequests("krane.api.v1.AgentService"),
      ingestor_(std::move(ingestor)),
      operators_(std::move(operators)) {
  checkUnary("ListAgents", this, &AgentServiceImpl::ListAgents);
  checkUnary("RemoveAgent", this, &AgentServiceImpl::RemoveAgent);
}

grpc::Status AgentServiceImpl::RemoveAgent(grpc::ServerContext* context,
                                           const v1::RemoveAgentRequest* request,
                                           v1::RemoveAgentResponse* response) {
  if (auto st = checkOperator(*context, *operators_); !st.ok()) return toGrpc(st);
  if (auto st = feed::checkId("region", request->region()); !st.ok()) return toGrpc(st);
  if (request->agent_id().empty()) {
    return toGrpc(absl::InvalidArgumentError("agent_id: required"));
  }
  if (request->agent_id().size() > 128) {
    return toGrpc(absl::InvalidArgumentError("agent_id: at most 128 bytes"));
  }
  auto last_seen = ingestor_->removeAgent(request->region(), request->agent_id(), request->force());
  if (!last_seen.ok()) return toGrpc(last_seen.status());
  response->set_last_seen_ms(*last_seen);
  return grpc::Status::OK;
}

grpc::Status AgentServiceImpl::ListAgents(grpc::ServerContext* context,
                                          const v1::ListAgentsRequest* request,
                                          v1::ListAgentsResponse* response) {
  if (auto st = checkOperator(*context, *operators_); !st.ok()) return toGrpc(st);
  if (!request->region().empty()) {
    if (auto st = feed::checkId("region", request->region()); !st.ok()) return toGrpc(st);
  }
  auto agents = ingestor_->listAgents(request->region());
  if (!agents.ok()) return toGrpc(agents.status());
  for (const auto& a : *agents) {
    auto* out = response->add_agents();
    out->set_agent_id(a.agent_id);
    out->set_region(a.region);
    out->set_build_version(a.build_version);
    out->set_applied_version(a.applied_version);
    out->set_latest_version(a.latest_version);
    out->set_lag(a.lag);
    out->set_is_leader(a.is_leader);
    out->set_parked_events(static_cast<uint32_t>(a.parked_events));
    out->set_retrying_events(static_cast<uint32_t>(a.retrying_events));
    for (const auto& p : a.plugins) *out->add_plugins() = p;
    out->set_first_seen_ms(a.first_seen_ms);
    out->set_last_seen_ms(a.last_seen_ms);
  }
  return grpc::Status::OK;
}

}  // namespace krane::api
