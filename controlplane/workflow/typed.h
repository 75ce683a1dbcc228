// Typed handlers over protobuf messages: what services are written with, so that none of them
// encodes or decodes payloads by hand.
//
//   ServiceDefinition::virtualObject("DeployService")
//       .exclusive("Deploy", typed<DeployRequest, DeployResult>(
//           [](Context& ctx, const DeployRequest& req) -> absl::StatusOr<DeployResult> { ... }));
//
//   TypedFuture<AcquireResponse> f = call<AcquireResponse>(ctx, "BuildSlotService",
//                                                          "AcquireOrWait", workspace, request);
//   absl::StatusOr<AcquireResponse> acquired = await(ctx, f);
//
// On the wire (inputs, outputs, journal entries, per-object state) a message is its proto3 JSON
// with the .proto field names: readable in `krane-ctrl workflow show`, and fields that a newer
// replica added are ignored by an older one during a rolling upgrade. An empty payload is the
// empty message. A payload that does not decode is a terminal INVALID_ARGUMENT naming what it
// was (the handler's input, a call's result, a state key).
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <google/protobuf/message.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "controlplane/workflow/engine.h"
#include "controlplane/workflow/service.h"

namespace krane::workflow {

// The payload of a message (proto3 JSON, .proto field names).
std::string encodeMessage(const google::protobuf::Message& message);
// Parses `payload` into `message`; a terminal INVALID_ARGUMENT naming `what` when it does not.
absl::Status decodeMessage(std::string_view payload, google::protobuf::Message* message,
                           std::string_view what);

template <typename M>
absl::StatusOr<M> decodeAs(std::string_view payload, std::string_view what) {
  M message;
  absl::Status s = decodeMessage(payload, &message, what);
  if (!s.ok()) return s;
  return message;
}

// A handler taking `Req` and returning `Resp`.
template <typename Req, typename Resp>
using TypedHandlerFn = std::function<absl::StatusOr<Resp>(Context&, const Req&)>;

template <typename Req, typename Resp>
Handler typed(TypedHandlerFn<Req, Resp> fn) {
  return
      [fn = std::move(fn)](Context& ctx, const std::string& input) -> absl::StatusOr<std::string> {
        absl::StatusOr<Req> request = decodeAs<Req>(input, "input");
        if (!request.ok()) return request.status();
        absl::StatusOr<Resp> response = fn(ctx, *request);
        if (!response.ok()) return response.status();
        return encodeMessage(*response);
      };
}

// The result of a call (or anything else settling to a `Resp`).
template <typename Resp>
struct TypedFuture {
  Future future;
  std::string what;  // names the result in decoding errors: "call Service.handler"
};

template <typename Resp, typename Req>
TypedFuture<Resp> call(Context& ctx, std::string_view service, std::string_view handler,
                       std::string_view key, const Req& request) {
  return TypedFuture<Resp>{
      ctx.call(service, handler, key, encodeMessage(request)),
      std::string("call ") + std::string(service) + "." + std::string(handler)};
}

template <typename Req>
void send(Context& ctx, std::string_view service, std::string_view handler, std::string_view key,
          const Req& request, std::chrono::milliseconds delay = std::chrono::milliseconds(0)) {
  ctx.send(service, handler, key, encodeMessage(request), delay);
}

template <typename Resp>
absl::StatusOr<Resp> await(Context& ctx, const TypedFuture<Resp>& f) {
  absl::StatusOr<std::string> raw = ctx.await(f.future);
  if (!raw.ok()) return raw.status();
  return decodeAs<Resp>(*raw, f.what);
}

// Every result, in order: each a message or that call's error. CANCELLED when cancelled.
template <typename Resp>
absl::StatusOr<std::vector<absl::StatusOr<Resp>>> awaitAll(
    Context& ctx, const std::vector<TypedFuture<Resp>>& futures) {
  std::vector<Future> raw_futures;
  raw_futures.reserve(futures.size());
  for (const auto& f : futures) raw_futures.push_back(f.future);
  auto raw = ctx.awaitAll(raw_futures);
  if (!raw.ok()) return raw.status();
  std::vector<absl::StatusOr<Resp>> out;
  out.reserve(raw->size());
  for (size_t i = 0; i < raw->size(); ++i) {
    if (!(*raw)[i].ok()) {
      out.emplace_back((*raw)[i].status());
    } else {
      out.push_back(decodeAs<Resp>(*(*raw)[i], futures[i].what));
    }
  }
  return out;
}

// A journaled side effect whose result is a message (Context::run).
template <typename M>
absl::StatusOr<M> run(Context& ctx, std::string_view name,
                      const std::function<absl::StatusOr<M>()>& fn) {
  absl::StatusOr<std::string> raw = ctx.run(name, [&]() -> absl::StatusOr<std::string> {
    absl::StatusOr<M> result = fn();
    if (!result.ok()) return result.status();
    return encodeMessage(*result);
  });
  if (!raw.ok()) return raw.status();
  return decodeAs<M>(*raw, std::string("run '") + std::string(name) + "'");
}

// A side effect on the engine's database, done in the transaction that journals it, whose result
// is a message (Context::runTx): exactly once.
template <typename M>
absl::StatusOr<M> runTx(Context& ctx, std::string_view name,
                        const std::function<absl::StatusOr<M>(db::Connection&)>& fn) {
  absl::StatusOr<std::string> raw =
      ctx.runTx(name, [&](db::Connection& conn) -> absl::StatusOr<std::string> {
        absl::StatusOr<M> result = fn(conn);
        if (!result.ok()) return result.status();
        return encodeMessage(*result);
      });
  if (!raw.ok()) return raw.status();
  return decodeAs<M>(*raw, std::string("runTx '") + std::string(name) + "'");
}

// Per-object state holding a message: nullopt when unset.
template <typename M>
absl::StatusOr<std::optional<M>> getState(Context& ctx, std::string_view name) {
  std::optional<std::string> raw = ctx.get(name);
  if (!raw) return std::optional<M>();
  absl::StatusOr<M> decoded = decodeAs<M>(*raw, std::string("state '") + std::string(name) + "'");
  if (!decoded.ok()) return decoded.status();
  return std::optional<M>(*std::move(decoded));
}

template <typename M>
void setState(Context& ctx, std::string_view name, const M& value) {
  ctx.set(name, encodeMessage(value));
}

// A compensation that owns what it needs: `data` is copied when it is registered, and `fn`
// captures nothing (it must convert to a plain function pointer, so a capture does not compile),
// so nothing it uses can dangle after the handler has returned. It runs with the Context: its
// steps (runTx on the engine's database, calls, sends) are journaled and resume after a crash.
//
//   compensate(ctx, "release slot", release,
//              [](Context& ctx, const ReleaseRequest& r) {
//                send(ctx, "BuildSlotService", "Release", r.workspace_id(), r);
//                return absl::OkStatus();
//              });
template <typename M>
void compensate(Context& ctx, std::string_view name, M data,
                std::type_identity_t<absl::Status (*)(Context&, const M&)> fn) {
  ctx.compensate(name, [data = std::move(data), fn](Context& c) { return fn(c, data); });
}

// Ingress from outside a handler (an API call, a test).
template <typename Req>
InvokeRequest invocation(std::string service, std::string handler, std::string key,
                         const Req& request, std::string idempotency_key = "") {
  InvokeRequest r;
  r.service = std::move(service);
  r.handler = std::move(handler);
  r.key = std::move(key);
  r.input = encodeMessage(request);
  r.idempotency_key = std::move(idempotency_key);
  return r;
}

// An invocation's result (Engine::awaitResult, Engine::call) as a message.
template <typename Resp>
absl::StatusOr<Resp> resultAs(const absl::StatusOr<std::string>& raw) {
  if (!raw.ok()) return raw.status();
  return decodeAs<Resp>(*raw, "result");
}

}  // namespace krane::workflow
