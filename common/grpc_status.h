// absl::Status <-> grpc::Status: the same codes, the same message.
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace krane {

// gRPC sends the message as metadata (grpc-message), which has a size limit: a message over it
// fails the call with a useless error, so longer ones are cut. Messages quote input through
// krane::quote (common/strings.h) and stay far below this; the cut is the last resort.
inline constexpr size_t kMaxStatusMessageBytes = 2048;

inline grpc::Status toGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  std::string message(status.message());
  if (message.size() > kMaxStatusMessageBytes) {
    size_t cut = kMaxStatusMessageBytes;
    // Not inside a UTF-8 character.
    while (cut > 0 && (static_cast<unsigned char>(message[cut]) & 0xc0) == 0x80) --cut;
    message.resize(cut);
    message += "... (message cut)";
  }
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::move(message));
}

inline absl::Status fromGrpc(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

}  // namespace krane
