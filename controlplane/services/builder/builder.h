// Builders: what the deploy workflow's building step calls to turn a BuildRequest into an image
// reference (proto/krane/services/v1/build.proto).
//
// - PrebuiltBuilder: the image is given; it is checked and recorded.
// - CommandBuilder: runs a build command (no shell) with its output kept in a log file, a
//   timeout after which its whole process group is killed, and a failure that quotes the last
//   lines of its log. For the `process` runtime, whose images map to local command lines.
//
// Another builder (a container image builder: BuildKit, Kaniko, a remote build service) plugs in
// by implementing Builder: build() gets the request and returns the pushed image reference, or a
// terminal error for what retrying cannot fix (a failed build) and a retryable one for what it
// can (the build service unreachable). `builderFor` picks the implementation from the request's
// source; a new source is a new field of BuildRequest.source.
//
// Thread-safety: build() may be called from several threads at once (one per deploy).
#pragma once

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "krane/services/v1/build.pb.h"

namespace krane::services::builder {

using BuildRequest = services::v1::BuildRequest;
using BuildResult = services::v1::BuildResult;

class Builder {
 public:
  virtual ~Builder() = default;
  virtual absl::StatusOr<BuildResult> build(const BuildRequest& request) = 0;
};

class PrebuiltBuilder : public Builder {
 public:
  absl::StatusOr<BuildResult> build(const BuildRequest& request) override;
};

struct CommandBuilderOptions {
  // Where build logs are kept, one file per deployment: <log_dir>/<deployment_id>.log.
  std::filesystem::path log_dir;
  std::chrono::seconds default_timeout{600};
  // After the timeout: SIGTERM to the process group, then SIGKILL after this.
  std::chrono::milliseconds kill_grace{2000};
  // Lines of the log quoted in a failure.
  int tail_lines = 20;
};

class CommandBuilder : public Builder {
 public:
  explicit CommandBuilder(CommandBuilderOptions options) : options_(std::move(options)) {}
  absl::StatusOr<BuildResult> build(const BuildRequest& request) override;

 private:
  CommandBuilderOptions options_;
};

// The builder for the request's source; INVALID_ARGUMENT (naming `source`) when it has none.
absl::StatusOr<Builder*> builderFor(const BuildRequest& request, PrebuiltBuilder& prebuilt,
                                    CommandBuilder& command);

// The last `lines` lines of a file ("" when it cannot be read).
std::string tailOf(const std::filesystem::path& file, int lines);

}  // namespace krane::services::builder
