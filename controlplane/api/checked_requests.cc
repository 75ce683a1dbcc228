#include "controlplane/api/checked_requests.h"

#include <cstdlib>
#include <map>
#include <vector>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>

#include "common/strings.h"
#include "spdlog/spdlog.h"

namespace krane::api {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::internal::WireFormatLite;

// Well-formed UTF-8 as protobuf requires it: no overlong forms, no surrogates, at most U+10FFFF.
bool validUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t n;
    uint32_t cp;
    if ((c & 0xe0) == 0xc0) {
      n = 2;
      cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      n = 3;
      cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      n = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    const uint32_t min = n == 2 ? 0x80 : n == 3 ? 0x800 : 0x10000;
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += n;
  }
  return true;
}

// Walks one message; `prefix` is its path with a trailing '.', or empty at the top.
std::optional<std::string> walk(const Descriptor& type, std::string_view wire,
                                const std::string& prefix, int depth) {
  google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(wire.data()),
                                            static_cast<int>(wire.size()));
  std::map<int, int> seen;  // occurrences of each repeated field so far
  while (true) {
    const uint32_t tag = in.ReadTag();
    if (tag == 0) return std::nullopt;
    const FieldDescriptor* field = type.FindFieldByNumber(WireFormatLite::GetTagFieldNumber(tag));
    const bool delimited =
        WireFormatLite::GetTagWireType(tag) == WireFormatLite::WIRETYPE_LENGTH_DELIMITED;
    const bool string_field = field != nullptr && field->type() == FieldDescriptor::TYPE_STRING;
    const bool message_field = field != nullptr && field->type() == FieldDescriptor::TYPE_MESSAGE;
    if (!delimited || !(string_field || message_field)) {
      // Numbers, bytes, unknown fields: protobuf decides about them.
      if (!WireFormatLite::SkipField(&in, tag)) return std::nullopt;
      continue;
    }
    uint32_t length = 0;
    if (!in.ReadVarint32(&length)) return std::nullopt;
    const void* data = nullptr;
    int available = 0;
    std::string value;
    if (!in.GetDirectBufferPointer(&data, &available) || available < static_cast<int>(length)) {
      return std::nullopt;  // truncated: protobuf refuses it
    }
    value.assign(static_cast<const char*>(data), length);
    in.Skip(static_cast<int>(length));
    std::string path = strCat(prefix, field->name());
    if (field->is_repeated()) strAppend(&path, "[", seen[field->number()]++, "]");
    if (string_field) {
      if (!validUtf8(value)) return path;
    } else if (depth < 32) {
      if (auto bad = walk(*field->message_type(), value, path + ".", depth + 1)) return bad;
    }
  }
}

}  // namespace

std::optional<std::string> firstInvalidUtf8Field(const Descriptor& type, std::string_view wire) {
  return walk(type, wire, "", 0);
}

absl::Status parseRequest(const grpc::ByteBuffer& raw, google::protobuf::Message& message) {
  std::vector<grpc::Slice> slices;
  if (!raw.Dump(&slices).ok()) return absl::InvalidArgumentError("request: cannot be read");
  std::string wire;
  for (const auto& slice : slices) {
    wire.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  return parseRequest(std::string_view(wire), message);
}

absl::Status parseRequest(std::string_view wire, google::protobuf::Message& message) {
  if (auto field = firstInvalidUtf8Field(*message.GetDescriptor(), wire)) {
    return absl::InvalidArgumentError(strCat(*field, ": not valid UTF-8"));
  }
  if (!message.ParseFromArray(wire.data(), static_cast<int>(wire.size()))) {
    return absl::InvalidArgumentError(
        strCat("request: not a valid ", message.GetDescriptor()->full_name()));
  }
  return absl::OkStatus();
}

int methodIndex(std::string_view full_service_name, std::string_view method) {
  const auto* service = google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
      std::string(full_service_name));
  const auto* found = service == nullptr ? nullptr : service->FindMethodByName(std::string(method));
  if (found == nullptr) {
    spdlog::critical("no method {} in service {}", method, full_service_name);
    std::abort();
  }
  return found->index();
}

}  // namespace krane::api
