#include "plugins/runtime/kubernetes/names.h"

#include <cctype>
#include <cstdint>
#include <cstdio>
#include <string_view>

#include "common/strings.h"

namespace krane::kube {
namespace {

uint32_t fnv1a32(std::string_view bytes) {
  uint32_t h = 2166136261u;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 16777619u;
  }
  return h;
}

bool alnum(char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; }

bool validName(std::string_view v) {
  if (v.empty() || v.size() > 63) return false;
  for (char c : v) {
    if (!alnum(c) && c != '-' && c != '_' && c != '.') return false;
  }
  return alnum(v.front()) && alnum(v.back());
}

}  // namespace

std::string dnsLabel(const std::string& prefix, const std::string& id) {
  std::string clean;
  for (char c : id) {
    const char l = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    clean.push_back(alnum(l) ? l : '-');
  }
  std::string name = prefix.empty() ? clean : strCat(prefix, "-", clean);
  if (clean != id || name.size() > 63) {
    char suffix[9];
    std::snprintf(suffix, sizeof(suffix), "%08x", fnv1a32(id));
    name = strCat(name.substr(0, 63 - 9), "-", suffix);
  }
  // No double, leading or trailing dashes from the cleaning.
  std::string out;
  for (char c : name) {
    if (c == '-' && (out.empty() || out.back() == '-')) continue;
    out.push_back(c);
  }
  while (!out.empty() && out.back() == '-') out.pop_back();
  return out;
}

bool validLabelValue(const std::string& value) { return value.empty() || validName(value); }

bool validLabelKey(const std::string& key) {
  const auto slash = key.find('/');
  if (slash == std::string::npos) return validName(key);
  const std::string_view prefix(key.data(), slash);
  if (prefix.empty() || prefix.size() > 253) return false;
  for (char c : prefix) {
    if (!(std::islower(static_cast<unsigned char>(c)) ||
          std::isdigit(static_cast<unsigned char>(c)) || c == '-' || c == '.')) {
      return false;
    }
  }
  return validName(std::string_view(key).substr(slash + 1));
}

}  // namespace krane::kube
