// Requests read from their raw bytes, so that a malformed one gets an answer that names the
// field. gRPC's own reading hands the bytes to protobuf, which refuses a proto3 `string` that is
// not valid UTF-8 without saying which; the call then fails with INTERNAL and an empty message.
// The public services install these handlers for every method instead: a string that is not
// UTF-8 is INVALID_ARGUMENT "<field path>: not valid UTF-8" before the handler runs, and nothing
// else changes (clients call the methods as before; unary methods are served as gRPC's
// "streamed unary", which is invisible to them).
//
// Threads: the handlers run where the generated ones would (sync methods on the server's
// threads, callback methods on gRPC's).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/support/method_handler.h>

#include "absl/status/status.h"
#include "common/grpc_status.h"

namespace krane::api {

// The path of the first string field of a `type` message serialized as `wire` whose value is not
// valid UTF-8, as "resource.cilium_network_policy.name", "build.argv[1]" or "spec.labels[0].key"
// (repeated and map fields by their position in the message); nullopt when there is none.
std::optional<std::string> firstInvalidUtf8Field(const google::protobuf::Descriptor& type,
                                                 std::string_view wire);

// Parses `raw` into `message`: INVALID_ARGUMENT "<field>: not valid UTF-8" for such a string,
// INVALID_ARGUMENT "request: not a valid <type>" for anything else that does not parse.
absl::Status parseRequest(const grpc::ByteBuffer& raw, google::protobuf::Message& message);
// The same from the message's bytes.
absl::Status parseRequest(std::string_view wire, google::protobuf::Message& message);

// The index of `method` in the service `full_service_name` (its declaration order, which is the
// order of the generated service's methods). Aborts for a method that does not exist: a typo
// in a service's constructor, found by the first test that starts a server.
int methodIndex(std::string_view full_service_name, std::string_view method);

// A generated `Service` (or one of its WithCallbackMethod_* wrappers) whose methods read their
// requests through parseRequest. A derived service calls checkUnary / checkServerStreaming /
// checkCallbackServerStreaming once per method in its constructor.
template <class Base>
class CheckedRequests : public Base {
 protected:
  explicit CheckedRequests(std::string_view full_service_name) : service_name_(full_service_name) {}

  // A sync unary method, e.g. checkUnary("Put", this, &ResourceServiceImpl::Put).
  template <class Impl, class Req, class Resp>
  void checkUnary(std::string_view method, Impl* impl,
                  grpc::Status (Impl::*call)(grpc::ServerContext*, const Req*, Resp*)) {
    using Streamer = grpc::ServerUnaryStreamer<grpc::ByteBuffer, grpc::ByteBuffer>;
    this->MarkMethodStreamed(
        methodIndex(service_name_, method),
        new grpc::internal::StreamedUnaryHandler<grpc::ByteBuffer, grpc::ByteBuffer>(
            [impl, call](grpc::ServerContext* context, Streamer* stream) -> grpc::Status {
              grpc::ByteBuffer raw;
              if (!stream->Read(&raw)) {
                return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "request: missing");
              }
              Req request;
              if (auto st = parseRequest(raw, request); !st.ok()) return toGrpc(st);
              Resp response;
              grpc::Status status = (impl->*call)(context, &request, &response);
              if (!status.ok()) return status;
              grpc::ByteBuffer out;
              bool own = false;
              status = grpc::SerializationTraits<Resp>::Serialize(response, &out, &own);
              if (status.ok()) stream->Write(out);
              return status;
            }));
  }

  // A sync server-streaming method; `call` writes through a ServerWriterInterface.
  template <class Impl, class Req, class Resp>
  void checkServerStreaming(std::string_view method, Impl* impl,
                            grpc::Status (Impl::*call)(grpc::ServerContext*, const Req*,
                                                       grpc::ServerWriterInterface<Resp>*)) {
    using Streamer = grpc::ServerSplitStreamer<grpc::ByteBuffer, grpc::ByteBuffer>;
    this->MarkMethodStreamed(
        methodIndex(service_name_, method),
        new grpc::internal::SplitServerStreamingHandler<grpc::ByteBuffer, grpc::ByteBuffer>(
            [impl, call](grpc::ServerContext* context, Streamer* stream) -> grpc::Status {
              grpc::ByteBuffer raw;
              if (!stream->Read(&raw)) {
                return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "request: missing");
              }
              Req request;
              if (auto st = parseRequest(raw, request); !st.ok()) return toGrpc(st);
              SerializingWriter<Resp> writer(stream);
              return (impl->*call)(context, &request, &writer);
            }));
  }

  // A callback server-streaming method: `call` makes the reactor, as the generated one would.
  template <class Impl, class Req, class Resp>
  void checkCallbackServerStreaming(
      std::string_view method, Impl* impl,
      grpc::ServerWriteReactor<Resp>* (Impl::*call)(grpc::CallbackServerContext*, const Req*)) {
    this->MarkMethodCallback(
        methodIndex(service_name_, method),
        new grpc::internal::CallbackServerStreamingHandler<grpc::ByteBuffer, Resp>(
            [impl, call](grpc::CallbackServerContext* context,
                         const grpc::ByteBuffer* raw) -> grpc::ServerWriteReactor<Resp>* {
              Req request;
              const absl::Status parsed = parseRequest(*raw, request);
              // gRPC keeps the raw request until the call ends, and its bytes share the
              // connection's read buffer: a long stream would pin that buffer for its whole life
              // (about 8 KiB per idle Watch). The handler owns a mutable buffer; release it now.
              const_cast<grpc::ByteBuffer*>(raw)->Clear();
              if (!parsed.ok()) return new Refused<Resp>(toGrpc(parsed));
              return (impl->*call)(context, &request);
            }));
  }

 private:
  // Writes each message to the raw stream, serialized.
  template <class Resp>
  class SerializingWriter final : public grpc::ServerWriterInterface<Resp> {
   public:
    explicit SerializingWriter(grpc::ServerSplitStreamer<grpc::ByteBuffer, grpc::ByteBuffer>* s)
        : stream_(s) {}
    void SendInitialMetadata() override { stream_->SendInitialMetadata(); }
    bool Write(const Resp& message, grpc::WriteOptions options) override {
      grpc::ByteBuffer out;
      bool own = false;
      if (!grpc::SerializationTraits<Resp>::Serialize(message, &out, &own).ok()) return false;
      return stream_->Write(out, options);
    }

   private:
    grpc::ServerSplitStreamer<grpc::ByteBuffer, grpc::ByteBuffer>* stream_;
  };

  // Ends a stream at once with `status`.
  template <class Resp>
  class Refused final : public grpc::ServerWriteReactor<Resp> {
   public:
    explicit Refused(grpc::Status status) { this->Finish(std::move(status)); }
    void OnDone() override { delete this; }
  };

  std::string service_name_;
};

}  // namespace krane::api
