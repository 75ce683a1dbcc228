// Who may call what: per-region agent tokens (stored hashed) and operator tokens (from config).
//
// Tokens travel as `authorization: Bearer <token>` metadata. Only SHA-256 hashes are kept; a
// presented token is hashed and compared in constant time. Agent token lookups are cached for
// `cache_ttl`, so a revoked token stops working within that time.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "controlplane/db/pool.h"

namespace grpc {
class ServerContextBase;
}

namespace krane::api {

struct AgentToken {
  std::string id;
  std::string region;
  std::string name;
  int64_t created_at_ms = 0;
  std::optional<int64_t> revoked_at_ms;
};

struct CreatedToken {
  AgentToken token;
  std::string secret;  // shown once; only its hash is stored
};

class AgentTokens {
 public:
  explicit AgentTokens(std::shared_ptr<db::Pool> pool,
                       std::chrono::milliseconds cache_ttl = std::chrono::seconds(10));

  // NOT_FOUND when the region is not registered.
  absl::StatusOr<CreatedToken> create(const std::string& region, const std::string& name);
  absl::Status revoke(const std::string& id);
  absl::StatusOr<std::vector<AgentToken>> list(const std::string& region);

  // The region the token belongs to; UNAUTHENTICATED for an unknown or revoked token.
  absl::StatusOr<std::string> regionOf(const std::string& secret);

  // Hashes (sha256) of the tokens revoked at or after `since_ms` (Unix ms, as recorded by
  // whichever process revoked them), which are also dropped from the cache, so that this
  // replica refuses them from now on. `*newest_ms` gets the latest revocation time seen.
  absl::StatusOr<std::set<std::string>> revokedSince(int64_t since_ms, int64_t* newest_ms);

 private:
  struct Cached {
    std::optional<std::string> region;  // nullopt: unknown or revoked
    std::chrono::steady_clock::time_point expires;
  };
  std::shared_ptr<db::Pool> pool_;
  std::chrono::milliseconds cache_ttl_;
  std::mutex mutex_;
  std::map<std::string, Cached> cache_;  // by token hash
};

// Operator tokens, hashed at start-up. Thread-safe (immutable after construction).
class OperatorTokens {
 public:
  explicit OperatorTokens(const std::vector<std::string>& secrets);
  bool empty() const { return hashes_.empty(); }
  bool accepts(const std::string& secret) const;

 private:
  std::vector<std::string> hashes_;
};

// The token of `authorization: Bearer <token>`, or empty.
std::string bearerToken(const grpc::ServerContextBase& context);
// The token of an `authorization` header's value `Bearer <token>`, or empty.
std::string bearerOf(std::string_view value);
// SHA-256, raw 32 bytes.
std::string sha256(std::string_view data);
// A new random secret with the given prefix: prefix + 43 characters of base64url (256 bits).
std::string newSecret(std::string_view prefix);
// Reads operator tokens from a file: one per line, blank lines and `#` comments ignored.
absl::StatusOr<std::vector<std::string>> readTokenFile(const std::string& path);

}  // namespace krane::api
