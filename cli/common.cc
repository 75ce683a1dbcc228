#include "cli/common.h"

#include <chrono>
#include <cstdio>

#include <google/protobuf/util/json_util.h>
#include <yaml-cpp/yaml.h>

namespace krane::cli {
int fail(int code, const std::string& message) {
  std::fprintf(stderr, "kranectl: error: %s\n", message.c_str());
  return code;
}

// An RPC error as a message and an exit code.
int rpcFail(const Globals& g, const std::string& what, const grpc::Status& s) {
  switch (s.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return fail(kUnreachable, strCat(what, ": cannot reach krane-ctrl at ", g.server, " (",
                                       s.error_message(), ")"));
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::PERMISSION_DENIED:
      return fail(kUnauthenticated,
                  strCat(what, ": the server refused the token: ", s.error_message(),
                         " (set --token, --token-file or $KRANE_TOKEN to an operator token)"));
    case grpc::StatusCode::NOT_FOUND:
      return fail(kNotFound, strCat(what, ": ", s.error_message()));
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::ABORTED:
      return fail(kRefused, strCat(what, ": refused: ", s.error_message()));
    default:
      return fail(kRefused, strCat(what, ": ", s.error_message()));
  }
}

// --- output ------------------------------------------------------------------------------------

Json protoJson(const google::protobuf::Message& m) {
  std::string text;
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(m, &text, o);
  return Json::parse(text, nullptr, false);
}

namespace {

void emitYaml(YAML::Emitter& out, const Json& j) {
  if (j.is_object()) {
    out << YAML::BeginMap;
    for (const auto& [k, v] : j.items()) {
      out << YAML::Key << k << YAML::Value;
      emitYaml(out, v);
    }
    out << YAML::EndMap;
  } else if (j.is_array()) {
    out << YAML::BeginSeq;
    for (const auto& v : j) emitYaml(out, v);
    out << YAML::EndSeq;
  } else if (j.is_string()) {
    out << j.get<std::string>();
  } else if (j.is_null()) {
    out << YAML::Null;
  } else {
    out << j.dump();
  }
}

}  // namespace

void printStructured(const Globals& g, const Json& j) {
  if (g.output == "json") {
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    YAML::Emitter out;
    emitYaml(out, j);
    std::printf("%s\n", out.c_str());
  }
}

// Columns padded to their widest cell.
void printTable(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width;
  for (const auto& r : rows) {
    width.resize(std::max(width.size(), r.size()));
    for (size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], r[i].size());
  }
  for (const auto& r : rows) {
    std::string line;
    for (size_t i = 0; i < r.size(); ++i) {
      line += r[i];
      if (i + 1 < r.size()) line += std::string(width[i] - r[i].size() + 3, ' ');
    }
    std::printf("%s\n", line.c_str());
  }
}

std::string ago(int64_t unix_ms) {
  if (unix_ms <= 0) return "never";
  const int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  const int64_t s = std::max<int64_t>(0, (now - unix_ms) / 1000);
  if (s < 120) return strCat(s, "s ago");
  if (s < 7200) return strCat(s / 60, "m ago");
  return strCat(s / 3600, "h ago");
}

}  // namespace krane::cli
