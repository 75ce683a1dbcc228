// What every kranectl command shares: global options, exit codes, the API client, output.
#pragma once

#include <algorithm>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <google/protobuf/message.h>
#include <grpcpp/grpcpp.h>
#include <nlohmann/json.hpp>

#include "common/strings.h"
#include "krane/api/v1/agents.grpc.pb.h"
#include "krane/api/v1/deployments.grpc.pb.h"
#include "krane/api/v1/resources.grpc.pb.h"
#include "krane/api/v1/rollouts.grpc.pb.h"
#include "krane/api/v1/sentinels.grpc.pb.h"
#include "krane/api/v1/tenancy.grpc.pb.h"

namespace krane::cli {

using Json = nlohmann::json;
namespace v1 = krane::api::v1;

enum Exit : int {
  kOk = 0,
  kRefused = 1,
  kUsage = 2,
  kUnreachable = 3,
  kUnauthenticated = 4,
  kNotFound = 5,
  kFailed = 6,
  kTimedOut = 7,
};

struct Globals {
  std::string server;
  std::string token;
  std::string token_file;
  std::string ca_file;
  std::string output = "table";
  double timeout_s = 10;
  // Seconds without data from krane-ctrl before kranectl pings it; a connection that stays
  // silent (a partition, a vanished host) then fails the command instead of hanging it. 0: off.
  double keepalive_s = 30;
};

// Prints "kranectl: error: <message>" and returns `code`.
int fail(int code, const std::string& message);
// An RPC error as a message and an exit code.
int rpcFail(const Globals& g, const std::string& what, const grpc::Status& s);

class Api {
 public:
  explicit Api(const Globals& g) : g_(g) {
    std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
    if (!g.ca_file.empty()) {
      std::ifstream in(g.ca_file);
      std::stringstream pem;
      pem << in.rdbuf();
      grpc::SslCredentialsOptions tls;
      tls.pem_root_certs = pem.str();
      creds = grpc::SslCredentials(tls);
    }
    grpc::ChannelArguments args;
    if (g.keepalive_s > 0) {
      const int every_ms = static_cast<int>(g.keepalive_s * 1000);
      args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, every_ms);
      args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, std::clamp(every_ms, 1000, 10000));
      // A watch sends nothing after its request: ping all the same.
      args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
      args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
    }
    channel_ = grpc::CreateCustomChannel(g.server, creds, args);
    resources_ = v1::ResourceService::NewStub(channel_);
    agents_ = v1::AgentService::NewStub(channel_);
    deployments_ = v1::DeploymentService::NewStub(channel_);
    tenancy_ = v1::TenancyService::NewStub(channel_);
    rollouts_ = v1::RolloutService::NewStub(channel_);
    sentinels_ = v1::SentinelService::NewStub(channel_);
  }

  std::unique_ptr<grpc::ClientContext> context(bool deadline = true) const {
    auto c = std::make_unique<grpc::ClientContext>();
    if (!g_.token.empty()) c->AddMetadata("authorization", strCat("Bearer ", g_.token));
    if (deadline) {
      c->set_deadline(std::chrono::system_clock::now() +
                      std::chrono::milliseconds(static_cast<int64_t>(g_.timeout_s * 1000)));
    }
    return c;
  }
  v1::ResourceService::Stub& resources() { return *resources_; }
  v1::AgentService::Stub& agents() { return *agents_; }
  v1::DeploymentService::Stub& deployments() { return *deployments_; }
  v1::TenancyService::Stub& tenancy() { return *tenancy_; }
  v1::RolloutService::Stub& rollouts() { return *rollouts_; }
  v1::SentinelService::Stub& sentinels() { return *sentinels_; }

 private:
  const Globals& g_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::ResourceService::Stub> resources_;
  std::unique_ptr<v1::AgentService::Stub> agents_;
  std::unique_ptr<v1::DeploymentService::Stub> deployments_;
  std::unique_ptr<v1::TenancyService::Stub> tenancy_;
  std::unique_ptr<v1::RolloutService::Stub> rollouts_;
  std::unique_ptr<v1::SentinelService::Stub> sentinels_;
};

// A message as JSON with the .proto field names.
Json protoJson(const google::protobuf::Message& m);
// JSON or YAML, as --output says.
void printStructured(const Globals& g, const Json& j);
// Columns padded to their widest cell.
void printTable(const std::vector<std::vector<std::string>>& rows);
// "12s ago", "5m ago", "never".
std::string ago(int64_t unix_ms);

}  // namespace krane::cli
