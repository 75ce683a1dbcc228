#include "controlplane/feed/encoded_event.h"

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

// A length-delimited field's tag and length; small enough to live inside the slice itself.
grpc::Slice lengthPrefix(int field, size_t length) {
  uint8_t bytes[kBatchFramingPerEvent];
  uint8_t* end = CodedOutputStream::WriteTagToArray(
      WireFormatLite::MakeTag(field, WireFormatLite::WIRETYPE_LENGTH_DELIMITED), bytes);
  end = CodedOutputStream::WriteVarint64ToArray(length, end);
  return grpc::Slice(bytes, static_cast<size_t>(end - bytes));
}

}  // namespace

grpc::ByteBuffer batchMessageOf(const grpc::Slice* events, size_t count) {
  // WatchEvent{batch: WatchEventBatch{events: [e0, e1, ...]}}: the outer field's prefix, then
  // each event as a length-delimited `events` entry whose bytes are the encoded event itself.
  std::vector<grpc::Slice> parts;
  parts.reserve(2 * count + 1);
  parts.emplace_back();  // the outer prefix, once the length is known
  size_t inner = 0;
  for (size_t i = 0; i < count; ++i) {
    parts.push_back(
        lengthPrefix(cluster::v1::WatchEventBatch::kEventsFieldNumber, events[i].size()));
    inner += parts.back().size() + events[i].size();
    parts.push_back(events[i]);
  }
  parts[0] = lengthPrefix(cluster::v1::WatchEvent::kBatchFieldNumber, inner);
  return grpc::ByteBuffer(parts.data(), parts.size());
}

}  // namespace krane::feed
