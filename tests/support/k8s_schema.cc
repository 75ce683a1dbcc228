#include "tests/support/k8s_schema.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <set>
#include <sstream>

#include <yaml-cpp/yaml.h>

#include "common/strings.h"

namespace krane::testing {
namespace {

using Json = nlohmann::json;

// YAML to JSON with YAML's plain-scalar typing (quoted scalars stay strings).
Json toJson(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map: {
      Json out = Json::object();
      for (const auto& entry : node) out[entry.first.as<std::string>()] = toJson(entry.second);
      return out;
    }
    case YAML::NodeType::Sequence: {
      Json out = Json::array();
      for (const auto& item : node) out.push_back(toJson(item));
      return out;
    }
    case YAML::NodeType::Scalar: {
      const std::string& text = node.Scalar();
      if (node.Tag() == "!") return text;
      if (text == "~" || text == "null" || text == "Null" || text == "NULL") return nullptr;
      if (text == "true" || text == "True" || text == "TRUE") return true;
      if (text == "false" || text == "False" || text == "FALSE") return false;
      if (!text.empty() && (std::isdigit(static_cast<unsigned char>(text[0])) || text[0] == '-')) {
        int64_t i = 0;
        auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), i);
        if (ec == std::errc() && end == text.data() + text.size()) return i;
        char* dend = nullptr;
        const double d = std::strtod(text.c_str(), &dend);
        if (dend == text.c_str() + text.size()) return d;
      }
      return text;
    }
    default:
      return nullptr;
  }
}

std::string child(const std::string& path, const std::string& key) {
  return path.empty() ? key : strCat(path, ".", key);
}

std::string typeName(const Json& v) {
  if (v.is_object()) return "object";
  if (v.is_array()) return "array";
  if (v.is_string()) return "string";
  if (v.is_boolean()) return "boolean";
  if (v.is_number_integer()) return "integer";
  if (v.is_number()) return "number";
  return "null";
}

const std::regex* compiled(const std::string& pattern) {
  static std::mutex mutex;
  static std::map<std::string, std::optional<std::regex>> cache;
  std::lock_guard lock(mutex);
  auto it = cache.find(pattern);
  if (it == cache.end()) {
    std::optional<std::regex> re;
    try {
      re.emplace(pattern, std::regex::ECMAScript);
    } catch (const std::regex_error&) {
      // A pattern ECMAScript cannot read (RE2-only syntax) is not checked.
    }
    it = cache.emplace(pattern, std::move(re)).first;
  }
  return it->second ? &*it->second : nullptr;
}

class Validator {
 public:
  Validator(const Json* document, std::vector<std::string>* out) : document_(document), out_(out) {}

  // `structural`: the schema describes fields (unknown ones are errors); false inside allOf /
  // anyOf / oneOf / not, whose branches only add value checks.
  void check(const Json& schema_in, const Json& value, const std::string& path, bool structural) {
    const Json& schema = resolve(schema_in);
    if (!schema.is_object()) return;
    const std::string at = path.empty() ? "(object)" : path;
    if (value.is_null()) {
      if (schema.value("nullable", false) || !schema.contains("type")) return;
      return error(at, "must not be null");
    }
    if (schema.value("x-kubernetes-int-or-string", false)) {
      if (!value.is_number_integer() && !value.is_string()) {
        return error(at, strCat("must be an integer or a string, got ", typeName(value)));
      }
    } else if (auto t = schema.find("type"); t != schema.end() && t->is_string()) {
      const std::string type = *t;
      bool ok = true;
      if (type == "object") {
        ok = value.is_object();
      } else if (type == "array") {
        ok = value.is_array();
      } else if (type == "string") {
        ok = value.is_string();
      } else if (type == "boolean") {
        ok = value.is_boolean();
      } else if (type == "number") {
        ok = value.is_number();
      } else if (type == "integer") {
        ok = value.is_number_integer() ||
             (value.is_number_float() && std::trunc(value.get<double>()) == value.get<double>());
      }
      if (!ok) return error(at, strCat("must be of type ", type, ", got ", typeName(value)));
    }
    if (auto e = schema.find("enum"); e != schema.end() && e->is_array()) {
      if (std::find(e->begin(), e->end(), value) == e->end()) {
        error(at, strCat("must be one of ", e->dump(), ", got ", value.dump()));
      }
    }
    if (value.is_string()) checkString(schema, value.get<std::string>(), at);
    if (value.is_number()) checkNumber(schema, value.get<double>(), at);
    if (value.is_array()) checkArray(schema, value, path, at, structural);
    if (value.is_object()) checkObject(schema, value, path, at, structural);
    checkCombinators(schema, value, path, at);
  }

 private:
  void error(const std::string& path, const std::string& what) {
    out_->push_back(strCat(path, ": ", what));
  }

  const Json& resolve(const Json& schema) {
    const Json* s = &schema;
    for (int depth = 0; depth < 32 && s->is_object() && s->contains("$ref"); ++depth) {
      const std::string ref = (*s)["$ref"].get<std::string>();
      if (!document_ || ref.rfind("#/", 0) != 0) break;
      try {
        s = &document_->at(Json::json_pointer(ref.substr(1)));
      } catch (const Json::exception&) {
        error("(schema)", strCat("unresolved $ref ", ref));
        static const Json empty = Json::object();
        return empty;
      }
    }
    return *s;
  }

  void checkString(const Json& schema, const std::string& s, const std::string& at) {
    if (auto p = schema.find("pattern"); p != schema.end() && p->is_string()) {
      if (const std::regex* re = compiled(*p); re && !std::regex_search(s, *re)) {
        error(at, strCat("\"", s, "\" must match pattern ", p->get<std::string>()));
      }
    }
    if (auto m = schema.find("maxLength"); m != schema.end() && s.size() > m->get<size_t>()) {
      error(at, strCat("must be at most ", m->get<size_t>(), " characters, got ", s.size()));
    }
    if (auto m = schema.find("minLength"); m != schema.end() && s.size() < m->get<size_t>()) {
      error(at, strCat("must be at least ", m->get<size_t>(), " characters, got ", s.size()));
    }
  }

  void checkNumber(const Json& schema, double v, const std::string& at) {
    if (auto m = schema.find("minimum"); m != schema.end() && m->is_number()) {
      const bool exclusive = schema.value("exclusiveMinimum", false);
      if (v < m->get<double>() || (exclusive && v == m->get<double>())) {
        error(at, strCat("must be ", exclusive ? "greater than " : "at least ", m->dump()));
      }
    }
    if (auto m = schema.find("maximum"); m != schema.end() && m->is_number()) {
      const bool exclusive = schema.value("exclusiveMaximum", false);
      if (v > m->get<double>() || (exclusive && v == m->get<double>())) {
        error(at, strCat("must be ", exclusive ? "less than " : "at most ", m->dump()));
      }
    }
  }

  void checkArray(const Json& schema, const Json& value, const std::string& path,
                  const std::string& at, bool structural) {
    if (auto m = schema.find("maxItems"); m != schema.end() && value.size() > m->get<size_t>()) {
      error(at, strCat("must have at most ", m->get<size_t>(), " items, got ", value.size()));
    }
    if (auto m = schema.find("minItems"); m != schema.end() && value.size() < m->get<size_t>()) {
      error(at, strCat("must have at least ", m->get<size_t>(), " items, got ", value.size()));
    }
    if (auto items = schema.find("items"); items != schema.end()) {
      for (size_t i = 0; i < value.size(); ++i) {
        check(*items, value[i], strCat(path, "[", i, "]"), structural);
      }
    }
    const std::string list_type = schema.value("x-kubernetes-list-type", "");
    if (list_type == "set") {
      std::set<std::string> seen;
      for (const auto& item : value) {
        if (!seen.insert(item.dump()).second) error(at, strCat("duplicate entry ", item.dump()));
      }
    } else if (list_type == "map") {
      const Json keys = schema.value("x-kubernetes-list-map-keys", Json::array());
      std::set<std::string> seen;
      for (const auto& item : value) {
        Json key = Json::array();
        for (const auto& k : keys) {
          key.push_back(item.is_object() ? item.value(k.get<std::string>(), Json()) : Json());
        }
        if (!seen.insert(key.dump()).second) {
          error(at, strCat("duplicate entry with keys ", keys.dump(), " = ", key.dump()));
        }
      }
    }
  }

  void checkObject(const Json& schema, const Json& value, const std::string& path,
                   const std::string& at, bool structural) {
    if (auto r = schema.find("required"); r != schema.end() && r->is_array()) {
      for (const auto& key : *r) {
        if (!value.contains(key.get<std::string>())) {
          error(child(path, key.get<std::string>()), "required field missing");
        }
      }
    }
    if (auto m = schema.find("maxProperties");
        m != schema.end() && value.size() > m->get<size_t>()) {
      error(at, strCat("must have at most ", m->get<size_t>(), " fields"));
    }
    if (auto m = schema.find("minProperties");
        m != schema.end() && value.size() < m->get<size_t>()) {
      error(at, strCat("must have at least ", m->get<size_t>(), " fields"));
    }
    const auto props = schema.find("properties");
    const bool has_props = props != schema.end() && props->is_object();
    const auto additional = schema.find("additionalProperties");
    const bool preserve = schema.value("x-kubernetes-preserve-unknown-fields", false);
    for (const auto& [key, field] : value.items()) {
      if (has_props && props->contains(key)) {
        check((*props)[key], field, child(path, key), structural);
      } else if (additional != schema.end() && additional->is_object()) {
        check(*additional, field, child(path, key), structural);
      } else if (additional != schema.end() && additional->is_boolean() &&
                 !additional->get<bool>()) {
        error(child(path, key), "unknown field (additional properties are not allowed)");
      } else if (structural && has_props && !preserve && additional == schema.end()) {
        error(child(path, key), "unknown field");
      }
    }
  }

  // Errors of `value` against `schema` alone (for the combinators).
  std::vector<std::string> alone(const Json& schema, const Json& value, const std::string& path) {
    std::vector<std::string> errors;
    Validator(document_, &errors).check(schema, value, path, false);
    return errors;
  }

  void checkCombinators(const Json& schema, const Json& value, const std::string& path,
                        const std::string& at) {
    if (auto all = schema.find("allOf"); all != schema.end() && all->is_array()) {
      for (const auto& branch : *all) check(branch, value, path, false);
    }
    if (auto any = schema.find("anyOf"); any != schema.end() && any->is_array()) {
      std::string first;
      bool matched = false;
      for (const auto& branch : *any) {
        const auto errors = alone(branch, value, path);
        if (errors.empty()) {
          matched = true;
          break;
        }
        if (first.empty()) first = errors.front();
      }
      if (!matched) {
        error(at, strCat("matches none of the ", any->size(),
                         " anyOf alternatives (the first: ", first, ")"));
      }
    }
    if (auto one = schema.find("oneOf"); one != schema.end() && one->is_array()) {
      size_t matches = 0;
      std::string first;
      for (const auto& branch : *one) {
        const auto errors = alone(branch, value, path);
        if (errors.empty()) {
          ++matches;
        } else if (first.empty()) {
          first = errors.front();
        }
      }
      if (matches == 0) {
        error(at, strCat("matches none of the ", one->size(),
                         " oneOf alternatives (the first: ", first, ")"));
      } else if (matches > 1) {
        error(at, strCat("matches ", matches, " of the oneOf alternatives; exactly one allowed"));
      }
    }
    if (auto n = schema.find("not"); n != schema.end() && alone(*n, value, path).empty()) {
      error(at, strCat("must not match ", n->dump()));
    }
  }

  const Json* document_;
  std::vector<std::string>* out_;
};

}  // namespace

absl::StatusOr<std::string> K8sSchemas::defaultDir() {
  if (const char* dir = std::getenv("KRANE_SCHEMA_DIR"); dir && *dir) return std::string(dir);
  // The copies in the tree (tests/schema/upstream), else the shared folder next to the tree:
  // this header's runfile is a symlink into the source tree.
  for (const char* var : {"TEST_SRCDIR", "RUNFILES_DIR"}) {
    const char* root = std::getenv(var);
    if (!root) continue;
    const auto in_tree = std::filesystem::path(root) / "krane/tests/schema/upstream";
    if (std::filesystem::is_directory(in_tree)) return in_tree.string();
    std::error_code ec;
    const auto header = std::filesystem::canonical(
        std::filesystem::path(root) / "krane/tests/support/k8s_schema.h", ec);
    if (ec) continue;
    const auto dir =
        header.parent_path().parent_path().parent_path().parent_path() / "shared/schemas";
    if (std::filesystem::is_directory(dir)) return dir.string();
  }
  return absl::NotFoundError(
      "cannot find the upstream schemas (tests/schema/upstream in the runfiles, or "
      "../shared/schemas "
      "next to the source tree); set KRANE_SCHEMA_DIR");
}

absl::StatusOr<K8sSchemas> K8sSchemas::load(const std::string& dir) {
  K8sSchemas out;
  std::error_code ec;
  std::vector<std::filesystem::path> files;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    const std::string ext = it->path().extension().string();
    if (it->is_regular_file() && (ext == ".yaml" || ext == ".yml" || ext == ".json")) {
      files.push_back(it->path());
    }
  }
  if (ec) {
    return absl::NotFoundError(strCat("cannot read schema directory ", dir, ": ", ec.message()));
  }
  std::sort(files.begin(), files.end());
  for (const auto& file : files) {
    std::vector<Json> documents;
    try {
      if (file.extension() == ".json") {
        std::ifstream in(file);
        documents.push_back(Json::parse(in));
      } else {
        for (const auto& node : YAML::LoadAllFromFile(file.string())) {
          documents.push_back(toJson(node));
        }
      }
    } catch (const std::exception& e) {
      return absl::InvalidArgumentError(strCat(file.string(), ": cannot parse: ", e.what()));
    }
    for (auto& doc : documents) {
      if (!doc.is_object()) continue;
      if (doc.value("kind", "") == "CustomResourceDefinition") {
        const Json spec = doc.value("spec", Json::object());
        const std::string group = spec.value("group", "");
        const std::string kind = spec.value("names", Json::object()).value("kind", "");
        for (const auto& version : spec.value("versions", Json::array())) {
          const Json schema =
              version.value("schema", Json::object()).value("openAPIV3Schema", Json());
          if (group.empty() || kind.empty() || !schema.is_object()) {
            return absl::InvalidArgumentError(
                strCat(file.string(),
                       ": a CustomResourceDefinition without group, kind or "
                       "openAPIV3Schema"));
          }
          out.schemas_[strCat(group, "/", version.value("name", ""), " ", kind)] = {nullptr,
                                                                                    schema};
        }
        continue;
      }
      const Json components = doc.value("components", Json::object()).value("schemas", Json());
      if (!components.is_object()) continue;
      auto shared = std::make_shared<const Json>(std::move(doc));
      for (const auto& [name, schema] : (*shared)["components"]["schemas"].items()) {
        for (const auto& gvk : schema.value("x-kubernetes-group-version-kind", Json::array())) {
          const std::string group = gvk.value("group", "");
          const std::string api_version = group.empty()
                                              ? gvk.value("version", "")
                                              : strCat(group, "/", gvk.value("version", ""));
          out.schemas_[strCat(api_version, " ", gvk.value("kind", ""))] = {shared, schema};
        }
      }
    }
  }
  return out;
}

bool K8sSchemas::has(const std::string& api_version, const std::string& kind) const {
  return schemas_.count(strCat(api_version, " ", kind)) > 0;
}

std::vector<std::string> K8sSchemas::kinds() const {
  std::vector<std::string> out;
  for (const auto& [key, entry] : schemas_) out.push_back(key);
  return out;
}

std::vector<std::string> K8sSchemas::violations(const Json& object) const {
  std::vector<std::string> out;
  const std::string key = strCat(object.value("apiVersion", ""), " ", object.value("kind", ""));
  auto it = schemas_.find(key);
  if (it == schemas_.end()) {
    out.push_back(strCat("(object): no schema for \"", key, "\""));
    return out;
  }
  Validator(it->second.document.get(), &out).check(it->second.schema, object, "", true);
  return out;
}

absl::Status K8sSchemas::validate(const Json& object) const {
  const auto found = violations(object);
  if (found.empty()) return absl::OkStatus();
  std::string message = strCat(object.value("kind", ""), " ",
                               object.value("metadata", Json::object()).value("name", ""), ": ");
  for (size_t i = 0; i < found.size(); ++i) strAppend(&message, i ? "; " : "", found[i]);
  return absl::InvalidArgumentError(message);
}

}  // namespace krane::testing
