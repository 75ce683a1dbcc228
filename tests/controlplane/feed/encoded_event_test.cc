// Encoded events: the bytes every stream writes are one WatchEvent message, shared, not copied.
#include "controlplane/feed/encoded_event.h"

#include <algorithm>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <google/protobuf/util/message_differencer.h>

namespace krane::feed {
namespace {

using cluster::v1::WatchEvent;

WatchEvent decode(const grpc::ByteBuffer& message) {
  std::vector<grpc::Slice> slices;
  REQUIRE(message.Dump(&slices).ok());
  std::string bytes;
  for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  WatchEvent event;
  REQUIRE(event.ParseFromString(bytes));
  return event;
}

TEST_CASE("an encoded event decodes to the event, and messages share its bytes",
          "[feed][encoded]") {
  WatchEvent event;
  auto* change = event.mutable_change();
  change->set_op(cluster::v1::CHANGE_OP_APPLY);
  change->set_version(42);
  change->mutable_resource()->set_type("example.krane.dev/bucket");
  change->mutable_resource()->set_id("b1");
  change->mutable_resource()->set_region("eu-1");
  change->mutable_resource()->set_version(42);
  change->mutable_resource()->mutable_generic()->set_spec(std::string(3000, 's'));

  const grpc::Slice wire = encodeEvent(event);
  CHECK(wire.size() == event.ByteSizeLong());
  CHECK(std::string(reinterpret_cast<const char*>(wire.begin()), wire.size()) ==
        event.SerializeAsString());

  const grpc::ByteBuffer first = messageOf(wire);
  const grpc::ByteBuffer second = messageOf(wire);
  CHECK(google::protobuf::util::MessageDifferencer::Equals(decode(first), event));
  CHECK(google::protobuf::util::MessageDifferencer::Equals(decode(second), event));
  std::vector<grpc::Slice> a, b;
  REQUIRE(first.Dump(&a).ok());
  REQUIRE(second.Dump(&b).ok());
  REQUIRE(a.size() == 1);
  REQUIRE(b.size() == 1);
  CHECK(a[0].begin() == wire.begin());  // the same bytes, not a copy
  CHECK(b[0].begin() == wire.begin());
}

TEST_CASE("an empty bookmark encodes to a message too", "[feed][encoded]") {
  WatchEvent event;
  event.mutable_bookmark();
  const grpc::Slice wire = encodeEvent(event);
  WatchEvent back;
  REQUIRE(back.ParseFromArray(wire.begin(), static_cast<int>(wire.size())));
  CHECK(back.has_bookmark());
}

// A batch is a WatchEvent whose bytes are framing around the events' own bytes: it decodes to
// exactly the events in order (small, empty and large ones, whose lengths take one to three
// bytes). A small batch is one slice; in a large one the events' bytes are shared, not copied.
TEST_CASE("a batch message decodes to its events in order; a large one shares their bytes",
          "[feed][encoded]") {
  std::vector<WatchEvent> events;
  for (size_t spec : {0, 10, 200, 70000}) {
    WatchEvent event;
    auto* change = event.mutable_change();
    change->set_op(cluster::v1::CHANGE_OP_APPLY);
    change->set_version(events.size() + 1);
    change->mutable_resource()->set_id(std::to_string(spec));
    change->mutable_resource()->mutable_generic()->set_spec(std::string(spec, 'x'));
    events.push_back(event);
  }
  events.emplace_back().mutable_bookmark();  // encodes to two bytes
  std::vector<grpc::Slice> wires;
  for (const auto& e : events) wires.push_back(encodeEvent(e));

  const size_t count = GENERATE(1, 2, 3, 4, 5);
  CAPTURE(count);
  const grpc::ByteBuffer message = batchMessageOf(wires.data(), count);
  const WatchEvent back = decode(message);
  REQUIRE(back.has_batch());
  REQUIRE(back.batch().events_size() == static_cast<int>(count));
  for (size_t i = 0; i < count; ++i) {
    CHECK(google::protobuf::util::MessageDifferencer::Equals(back.batch().events(i), events[i]));
  }
  size_t event_bytes = 0;
  for (size_t i = 0; i < count; ++i) event_bytes += wires[i].size();
  CHECK(message.Length() <= event_bytes + (count + 1) * kBatchFramingPerEvent);
  std::vector<grpc::Slice> parts;
  REQUIRE(message.Dump(&parts).ok());
  if (message.Length() <= kBatchCopyBytes) {
    CHECK(count <= 3);  // the 70,000-byte event is the fourth
    CHECK(parts.size() == 1);
    return;
  }
  CHECK(count >= 4);
  for (size_t i = 0; i < count; ++i) {
    if (wires[i].size() <= 64) continue;  // a small slice holds its bytes inline, copied
    const bool shared = std::any_of(parts.begin(), parts.end(), [&](const grpc::Slice& p) {
      return p.begin() == wires[i].begin() && p.size() == wires[i].size();
    });
    CHECK(shared);
  }
}

}  // namespace
}  // namespace krane::feed
