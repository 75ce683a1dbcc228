#include "plugins/runtime/kubernetes/client.h"

#include <algorithm>
#include <thread>

#include <curl/curl.h>

#include "common/files.h"
#include "common/status.h"
#include "common/strings.h"
#include "plugins/runtime/kubernetes/errors.h"

namespace krane::kube {
namespace {

constexpr char kApplyContentType[] = "application/apply-patch+yaml";
constexpr char kMergePatchContentType[] = "application/merge-patch+json";
constexpr char kJsonContentType[] = "application/json";

void globalInit() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

std::string urlEncode(const std::string& s) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(hex[c >> 4]);
      out.push_back(hex[c & 15]);
    }
  }
  return out;
}

// "path?a=b&c=d", skipping empty values.
std::string withQuery(std::string path,
                      const std::vector<std::pair<std::string, std::string>>& params) {
  char sep = '?';
  for (const auto& [key, value] : params) {
    if (value.empty()) continue;
    strAppend(&path, sep, key, "=", urlEncode(value));
    sep = '&';
  }
  return path;
}

bool retriableTransport(CURLcode code) {
  switch (code) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
      return true;
    default:
      return false;
  }
}

struct Target {
  ResourceType type;
  std::string ns;
  std::string name;
};

std::string stringField(const Json& object, const char* key) {
  auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// The resource, namespace and name of an object given in wire form.
absl::StatusOr<Target> targetOf(const Json& object) {
  if (!object.is_object()) return absl::InvalidArgumentError("object: must be a JSON object");
  const std::string api_version = stringField(object, "apiVersion");
  const std::string kind = stringField(object, "kind");
  if (api_version.empty()) return absl::InvalidArgumentError("object: apiVersion missing");
  if (kind.empty()) return absl::InvalidArgumentError("object: kind missing");
  KRANE_ASSIGN_OR_RETURN(ResourceType type, resourceFor(api_version, kind));
  const auto meta = object.find("metadata");
  if (meta == object.end() || !meta->is_object()) {
    return absl::InvalidArgumentError(strCat(kind, ": metadata missing"));
  }
  Target target{type, stringField(*meta, "namespace"), stringField(*meta, "name")};
  if (target.name.empty()) {
    return absl::InvalidArgumentError(strCat(kind, ": metadata.name missing"));
  }
  if (type.namespaced && target.ns.empty()) {
    return absl::InvalidArgumentError(
        strCat(kind, " ", target.name, ": metadata.namespace missing (", kind, " is namespaced)"));
  }
  if (!type.namespaced) target.ns.clear();
  return target;
}

absl::StatusOr<Target> targetOf(const ObjectRef& ref) {
  KRANE_ASSIGN_OR_RETURN(ResourceType type, resourceFor(ref.api_version, ref.kind));
  if (ref.name.empty()) return absl::InvalidArgumentError(strCat(ref.kind, ": name missing"));
  if (type.namespaced && ref.ns.empty()) {
    return absl::InvalidArgumentError(strCat(ref.kind, " ", ref.name, ": namespace missing"));
  }
  return Target{type, type.namespaced ? ref.ns : "", ref.name};
}

const char* propagationName(Propagation p) {
  switch (p) {
    case Propagation::kForeground:
      return "Foreground";
    case Propagation::kOrphan:
      return "Orphan";
    case Propagation::kBackground:
      break;
  }
  return "Background";
}

}  // namespace

// One libcurl easy handle; reused so its connection stays open between requests.
class Client::Handle {
 public:
  Handle() : curl_(curl_easy_init()) {}
  ~Handle() {
    if (curl_) curl_easy_cleanup(curl_);
  }
  CURL* get() const { return curl_; }

 private:
  CURL* curl_;
};

namespace {

struct Transfer {
  std::string body;
  std::string retry_after;
};

size_t collectBody(char* data, size_t size, size_t count, void* user) {
  static_cast<Transfer*>(user)->body.append(data, size * count);
  return size * count;
}

size_t collectHeader(char* data, size_t size, size_t count, void* user) {
  std::string_view line(data, size * count);
  constexpr std::string_view kName = "retry-after:";
  if (line.size() > kName.size()) {
    std::string lower(line.substr(0, kName.size()));
    std::transform(lower.begin(), lower.end(), lower.begin(), ::tolower);
    if (lower == kName) {
      std::string value(line.substr(kName.size()));
      value.erase(0, value.find_first_not_of(" \t"));
      while (!value.empty() && (value.back() == '\r' || value.back() == '\n')) value.pop_back();
      static_cast<Transfer*>(user)->retry_after = value;
    }
  }
  return size * count;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Client>> Client::create(ClusterConfig config,
                                                       ClientOptions options) {
  globalInit();
  if (config.server.empty()) {
    return absl::InvalidArgumentError(strCat(config.source, ": no API server address"));
  }
  if (config.server.rfind("https://", 0) != 0 && config.server.rfind("http://", 0) != 0) {
    return absl::InvalidArgumentError(
        strCat(config.source, ": server \"", config.server, "\" must start with https://"));
  }
  while (config.server.back() == '/') config.server.pop_back();
  return std::unique_ptr<Client>(new Client(std::move(config), std::move(options)));
}

Client::Client(ClusterConfig config, ClientOptions options)
    : config_(std::move(config)),
      options_(std::move(options)),
      limiter_(options_.qps, options_.burst),
      token_(config_.bearer_token),
      token_read_(std::chrono::steady_clock::now()) {}

Client::~Client() = default;

ClientStats Client::stats() const { return {requests_.load(), retries_.load(), throttled_.load()}; }

std::string Client::currentToken() {
  std::lock_guard lock(mutex_);
  if (!config_.token_file.empty() &&
      std::chrono::steady_clock::now() - token_read_ >= options_.token_reread_interval) {
    token_read_ = std::chrono::steady_clock::now();
    if (auto token = readFile(config_.token_file, "token"); token.ok()) {
      std::string t = *token;
      while (!t.empty() && (t.back() == '\n' || t.back() == '\r')) t.pop_back();
      if (!t.empty()) token_ = t;
    }
  }
  return token_;
}

std::unique_ptr<Client::Handle> Client::takeHandle() {
  {
    std::lock_guard lock(mutex_);
    if (!idle_.empty()) {
      auto handle = std::move(idle_.back());
      idle_.pop_back();
      return handle;
    }
  }
  return std::make_unique<Handle>();
}

void Client::returnHandle(std::unique_ptr<Handle> handle) {
  std::lock_guard lock(mutex_);
  if (idle_.size() < 16) idle_.push_back(std::move(handle));
}

namespace {

// Options common to every request on `curl`; `headers` must outlive the transfer.
void prepare(CURL* curl, const ClusterConfig& config, const ClientOptions& options,
             const std::string& url, const std::string& method, const std::string& token,
             const std::string& content_type, curl_slist** headers, char* error_buffer) {
  curl_easy_reset(curl);
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error_buffer);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_USERAGENT, options.user_agent.c_str());
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(options.connect_timeout.count()));
  curl_easy_setopt(curl, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(curl, CURLOPT_TCP_NODELAY, 1L);
  if (method == "GET") {
    curl_easy_setopt(curl, CURLOPT_HTTPGET, 1L);
  } else {
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method.c_str());
  }
  *headers = curl_slist_append(*headers, "Accept: application/json");
  if (!token.empty()) {
    *headers = curl_slist_append(*headers, strCat("Authorization: Bearer ", token).c_str());
  }
  if (!content_type.empty()) {
    *headers = curl_slist_append(*headers, strCat("Content-Type: ", content_type).c_str());
  }
  *headers = curl_slist_append(*headers, "Expect:");
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, *headers);
  if (!config.ca_pem.empty()) {
    curl_blob blob{const_cast<char*>(config.ca_pem.data()), config.ca_pem.size(), CURL_BLOB_COPY};
    curl_easy_setopt(curl, CURLOPT_CAINFO_BLOB, &blob);
  }
  if (!config.client_cert_pem.empty()) {
    curl_blob cert{const_cast<char*>(config.client_cert_pem.data()), config.client_cert_pem.size(),
                   CURL_BLOB_COPY};
    curl_blob key{const_cast<char*>(config.client_key_pem.data()), config.client_key_pem.size(),
                  CURL_BLOB_COPY};
    curl_easy_setopt(curl, CURLOPT_SSLCERTTYPE, "PEM");
    curl_easy_setopt(curl, CURLOPT_SSLCERT_BLOB, &cert);
    curl_easy_setopt(curl, CURLOPT_SSLKEYTYPE, "PEM");
    curl_easy_setopt(curl, CURLOPT_SSLKEY_BLOB, &key);
  }
  if (config.insecure_skip_tls_verify) {
    curl_easy_setopt(curl, CURLOPT_SSL_VERIFYPEER, 0L);
    curl_easy_setopt(curl, CURLOPT_SSL_VERIFYHOST, 0L);
  }
}

}  // namespace

absl::StatusOr<Client::Response> Client::send(const std::string& method,
                                              const std::string& path_and_query,
                                              const std::string& content_type,
                                              const std::string& body) {
  const std::string url = config_.server + path_and_query;
  const std::string request = strCat(method, " ", path_and_query);
  Backoff backoff(options_.backoff);
  for (int attempt = 0;; ++attempt) {
    if (limiter_.acquire().count() > 0) ++throttled_;
    ++requests_;
    auto handle = takeHandle();
    if (!handle->get()) return absl::InternalError("curl_easy_init failed");
    CURL* curl = handle->get();
    curl_slist* headers = nullptr;
    char error_buffer[CURL_ERROR_SIZE] = {0};
    prepare(curl, config_, options_, url, method, currentToken(), content_type, &headers,
            error_buffer);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS,
                     static_cast<long>(options_.request_timeout.count() * 1000));
    if (method != "GET" && method != "DELETE") {
      curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.data());
      curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
    }
    Transfer transfer;
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, collectBody);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &transfer);
    curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, collectHeader);
    curl_easy_setopt(curl, CURLOPT_HEADERDATA, &transfer);
    const CURLcode rc = curl_easy_perform(curl);
    long code = 0;
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &code);
    curl_slist_free_all(headers);
    returnHandle(std::move(handle));

    const std::string attempts =
        attempt > 0 ? strCat(" (gave up after ", attempt + 1, " attempts)") : "";
    std::chrono::milliseconds delay = backoff.next();
    if (rc != CURLE_OK) {
      const std::string detail = error_buffer[0] ? error_buffer : curl_easy_strerror(rc);
      if (!retriableTransport(rc) || attempt >= options_.max_retries) {
        return absl::UnavailableError(strCat(request, ": cannot reach the API server ",
                                             config_.server, ": ", detail, attempts));
      }
    } else if (code == 429 || code >= 500) {
      if (attempt >= options_.max_retries) {
        return apiError(code, transfer.body, strCat(request, attempts));
      }
      if (!transfer.retry_after.empty() &&
          std::all_of(transfer.retry_after.begin(), transfer.retry_after.end(), ::isdigit)) {
        delay = std::min<std::chrono::milliseconds>(
            std::chrono::seconds(std::stoll(transfer.retry_after)), options_.max_retry_after);
      }
    } else {
      return Response{code, std::move(transfer.body)};
    }
    ++retries_;
    std::this_thread::sleep_for(delay);
  }
}

absl::StatusOr<Json> Client::call(const std::string& method, const std::string& path_and_query,
                                  const std::string& content_type, const std::string& body) {
  KRANE_ASSIGN_OR_RETURN(Response response, send(method, path_and_query, content_type, body));
  if (response.code < 200 || response.code >= 300) {
    return apiError(response.code, response.body, strCat(method, " ", path_and_query));
  }
  auto parsed = Json::parse(response.body, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) {
    return absl::InternalError(
        strCat(method, " ", path_and_query,
               ": the API server answered with invalid JSON: ", response.body.substr(0, 200)));
  }
  return parsed;
}

absl::StatusOr<Json> Client::apply(const Json& object) {
  KRANE_ASSIGN_OR_RETURN(Target t, targetOf(object));
  return call("PATCH",
              withQuery(t.type.objectPath(t.ns, t.name),
                        {{"fieldManager", options_.field_manager}, {"force", "true"}}),
              kApplyContentType, object.dump());
}

absl::StatusOr<Json> Client::applyStatus(const Json& object) {
  KRANE_ASSIGN_OR_RETURN(Target t, targetOf(object));
  return call("PATCH",
              withQuery(t.type.objectPath(t.ns, t.name) + "/status",
                        {{"fieldManager", options_.field_manager}, {"force", "true"}}),
              kApplyContentType, object.dump());
}

absl::StatusOr<Json> Client::create(const Json& object) {
  KRANE_ASSIGN_OR_RETURN(Target t, targetOf(object));
  return call("POST",
              withQuery(t.type.collectionPath(t.ns), {{"fieldManager", options_.field_manager}}),
              kJsonContentType, object.dump());
}

absl::StatusOr<Json> Client::replace(const Json& object) {
  KRANE_ASSIGN_OR_RETURN(Target t, targetOf(object));
  return call(
      "PUT", withQuery(t.type.objectPath(t.ns, t.name), {{"fieldManager", options_.field_manager}}),
      kJsonContentType, object.dump());
}

absl::StatusOr<Json> Client::get(const ObjectRef& ref) {
  KRANE_ASSIGN_OR_RETURN(Target t, targetOf(ref));
  return call("GET", t.type.objectPath(t.ns, t.name), "", "");
}

absl::StatusOr<Json> Client::getStatus(const ObjectRef& ref) {
  KRANE_ASSIGN_OR_RETURN(Target t, targetOf(ref));
  return call("GET", t.type.objectPath(t.ns, t.name) + "/status", "", "");
}

absl::StatusOr<Json> Client::patchStatus(const ObjectRef& ref, const Json& merge_patch) {
  KRANE_ASSIGN_OR_RETURN(Target t, targetOf(ref));
  return call("PATCH", t.type.objectPath(t.ns, t.name) + "/status", kMergePatchContentType,
              merge_patch.dump());
}

absl::Status Client::remove(const ObjectRef& ref, Propagation propagation) {
  KRANE_ASSIGN_OR_RETURN(Target t, targetOf(ref));
  return call("DELETE",
              withQuery(t.type.objectPath(t.ns, t.name),
                        {{"propagationPolicy", propagationName(propagation)}}),
              "", "")
      .status();
}

absl::StatusOr<ListPage> Client::list(const ListRequest& request) {
  KRANE_ASSIGN_OR_RETURN(ResourceType type, resourceFor(request.api_version, request.kind));
  const std::string path =
      withQuery(type.collectionPath(type.namespaced ? request.ns : ""),
                {{"labelSelector", request.label_selector},
                 {"fieldSelector", request.field_selector},
                 {"limit", request.limit > 0 ? std::to_string(request.limit) : ""},
                 {"continue", request.continue_token}});
  KRANE_ASSIGN_OR_RETURN(Json answer, call("GET", path, "", ""));
  ListPage page;
  if (auto meta = answer.find("metadata"); meta != answer.end() && meta->is_object()) {
    page.resource_version = stringField(*meta, "resourceVersion");
    page.continue_token = stringField(*meta, "continue");
  }
  if (auto items = answer.find("items"); items != answer.end() && items->is_array()) {
    page.items.reserve(items->size());
    for (auto& item : *items) {
      // Items of a typed list omit their apiVersion and kind; callers get whole objects.
      if (!item.contains("apiVersion")) item["apiVersion"] = type.apiVersion();
      if (!item.contains("kind")) item["kind"] = type.kind;
      page.items.push_back(std::move(item));
    }
  }
  return page;
}

absl::StatusOr<ListPage> Client::listAll(ListRequest request) {
  ListPage all;
  for (;;) {
    KRANE_ASSIGN_OR_RETURN(ListPage page, list(request));
    for (auto& item : page.items) all.items.push_back(std::move(item));
    all.resource_version = page.resource_version;
    if (page.continue_token.empty()) return all;
    request.continue_token = page.continue_token;
  }
}

namespace {

struct WatchState {
  CURL* curl = nullptr;
  const std::function<bool(const WatchEvent&)>* on_event = nullptr;
  const std::atomic<bool>* cancel = nullptr;
  std::string request;
  std::string buffer;
  std::string error_body;
  long code = 0;
  bool stopped = false;
  absl::Status stream_error;
};

// One line of the stream; false to end the transfer.
bool handleLine(WatchState& state, const std::string& line) {
  if (line.empty()) return true;
  auto parsed = Json::parse(line, nullptr, false);
  if (!parsed.is_object()) {
    state.stream_error =
        absl::InternalError(strCat(state.request, ": invalid watch event: ", line.substr(0, 200)));
    return false;
  }
  WatchEvent event{stringField(parsed, "type"), std::move(parsed["object"])};
  if (event.type == "ERROR") {
    state.stream_error = watchError(event.object.dump(), state.request);
    return false;
  }
  if (!(*state.on_event)(event)) {
    state.stopped = true;
    return false;
  }
  return true;
}

size_t watchWrite(char* data, size_t size, size_t count, void* user) {
  auto& state = *static_cast<WatchState*>(user);
  const size_t n = size * count;
  if (state.code == 0) curl_easy_getinfo(state.curl, CURLINFO_RESPONSE_CODE, &state.code);
  if (state.code != 200) {
    if (state.error_body.size() < 65536) state.error_body.append(data, n);
    return n;
  }
  state.buffer.append(data, n);
  size_t start = 0;
  for (size_t nl; (nl = state.buffer.find('\n', start)) != std::string::npos; start = nl + 1) {
    if (!handleLine(state, state.buffer.substr(start, nl - start))) return 0;
  }
  state.buffer.erase(0, start);
  return n;
}

int watchProgress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  const auto& state = *static_cast<WatchState*>(user);
  return state.cancel && state.cancel->load() ? 1 : 0;
}

}  // namespace

absl::Status Client::watch(const WatchRequest& request,
                           const std::function<bool(const WatchEvent&)>& on_event,
                           const std::atomic<bool>* cancel) {
  KRANE_ASSIGN_OR_RETURN(ResourceType type, resourceFor(request.api_version, request.kind));
  const std::string path =
      withQuery(type.collectionPath(type.namespaced ? request.ns : ""),
                {{"watch", "true"},
                 {"resourceVersion", request.resource_version},
                 {"labelSelector", request.label_selector},
                 {"fieldSelector", request.field_selector},
                 {"allowWatchBookmarks", "true"},
                 {"timeoutSeconds",
                  request.timeout_seconds > 0 ? std::to_string(request.timeout_seconds) : ""}});
  if (limiter_.acquire().count() > 0) ++throttled_;
  ++requests_;
  Handle handle;
  if (!handle.get()) return absl::InternalError("curl_easy_init failed");
  curl_slist* headers = nullptr;
  char error_buffer[CURL_ERROR_SIZE] = {0};
  prepare(handle.get(), config_, options_, config_.server + path, "GET", currentToken(), "",
          &headers, error_buffer);
  WatchState state;
  state.curl = handle.get();
  state.on_event = &on_event;
  state.cancel = cancel;
  state.request = strCat("GET ", path);
  curl_easy_setopt(handle.get(), CURLOPT_WRITEFUNCTION, watchWrite);
  curl_easy_setopt(handle.get(), CURLOPT_WRITEDATA, &state);
  curl_easy_setopt(handle.get(), CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(handle.get(), CURLOPT_XFERINFOFUNCTION, watchProgress);
  curl_easy_setopt(handle.get(), CURLOPT_XFERINFODATA, &state);
  // The server ends the watch after timeout_seconds; a connection that went silent is given up
  // a little later.
  if (request.timeout_seconds > 0) {
    curl_easy_setopt(handle.get(), CURLOPT_TIMEOUT_MS,
                     static_cast<long>(request.timeout_seconds + 30) * 1000);
  }
  const CURLcode rc = curl_easy_perform(handle.get());
  curl_slist_free_all(headers);
  if (state.code == 0) curl_easy_getinfo(handle.get(), CURLINFO_RESPONSE_CODE, &state.code);
  if (!state.stream_error.ok()) return state.stream_error;
  if (state.code != 0 && state.code != 200) {
    return apiError(state.code, state.error_body, state.request);
  }
  if (rc == CURLE_OK || state.stopped || rc == CURLE_ABORTED_BY_CALLBACK) return absl::OkStatus();
  return absl::UnavailableError(strCat(state.request, ": watch interrupted: ",
                                       error_buffer[0] ? error_buffer : curl_easy_strerror(rc)));
}

}  // namespace krane::kube
