// Encoded events: the bytes every stream writes are one WatchEvent message, shared, not copied.
#include "controlplane/feed/encoded_event.h"

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

}  // namespace
}  // namespace krane::feed
