#include "controlplane/feed/encoded_event.h"

namespace krane::feed {

grpc::Slice encodeEvent(const cluster::v1::WatchEvent& event) {
  const size_t size = event.ByteSizeLong();
  grpc::Slice wire(size);
  event.SerializeWithCachedSizesToArray(const_cast<uint8_t*>(wire.begin()));
  return wire;
}

}  // namespace krane::feed
