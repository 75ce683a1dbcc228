#include "controlplane/workflow/typed.h"

#include <google/protobuf/util/json_util.h>

#include "common/strings.h"

namespace krane::workflow {

std::string encodeMessage(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  std::string out;
  // Printing a well-formed message cannot fail (no Any with an unknown type is used here).
  const auto status = google::protobuf::util::MessageToJsonString(message, &out, options);
  if (!status.ok()) return "{}";
  return out;
}

absl::Status decodeMessage(std::string_view payload, google::protobuf::Message* message,
                           std::string_view what) {
  message->Clear();
  if (payload.empty()) return absl::OkStatus();
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;
  const auto status = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(payload.data(), payload.size()), message, options);
  if (status.ok()) return absl::OkStatus();
  return terminalError(absl::StatusCode::kInvalidArgument,
                       strCat(what, ": not a valid ", message->GetDescriptor()->full_name(), ": ",
                              std::string(status.message().data(), status.message().size())));
}

}  // namespace krane::workflow
