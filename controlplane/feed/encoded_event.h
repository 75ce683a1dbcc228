// A WatchEvent serialized once into a reference-counted buffer.
//
// The tailer encodes each change once; every Watch stream of the replica writes the same bytes
// (a grpc::Slice copy only takes a reference), so fan-out costs no serialization per stream.
// The bytes are exactly the WatchEvent message the agents read. Thread-safe: the bytes are
// immutable once encoded.
#pragma once

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include "krane/cluster/v1/cluster.pb.h"

namespace krane::feed {

// The wire form of `event`, allocated once.
grpc::Slice encodeEvent(const cluster::v1::WatchEvent& event);

// A message to write that shares `wire`'s bytes (no copy).
inline grpc::ByteBuffer messageOf(const grpc::Slice& wire) { return grpc::ByteBuffer(&wire, 1); }

// One WatchEvent carrying `events[0, count)` in order as a WatchEventBatch, for a stream that
// accepts batches. A batch of up to kBatchCopyBytes is copied into one slice with its framing;
// a larger one (a full-sync page, a stream far behind) shares the events' bytes and adds only a
// few bytes of framing per event. `count` must be at least 1, and no event may itself be a
// batch.
grpc::ByteBuffer batchMessageOf(const grpc::Slice* events, size_t count);
// Below this size copying a batch costs less than a slice per event (each shared slice is a
// reference taken and dropped on a count every stream's writes touch, and two entries in the
// message's slice buffer): at 10,000 streams the slice handling was a tenth of the replicas' CPU.
inline constexpr size_t kBatchCopyBytes = 16 << 10;
// The most framing a batch adds per event (a tag and a length), and once more for the batch.
inline constexpr size_t kBatchFramingPerEvent = 11;

}  // namespace krane::feed
