#include "plugins/cilium/policy.h"

#include <cctype>
#include <cstdio>
#include <initializer_list>
#include <string_view>
#include <utility>

#include "common/status.h"
#include "common/strings.h"

namespace krane::cilium {
namespace {

using nlohmann::json;

uint32_t fnv1a32(std::string_view bytes) {
  uint32_t h = 2166136261u;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 16777619u;
  }
  return h;
}

bool isAlnumLower(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }

// A JSON value in an error message, quoted and cut like every echoed input.
std::string shown(const json& value) {
  return quote(value.is_string() ? value.get<std::string>() : value.dump());
}

absl::Status invalid(const std::string& path, std::string_view what) {
  return absl::InvalidArgumentError(strCat(path, ": ", what));
}

const char* typeName(const json& v) {
  switch (v.type()) {
    case json::value_t::object:
      return "an object";
    case json::value_t::array:
      return "an array";
    case json::value_t::string:
      return "a string";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::null:
      return "null";
    default:
      return "a number";
  }
}

enum class Want { kObject, kArrayOfObjects, kString };

absl::Status checkType(const json& v, const std::string& path, Want want) {
  switch (want) {
    case Want::kObject:
      if (!v.is_object()) return invalid(path, strCat("must be an object, got ", typeName(v)));
      return absl::OkStatus();
    case Want::kString:
      if (!v.is_string()) return invalid(path, strCat("must be a string, got ", typeName(v)));
      return absl::OkStatus();
    case Want::kArrayOfObjects:
      if (!v.is_array()) return invalid(path, strCat("must be an array, got ", typeName(v)));
      for (size_t i = 0; i < v.size(); ++i) {
        if (!v[i].is_object()) {
          return invalid(strCat(path, "[", i, "]"),
                         strCat("must be an object, got ", typeName(v[i])));
        }
      }
      return absl::OkStatus();
  }
  return absl::OkStatus();
}

// The keys of one rule upstream (the CRD's spec), with their JSON types.
constexpr std::pair<std::string_view, Want> kRuleKeys[] = {
    {"description", Want::kString},
    {"egress", Want::kArrayOfObjects},
    {"egressDeny", Want::kArrayOfObjects},
    {"enableDefaultDeny", Want::kObject},
    {"endpointSelector", Want::kObject},
    {"ingress", Want::kArrayOfObjects},
    {"ingressDeny", Want::kArrayOfObjects},
    {"labels", Want::kArrayOfObjects},
    {"log", Want::kObject},
    {"nodeSelector", Want::kObject},
};

absl::Status checkRule(const json& rule, const std::string& path) {
  if (!rule.is_object()) return invalid(path, strCat("must be an object, got ", typeName(rule)));
  for (const auto& [key, value] : rule.items()) {
    const Want* want = nullptr;
    for (const auto& [name, w] : kRuleKeys) {
      if (name == key) want = &w;
    }
    if (want == nullptr) {
      return invalid(strCat(path, ".", key), "unknown field of a CiliumNetworkPolicy rule");
    }
    KRANE_RETURN_IF_ERROR(checkType(value, strCat(path, ".", key), *want));
  }
  const bool endpoint = rule.contains("endpointSelector");
  const bool node = rule.contains("nodeSelector");
  if (endpoint == node) {
    return invalid(path, endpoint ? "endpointSelector and nodeSelector are mutually exclusive"
                                  : "endpointSelector required (or nodeSelector)");
  }
  return absl::OkStatus();
}

absl::Status checkStringMap(const json& v, const std::string& path) {
  KRANE_RETURN_IF_ERROR(checkType(v, path, Want::kObject));
  for (const auto& [key, value] : v.items()) {
    if (!value.is_string()) {
      return invalid(strCat(path, ".", key), strCat("must be a string, got ", typeName(value)));
    }
  }
  return absl::OkStatus();
}

bool isFullObject(const json& j) {
  for (const char* key : {"apiVersion", "kind", "metadata", "spec", "specs"}) {
    if (j.contains(key)) return true;
  }
  return false;
}

// The metadata of a whole object, without what the API server manages.
absl::StatusOr<json> userMetadata(const json& object) {
  if (!object.contains("metadata")) return json::object();
  const json& meta = object["metadata"];
  KRANE_RETURN_IF_ERROR(checkType(meta, "policy_json.metadata", Want::kObject));
  json out = json::object();
  for (const auto& [key, value] : meta.items()) {
    const std::string path = strCat("policy_json.metadata.", key);
    if (key == "name" || key == "namespace") {
      KRANE_RETURN_IF_ERROR(checkType(value, path, Want::kString));
      out[key] = value;
    } else if (key == "labels" || key == "annotations") {
      KRANE_RETURN_IF_ERROR(checkStringMap(value, path));
      out[key] = value;
    } else if (key == "resourceVersion" || key == "uid" || key == "creationTimestamp" ||
               key == "generation" || key == "managedFields" || key == "selfLink") {
      continue;  // the API server's, not the policy's
    } else {
      return invalid(path, "not supported (name, namespace, labels and annotations are)");
    }
  }
  return out;
}

}  // namespace

bool isDnsLabel(const std::string& s) {
  if (s.empty() || s.size() > 63) return false;
  for (char c : s) {
    if (!isAlnumLower(c) && c != '-') return false;
  }
  return isAlnumLower(s.front()) && isAlnumLower(s.back());
}

bool isDnsSubdomain(const std::string& s) {
  if (s.empty() || s.size() > 253) return false;
  size_t start = 0;
  while (true) {
    const size_t dot = s.find('.', start);
    const std::string part =
        s.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (!isDnsLabel(part)) return false;
    if (dot == std::string::npos) return true;
    start = dot + 1;
  }
}

bool isLabelValue(const std::string& v) {
  if (v.size() > 63) return false;
  for (char c : v) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') {
      return false;
    }
  }
  return v.empty() || (std::isalnum(static_cast<unsigned char>(v.front())) &&
                       std::isalnum(static_cast<unsigned char>(v.back())));
}

std::string dnsLabel(const std::string& prefix, const std::string& id) {
  std::string clean;
  for (char c : id) {
    const char l = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    clean.push_back(isAlnumLower(l) ? l : '-');
  }
  std::string name = prefix.empty() ? clean : strCat(prefix, "-", clean);
  if (clean != id || !isDnsLabel(name)) {
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
  if (!out.empty() && !isAlnumLower(out.front())) out.insert(out.begin(), 'x');
  return out;
}

std::string workspaceNamespace(const std::string& workspace_id) {
  return dnsLabel("", workspace_id);
}

absl::StatusOr<json> policyObject(const cluster::v1::CiliumNetworkPolicy& policy,
                                  const std::string& resource_id,
                                  const std::string& default_namespace) {
  if (resource_id.empty()) return invalid("policy_id", "required");
  if (policy.policy_json().empty()) return invalid("policy_json", "required");
  json input = json::parse(policy.policy_json(), nullptr, /*allow_exceptions=*/false);
  if (input.is_discarded()) return invalid("policy_json", "not valid JSON");
  if (!input.is_object()) {
    return invalid("policy_json", strCat("must be a JSON object, got ", typeName(input)));
  }

  json object = {{"apiVersion", kApiVersion}, {"kind", kKind}};
  json metadata = json::object();
  if (isFullObject(input)) {
    for (const auto& [key, value] : input.items()) {
      const std::string path = strCat("policy_json.", key);
      if (key == "apiVersion") {
        if (value != kApiVersion) {
          return invalid(path, strCat("must be ", kApiVersion, ", got ", shown(value)));
        }
      } else if (key == "kind") {
        if (value != kKind) return invalid(path, strCat("must be ", kKind, ", got ", shown(value)));
      } else if (key == "spec") {
        KRANE_RETURN_IF_ERROR(checkRule(value, path));
        object["spec"] = value;
      } else if (key == "specs") {
        KRANE_RETURN_IF_ERROR(checkType(value, path, Want::kArrayOfObjects));
        for (size_t i = 0; i < value.size(); ++i) {
          KRANE_RETURN_IF_ERROR(checkRule(value[i], strCat(path, "[", i, "]")));
        }
        if (!value.empty()) object["specs"] = value;
      } else if (key == "metadata" || key == "status") {
        continue;  // metadata below; status is written by Cilium
      } else {
        return invalid(path, "unknown field of a CiliumNetworkPolicy");
      }
    }
    if (!object.contains("spec") && !object.contains("specs")) {
      return invalid("policy_json", "spec required (or a non-empty specs)");
    }
    KRANE_ASSIGN_OR_RETURN(metadata, userMetadata(input));
  } else {
    KRANE_RETURN_IF_ERROR(checkRule(input, "policy_json"));
    object["spec"] = input;
  }

  // Name.
  std::string name = policy.name();
  const std::string given = metadata.value("name", "");
  if (!name.empty() && !given.empty() && name != given) {
    return invalid("policy_json.metadata.name",
                   strCat(quote(given), " differs from the policy's name ", quote(name)));
  }
  if (name.empty()) name = given;
  const std::string name_field = policy.name().empty() ? "policy_json.metadata.name" : "name";
  if (name.empty()) name = dnsLabel("krane-policy", resource_id);
  if (!isDnsSubdomain(name)) {
    return invalid(name_field,
                   strCat(quote(name),
                          " is not a valid object name (lowercase letters, digits, '-' and '.', "
                          "at most 253 characters, alphanumeric at both ends)"));
  }

  // Namespace.
  std::string ns = metadata.value("namespace", "");
  std::string ns_field = "policy_json.metadata.namespace";
  if (ns.empty() && !default_namespace.empty()) {
    ns = default_namespace;
    ns_field = "namespace (plugin configuration)";
  }
  if (ns.empty()) {
    if (policy.workspace_id().empty()) {
      return invalid("workspace_id", "required when policy_json has no metadata.namespace");
    }
    ns = workspaceNamespace(policy.workspace_id());
    ns_field = "workspace_id";
  }
  if (!isDnsLabel(ns)) {
    return invalid(ns_field, strCat(quote(ns),
                                    " is not a valid namespace (lowercase letters, digits and "
                                    "'-', at most 63 characters, alphanumeric at both ends)"));
  }

  json labels = metadata.value("labels", json::object());
  labels[kManagedByLabel] = "krane";
  labels[kComponentLabel] = kComponent;
  const std::pair<const char*, const std::string*> ids[] = {
      {"krane.dev/workspace.id", &policy.workspace_id()},
      {"krane.dev/project.id", &policy.project_id()},
      {"krane.dev/environment.id", &policy.environment_id()},
      {kRegionLabel, &policy.region()},
      {kPolicyIdKey, &resource_id},
  };
  for (const auto& [key, value] : ids) {
    if (!value->empty() && isLabelValue(*value)) {
      labels[key] = *value;
    } else {
      labels.erase(key);
    }
  }
  json annotations = metadata.value("annotations", json::object());
  annotations[kPolicyIdKey] = resource_id;

  object["metadata"] = {
      {"name", name}, {"namespace", ns}, {"labels", labels}, {"annotations", annotations}};
  return object;
}

}  // namespace krane::cilium
