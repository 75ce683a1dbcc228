// Names and label values as Kubernetes accepts them, made from Krane's ids.
#pragma once

#include <string>

namespace krane::kube {

// A DNS-1123 label (lowercase letters, digits, '-'; at most 63; no dash at either end) made
// from `prefix` and `id` ("<prefix>-<id>"). An id that had to be changed (case, characters,
// length) gets a hash suffix of the original, so two ids never map to one name.
std::string dnsLabel(const std::string& prefix, const std::string& id);

// At most 63 characters of [A-Za-z0-9-_.], alphanumeric at both ends (or empty).
bool validLabelValue(const std::string& value);

// A label key: an optional DNS-subdomain prefix and '/', then a name of at most 63 characters
// of [A-Za-z0-9-_.], alphanumeric at both ends.
bool validLabelKey(const std::string& key);

}  // namespace krane::kube
