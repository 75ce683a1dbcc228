#include "controlplane/api/workflows.h"

#include "common/grpc_status.h"
#include "common/strings.h"
#include "controlplane/api/services.h"
#include "controlplane/workflow/operations.h"
#include "controlplane/workflow/service.h"

namespace krane::api {
namespace {

void fill(const workflow::InvocationSummary& s, v1::InvocationSummary* out) {
  out->set_id(s.id);
  out->set_service(s.service);
  out->set_handler(s.handler);
  out->set_key(s.key);
  out->set_status(s.status);
  out->set_attempts(s.attempts);
  out->set_created_at_ms(s.created_at);
  out->set_finished_at_ms(s.finished_at.value_or(0));
  out->set_last_error(s.last_error);
}

absl::Status requireId(const std::string& field, const std::string& id) {
  if (id.empty()) return absl::InvalidArgumentError(strCat(field, ": required"));
  if (id.size() > 128) return absl::InvalidArgumentError(strCat(field, ": at most 128 bytes"));
  return absl::OkStatus();
}

}  // namespace

WorkflowServiceImpl::WorkflowServiceImpl(std::shared_ptr<db::Pool> pool,
                                         std::shared_ptr<const OperatorTokens> operators)
    : CheckedRequests("krane.api.v1.WorkflowService"),
      pool_(std::move(pool)),
      operators_(std::move(operators)) {
  checkUnary("ListInvocations", this, &WorkflowServiceImpl::ListInvocations);
  checkUnary("GetInvocation", this, &WorkflowServiceImpl::GetInvocation);
  checkUnary("CancelInvocation", this, &WorkflowServiceImpl::CancelInvocation);
  checkUnary("KillInvocation", this, &WorkflowServiceImpl::KillInvocation);
  checkUnary("ResumeInvocation", this, &WorkflowServiceImpl::ResumeInvocation);
  checkUnary("SettleAwakeable", this, &WorkflowServiceImpl::SettleAwakeable);
  checkUnary("ListHeldKeys", this, &WorkflowServiceImpl::ListHeldKeys);
}

grpc::Status WorkflowServiceImpl::ListInvocations(grpc::ServerContext* context,
                                                  const v1::ListInvocationsRequest* request,
                                                  v1::ListInvocationsResponse* response) {
  if (auto st = checkOperator(*context, *operators_); !st.ok()) return toGrpc(st);
  if (!request->key().empty() && request->service().empty()) {
    return toGrpc(absl::InvalidArgumentError("key: a key filter needs a service"));
  }
  // The limits of service names and object keys (controlplane/workflow/engine.h).
  if (request->service().size() > 64) {
    return toGrpc(absl::InvalidArgumentError("service: at most 64 bytes"));
  }
  if (request->key().size() > 255) {
    return toGrpc(absl::InvalidArgumentError("key: at most 255 bytes"));
  }
  workflow::InvocationFilter filter;
  filter.service = request->service();
  filter.key = request->key();
  filter.status = request->status();
  filter.limit = request->limit() == 0 ? 100 : std::min<uint32_t>(request->limit(), 10000);
  auto all = workflow::listInvocations(*pool_, filter);
  if (!all.ok()) return toGrpc(all.status());
  for (const auto& s : *all) fill(s, response->add_invocations());
  return grpc::Status::OK;
}

grpc::Status WorkflowServiceImpl::GetInvocation(grpc::ServerContext* context,
                                                const v1::GetInvocationRequest* request,
                                                v1::GetInvocationResponse* response) {
  if (auto st = checkOperator(*context, *operators_); !st.ok()) return toGrpc(st);
  if (auto st = requireId("id", request->id()); !st.ok()) return toGrpc(st);
  auto d = workflow::showInvocation(*pool_, request->id());
  if (!d.ok()) return toGrpc(d.status());
  fill(d->summary, response->mutable_summary());
  response->set_input(d->input);
  if (d->output) response->set_output(*d->output);
  response->set_error(d->error);
  response->set_parent_id(d->parent_id.value_or(""));
  response->set_idempotency_key(d->idempotency_key.value_or(""));
  response->set_lease_owner(d->lease_owner.value_or(""));
  response->set_claims(d->claims);
  response->set_cancel_requested(d->cancel_requested);
  for (const auto& e : d->journal) {
    auto* out = response->add_journal();
    out->set_seq(e.seq);
    out->set_kind(e.kind);
    out->set_name(e.name);
    out->set_ok(e.ok);
    if (e.payload) out->set_payload(*e.payload);
    out->set_error(e.error);
    out->set_duration_ms(e.duration_ms);
    out->set_created_at_ms(e.created_at);
  }
  return grpc::Status::OK;
}

grpc::Status WorkflowServiceImpl::CancelInvocation(grpc::ServerContext* context,
                                                   const v1::InvocationRef* request,
                                                   v1::InvocationActionResponse*) {
  if (auto st = checkOperator(*context, *operators_); !st.ok()) return toGrpc(st);
  if (auto st = requireId("id", request->id()); !st.ok()) return toGrpc(st);
  return toGrpc(workflow::cancelInvocation(*pool_, request->id()));
}

grpc::Status WorkflowServiceImpl::KillInvocation(grpc::ServerContext* context,
                                                 const v1::InvocationRef* request,
                                                 v1::InvocationActionResponse*) {
  if (auto st = checkOperator(*context, *operators_); !st.ok()) return toGrpc(st);
  if (auto st = requireId("id", request->id()); !st.ok()) return toGrpc(st);
  return toGrpc(workflow::killInvocation(*pool_, request->id()));
}

grpc::Status WorkflowServiceImpl::ResumeInvocation(grpc::ServerContext* context,
                                                   const v1::InvocationRef* request,
                                                   v1::InvocationActionResponse*) {
  if (auto st = checkOperator(*context, *operators_); !st.ok()) return toGrpc(st);
  if (auto st = requireId("id", request->id()); !st.ok()) return toGrpc(st);
  return toGrpc(workflow::resumeInvocation(*pool_, request->id()));
}

grpc::Status WorkflowServiceImpl::SettleAwakeable(grpc::ServerContext* context,
                                                  const v1::SettleAwakeableRequest* request,
                                                  v1::SettleAwakeableResponse*) {
  if (auto st = checkOperator(*context, *operators_); !st.ok()) return toGrpc(st);
  if (auto st = requireId("awakeable_id", request->awakeable_id()); !st.ok()) return toGrpc(st);
  if (request->reject()) {
    if (request->error_message().empty()) {
      return toGrpc(absl::InvalidArgumentError("error_message: required to reject"));
    }
    return toGrpc(workflow::settleAwakeable(
        *pool_, request->awakeable_id(),
        workflow::terminalError(absl::StatusCode::kAborted, request->error_message())));
  }
  return toGrpc(workflow::settleAwakeable(*pool_, request->awakeable_id(), request->payload()));
}

grpc::Status WorkflowServiceImpl::ListHeldKeys(grpc::ServerContext* context,
                                               const v1::ListHeldKeysRequest* request,
                                               v1::ListHeldKeysResponse* response) {
  if (auto st = checkOperator(*context, *operators_); !st.ok()) return toGrpc(st);
  if (request->older_than_ms() < 0) {
    return toGrpc(absl::InvalidArgumentError("older_than_ms: must not be negative"));
  }
  auto held =
      workflow::keysHeldLongerThan(*pool_, std::chrono::milliseconds(request->older_than_ms()));
  if (!held.ok()) return toGrpc(held.status());
  for (const auto& k : *held) {
    auto* out = response->add_keys();
    out->set_service(k.service);
    out->set_key(k.key);
    out->set_holder(k.holder);
    out->set_holder_handler(k.holder_handler);
    out->set_holder_status(k.holder_status);
    out->set_held_ms(k.held_ms);
    out->set_queued(k.queued);
  }
  return grpc::Status::OK;
}

}  // namespace krane::api
