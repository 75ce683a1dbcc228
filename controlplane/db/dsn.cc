#include "controlplane/db/dsn.h"

#include <charconv>

#include "absl/status/status.h"
#include "common/strings.h"

namespace krane::db {
namespace {

constexpr std::string_view kForm = "mysql://user[:password]@host[:port]/database[?socket=PATH]";

absl::Status bad(std::string_view text, std::string_view what) {
  return absl::InvalidArgumentError(strCat("invalid DSN: ", what, " (expected ", kForm, ")"));
}

absl::StatusOr<std::string> percentDecode(std::string_view in, std::string_view field) {
  std::string out;
  out.reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '%') {
      out.push_back(in[i]);
      continue;
    }
    unsigned value = 0;
    if (i + 2 >= in.size() ||
        std::from_chars(in.data() + i + 1, in.data() + i + 3, value, 16).ptr != in.data() + i + 3) {
      return absl::InvalidArgumentError(strCat("invalid DSN: bad percent-encoding in the ", field));
    }
    out.push_back(static_cast<char>(value));
    i += 2;
  }
  return out;
}

absl::StatusOr<unsigned> parseNumber(std::string_view text, std::string_view value,
                                     std::string_view field, unsigned max) {
  unsigned n = 0;
  auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
  if (value.empty() || ec != std::errc() || ptr != value.data() + value.size() || n > max) {
    return bad(text, strCat(field, " must be a number up to ", max, ", got \"", value, "\""));
  }
  return n;
}

}  // namespace

std::string Dsn::redacted() const {
  std::string out =
      strCat("mysql://", user, password.empty() ? "" : ":***", "@", host, ":", port, "/", database);
  if (!socket.empty()) strAppend(&out, "?socket=", socket);
  return out;
}

std::string Dsn::where() const {
  return socket.empty() ? strCat(host, ":", port, "/", database) : strCat(socket, "/", database);
}

absl::StatusOr<Dsn> parseDsn(std::string_view text) {
  constexpr std::string_view kScheme = "mysql://";
  if (text.substr(0, kScheme.size()) != kScheme) {
    return bad(text, "it must start with mysql://");
  }
  std::string_view rest = text.substr(kScheme.size());
  Dsn dsn;

  std::string_view query;
  if (auto q = rest.find('?'); q != std::string_view::npos) {
    query = rest.substr(q + 1);
    rest = rest.substr(0, q);
  }
  const auto at = rest.rfind('@');
  if (at == std::string_view::npos) return bad(text, "missing user (user@host)");
  std::string_view userinfo = rest.substr(0, at);
  std::string_view hostpath = rest.substr(at + 1);

  std::string_view user = userinfo;
  if (auto colon = userinfo.find(':'); colon != std::string_view::npos) {
    user = userinfo.substr(0, colon);
    auto password = percentDecode(userinfo.substr(colon + 1), "password");
    if (!password.ok()) return password.status();
    dsn.password = *std::move(password);
  }
  if (user.empty()) return bad(text, "missing user");
  auto decoded_user = percentDecode(user, "user");
  if (!decoded_user.ok()) return decoded_user.status();
  dsn.user = *std::move(decoded_user);

  const auto slash = hostpath.find('/');
  if (slash == std::string_view::npos || slash + 1 == hostpath.size()) {
    return bad(text, "missing database name after the host");
  }
  dsn.database = std::string(hostpath.substr(slash + 1));
  if (dsn.database.find('/') != std::string::npos || dsn.database.size() > 64) {
    return bad(text, strCat("database name \"", dsn.database, "\" is not valid"));
  }
  std::string_view hostport = hostpath.substr(0, slash);
  if (auto colon = hostport.rfind(':'); colon != std::string_view::npos) {
    auto port = parseNumber(text, hostport.substr(colon + 1), "port", 65535);
    if (!port.ok()) return port.status();
    if (*port == 0) return bad(text, "port must not be 0");
    dsn.port = *port;
    hostport = hostport.substr(0, colon);
  }
  if (hostport.empty()) return bad(text, "missing host");
  dsn.host = std::string(hostport);

  if (!query.empty()) {
    while (!query.empty()) {
      const auto amp = query.find('&');
      const std::string_view pair = query.substr(0, amp);
      query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
      const auto eq = pair.find('=');
      if (eq == std::string_view::npos) {
        return bad(text, strCat("option \"", pair, "\" has no value"));
      }
      const std::string_view key = pair.substr(0, eq);
      const std::string_view value = pair.substr(eq + 1);
      if (key == "socket") {
        if (value.empty() || value[0] != '/') return bad(text, "socket must be an absolute path");
        dsn.socket = std::string(value);
      } else if (key == "connect_timeout" || key == "read_timeout" || key == "write_timeout") {
        auto seconds = parseNumber(text, value, key, 3600);
        if (!seconds.ok()) return seconds.status();
        auto& target = key == "connect_timeout" ? dsn.connect_timeout
                       : key == "read_timeout"  ? dsn.read_timeout
                                                : dsn.write_timeout;
        target = std::chrono::seconds(*seconds);
      } else {
        return bad(text,
                   strCat("unknown option \"", key,
                          "\" (known: socket, connect_timeout, read_timeout, write_timeout)"));
      }
    }
  }
  return dsn;
}

}  // namespace krane::db
