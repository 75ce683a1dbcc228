#include "controlplane/workflow/typed.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/util/json_util.h>
#include <nlohmann/json.hpp>

#include "common/strings.h"

namespace krane::workflow {
namespace {

namespace pb = google::protobuf;

// protobuf's JSON parser takes any string for a bool ("yes" becomes true); proto3 JSON allows
// only true and false. Returns the path of the first bool field that holds something else.
std::optional<std::string> looseBool(const nlohmann::json& j, const pb::Descriptor* d,
                                     const std::string& path) {
  if (!j.is_object() || d->file()->name().rfind("google/protobuf/", 0) == 0) return std::nullopt;
  for (const auto& [key, value] : j.items()) {
    const pb::FieldDescriptor* f = d->FindFieldByName(key);
    for (int i = 0; f == nullptr && i < d->field_count(); ++i) {
      if (d->field(i)->json_name() == key) f = d->field(i);
    }
    if (f == nullptr || value.is_null() || f->is_map()) continue;
    const std::string at = path.empty() ? f->name() : strCat(path, ".", f->name());
    std::vector<const nlohmann::json*> items;
    if (f->is_repeated() && value.is_array()) {
      for (const nlohmann::json& item : value) items.push_back(&item);
    } else {
      items.push_back(&value);
    }
    for (const nlohmann::json* item : items) {
      if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_BOOL && !item->is_boolean()) return at;
      if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
        if (auto bad = looseBool(*item, f->message_type(), at)) return bad;
      }
    }
  }
  return std::nullopt;
}

}  // namespace

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
  if (status.ok()) {
    const nlohmann::json j = nlohmann::json::parse(payload, nullptr, /*allow_exceptions=*/false);
    if (auto field = looseBool(j, message->GetDescriptor(), "")) {
      message->Clear();
      return terminalError(absl::StatusCode::kInvalidArgument,
                           strCat(what, ": not a valid ", message->GetDescriptor()->full_name(),
                                  ": (", *field, "): must be true or false"));
    }
    return absl::OkStatus();
  }
  return terminalError(absl::StatusCode::kInvalidArgument,
                       strCat(what, ": not a valid ", message->GetDescriptor()->full_name(), ": ",
                              std::string(status.message().data(), status.message().size())));
}

}  // namespace krane::workflow
