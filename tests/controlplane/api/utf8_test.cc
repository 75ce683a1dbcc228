// Every string field of every request of krane-ctrl's gRPC services, found by reflection over
// the request messages (so a new field or method is covered without touching this test), gets
// INVALID_ARGUMENT naming the field when it holds bytes that are not UTF-8, never INTERNAL with
// an empty message; and a 1 MiB value in any of them gets a short answer at once (a limit, or a
// message that quotes it cut short). Requests are sent as raw bytes, as any client could.
#include <chrono>
#include <set>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <google/protobuf/descriptor.h>
#include <google/protobuf/dynamic_message.h>
#include <grpcpp/impl/client_unary_call.h>
#include <grpcpp/impl/rpc_method.h>

#include "controlplane/api/checked_requests.h"
#include "krane/api/v1/agents.grpc.pb.h"
#include "krane/api/v1/deployments.grpc.pb.h"
#include "krane/api/v1/resources.grpc.pb.h"
#include "krane/api/v1/rollouts.grpc.pb.h"
#include "krane/api/v1/sentinels.grpc.pb.h"
#include "krane/api/v1/tenancy.grpc.pb.h"
#include "krane/api/v1/workflows.grpc.pb.h"
#include "krane/cluster/v1/cluster.grpc.pb.h"
#include "tests/support/control_plane.h"
#include "tests/support/matchers.h"

namespace krane {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using krane::testing::kOperatorToken;
using krane::testing::TestControlPlane;

// The services krane-ctrl serves.
const std::vector<std::string> kServices = {
    "krane.api.v1.ResourceService",   "krane.api.v1.AgentService",
    "krane.api.v1.DeploymentService", "krane.api.v1.TenancyService",
    "krane.api.v1.WorkflowService",   "krane.cluster.v1.ClusterService",
    "krane.api.v1.RolloutService",    "krane.api.v1.SentinelService",
};

const std::string kNotUtf8 = std::string("ok\xff\xfe", 4);

// One string field somewhere in a request: the fields leading to it, outermost first.
using FieldPath = std::vector<const FieldDescriptor*>;

// Every string field reachable from `type` (a message type met again on the way down is not
// entered twice, so recursive types end).
void stringFields(const Descriptor& type, FieldPath& prefix, std::set<const Descriptor*>& open,
                  std::vector<FieldPath>& out) {
  open.insert(&type);
  for (int i = 0; i < type.field_count(); ++i) {
    const FieldDescriptor* field = type.field(i);
    prefix.push_back(field);
    if (field->type() == FieldDescriptor::TYPE_STRING) {
      out.push_back(prefix);
    } else if (field->type() == FieldDescriptor::TYPE_MESSAGE &&
               !open.count(field->message_type())) {
      stringFields(*field->message_type(), prefix, open, out);
    }
    prefix.pop_back();
  }
  open.erase(&type);
}

// How the server names the field: "resource.cilium_network_policy.name", "build.argv[0]".
std::string pathText(const FieldPath& path) {
  std::string text;
  for (const FieldDescriptor* field : path) {
    if (!text.empty()) text += ".";
    text += field->name();
    if (field->is_repeated()) text += "[0]";
  }
  return text;
}

// A request with only that field set, to `value` (bytes that are not UTF-8 by default).
std::string requestWithBadString(const Descriptor& type, const FieldPath& path,
                                 const std::string& value = kNotUtf8) {
  std::unique_ptr<Message> request(
      google::protobuf::MessageFactory::generated_factory()->GetPrototype(&type)->New());
  Message* at = request.get();
  for (size_t i = 0; i + 1 < path.size(); ++i) {
    const auto* reflection = at->GetReflection();
    at = path[i]->is_repeated() ? reflection->AddMessage(at, path[i])
                                : reflection->MutableMessage(at, path[i]);
  }
  const auto* reflection = at->GetReflection();
  if (path.back()->is_repeated()) {
    reflection->AddString(at, path.back(), value);
  } else {
    reflection->SetString(at, path.back(), value);
  }
  std::string wire;
  REQUIRE(request->SerializePartialToString(&wire));
  return wire;
}

grpc::Status callRaw(grpc::Channel& channel, const std::string& method, const std::string& wire) {
  grpc::Slice slice(wire);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  auto context = TestControlPlane::withToken(kOperatorToken, std::chrono::seconds(10));
  const grpc::internal::RpcMethod rpc(method.c_str(), grpc::internal::RpcMethod::NORMAL_RPC);
  return grpc::internal::BlockingUnaryCall(&channel, rpc, context.get(), request, &response);
}

TEST_CASE("a string that is not utf8 in any field of any request is refused naming the field",
          "[utf8]") {
  TestControlPlane cp;
  cp.startReplica();
  auto channel = cp.channel();
  size_t checked = 0;
  for (const std::string& name : kServices) {
    const auto* service =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(name);
    REQUIRE(service != nullptr);
    for (int m = 0; m < service->method_count(); ++m) {
      const auto* method = service->method(m);
      const std::string rpc = "/" + service->full_name() + "/" + method->name();
      std::vector<FieldPath> fields;
      FieldPath prefix;
      std::set<const Descriptor*> open;
      stringFields(*method->input_type(), prefix, open, fields);
      for (const FieldPath& field : fields) {
        const std::string path = pathText(field);
        INFO(rpc << " " << path);
        const grpc::Status st =
            callRaw(*channel, rpc, requestWithBadString(*method->input_type(), field));
        CHECK(st.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
        CHECK(st.error_message() == path + ": not valid UTF-8");
        ++checked;
      }
    }
  }
  // Every service has string fields; far fewer would mean the reflection found nothing.
  CHECK(checked > 100u);
  // Nothing was written by any of them.
  auto rows = (*cp.pool()->acquire())->query("SELECT COUNT(*) FROM resource_changes", {});
  REQUIRE_THAT(rows, IsOk());
  CHECK(rows->rows[0].i64(0) == 0);
}

TEST_CASE("a 1 MiB value in any string field of any request gets a short answer at once",
          "[utf8]") {
  TestControlPlane cp;
  cp.startReplica();
  auto channel = cp.channel();
  const std::string huge(1 << 20, 'a');
  size_t checked = 0;
  for (const std::string& name : kServices) {
    const auto* service =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(name);
    REQUIRE(service != nullptr);
    for (int m = 0; m < service->method_count(); ++m) {
      const auto* method = service->method(m);
      const std::string rpc = "/" + service->full_name() + "/" + method->name();
      std::vector<FieldPath> fields;
      FieldPath prefix;
      std::set<const Descriptor*> open;
      stringFields(*method->input_type(), prefix, open, fields);
      for (const FieldPath& field : fields) {
        INFO(rpc << " " << pathText(field));
        const auto started = std::chrono::steady_clock::now();
        const grpc::Status st =
            callRaw(*channel, rpc, requestWithBadString(*method->input_type(), field, huge));
        CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(5));
        INFO(st.error_message().substr(0, 200));
        CHECK_FALSE(st.ok());  // each request lacks what its method requires
        CHECK(st.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED);
        CHECK(st.error_code() != grpc::StatusCode::INTERNAL);
        CHECK(st.error_message().size() < 512u);
        ++checked;
      }
    }
  }
  CHECK(checked > 100u);
}

TEST_CASE("well formed utf8 of every length passes and the field paths are as documented",
          "[utf8]") {
  const auto* put = krane::api::v1::PutResourceRequest::descriptor();
  krane::api::v1::PutResourceRequest request;
  request.mutable_resource()->set_id("grüße-€-𝄞");
  request.mutable_resource()->mutable_deployment_topology()->add_args("ok");
  request.mutable_resource()->mutable_deployment_topology()->add_args(kNotUtf8);
  CHECK(api::firstInvalidUtf8Field(*put, request.SerializePartialAsString()) ==
        "resource.deployment_topology.args[1]");
  request.mutable_resource()->mutable_deployment_topology()->clear_args();
  CHECK(api::firstInvalidUtf8Field(*put, request.SerializePartialAsString()) == std::nullopt);
  // Overlong forms and surrogates are not UTF-8 either.
  for (const std::string& bad : {std::string("\xc0\xaf"), std::string("\xed\xa0\x80"),
                                 std::string("\xf4\x90\x80\x80"), std::string("\xe2\x82")}) {
    request.mutable_resource()->set_id(bad);
    CHECK(api::firstInvalidUtf8Field(*put, request.SerializePartialAsString()) == "resource.id");
  }
}

}  // namespace
}  // namespace krane
