#include "tests/support/fake_kube_api.h"

#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <functional>

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include "common/http_serve.h"
#include "common/strings.h"
#include "plugins/runtime/kubernetes/resources.h"

namespace krane::testing {
namespace {

using Json = nlohmann::json;
using kube::ResourceType;

constexpr auto kWatchHeartbeat = std::chrono::seconds(1);

std::string nowRfc3339() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// "deployments.apps", "services" (how the API server names a resource in messages).
std::string qualifiedResource(const ResourceType& type) {
  return type.group.empty() ? type.plural : strCat(type.plural, ".", type.group);
}

std::string qualifiedKind(const ResourceType& type) {
  return type.group.empty() ? type.kind : strCat(type.kind, ".", type.group);
}

Json statusObject(int code, const std::string& reason, const std::string& message,
                  Json details = nullptr) {
  Json status = {{"kind", "Status"},    {"apiVersion", "v1"}, {"metadata", Json::object()},
                 {"status", "Failure"}, {"message", message}, {"reason", reason},
                 {"code", code}};
  if (!details.is_null()) status["details"] = std::move(details);
  return status;
}

void answer(httplib::Response& res, int code, const Json& body) {
  res.status = code;
  res.set_content(body.dump(), "application/json");
}

void fail(httplib::Response& res, int code, const std::string& reason, const std::string& message,
          Json details = nullptr) {
  answer(res, code, statusObject(code, reason, message, std::move(details)));
}

std::string reasonFor(int code) {
  switch (code) {
    case 400:
      return "BadRequest";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "NotFound";
    case 409:
      return "Conflict";
    case 410:
      return "Expired";
    case 422:
      return "Invalid";
    case 429:
      return "TooManyRequests";
    case 503:
      return "ServiceUnavailable";
    case 504:
      return "Timeout";
    default:
      return "InternalError";
  }
}

// --- names and labels, as the API server validates them ---

bool isAlnumLower(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }

bool isDns1123Label(const std::string& s) {
  if (s.empty() || s.size() > 63 || !isAlnumLower(s.front()) || !isAlnumLower(s.back())) {
    return false;
  }
  return std::all_of(s.begin(), s.end(), [](char c) { return isAlnumLower(c) || c == '-'; });
}

bool isDns1123Subdomain(const std::string& s) {
  if (s.empty() || s.size() > 253) return false;
  size_t start = 0;
  for (;;) {
    const size_t dot = s.find('.', start);
    if (!isDns1123Label(s.substr(start, dot == std::string::npos ? dot : dot - start))) {
      return false;
    }
    if (dot == std::string::npos) return true;
    start = dot + 1;
  }
}

bool isLabelName(const std::string& s) {
  if (s.empty() || s.size() > 63 || !std::isalnum(static_cast<unsigned char>(s.front())) ||
      !std::isalnum(static_cast<unsigned char>(s.back()))) {
    return false;
  }
  return std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
  });
}

bool isLabelKey(const std::string& key) {
  const size_t slash = key.find('/');
  if (slash == std::string::npos) return isLabelName(key);
  return isDns1123Subdomain(key.substr(0, slash)) && isLabelName(key.substr(slash + 1));
}

bool isLabelValue(const std::string& v) { return v.empty() || isLabelName(v); }

// The field errors of an object about to be stored ("metadata.name: Invalid value: ...").
std::vector<std::string> validate(const ResourceType& type, const Json& obj) {
  std::vector<std::string> causes;
  const Json meta = obj.value("metadata", Json::object());
  const std::string name = meta.value("name", "");
  const bool label_name = type.kind == "Namespace" || type.kind == "Service";
  if (name.empty()) {
    causes.push_back("metadata.name: Required value: name or generateName is required");
  } else if (label_name ? !isDns1123Label(name) : !isDns1123Subdomain(name)) {
    causes.push_back(strCat("metadata.name: Invalid value: \"", name, "\": a lowercase RFC 1123 ",
                            label_name ? "label" : "subdomain",
                            " must consist of lower case alphanumeric characters, '-'",
                            label_name ? "" : " or '.'",
                            ", and must start and end with an alphanumeric character"));
  }
  if (auto labels = meta.find("labels"); labels != meta.end()) {
    if (!labels->is_object()) {
      causes.push_back("metadata.labels: Invalid value: must be a map of strings");
    } else {
      for (const auto& [key, value] : labels->items()) {
        if (!isLabelKey(key)) {
          causes.push_back(strCat("metadata.labels: Invalid value: \"", key,
                                  "\": name part must consist of alphanumeric characters, '-', "
                                  "'_' or '.', and must start and end with an alphanumeric "
                                  "character"));
        }
        if (!value.is_string() || !isLabelValue(value.get<std::string>())) {
          causes.push_back(strCat("metadata.labels: Invalid value: \"", value.dump(),
                                  "\": a valid label must be an empty string or consist of "
                                  "alphanumeric characters, '-', '_' or '.'"));
        }
      }
    }
  }
  const Json spec = obj.value("spec", Json::object());
  auto check_pod_spec = [&causes](const Json& pod_spec, const std::string& path) {
    const Json containers = pod_spec.value("containers", Json::array());
    if (!containers.is_array() || containers.empty()) {
      causes.push_back(strCat(path, ".containers: Required value"));
      return;
    }
    for (size_t i = 0; i < containers.size(); ++i) {
      const std::string cpath = strCat(path, ".containers[", i, "]");
      const std::string cname = containers[i].value("name", "");
      if (cname.empty()) {
        causes.push_back(strCat(cpath, ".name: Required value"));
      } else if (!isDns1123Label(cname)) {
        causes.push_back(strCat(cpath, ".name: Invalid value: \"", cname, "\""));
      }
      if (containers[i].value("image", "").empty()) {
        causes.push_back(strCat(cpath, ".image: Required value"));
      }
    }
  };
  if (type.kind == "Deployment" || type.kind == "ReplicaSet") {
    const Json selector = spec.value("selector", Json());
    const Json template_labels = spec.value("template", Json::object())
                                     .value("metadata", Json::object())
                                     .value("labels", Json::object());
    if (!selector.is_object() || selector.empty()) {
      causes.push_back("spec.selector: Required value");
    } else {
      const Json match_labels = selector.value("matchLabels", Json::object());
      for (const auto& [key, value] : match_labels.items()) {
        if (!template_labels.contains(key) || template_labels[key] != value) {
          causes.push_back(
              strCat("spec.template.metadata.labels: Invalid value: ", template_labels.dump(),
                     ": `selector` does not match template "
                     "`labels`"));
          break;
        }
      }
    }
    if (auto replicas = spec.find("replicas");
        replicas != spec.end() && (!replicas->is_number_integer() || *replicas < 0)) {
      causes.push_back("spec.replicas: Invalid value: must be greater than or equal to 0");
    }
    check_pod_spec(spec.value("template", Json::object()).value("spec", Json::object()),
                   "spec.template.spec");
  } else if (type.kind == "Pod") {
    check_pod_spec(spec, "spec");
  } else if (type.kind == "Service") {
    const Json ports = spec.value("ports", Json::array());
    for (size_t i = 0; ports.is_array() && i < ports.size(); ++i) {
      const Json port = ports[i].value("port", Json());
      if (!port.is_number_integer() || port < 1 || port > 65535) {
        causes.push_back(strCat("spec.ports[", i, "].port: Invalid value: ", port.dump(),
                                ": must be between 1 and 65535, inclusive"));
      }
    }
  }
  return causes;
}

// --- label selectors ---

struct Requirement {
  enum class Op { kEq, kNotEq, kIn, kNotIn, kExists, kNotExists };
  std::string key;
  Op op;
  std::vector<std::string> values;
};

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

// INVALID_ARGUMENT with the API server's wording for a selector it cannot parse.
absl::StatusOr<std::vector<Requirement>> parseSelector(const std::string& text) {
  std::vector<std::string> terms;
  int depth = 0;
  std::string current;
  for (char c : text) {
    if (c == '(') ++depth;
    if (c == ')') --depth;
    if (c == ',' && depth == 0) {
      terms.push_back(current);
      current.clear();
    } else {
      current.push_back(c);
    }
  }
  if (!trim(current).empty() || !terms.empty()) terms.push_back(current);
  std::vector<Requirement> out;
  auto bad = [&text](const std::string& why) {
    return absl::InvalidArgumentError(
        strCat("unable to parse requirement: ", why, " (selector \"", text, "\")"));
  };
  for (const auto& raw : terms) {
    const std::string term = trim(raw);
    if (term.empty()) return bad("empty requirement");
    Requirement r;
    auto set_based = [&](size_t at, size_t op_len, Requirement::Op op) -> absl::Status {
      r.key = trim(term.substr(0, at));
      r.op = op;
      const std::string rest = trim(term.substr(at + op_len));
      if (rest.size() < 2 || rest.front() != '(' || rest.back() != ')') {
        return bad(strCat("expected a parenthesised value list in \"", term, "\""));
      }
      std::string values = rest.substr(1, rest.size() - 2);
      size_t start = 0;
      for (;;) {
        const size_t comma = values.find(',', start);
        r.values.push_back(trim(values.substr(start, comma - start)));
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
      return absl::OkStatus();
    };
    if (term.front() == '!') {
      r.key = trim(term.substr(1));
      r.op = Requirement::Op::kNotExists;
    } else if (size_t at = term.find(" notin "); at != std::string::npos) {
      if (auto st = set_based(at, 7, Requirement::Op::kNotIn); !st.ok()) return st;
    } else if (size_t at2 = term.find(" in "); at2 != std::string::npos) {
      if (auto st = set_based(at2, 4, Requirement::Op::kIn); !st.ok()) return st;
    } else if (size_t ne = term.find("!="); ne != std::string::npos) {
      r.key = trim(term.substr(0, ne));
      r.op = Requirement::Op::kNotEq;
      r.values = {trim(term.substr(ne + 2))};
    } else if (size_t eq = term.find('='); eq != std::string::npos) {
      const size_t len = term.compare(eq, 2, "==") == 0 ? 2 : 1;
      r.key = trim(term.substr(0, eq));
      r.op = Requirement::Op::kEq;
      r.values = {trim(term.substr(eq + len))};
    } else {
      r.key = term;
      r.op = Requirement::Op::kExists;
    }
    if (!isLabelKey(r.key)) return bad(strCat("invalid label key \"", r.key, "\""));
    for (const auto& v : r.values) {
      if (!isLabelValue(v)) return bad(strCat("invalid label value \"", v, "\""));
    }
    out.push_back(std::move(r));
  }
  return out;
}

struct Selector {
  std::vector<Requirement> labels;
  std::vector<Requirement> fields;
};

// The value at a dotted path ("status.phase"); "" when absent.
std::string fieldValue(const Json& object, const std::string& path) {
  const Json* at = &object;
  size_t start = 0;
  for (;;) {
    const size_t dot = path.find('.', start);
    const std::string key = path.substr(start, dot == std::string::npos ? dot : dot - start);
    if (!at->is_object() || !at->contains(key)) return "";
    at = &(*at)[key];
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  if (at->is_string()) return at->get<std::string>();
  return at->is_null() ? "" : at->dump();
}

// Field selectors support = / == / != on the fields the API server indexes for the kind.
absl::StatusOr<std::vector<Requirement>> parseFieldSelector(const std::string& text,
                                                            const ResourceType& type) {
  std::vector<Requirement> out;
  if (trim(text).empty()) return out;
  size_t start = 0;
  for (;;) {
    const size_t comma = text.find(',', start);
    const std::string term =
        trim(text.substr(start, comma == std::string::npos ? comma : comma - start));
    Requirement r;
    if (const size_t ne = term.find("!="); ne != std::string::npos) {
      r.key = trim(term.substr(0, ne));
      r.op = Requirement::Op::kNotEq;
      r.values = {trim(term.substr(ne + 2))};
    } else if (const size_t eq = term.find('='); eq != std::string::npos) {
      const size_t len = term.compare(eq, 2, "==") == 0 ? 2 : 1;
      r.key = trim(term.substr(0, eq));
      r.op = Requirement::Op::kEq;
      r.values = {trim(term.substr(eq + len))};
    } else {
      return absl::InvalidArgumentError(
          strCat("invalid field selector: \"", term, "\": expected field=value or field!=value"));
    }
    static const std::vector<std::string> kPodFields = {
        "spec.nodeName", "spec.restartPolicy", "spec.schedulerName",      "spec.serviceAccountName",
        "status.phase",  "status.podIP",       "status.nominatedNodeName"};
    const bool known = r.key == "metadata.name" || r.key == "metadata.namespace" ||
                       (type.kind == "Pod" &&
                        std::find(kPodFields.begin(), kPodFields.end(), r.key) != kPodFields.end());
    if (!known) {
      return absl::InvalidArgumentError(
          strCat("\"", r.key,
                 "\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\"",
                 type.kind == "Pod" ? " and the pod fields" : ""));
    }
    out.push_back(std::move(r));
    if (comma == std::string::npos) return out;
    start = comma + 1;
  }
}

absl::StatusOr<Selector> parseSelectors(const std::string& labels, const std::string& fields,
                                        const ResourceType& type) {
  Selector out;
  auto l = parseSelector(labels);
  if (!l.ok()) return l.status();
  out.labels = std::move(*l);
  auto f = parseFieldSelector(fields, type);
  if (!f.ok()) return f.status();
  out.fields = std::move(*f);
  return out;
}

bool matches(const std::vector<Requirement>& selector, const Json& object);

bool matches(const Selector& selector, const Json& object) {
  if (!matches(selector.labels, object)) return false;
  for (const auto& r : selector.fields) {
    const bool equal = fieldValue(object, r.key) == r.values[0];
    if (equal != (r.op == Requirement::Op::kEq)) return false;
  }
  return true;
}

bool matches(const std::vector<Requirement>& selector, const Json& object) {
  const Json labels = object.value("metadata", Json::object()).value("labels", Json::object());
  for (const auto& r : selector) {
    const bool has = labels.contains(r.key) && labels[r.key].is_string();
    const std::string value = has ? labels[r.key].get<std::string>() : "";
    const bool in = std::find(r.values.begin(), r.values.end(), value) != r.values.end();
    switch (r.op) {
      case Requirement::Op::kEq:
      case Requirement::Op::kIn:
        if (!has || !in) return false;
        break;
      case Requirement::Op::kNotEq:
      case Requirement::Op::kNotIn:
        if (has && in) return false;
        break;
      case Requirement::Op::kExists:
        if (!has) return false;
        break;
      case Requirement::Op::kNotExists:
        if (has) return false;
        break;
    }
  }
  return true;
}

// --- merging ---

// Objects merge recursively, anything else (lists included) is replaced, null removes the key.
void mergeInto(Json& target, const Json& patch) {
  if (!patch.is_object() || !target.is_object()) {
    target = patch;
    return;
  }
  for (const auto& [key, value] : patch.items()) {
    if (value.is_null()) {
      target.erase(key);
    } else if (value.is_object() && target.contains(key) && target[key].is_object()) {
      mergeInto(target[key], value);
    } else {
      target[key] = value;
    }
  }
}

// Removes from `target` what the manager applied `before` and no longer applies `now`.
void removeDropped(Json& target, const Json& before, const Json& now) {
  if (!before.is_object() || !target.is_object()) return;
  for (const auto& [key, value] : before.items()) {
    if (!now.is_object() || !now.contains(key)) {
      target.erase(key);
    } else if (value.is_object() && now[key].is_object() && target.contains(key)) {
      removeDropped(target[key], value, now[key]);
    }
  }
}

// What a client may set: server-managed metadata dropped, and either the status or all but it.
Json userPart(const Json& body, bool status_subresource) {
  Json part = body;
  if (status_subresource) {
    Json only = {{"status", body.value("status", Json::object())}};
    return only;
  }
  part.erase("status");
  if (part.contains("metadata") && part["metadata"].is_object()) {
    for (const char* key : {"resourceVersion", "uid", "creationTimestamp", "generation",
                            "managedFields", "deletionTimestamp", "selfLink"}) {
      part["metadata"].erase(key);
    }
  }
  return part;
}

// The object without metadata and status: a change here bumps metadata.generation.
Json specPart(const Json& object) {
  Json part = object;
  part.erase("metadata");
  part.erase("status");
  return part;
}

std::string hashHex(const std::string& text) {
  const size_t h = std::hash<std::string>{}(text);
  static const char* alphabet = "bcdfghjklmnpqrstvwxz2456789";
  std::string out;
  size_t v = h;
  for (int i = 0; i < 10; ++i) {
    out.push_back(alphabet[v % 27]);
    v /= 27;
  }
  return out;
}

std::vector<std::string> splitKey(const std::string& key) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (;;) {
    const size_t slash = key.find('/', start);
    parts.push_back(key.substr(start, slash - start));
    if (slash == std::string::npos) return parts;
    start = slash + 1;
  }
}

std::string objectKey(const ResourceType& type, const std::string& ns, const std::string& name) {
  return strCat(type.group, "/", type.plural, "/", type.namespaced ? ns : "", "/", name);
}

std::string typeKey(const ResourceType& type) { return strCat(type.group, "/", type.plural); }

std::string param(const httplib::Request& req, const std::string& name) {
  return req.has_param(name.c_str()) ? req.get_param_value(name.c_str()) : std::string();
}

// --- certificates for the HTTPS mode ---

struct Pki {
  EVP_PKEY* ca_key = nullptr;
  X509* ca = nullptr;
  EVP_PKEY* server_key = nullptr;
  X509* server = nullptr;
  EVP_PKEY* client_key = nullptr;
  X509* client = nullptr;
  ~Pki() {
    for (X509* c : {ca, server, client}) X509_free(c);
    for (EVP_PKEY* k : {ca_key, server_key, client_key}) EVP_PKEY_free(k);
  }
};

void addExtension(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
  if (!ext) throw std::runtime_error("X509V3_EXT_conf_nid failed");
  X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
}

// A certificate for `key` named `cn`, signed by `issuer` / `issuer_key` (self-signed when null).
X509* certificate(EVP_PKEY* key, const std::string& cn, X509* issuer, EVP_PKEY* issuer_key,
                  long serial, bool ca) {
  X509* cert = X509_new();
  X509_set_version(cert, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(cert), serial);
  X509_gmtime_adj(X509_getm_notBefore(cert), -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert), 7L * 24 * 3600);
  X509_set_pubkey(cert, key);
  X509_NAME* name = X509_get_subject_name(cert);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  X509_set_issuer_name(cert, issuer ? X509_get_subject_name(issuer) : name);
  X509* signer = issuer ? issuer : cert;
  addExtension(cert, signer, NID_subject_key_identifier, "hash");
  addExtension(cert, signer, NID_authority_key_identifier, "keyid:always");
  if (ca) {
    addExtension(cert, signer, NID_basic_constraints, "critical,CA:TRUE");
    addExtension(cert, signer, NID_key_usage, "critical,keyCertSign,cRLSign");
  } else {
    addExtension(cert, signer, NID_basic_constraints, "critical,CA:FALSE");
    addExtension(cert, signer, NID_key_usage, "critical,digitalSignature,keyEncipherment");
    addExtension(cert, signer, NID_ext_key_usage, "serverAuth,clientAuth");
    addExtension(cert, signer, NID_subject_alt_name, "IP:127.0.0.1,DNS:localhost");
  }
  X509_sign(cert, issuer_key ? issuer_key : key, EVP_sha256());
  return cert;
}

std::string pem(X509* cert) {
  BIO* bio = BIO_new(BIO_s_mem());
  PEM_write_bio_X509(bio, cert);
  char* data = nullptr;
  const long len = BIO_get_mem_data(bio, &data);
  std::string out(data, static_cast<size_t>(len));
  BIO_free(bio);
  return out;
}

std::string pem(EVP_PKEY* key) {
  BIO* bio = BIO_new(BIO_s_mem());
  PEM_write_bio_PrivateKey(bio, key, nullptr, nullptr, 0, nullptr, nullptr);
  char* data = nullptr;
  const long len = BIO_get_mem_data(bio, &data);
  std::string out(data, static_cast<size_t>(len));
  BIO_free(bio);
  return out;
}

}  // namespace

struct FakeKubeApi::Route {
  ResourceType type;
  std::string ns;
  std::string name;  // empty for a collection
  bool status = false;
};

FakeKubeApi::FakeKubeApi() : FakeKubeApi(Options{}) {}

FakeKubeApi::FakeKubeApi(Options options) : options_(options) {
  for (const char* ns : {"default", "kube-system"}) {
    put({{"apiVersion", "v1"},
         {"kind", "Namespace"},
         {"metadata", {{"name", ns}}},
         {"status", {{"phase", "Active"}}}});
  }
  if (options_.require_client_cert) options_.tls = true;
  if (options_.tls) {
    Pki pki;
    pki.ca_key = EVP_EC_gen("P-256");
    pki.server_key = EVP_EC_gen("P-256");
    pki.client_key = EVP_EC_gen("P-256");
    pki.ca = certificate(pki.ca_key, "fake-kube-api-ca", nullptr, nullptr, 1, true);
    pki.server = certificate(pki.server_key, "kube-apiserver", pki.ca, pki.ca_key, 2, false);
    pki.client = certificate(pki.client_key, "krane-agent", pki.ca, pki.ca_key, 3, false);
    ca_pem_ = pem(pki.ca);
    client_cert_pem_ = pem(pki.client);
    client_key_pem_ = pem(pki.client_key);
    X509_STORE* client_cas = nullptr;  // owned by the server's SSL context once given
    if (options_.require_client_cert) {
      client_cas = X509_STORE_new();
      X509_STORE_add_cert(client_cas, pki.ca);
    }
    server_ = std::make_unique<httplib::SSLServer>(pki.server, pki.server_key, client_cas);
  } else {
    server_ = std::make_unique<httplib::Server>();
  }
  server_->new_task_queue = [] { return new httplib::ThreadPool(64); };
  server_->set_keep_alive_timeout(2);
  // Headers and body go out in separate writes; without this, Nagle's algorithm and delayed
  // acknowledgements hold every answer back by tens of milliseconds.
  server_->set_tcp_nodelay(true);
  auto handler = [this](const httplib::Request& req, httplib::Response& res) { serve(req, res); };
  server_->Get(".*", handler);
  server_->Post(".*", handler);
  server_->Put(".*", handler);
  server_->Patch(".*", handler);
  server_->Delete(".*", handler);
  port_ = server_->bind_to_any_port("127.0.0.1");
  thread_ = serveInBackground(*server_);
}

FakeKubeApi::~FakeKubeApi() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  server_->stop();
  if (thread_.joinable()) thread_.join();
}

std::string FakeKubeApi::url() const {
  return strCat(options_.tls ? "https" : "http", "://127.0.0.1:", port_);
}

std::string FakeKubeApi::kubeconfigYaml() const {
  std::string token;
  {
    std::lock_guard lock(mutex_);
    token = token_;
  }
  return strCat("apiVersion: v1\nkind: Config\ncurrent-context: fake\n",
                "clusters: [{name: fake, cluster: {server: '", url(), "'}}]\n",
                "users: [{name: u, user: {", token.empty() ? "" : strCat("token: ", token), "}}]\n",
                "contexts: [{name: fake, context: {cluster: fake, user: u}}]\n");
}

kube::ClusterConfig FakeKubeApi::clusterConfig() const {
  kube::ClusterConfig config;
  config.server = url();
  config.source = "fake API server";
  config.ca_pem = ca_pem_;
  if (options_.require_client_cert) {
    config.client_cert_pem = client_cert_pem_;
    config.client_key_pem = client_key_pem_;
  }
  std::lock_guard lock(mutex_);
  config.bearer_token = token_;
  return config;
}

void FakeKubeApi::requireToken(std::string token) {
  std::lock_guard lock(mutex_);
  token_ = std::move(token);
}

void FakeKubeApi::failNext(int count, int http_code, int retry_after_seconds, std::string method) {
  std::lock_guard lock(mutex_);
  injected_ = {count, http_code, retry_after_seconds, std::move(method)};
}

void FakeKubeApi::compactHistory() {
  std::lock_guard lock(mutex_);
  history_.clear();
  compacted_rv_ = rv_;
  changed_.notify_all();
}

uint64_t FakeKubeApi::resourceVersion() const {
  std::lock_guard lock(mutex_);
  return rv_;
}

std::vector<FakeKubeApi::Request> FakeKubeApi::requests() const {
  std::lock_guard lock(mutex_);
  return log_;
}

size_t FakeKubeApi::countRequests(const std::string& method, const std::string& path_part) const {
  std::lock_guard lock(mutex_);
  return std::count_if(log_.begin(), log_.end(), [&](const Request& r) {
    return (method.empty() || r.method == method) && r.path.find(path_part) != std::string::npos;
  });
}

void FakeKubeApi::clearRequests() {
  std::lock_guard lock(mutex_);
  log_.clear();
}

std::optional<nlohmann::json> FakeKubeApi::object(const std::string& api_version,
                                                  const std::string& kind, const std::string& ns,
                                                  const std::string& name) const {
  auto type = kube::resourceFor(api_version, kind);
  if (!type.ok()) return std::nullopt;
  std::lock_guard lock(mutex_);
  auto it = objects_.find(objectKey(*type, ns, name));
  if (it == objects_.end()) return std::nullopt;
  return it->second;
}

std::vector<nlohmann::json> FakeKubeApi::objects(const std::string& api_version,
                                                 const std::string& kind,
                                                 const std::string& ns) const {
  std::vector<Json> out;
  auto type = kube::resourceFor(api_version, kind);
  if (!type.ok()) return out;
  const std::string prefix =
      strCat(typeKey(*type), "/", type->namespaced && !ns.empty() ? ns + "/" : "");
  std::lock_guard lock(mutex_);
  for (auto it = objects_.lower_bound(prefix);
       it != objects_.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it) {
    out.push_back(it->second);
  }
  return out;
}

nlohmann::json FakeKubeApi::put(const Json& object) {
  auto type = kube::resourceFor(object.value("apiVersion", ""), object.value("kind", ""));
  if (!type.ok()) throw std::invalid_argument(std::string(type.status().message()));
  const Json meta = object.value("metadata", Json::object());
  const std::string ns = type->namespaced ? meta.value("namespace", "") : "";
  const std::string key = objectKey(*type, ns, meta.value("name", ""));
  std::lock_guard lock(mutex_);
  const bool created = objects_.find(key) == objects_.end();
  return store(key, object, typeKey(*type), ns, created);
}

void FakeKubeApi::record(const Event& event) {
  history_.push_back(event);
  while (history_.size() > options_.history) {
    compacted_rv_ = history_.front().rv;
    history_.pop_front();
  }
  changed_.notify_all();
}

nlohmann::json FakeKubeApi::store(const std::string& key, Json object, const std::string& type_key,
                                  const std::string& ns, bool created) {
  Json previous;
  Json& meta = object["metadata"];
  if (created) {
    meta["uid"] = strCat("00000000-0000-4000-8000-", fmt::format("{:012x}", ++uid_counter_));
    meta["creationTimestamp"] = nowRfc3339();
    meta["generation"] = 1;
  } else {
    const Json& old = objects_.at(key);
    previous = old;
    const Json& old_meta = old["metadata"];
    meta["uid"] = old_meta["uid"];
    meta["creationTimestamp"] = old_meta["creationTimestamp"];
    const int64_t generation = old_meta.value("generation", int64_t{1});
    meta["generation"] = specPart(old) == specPart(object) ? generation : generation + 1;
  }
  if (!ns.empty()) meta["namespace"] = ns;
  meta.erase("managedFields");
  meta["resourceVersion"] = std::to_string(++rv_);
  objects_[key] = object;
  record({rv_, created ? "ADDED" : "MODIFIED", type_key, ns, object,
          created ? Json() : std::move(previous)});
  return object;
}

void FakeKubeApi::erase(const std::string& key, const std::string& type_key, bool orphan) {
  auto it = objects_.find(key);
  if (it == objects_.end()) return;
  Json object = std::move(it->second);
  objects_.erase(it);
  for (auto a = applied_.lower_bound(key + "|");
       a != applied_.end() && a->first.compare(0, key.size() + 1, key + "|") == 0;) {
    a = applied_.erase(a);
  }
  object["metadata"]["resourceVersion"] = std::to_string(++rv_);
  const std::string ns = object["metadata"].value("namespace", "");
  record({rv_, "DELETED", type_key, ns, object, Json()});

  std::vector<std::string> dependents;
  const std::string uid = object["metadata"].value("uid", "");
  const bool is_namespace = type_key == "/namespaces";
  const std::string name = object["metadata"].value("name", "");
  for (const auto& [k, v] : objects_) {
    const Json meta = v.value("metadata", Json::object());
    if (is_namespace && meta.value("namespace", "") == name) {
      dependents.push_back(k);
      continue;
    }
    if (orphan) continue;
    for (const auto& ref : meta.value("ownerReferences", Json::array())) {
      if (ref.value("uid", "") == uid) {
        dependents.push_back(k);
        break;
      }
    }
  }
  for (const auto& k : dependents) {
    const auto parts = splitKey(k);
    erase(k, strCat(parts[0], "/", parts[1]), orphan);
  }
}

void FakeKubeApi::serve(const httplib::Request& req, httplib::Response& res) {
  Request entry{req.method, req.path, "", req.get_header_value("Content-Type"), req.body, 0};
  if (const size_t q = req.target.find('?'); q != std::string::npos) {
    entry.query = req.target.substr(q + 1);
  }
  size_t index = 0;
  {
    std::lock_guard lock(mutex_);
    index = log_.size();
    log_.push_back(entry);
  }
  auto finish = [&] {
    std::lock_guard lock(mutex_);
    if (index < log_.size()) log_[index].status = res.status;
  };
  {
    std::unique_lock lock(mutex_);
    if (!token_.empty() && req.get_header_value("Authorization") != "Bearer " + token_) {
      lock.unlock();
      fail(res, 401, "Unauthorized", "Unauthorized");
      return finish();
    }
    if (injected_.count > 0 && (injected_.method.empty() || injected_.method == req.method)) {
      --injected_.count;
      const Injected failure = injected_;
      lock.unlock();
      if (failure.retry_after >= 0) {
        res.set_header("Retry-After", std::to_string(failure.retry_after));
      }
      fail(res, failure.code, reasonFor(failure.code),
           failure.code == 429 ? "Too many requests, please try again later."
                               : "injected failure of the fake API server");
      return finish();
    }
  }

  // /api/<version>/... or /apis/<group>/<version>/...
  std::vector<std::string> parts;
  for (size_t start = 1; start <= req.path.size();) {
    const size_t slash = req.path.find('/', start);
    const size_t end = slash == std::string::npos ? req.path.size() : slash;
    if (end > start) parts.push_back(req.path.substr(start, end - start));
    start = end + 1;
  }
  auto not_found = [&] {
    fail(res, 404, "NotFound", "the server could not find the requested resource");
    finish();
  };
  std::string group;
  std::string version;
  size_t at = 0;
  if (parts.size() >= 2 && parts[0] == "api") {
    version = parts[1];
    at = 2;
  } else if (parts.size() >= 3 && parts[0] == "apis") {
    group = parts[1];
    version = parts[2];
    at = 3;
  } else {
    return not_found();
  }
  std::vector<std::string> rest(parts.begin() + static_cast<std::ptrdiff_t>(at), parts.end());
  Route route;
  std::string plural;
  if (rest.size() >= 3 && rest[0] == "namespaces" && rest[2] != "status") {
    route.ns = rest[1];
    plural = rest[2];
    rest.erase(rest.begin(), rest.begin() + 3);
  } else if (!rest.empty()) {
    plural = rest[0];
    rest.erase(rest.begin());
  } else {
    return not_found();
  }
  if (!rest.empty()) route.name = rest[0];
  if (rest.size() == 2 && rest[1] == "status") {
    route.status = true;
  } else if (rest.size() > 1) {
    return not_found();
  }
  auto type = kube::resourceForPlural(group, version, plural);
  if (!type.ok()) return not_found();
  route.type = *type;
  if (!route.type.namespaced && !route.ns.empty()) return not_found();

  if (req.method == "GET" && route.name.empty() &&
      (param(req, "watch") == "true" || param(req, "watch") == "1")) {
    watch(req, res, route);
  } else {
    handle(req, res, route);
  }
  finish();
}

void FakeKubeApi::handle(const httplib::Request& req, httplib::Response& res, const Route& route) {
  const ResourceType& type = route.type;
  const std::string what = strCat(qualifiedResource(type), " \"", route.name, "\"");
  Json details = {{"name", route.name}, {"group", type.group}, {"kind", type.plural}};
  const std::string key = objectKey(type, route.ns, route.name);

  Json body;
  if (req.method == "POST" || req.method == "PUT" || req.method == "PATCH") {
    body = Json::parse(req.body, nullptr, false);
    if (!body.is_object()) {
      return fail(res, 400, "BadRequest",
                  "the body of the request was in an unknown format - accepted media types "
                  "include: application/json (the fake API server reads JSON bodies only)");
    }
    if (route.status && req.method == "PATCH") {
      // A status patch may omit apiVersion / kind.
    } else {
      const std::string api_version = body.value("apiVersion", "");
      if (api_version != type.apiVersion() || body.value("kind", "") != type.kind) {
        return fail(res, 400, "BadRequest",
                    strCat("the API version in the data (", api_version,
                           ") does not match the expected API version (", type.apiVersion(),
                           ") or kind (", body.value("kind", ""), " vs ", type.kind, ")"));
      }
    }
    Json& meta = body["metadata"];
    if (!meta.is_object()) meta = Json::object();
    if (!route.name.empty() && meta.contains("name") && meta["name"] != route.name) {
      return fail(res, 400, "BadRequest",
                  strCat("the name of the object (", meta.value("name", ""),
                         ") does not match the name on the URL (", route.name, ")"));
    }
    if (type.namespaced && meta.contains("namespace") && meta["namespace"] != route.ns) {
      return fail(res, 400, "BadRequest",
                  "the namespace of the provided object does not match the namespace sent on "
                  "the request");
    }
    if (!route.name.empty()) meta["name"] = route.name;
  }

  std::unique_lock lock(mutex_);
  if (type.namespaced && !route.ns.empty() && req.method != "GET" && req.method != "DELETE" &&
      objects_.find(strCat("/namespaces//", route.ns)) == objects_.end()) {
    return fail(res, 404, "NotFound", strCat("namespaces \"", route.ns, "\" not found"),
                Json{{"name", route.ns}, {"kind", "namespaces"}});
  }
  auto existing = objects_.find(key);
  const bool exists = existing != objects_.end();

  auto invalid = [&](const Json& object) -> bool {
    const auto causes = validate(type, object);
    if (causes.empty()) return false;
    std::string message =
        strCat(qualifiedKind(type), " \"", object["metadata"].value("name", ""), "\" is invalid: ");
    Json cause_list = Json::array();
    for (size_t i = 0; i < causes.size(); ++i) {
      strAppend(&message, i ? ", " : "", causes[i]);
      cause_list.push_back(
          {{"message", causes[i]}, {"field", causes[i].substr(0, causes[i].find(':'))}});
    }
    Json d = details;
    d["kind"] = type.kind;
    d["name"] = object["metadata"].value("name", "");
    d["causes"] = cause_list;
    lock.unlock();
    fail(res, 422, "Invalid", message, d);
    return true;
  };
  auto conflict = [&]() {
    lock.unlock();
    fail(res, 409, "Conflict",
         strCat("Operation cannot be fulfilled on ", what,
                ": the object has been modified; please apply your changes to the latest "
                "version and try again"),
         details);
  };
  auto precondition_fails = [&]() {
    const std::string wanted = body["metadata"].value("resourceVersion", "");
    return exists && !wanted.empty() &&
           wanted != existing->second["metadata"].value("resourceVersion", "");
  };
  auto not_found = [&]() {
    lock.unlock();
    fail(res, 404, "NotFound", strCat(what, " not found"), details);
  };

  if (req.method == "GET" && route.name.empty()) {
    auto selector = parseSelectors(param(req, "labelSelector"), param(req, "fieldSelector"), type);
    if (!selector.ok()) {
      lock.unlock();
      return fail(res, 400, "BadRequest", std::string(selector.status().message()));
    }
    const int64_t limit = param(req, "limit").empty() ? 0 : std::stoll(param(req, "limit"));
    const std::string token = param(req, "continue");
    uint64_t list_rv = rv_;
    std::string after;
    if (!token.empty()) {
      const size_t colon = token.find(':');
      if (colon == std::string::npos) {
        lock.unlock();
        return fail(res, 400, "BadRequest", "continue key is not valid");
      }
      list_rv = std::stoull(token.substr(0, colon));
      after = token.substr(colon + 1);
      if (list_rv < compacted_rv_) {
        lock.unlock();
        return fail(res, 410, "Expired",
                    "The provided continue parameter is too old to display a consistent list "
                    "result. You can start a new list without the continue parameter.");
      }
    }
    const std::string prefix =
        strCat(typeKey(type), "/", type.namespaced && !route.ns.empty() ? route.ns + "/" : "");
    Json items = Json::array();
    std::string last;
    int64_t remaining = 0;
    for (auto it = after.empty() ? objects_.lower_bound(prefix) : objects_.upper_bound(after);
         it != objects_.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it) {
      if (!matches(*selector, it->second)) continue;
      if (limit > 0 && static_cast<int64_t>(items.size()) >= limit) {
        ++remaining;
        continue;
      }
      Json item = it->second;
      item.erase("apiVersion");  // as in a real typed list
      item.erase("kind");
      items.push_back(std::move(item));
      last = it->first;
    }
    Json list_meta = {{"resourceVersion", std::to_string(list_rv)}};
    if (remaining > 0) {
      list_meta["continue"] = strCat(list_rv, ":", last);
      list_meta["remainingItemCount"] = remaining;
    }
    lock.unlock();
    return answer(res, 200,
                  {{"kind", type.kind + "List"},
                   {"apiVersion", type.apiVersion()},
                   {"metadata", list_meta},
                   {"items", items}});
  }

  if (req.method == "GET") {
    if (!exists) return not_found();
    Json object = existing->second;
    lock.unlock();
    return answer(res, 200, object);
  }

  if (req.method == "DELETE") {
    if (!exists) return not_found();
    const std::string uid = existing->second["metadata"].value("uid", "");
    erase(key, typeKey(type), param(req, "propagationPolicy") == "Orphan");
    lock.unlock();
    Json d = details;
    d["uid"] = uid;
    return answer(res, 200,
                  {{"kind", "Status"},
                   {"apiVersion", "v1"},
                   {"metadata", Json::object()},
                   {"status", "Success"},
                   {"details", d}});
  }

  if (req.method == "POST") {
    if (!route.name.empty() || route.status) {
      lock.unlock();
      return fail(res, 405, "MethodNotAllowed", "the server does not allow this method");
    }
    const std::string name = body["metadata"].value("name", "");
    const std::string create_key = objectKey(type, route.ns, name);
    Json object = userPart(body, false);
    if (invalid(object)) return;
    if (objects_.count(create_key)) {
      lock.unlock();
      return fail(res, 409, "AlreadyExists",
                  strCat(qualifiedResource(type), " \"", name, "\" already exists"),
                  Json{{"name", name}, {"group", type.group}, {"kind", type.plural}});
    }
    Json stored = store(create_key, object, typeKey(type), route.ns, true);
    lock.unlock();
    return answer(res, 201, stored);
  }

  if (req.method == "PUT") {
    if (!exists) return not_found();
    if (precondition_fails()) return conflict();
    Json object;
    if (route.status) {
      object = existing->second;
      object["status"] = body.value("status", Json::object());
    } else {
      object = userPart(body, false);
      if (existing->second.contains("status")) object["status"] = existing->second["status"];
    }
    if (invalid(object)) return;
    Json stored = store(key, object, typeKey(type), route.ns, false);
    lock.unlock();
    return answer(res, 200, stored);
  }

  // PATCH
  const std::string content_type = req.get_header_value("Content-Type");
  if (content_type.rfind("application/apply-patch+yaml", 0) == 0) {
    const std::string manager = param(req, "fieldManager");
    if (manager.empty()) {
      lock.unlock();
      return fail(res, 422, "Invalid",
                  "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is "
                  "required for apply patch");
    }
    if (precondition_fails()) return conflict();
    const Json part = userPart(body, route.status);
    const std::string applied_key = strCat(key, "|", manager, route.status ? "|status" : "");
    Json object;
    if (exists) {
      object = existing->second;
      mergeInto(object, part);
      if (auto before = applied_.find(applied_key); before != applied_.end()) {
        removeDropped(object, before->second, part);
      }
    } else {
      if (route.status) return not_found();
      object = part;
    }
    if (invalid(object)) return;
    applied_[applied_key] = part;
    if (exists && object == existing->second) {
      lock.unlock();
      return answer(res, 200, object);
    }
    Json stored = store(key, object, typeKey(type), route.ns, !exists);
    lock.unlock();
    return answer(res, exists ? 200 : 201, stored);
  }
  if (content_type.rfind("application/merge-patch+json", 0) == 0 ||
      content_type.rfind("application/strategic-merge-patch+json", 0) == 0) {
    if (!exists) return not_found();
    if (precondition_fails()) return conflict();
    Json object = existing->second;
    Json patch = userPart(body, route.status);
    if (!route.status) patch.erase("metadata");
    if (!route.status && body["metadata"].is_object()) {
      Json meta_patch = body["metadata"];
      for (const char* k : {"resourceVersion", "uid", "creationTimestamp", "generation", "name",
                            "namespace", "managedFields"}) {
        meta_patch.erase(k);
      }
      patch["metadata"] = meta_patch;
    }
    mergeInto(object, patch);
    if (invalid(object)) return;
    if (object == existing->second) {
      lock.unlock();
      return answer(res, 200, object);
    }
    Json stored = store(key, object, typeKey(type), route.ns, false);
    lock.unlock();
    return answer(res, 200, stored);
  }
  lock.unlock();
  fail(res, 415, "UnsupportedMediaType",
       strCat("the body of the request was in an unknown format - accepted media types include: "
              "application/json-patch+json, application/merge-patch+json, "
              "application/apply-patch+yaml (got \"",
              content_type, "\")"));
}

void FakeKubeApi::watch(const httplib::Request& req, httplib::Response& res, const Route& route) {
  auto selector =
      parseSelectors(param(req, "labelSelector"), param(req, "fieldSelector"), route.type);
  if (!selector.ok()) return fail(res, 400, "BadRequest", std::string(selector.status().message()));
  struct State {
    Selector selector;
    std::string type_key;
    std::string ns;
    uint64_t last_rv = 0;
    std::string pending;  // lines to send first
    std::chrono::steady_clock::time_point deadline;
    bool bookmarks = false;
    bool done = false;
    Json bookmark_object;
  };
  auto state = std::make_shared<State>();
  state->selector = std::move(*selector);
  state->type_key = typeKey(route.type);
  state->ns = route.type.namespaced ? route.ns : "";
  state->bookmarks = param(req, "allowWatchBookmarks") == "true";
  state->bookmark_object = {{"apiVersion", route.type.apiVersion()},
                            {"kind", route.type.kind},
                            {"metadata", Json::object()}};
  const std::string timeout = param(req, "timeoutSeconds");
  state->deadline = std::chrono::steady_clock::now() +
                    std::chrono::seconds(timeout.empty() ? 1800 : std::stoll(timeout));
  const std::string from = param(req, "resourceVersion");
  {
    std::lock_guard lock(mutex_);
    if (from.empty() || from == "0") {
      const std::string prefix =
          strCat(state->type_key, "/", state->ns.empty() ? "" : state->ns + "/");
      for (auto it = objects_.lower_bound(prefix);
           it != objects_.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it) {
        if (matches(state->selector, it->second)) {
          strAppend(&state->pending, Json{{"type", "ADDED"}, {"object", it->second}}.dump(), "\n");
        }
      }
      state->last_rv = rv_;
    } else {
      state->last_rv = std::stoull(from);
    }
  }
  res.status = 200;
  res.set_chunked_content_provider(
      "application/json", [this, state](size_t, httplib::DataSink& sink) {
        std::string out = std::move(state->pending);
        state->pending.clear();
        std::unique_lock lock(mutex_);
        for (;;) {
          if (stopping_ || state->done || std::chrono::steady_clock::now() > state->deadline) {
            lock.unlock();
            if (!out.empty()) sink.write(out.data(), out.size());
            sink.done();
            return true;
          }
          if (state->last_rv < compacted_rv_) {
            Json status = statusObject(
                410, "Expired",
                strCat("too old resource version: ", state->last_rv, " (", compacted_rv_, ")"));
            strAppend(&out, Json{{"type", "ERROR"}, {"object", status}}.dump(), "\n");
            state->done = true;
            continue;
          }
          auto it = std::upper_bound(history_.begin(), history_.end(), state->last_rv,
                                     [](uint64_t rv, const Event& e) { return rv < e.rv; });
          for (; it != history_.end(); ++it) {
            if (it->type_key != state->type_key) continue;
            if (!state->ns.empty() && it->ns != state->ns) continue;
            const bool now_matches = matches(state->selector, it->object);
            const bool matched_before =
                it->type == "MODIFIED" && matches(state->selector, it->previous);
            std::string type = it->type;
            if (type == "MODIFIED" && now_matches != matched_before) {
              type = now_matches ? "ADDED" : "DELETED";
            } else if (!now_matches) {
              continue;
            }
            strAppend(&out, Json{{"type", type}, {"object", it->object}}.dump(), "\n");
          }
          state->last_rv = rv_;
          if (!out.empty()) break;
          if (changed_.wait_for(lock, kWatchHeartbeat) == std::cv_status::timeout) {
            // Idle: a bookmark (or a bare newline) finds out whether the client is still there.
            if (state->bookmarks) {
              Json bookmark = state->bookmark_object;
              bookmark["metadata"]["resourceVersion"] = std::to_string(rv_);
              state->last_rv = rv_;
              out = Json{{"type", "BOOKMARK"}, {"object", bookmark}}.dump() + "\n";
            } else {
              out = "\n";
            }
            break;
          }
        }
        lock.unlock();
        return sink.write(out.data(), out.size());
      });
}

absl::Status FakeKubeApi::makePodsReady(const std::string& ns, const std::string& deployment) {
  return podsHook(ns, deployment, "ready", 0, 0, "");
}

absl::Status FakeKubeApi::makePodsCrashLoop(const std::string& ns, const std::string& deployment,
                                            int restarts, int exit_code) {
  return podsHook(ns, deployment, "crashloop", restarts, exit_code, "CrashLoopBackOff");
}

absl::Status FakeKubeApi::makePodsFailImagePull(const std::string& ns,
                                                const std::string& deployment,
                                                const std::string& reason) {
  return podsHook(ns, deployment, "pull", 0, 0, reason);
}

absl::Status FakeKubeApi::podsHook(const std::string& ns, const std::string& deployment,
                                   const std::string& mode, int restarts, int exit_code,
                                   const std::string& reason) {
  const ResourceType deployments = *kube::resourceFor("apps/v1", "Deployment");
  const ResourceType replicasets = *kube::resourceFor("apps/v1", "ReplicaSet");
  const ResourceType pods = *kube::resourceFor("v1", "Pod");
  std::lock_guard lock(mutex_);
  const std::string dkey = objectKey(deployments, ns, deployment);
  auto found = objects_.find(dkey);
  if (found == objects_.end()) {
    return absl::NotFoundError(strCat("deployment ", ns, "/", deployment, " not found"));
  }
  Json deploy = found->second;
  const Json spec = deploy.value("spec", Json::object());
  const int64_t replicas = spec.value("replicas", int64_t{1});
  const Json tmpl = spec.value("template", Json::object());
  const std::string hash = hashHex(tmpl.dump());
  const std::string rs_name = strCat(deployment, "-", hash);
  const std::string now = nowRfc3339();

  // Replace the deployment's ReplicaSets (and so their pods) with one for the current template.
  const std::string deploy_uid = deploy["metadata"].value("uid", "");
  std::vector<std::string> old;
  for (const auto& [k, v] : objects_) {
    if (k.rfind(typeKey(replicasets) + "/" + ns + "/", 0) != 0) continue;
    for (const auto& ref : v["metadata"].value("ownerReferences", Json::array())) {
      if (ref.value("uid", "") == deploy_uid) old.push_back(k);
    }
  }
  for (const auto& k : old) erase(k, typeKey(replicasets), false);

  Json labels = tmpl.value("metadata", Json::object()).value("labels", Json::object());
  labels["pod-template-hash"] = hash;
  Json match = spec.value("selector", Json::object()).value("matchLabels", Json::object());
  match["pod-template-hash"] = hash;
  const bool ready = mode == "ready";
  Json rs_status = {{"replicas", replicas}, {"observedGeneration", 1}};
  if (ready && replicas > 0) {
    rs_status["readyReplicas"] = replicas;
    rs_status["availableReplicas"] = replicas;
  }
  Json rs = {{"apiVersion", "apps/v1"},
             {"kind", "ReplicaSet"},
             {"metadata",
              {{"name", rs_name},
               {"namespace", ns},
               {"labels", labels},
               {"ownerReferences", Json::array({{{"apiVersion", "apps/v1"},
                                                 {"kind", "Deployment"},
                                                 {"name", deployment},
                                                 {"uid", deploy_uid},
                                                 {"controller", true},
                                                 {"blockOwnerDeletion", true}}})}}},
             {"spec",
              {{"replicas", replicas}, {"selector", {{"matchLabels", match}}}, {"template", tmpl}}},
             {"status", rs_status}};
  Json rs_stored = store(objectKey(replicasets, ns, rs_name), rs, typeKey(replicasets), ns, true);

  Json pod_spec = tmpl.value("spec", Json::object());
  pod_spec["nodeName"] = "fake-node-1";
  for (int64_t i = 0; i < replicas; ++i) {
    const std::string pod_name = strCat(rs_name, "-", hashHex(strCat(rs_name, i)).substr(0, 5));
    Json container_statuses = Json::array();
    for (const auto& c : pod_spec.value("containers", Json::array())) {
      Json cs = {{"name", c.value("name", "")},
                 {"image", c.value("image", "")},
                 {"imageID", ""},
                 {"ready", ready},
                 {"started", ready},
                 {"restartCount", mode == "crashloop" ? restarts : 0}};
      if (ready) {
        cs["state"] = {{"running", {{"startedAt", now}}}};
        cs["imageID"] = strCat(c.value("image", ""), "@sha256:", hashHex(c.value("image", "")));
      } else if (mode == "crashloop") {
        cs["state"] = {{"waiting",
                        {{"reason", reason},
                         {"message", strCat("back-off 5m0s restarting failed container=",
                                            c.value("name", ""), " pod=", pod_name)}}}};
        cs["lastState"] = {{"terminated",
                            {{"exitCode", exit_code},
                             {"reason", "Error"},
                             {"startedAt", now},
                             {"finishedAt", now}}}};
      } else {
        cs["state"] = {
            {"waiting",
             {{"reason", reason},
              {"message", strCat("Back-off pulling image \"", c.value("image", ""), "\"")}}}};
      }
      container_statuses.push_back(cs);
    }
    const std::string ready_text = ready ? "True" : "False";
    Json status = {
        {"phase", mode == "pull" ? "Pending" : "Running"},
        {"hostIP", "10.0.0.1"},
        {"startTime", now},
        {"conditions", Json::array({{{"type", "Initialized"}, {"status", "True"}},
                                    {{"type", "Ready"}, {"status", ready_text}},
                                    {{"type", "ContainersReady"}, {"status", ready_text}},
                                    {{"type", "PodScheduled"}, {"status", "True"}}})},
        {"containerStatuses", container_statuses}};
    if (mode != "pull") {
      ++ip_counter_;
      const std::string ip = strCat("10.244.", ip_counter_ / 250, ".", ip_counter_ % 250 + 1);
      status["podIP"] = ip;
      status["podIPs"] = Json::array({{{"ip", ip}}});
    }
    if (!ready) {
      status["conditions"][1]["reason"] = "ContainersNotReady";
      status["conditions"][2]["reason"] = "ContainersNotReady";
    }
    Json pod = {{"apiVersion", "v1"},
                {"kind", "Pod"},
                {"metadata",
                 {{"name", pod_name},
                  {"namespace", ns},
                  {"labels", labels},
                  {"ownerReferences", Json::array({{{"apiVersion", "apps/v1"},
                                                    {"kind", "ReplicaSet"},
                                                    {"name", rs_name},
                                                    {"uid", rs_stored["metadata"]["uid"]},
                                                    {"controller", true},
                                                    {"blockOwnerDeletion", true}}})}}},
                {"spec", pod_spec},
                {"status", status}};
    store(objectKey(pods, ns, pod_name), pod, typeKey(pods), ns, true);
  }

  // The Deployment's status, with zero counts omitted as the API server does.
  Json status = {{"observedGeneration", deploy["metadata"].value("generation", int64_t{1})}};
  if (replicas > 0) {
    status["replicas"] = replicas;
    status["updatedReplicas"] = replicas;
    if (ready) {
      status["readyReplicas"] = replicas;
      status["availableReplicas"] = replicas;
    } else {
      status["unavailableReplicas"] = replicas;
    }
  }
  status["conditions"] =
      Json::array({{{"type", "Available"},
                    {"status", ready || replicas == 0 ? "True" : "False"},
                    {"reason", ready || replicas == 0 ? "MinimumReplicasAvailable"
                                                      : "MinimumReplicasUnavailable"},
                    {"lastUpdateTime", now}},
                   {{"type", "Progressing"},
                    {"status", "True"},
                    {"reason", ready ? "NewReplicaSetAvailable" : "ReplicaSetUpdated"},
                    {"lastUpdateTime", now}}});
  deploy["status"] = status;
  store(dkey, deploy, typeKey(deployments), ns, false);
  return absl::OkStatus();
}

}  // namespace krane::testing
