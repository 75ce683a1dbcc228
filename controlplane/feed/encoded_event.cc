#include "controlplane/feed/encoded_event.h"

#include <algorithm>
#include <vector>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>

namespace krane::feed {

grpc::Slice encodeEvent(const cluster::v1::WatchEvent& event) {
  const size_t size = event.ByteSizeLong();
  grpc::Slice wire(size);
  event.SerializeWithCachedSizesToArray(const_cast<uint8_t*>(wire.begin()));
  return wire;
}

namespace {

using google::protobuf::internal::WireFormatLite;
using google::protobuf::io::CodedOutputStream;

constexpr uint32_t lengthDelimitedTag(int field) {
  return WireFormatLite::MakeTag(field, WireFormatLite::WIRETYPE_LENGTH_DELIMITED);
}
constexpr uint32_t kBatchTag = lengthDelimitedTag(cluster::v1::WatchEvent::kBatchFieldNumber);
constexpr uint32_t kEventsTag =
    lengthDelimitedTag(cluster::v1::WatchEventBatch::kEventsFieldNumber);

size_t prefixSize(uint32_t tag, size_t length) {
  return CodedOutputStream::VarintSize32(tag) + CodedOutputStream::VarintSize64(length);
}

uint8_t* writePrefix(uint32_t tag, size_t length, uint8_t* out) {
  out = CodedOutputStream::WriteTagToArray(tag, out);
  return CodedOutputStream::WriteVarint64ToArray(length, out);
}

// A length-delimited field's tag and length; small enough to live inside the slice itself.
grpc::Slice prefixSlice(uint32_t tag, size_t length) {
  uint8_t bytes[kBatchFramingPerEvent];
  return grpc::Slice(bytes, static_cast<size_t>(writePrefix(tag, length, bytes) - bytes));
}

}  // namespace

grpc::ByteBuffer batchMessageOf(const grpc::Slice* events, size_t count) {
  // WatchEvent{batch: WatchEventBatch{events: [e0, e1, ...]}}: the outer field's prefix, then
  // each event as a length-delimited `events` entry whose bytes are the encoded event itself.
  size_t inner = 0;
  for (size_t i = 0; i < count; ++i) {
    inner += prefixSize(kEventsTag, events[i].size()) + events[i].size();
  }
  const size_t total = prefixSize(kBatchTag, inner) + inner;
  if (total <= kBatchCopyBytes) {
    grpc::Slice message(total);
    uint8_t* out = writePrefix(kBatchTag, inner, const_cast<uint8_t*>(message.begin()));
    for (size_t i = 0; i < count; ++i) {
      out = writePrefix(kEventsTag, events[i].size(), out);
      out = std::copy(events[i].begin(), events[i].end(), out);
    }
    return grpc::ByteBuffer(&message, 1);
  }
  std::vector<grpc::Slice> parts;
  parts.reserve(2 * count + 1);
  parts.push_back(prefixSlice(kBatchTag, inner));
  for (size_t i = 0; i < count; ++i) {
    parts.push_back(prefixSlice(kEventsTag, events[i].size()));
    parts.push_back(events[i]);
  }
  return grpc::ByteBuffer(parts.data(), parts.size());
}

}  // namespace krane::feed
