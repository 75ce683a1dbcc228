// "host:port" addresses as configured: split, checked, and classified. The host may be a
// bracketed IPv6 address ("[fd00::7]:7072"); the port is the digits after the last colon.
#pragma once

#include <string>
#include <utility>

namespace krane {

// Split at the last colon; an IPv6 host keeps its brackets. No colon: the whole is the host.
std::pair<std::string, std::string> splitHostPort(const std::string& address);

// A host, a colon and a port of 0-65535.
bool validHostPort(const std::string& address);

// The port of an address that passed validHostPort ("00" is 0 too).
int portOf(const std::string& address);

// 10.0.0.7, or [fd00::7].
bool isIpLiteral(const std::string& host);

// A host that binds every interface, which nobody can dial: *, 0.0.0.0, and the unspecified
// IPv6 address with or without brackets ("[::]", "::"; an IPv6 pod address comes without).
bool isAnyAddress(const std::string& host);

}  // namespace krane
