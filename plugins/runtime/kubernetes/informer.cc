#include "plugins/runtime/kubernetes/informer.h"

#include "common/strings.h"
#include "plugins/runtime/kubernetes/errors.h"

namespace krane::kube {
namespace {

std::string keyOf(const Json& object) {
  const Json& m = object.value("metadata", Json::object());
  return strCat(m.value("namespace", ""), "/", m.value("name", ""));
}

std::string versionOf(const Json& object) {
  return object.value("metadata", Json::object()).value("resourceVersion", "");
}

}  // namespace

Informer::Informer(Client& client, InformerOptions options, Handler handler)
    : client_(client), options_(std::move(options)), handler_(std::move(handler)) {}

Informer::~Informer() { stop(); }

void Informer::start() {
  thread_ = std::thread([this] { run(); });
}

void Informer::stop() {
  stop_ = true;
  {
    std::lock_guard lock(mutex_);
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

bool Informer::waitSynced(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  return cv_.wait_for(lock, timeout, [this] { return synced_; });
}

std::vector<Json> Informer::snapshot() const {
  std::lock_guard lock(mutex_);
  std::vector<Json> out;
  out.reserve(objects_.size());
  for (const auto& [key, object] : objects_) out.push_back(object);
  return out;
}

void Informer::deliver(const Json& object, bool deleted) {
  {
    std::lock_guard lock(mutex_);
    if (deleted) {
      objects_.erase(keyOf(object));
    } else {
      objects_[keyOf(object)] = object;
    }
  }
  handler_(object, deleted);
}

absl::StatusOr<std::string> Informer::relist() {
  ListRequest request;
  request.api_version = options_.api_version;
  request.kind = options_.kind;
  request.ns = options_.ns;
  request.label_selector = options_.label_selector;
  request.field_selector = options_.field_selector;
  request.limit = 500;
  auto page = client_.listAll(request);
  if (!page.ok()) return page.status();
  ++lists_;
  std::map<std::string, const Json*> listed;
  for (const auto& item : page->items) listed[keyOf(item)] = &item;
  std::vector<Json> gone;
  std::vector<const Json*> changed;
  {
    std::lock_guard lock(mutex_);
    for (const auto& [key, object] : objects_) {
      if (listed.count(key) == 0) gone.push_back(object);
    }
    for (const auto& [key, item] : listed) {
      auto it = objects_.find(key);
      if (it == objects_.end() || versionOf(it->second) != versionOf(*item)) {
        changed.push_back(item);
      }
    }
  }
  for (const auto& object : gone) deliver(object, true);
  for (const Json* item : changed) deliver(*item, false);
  {
    std::lock_guard lock(mutex_);
    synced_ = true;
    cv_.notify_all();
  }
  return page->resource_version;
}

void Informer::run() {
  Backoff backoff(options_.retry);
  std::string version;  // empty: list first
  const auto failed = [&](const absl::Status& st) {
    if (options_.on_error) options_.on_error(st);
    std::unique_lock lock(mutex_);
    cv_.wait_for(lock, backoff.next(), [this] { return stop_.load(); });
  };
  while (!stop_) {
    if (version.empty()) {
      auto listed = relist();
      if (!listed.ok()) {
        failed(listed.status());
        continue;
      }
      version = *listed;
    }
    WatchRequest request;
    request.api_version = options_.api_version;
    request.kind = options_.kind;
    request.ns = options_.ns;
    request.label_selector = options_.label_selector;
    request.field_selector = options_.field_selector;
    request.resource_version = version;
    request.timeout_seconds = options_.watch_timeout_seconds;
    const absl::Status st = client_.watch(
        request,
        [&](const WatchEvent& event) {
          const std::string v = versionOf(event.object);
          if (!v.empty()) version = v;
          if (event.type == "ADDED" || event.type == "MODIFIED") {
            deliver(event.object, false);
          } else if (event.type == "DELETED") {
            deliver(event.object, true);
          }
          backoff.reset();
          return !stop_.load();
        },
        &stop_);
    if (stop_) break;
    if (st.ok()) continue;  // the server ended the watch: resume from `version`
    version.clear();        // list again
    if (!isGone(st)) failed(st);
  }
}

}  // namespace krane::kube
