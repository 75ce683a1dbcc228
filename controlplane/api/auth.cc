#include "controlplane/api/auth.h"

#include <fstream>

#include <grpcpp/server_context.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#include "common/clock.h"
#include "common/status.h"
#include "common/strings.h"
#include "controlplane/feed/resource_table.h"

namespace krane::api {
namespace {

bool equalConstantTime(const std::string& a, const std::string& b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

constexpr size_t kMaxCached = 10000;

}  // namespace

std::string sha256(std::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_Digest(data.data(), data.size(), digest, &length, EVP_sha256(), nullptr);
  return std::string(reinterpret_cast<char*>(digest), length);
}

std::string newSecret(std::string_view prefix) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  unsigned char bytes[32];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) std::abort();  // no randomness: nothing is safe
  std::string out(prefix);
  uint32_t acc = 0;
  int bits = 0;
  for (unsigned char b : bytes) {
    acc = (acc << 8) | b;
    bits += 8;
    while (bits >= 6) {
      bits -= 6;
      out.push_back(kAlphabet[(acc >> bits) & 63]);
    }
  }
  if (bits > 0) out.push_back(kAlphabet[(acc << (6 - bits)) & 63]);
  return out;
}

std::string bearerToken(const grpc::ServerContextBase& context) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) return "";
  return bearerOf(std::string_view(it->second.data(), it->second.size()));
}

std::string bearerOf(std::string_view value) {
  constexpr std::string_view kBearer = "Bearer ";
  if (value.substr(0, kBearer.size()) != kBearer) return "";
  return std::string(value.substr(kBearer.size()));
}

absl::StatusOr<std::vector<std::string>> readTokenFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(strCat("cannot read token file ", path));
  std::vector<std::string> tokens;
  std::string line;
  while (std::getline(in, line)) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
    size_t start = line.find_first_not_of(' ');
    if (start == std::string::npos || line[start] == '#') continue;
    if (line.size() - start < 16) {
      return absl::InvalidArgumentError(
          strCat(path, ": operator tokens must be at least 16 characters"));
    }
    tokens.push_back(line.substr(start));
  }
  return tokens;
}

OperatorTokens::OperatorTokens(const std::vector<std::string>& secrets) {
  for (const auto& s : secrets) hashes_.push_back(sha256(s));
}

bool OperatorTokens::accepts(const std::string& secret) const {
  if (secret.empty()) return false;
  const std::string hash = sha256(secret);
  bool match = false;
  for (const auto& h : hashes_) match |= equalConstantTime(h, hash);
  return match;
}

AgentTokens::AgentTokens(std::shared_ptr<db::Pool> pool, std::chrono::milliseconds cache_ttl)
    : pool_(std::move(pool)), cache_ttl_(cache_ttl) {}

absl::StatusOr<CreatedToken> AgentTokens::create(const std::string& region,
                                                 const std::string& name) {
  KRANE_RETURN_IF_ERROR(feed::checkId("region", region));
  if (name.size() > 255) return absl::InvalidArgumentError("name: at most 255 characters");
  CreatedToken created;
  created.secret = newSecret("krane_agent_");
  created.token.id = strCat("tok_", newSecret("").substr(0, 20));
  created.token.region = region;
  created.token.name = name.empty() ? strCat("agent token for ", region) : name;
  created.token.created_at_ms = unixMillis();
  KRANE_RETURN_IF_ERROR(pool_->transact("token-create", [&](db::Connection& conn) -> absl::Status {
    KRANE_ASSIGN_OR_RETURN(auto rows, conn.query("SELECT 1 FROM regions WHERE id = ?", {region}));
    if (rows.empty()) {
      return absl::NotFoundError(
          strCat("region ", quote(region), " is not registered (krane-ctrl region add NAME)"));
    }
    return conn
        .exec(
            "INSERT INTO agent_tokens (id, region_id, name, token_hash, created_at) VALUES (?, ?, "
            "?, ?, ?)",
            {created.token.id, region, created.token.name, db::Blob{sha256(created.secret)},
             created.token.created_at_ms})
        .status();
  }));
  return created;
}

absl::Status AgentTokens::revoke(const std::string& id) {
  KRANE_ASSIGN_OR_RETURN(auto conn, pool_->acquire());
  KRANE_ASSIGN_OR_RETURN(
      auto affected,
      conn->exec("UPDATE agent_tokens SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL",
                 {unixMillis(), id}));
  if (affected == 0) return absl::NotFoundError(strCat("no active agent token with id ", id));
  std::lock_guard lock(mutex_);
  cache_.clear();
  return absl::OkStatus();
}

absl::StatusOr<std::set<std::string>> AgentTokens::revokedSince(int64_t since_ms,
                                                                int64_t* newest_ms) {
  KRANE_ASSIGN_OR_RETURN(auto conn, pool_->acquire());
  std::set<std::string> hashes;
  KRANE_RETURN_IF_ERROR(
      conn->queryEach("SELECT token_hash, revoked_at FROM agent_tokens WHERE revoked_at >= ?",
                      {since_ms}, [&](const db::Row& row) {
                        hashes.insert(row.str(0));
                        *newest_ms = std::max(*newest_ms, row.i64(1));
                        return absl::OkStatus();
                      }));
  if (!hashes.empty()) {
    std::lock_guard lock(mutex_);
    for (const auto& h : hashes) cache_.erase(h);
  }
  return hashes;
}

absl::StatusOr<std::vector<AgentToken>> AgentTokens::list(const std::string& region) {
  KRANE_ASSIGN_OR_RETURN(auto conn, pool_->acquire());
  std::vector<AgentToken> out;
  KRANE_RETURN_IF_ERROR(conn->queryEach(
      "SELECT id, region_id, name, created_at, revoked_at FROM agent_tokens WHERE (? = '' OR "
      "region_id = ?)"
      " ORDER BY region_id, created_at",
      {region, region}, [&](const db::Row& row) {
        out.push_back(AgentToken{row.str(0), row.str(1), row.str(2), row.i64(3), row.optI64(4)});
        return absl::OkStatus();
      }));
  return out;
}

absl::StatusOr<std::string> AgentTokens::regionOf(const std::string& secret) {
  if (secret.empty()) {
    return absl::UnauthenticatedError("missing agent token (send `authorization: Bearer <token>`)");
  }
  const std::string hash = sha256(secret);
  const auto now = std::chrono::steady_clock::now();
  {
    std::lock_guard lock(mutex_);
    auto it = cache_.find(hash);
    if (it != cache_.end() && it->second.expires > now) {
      if (it->second.region) return *it->second.region;
      return absl::UnauthenticatedError("unknown or revoked agent token");
    }
  }
  KRANE_ASSIGN_OR_RETURN(auto conn, pool_->acquire());
  KRANE_ASSIGN_OR_RETURN(auto rows, conn->query("SELECT region_id, token_hash FROM agent_tokens"
                                                " WHERE token_hash = ? AND revoked_at IS NULL",
                                                {db::Blob{hash}}));
  std::optional<std::string> region;
  if (!rows.empty() && equalConstantTime(rows.rows[0].str(1), hash)) region = rows.rows[0].str(0);
  {
    std::lock_guard lock(mutex_);
    if (cache_.size() >= kMaxCached) cache_.clear();
    cache_[hash] = Cached{region, now + cache_ttl_};
  }
  if (!region) return absl::UnauthenticatedError("unknown or revoked agent token");
  return *region;
}

}  // namespace krane::api
