#include "common/host_port.h"

#include <arpa/inet.h>
#include <netinet/in.h>

namespace krane {
namespace {

bool bracketed(const std::string& host) {
  return host.size() > 2 && host.front() == '[' && host.back() == ']';
}

}  // namespace

std::pair<std::string, std::string> splitHostPort(const std::string& address) {
  const auto colon = address.rfind(':');
  if (colon == std::string::npos) return {address, ""};
  return {address.substr(0, colon), address.substr(colon + 1)};
}

bool validHostPort(const std::string& address) {
  const auto colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) return false;
  const std::string port = address.substr(colon + 1);
  if (port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos) return false;
  return std::stol(port) <= 65535;
}

int portOf(const std::string& address) { return std::stoi(splitHostPort(address).second); }

bool isIpLiteral(const std::string& host) {
  in6_addr v6;
  in_addr v4;
  if (bracketed(host))
    return inet_pton(AF_INET6, host.substr(1, host.size() - 2).c_str(), &v6) == 1;
  return inet_pton(AF_INET, host.c_str(), &v4) == 1;
}

bool isAnyAddress(const std::string& host) {
  if (host == "*" || host == "0.0.0.0") return true;
  const std::string bare = bracketed(host) ? host.substr(1, host.size() - 2) : host;
  in6_addr v6;
  return inet_pton(AF_INET6, bare.c_str(), &v6) == 1 && IN6_IS_ADDR_UNSPECIFIED(&v6);
}

}  // namespace krane
