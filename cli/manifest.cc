#include "cli/manifest.h"

#include <algorithm>
#include <fstream>
#include <iostream>
#include <sstream>

#include <google/protobuf/util/json_util.h>
#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include "common/strings.h"

namespace krane::cli {
namespace {

using Json = nlohmann::json;

struct Kind {
  const char* name;
  const char* type;
};
constexpr Kind kKinds[] = {{"Deployment", "deployment_topology"},
                           {"Sentinel", "sentinel"},
                           {"CiliumNetworkPolicy", "cilium_network_policy"},
                           {"Resource", ""}};

// A plain YAML scalar becomes null, a boolean or a number when it reads as one; a quoted one
// stays a string.
Json scalar(const YAML::Node& node) {
  const std::string& text = node.Scalar();
  if (node.Tag() == "!") return text;
  if (text == "~" || text == "null" || text.empty()) return nullptr;
  if (text == "true") return true;
  if (text == "false") return false;
  const auto number = Json::parse(text, nullptr, false);
  if (number.is_number()) return number;
  return text;
}

Json toJson(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map: {
      Json out = Json::object();
      for (const auto& kv : node) out[kv.first.as<std::string>()] = toJson(kv.second);
      return out;
    }
    case YAML::NodeType::Sequence: {
      Json out = Json::array();
      for (const auto& item : node) out.push_back(toJson(item));
      return out;
    }
    case YAML::NodeType::Scalar:
      return scalar(node);
    default:
      return nullptr;
  }
}

absl::Status bad(const std::string& where, const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(strCat(where, ": ", field, ": ", what));
}

// Fills `field` of the spec from the document, refusing a different value.
absl::Status fill(Json& spec, const char* field, const char* snake, const std::string& value,
                  const std::string& where, const char* from) {
  for (const char* name : {field, snake}) {
    if (!spec.contains(name)) continue;
    if (!spec[name].is_string() || spec[name].get<std::string>() != value) {
      return bad(where, strCat("spec.", name),
                 strCat("is ", spec[name].dump(), " but the document's ", from, " is \"", value,
                        "\" (leave it out)"));
    }
    spec.erase(name);
  }
  spec[field] = value;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ManifestEntry>> parseDocument(const YAML::Node& doc,
                                                         const std::string& where0) {
  if (!doc.IsMap()) return bad(where0, "(document)", "must be a mapping with kind, id and spec");
  static const char* kKeys[] = {"kind", "id", "region", "regions", "type", "spec"};
  for (const auto& kv : doc) {
    const auto key = kv.first.as<std::string>();
    if (std::find_if(std::begin(kKeys), std::end(kKeys), [&](const char* k) { return key == k; }) ==
        std::end(kKeys)) {
      return bad(where0, key, "unknown key (expected kind, id, region or regions, type, spec)");
    }
  }
  const std::string kind = doc["kind"] ? doc["kind"].as<std::string>() : "";
  const Kind* k = std::find_if(std::begin(kKinds), std::end(kKinds),
                               [&](const Kind& c) { return kind == c.name; });
  if (k == std::end(kKinds)) {
    return bad(where0, "kind",
               kind.empty() ? "required (Deployment, Sentinel, CiliumNetworkPolicy or Resource)"
                            : strCat("\"", kind,
                                     "\" is not one of Deployment, Sentinel, CiliumNetworkPolicy, "
                                     "Resource"));
  }
  const std::string id = doc["id"] && doc["id"].IsScalar() ? doc["id"].as<std::string>() : "";
  if (id.empty()) return bad(where0, "id", "required");
  const std::string where = strCat(where0, " (", kind, " ", id, ")");

  std::vector<std::string> regions;
  if (doc["region"] && doc["regions"])
    return bad(where, "regions", "give region or regions, not both");
  if (doc["region"]) {
    if (!doc["region"].IsScalar()) return bad(where, "region", "must be a string");
    regions.push_back(doc["region"].as<std::string>());
  } else if (doc["regions"]) {
    if (!doc["regions"].IsSequence() || doc["regions"].size() == 0)
      return bad(where, "regions", "must be a non-empty list");
    for (const auto& r : doc["regions"]) {
      if (!r.IsScalar()) return bad(where, "regions", "must be a list of strings");
      regions.push_back(r.as<std::string>());
    }
  } else {
    return bad(where, "region", "required (region or regions)");
  }

  std::string type = k->type;
  if (type.empty()) {
    if (!doc["type"] || !doc["type"].IsScalar())
      return bad(where, "type", "required for kind Resource");
    type = doc["type"].as<std::string>();
  } else if (doc["type"]) {
    return bad(where, "type", strCat("only for kind Resource (", kind, " is type ", type, ")"));
  }
  if (!doc["spec"] || !doc["spec"].IsMap()) return bad(where, "spec", "required, a mapping");
  const Json spec0 = toJson(doc["spec"]);

  std::vector<ManifestEntry> out;
  for (const auto& region : regions) {
    ManifestEntry entry;
    entry.origin = regions.size() > 1 ? strCat(where, " in ", region) : where;
    cluster::v1::Resource& r = entry.resource;
    r.set_type(type);
    r.set_id(id);
    r.set_region(region);
    Json spec = spec0;
    google::protobuf::Message* message = nullptr;
    if (type == "deployment_topology") {
      if (auto st = fill(spec, "deploymentId", "deployment_id", id, where, "id"); !st.ok())
        return st;
      if (auto st = fill(spec, "region", "region", region, where, "region"); !st.ok()) return st;
      message = r.mutable_deployment_topology();
    } else if (type == "sentinel") {
      if (auto st = fill(spec, "sentinelId", "sentinel_id", id, where, "id"); !st.ok()) return st;
      if (auto st = fill(spec, "region", "region", region, where, "region"); !st.ok()) return st;
      message = r.mutable_sentinel();
    } else if (type == "cilium_network_policy") {
      if (auto st = fill(spec, "policyId", "policy_id", id, where, "id"); !st.ok()) return st;
      if (auto st = fill(spec, "region", "region", region, where, "region"); !st.ok()) return st;
      // The policy may be written as YAML under `policy`; it travels as JSON.
      if (spec.contains("policy")) {
        if (!spec["policy"].is_object()) {
          return bad(where, "spec.policy", "must be a mapping (the policy object or its spec)");
        }
        spec["policyJson"] = spec["policy"].dump();
        spec.erase("policy");
      }
      message = r.mutable_cilium_network_policy();
    } else {
      auto* g = r.mutable_generic();
      g->set_type(type);
      g->set_id(id);
      g->set_region(region);
      g->set_spec(spec.dump());
      g->set_content_type("application/json");
    }
    if (message != nullptr) {
      const auto parsed = google::protobuf::util::JsonStringToMessage(spec.dump(), message);
      if (!parsed.ok()) {
        std::string why = parsed.message().ToString();
        return bad(where, "spec", why);
      }
    }
    out.push_back(std::move(entry));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<ManifestEntry>> parseManifests(const std::string& yaml,
                                                          const std::string& source) {
  std::vector<YAML::Node> docs;
  try {
    docs = YAML::LoadAll(yaml);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        strCat(source, ": line ", e.mark.line + 1, ": not valid YAML: ", e.msg));
  }
  std::vector<ManifestEntry> out;
  int n = 0;
  for (const auto& doc : docs) {
    ++n;
    if (doc.IsNull()) continue;  // an empty document between separators
    auto entries = parseDocument(doc, strCat(source, ": document ", n));
    if (!entries.ok()) return entries.status();
    for (auto& e : *entries) out.push_back(std::move(e));
  }
  if (out.empty()) return absl::InvalidArgumentError(strCat(source, ": no documents"));
  return out;
}

absl::StatusOr<std::vector<ManifestEntry>> loadManifests(const std::string& path) {
  std::ostringstream text;
  if (path == "-") {
    text << std::cin.rdbuf();
  } else {
    std::ifstream in(path);
    if (!in) return absl::NotFoundError(strCat(path, ": cannot read the file"));
    text << in.rdbuf();
  }
  return parseManifests(text.str(), path == "-" ? "<stdin>" : path);
}

std::string resourceType(const std::string& name) {
  std::string n = name;
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return std::tolower(c); });
  if (n == "deployment" || n == "deployments" || n == "deploy" || n == "deployment_topology")
    return "deployment_topology";
  if (n == "sentinel" || n == "sentinels") return "sentinel";
  if (n == "cnp" || n == "ciliumnetworkpolicy" || n == "ciliumnetworkpolicies" ||
      n == "cilium_network_policy")
    return "cilium_network_policy";
  return name;
}

}  // namespace krane::cli
