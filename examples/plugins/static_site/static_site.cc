// Example plugin "static-site": owns the resource type `example.krane.dev/static-site` and
// writes each resource's files into a directory of its own, `<root>/<resource id>/`.
//
// A resource's spec is JSON:
//
//   {"files": {"index.html": "<h1>Hello</h1>", "css/site.css": "h1 { color: teal }"}}
//
// Configuration (the `config:` mapping of the plugin's entry in the agent's YAML, which the agent
// hands over as JSON):
//
//   root:      required, absolute: the directory the sites are written to (created if missing)
//   max_files: files per site, 1..10000, default 100
//
// What it shows (docs/plugin-guide.md walks through it):
//  - apply is idempotent and replaces a site atomically (a reader never sees half a site);
//  - a spec that can never work is INVALID_ARGUMENT naming the field, so the agent parks it and
//    reports it, while a disk error is UNAVAILABLE and retried;
//  - every site carries a marker file, so garbage collection after a full sync deletes exactly
//    the sites this plugin made and nothing else in `root`;
//  - status is reported after each apply and delete, and observe() rebuilds it from disk alone,
//    so a restarted plugin host needs nothing in memory.
#include <fcntl.h>
#include <stdio.h>  // renameat2

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/strings.h"
#include "nlohmann/json.hpp"
#include "plugins/sdk/plugin.h"

namespace krane::examples {
namespace {

namespace fs = std::filesystem;
using cluster::v1::Change;
using nlohmann::json;

constexpr char kPluginName[] = "static-site";
constexpr char kType[] = "example.krane.dev/static-site";
// Written into every site directory: marks it as ours and records what it holds.
constexpr char kMarker[] = ".krane-static-site.json";

struct Config {
  fs::path root;
  size_t max_files = 100;
};

// relative path -> content
using Files = std::map<std::string, std::string>;

// INVALID_ARGUMENT naming `<path>.<key>` for the first key of `object` that is not in `known`.
absl::Status onlyKnownKeys(const json& object, const std::string& path,
                           std::initializer_list<std::string_view> known) {
  for (const auto& [key, value] : object.items()) {
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      std::string expected;
      for (std::string_view k : known) expected += strCat(expected.empty() ? "" : ", ", k);
      return absl::InvalidArgumentError(
          strCat(path, ".", key, ": unknown key (expected: ", expected, ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Config> parseConfig(std::string_view text) {
  const json doc = json::parse(text.empty() ? std::string_view("{}") : text, nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) {
    return absl::InvalidArgumentError("config: must be a JSON object");
  }
  if (auto st = onlyKnownKeys(doc, "config", {"root", "max_files"}); !st.ok()) return st;
  Config config;
  if (!doc.contains("root") || !doc["root"].is_string() ||
      !fs::path(doc["root"].get<std::string>()).is_absolute()) {
    return absl::InvalidArgumentError("config.root: required, an absolute directory path");
  }
  config.root = doc["root"].get<std::string>();
  if (doc.contains("max_files")) {
    const json& v = doc["max_files"];
    if (!v.is_number_unsigned() || v.get<uint64_t>() < 1 || v.get<uint64_t>() > 10000) {
      return absl::InvalidArgumentError(
          strCat("config.max_files: must be a whole number between 1 and 10000, got ", v.dump()));
    }
    config.max_files = v.get<size_t>();
  }
  return config;
}

// The resource id becomes a directory name: refuse what would escape `root` or collide with
// the plugin's own dot-directories. (The control plane already limits ids to letters, digits
// and `.`, `_`, `-`, `:`; a plugin still checks what it turns into a path.)
absl::Status checkSiteId(const std::string& id) {
  if (id.empty() || id[0] == '.' || id.find('/') != std::string::npos) {
    return absl::InvalidArgumentError(strCat(
        "resource id \"", id, "\": a site id may not be empty, contain '/' or start with '.'"));
  }
  return absl::OkStatus();
}

// A file name of the spec: a relative path inside the site.
absl::Status checkFileName(const std::string& name, const std::string& field) {
  if (name.empty() || name.size() > 1024 || name[0] == '/') {
    return absl::InvalidArgumentError(strCat(field, ": must be a relative path"));
  }
  if (name == kMarker) {
    return absl::InvalidArgumentError(strCat(field, ": the name is reserved by the plugin"));
  }
  std::istringstream parts(name);
  std::string part;
  while (std::getline(parts, part, '/')) {
    if (part.empty() || part == "." || part == ".." || part.find('\0') != std::string::npos) {
      return absl::InvalidArgumentError(
          strCat(field, ": empty, '.' and '..' path components are not allowed"));
    }
  }
  if (name.back() == '/') return absl::InvalidArgumentError(strCat(field, ": names a directory"));
  return absl::OkStatus();
}

absl::StatusOr<Files> parseSpec(const cluster::v1::GenericResource& resource, size_t max_files) {
  const std::string& content_type = resource.content_type();
  if (!content_type.empty() && content_type.rfind("application/json", 0) != 0) {
    return absl::InvalidArgumentError(
        strCat("content_type: \"", content_type, "\" is not supported; use application/json"));
  }
  const json doc = json::parse(resource.spec(), nullptr, false);
  if (doc.is_discarded()) return absl::InvalidArgumentError("spec: not valid JSON");
  if (!doc.is_object()) return absl::InvalidArgumentError("spec: must be a JSON object");
  if (auto st = onlyKnownKeys(doc, "spec", {"files"}); !st.ok()) return st;
  if (!doc.contains("files") || !doc["files"].is_object()) {
    return absl::InvalidArgumentError(
        "spec.files: required, an object of file name -> content, e.g. {\"index.html\": \"...\"}");
  }
  const json& files = doc["files"];
  if (files.size() > max_files) {
    return absl::InvalidArgumentError(
        strCat("spec.files: at most ", max_files, " files, got ", files.size()));
  }
  Files out;
  for (const auto& [name, content] : files.items()) {
    const std::string field = strCat("spec.files[\"", name, "\"]");
    if (auto st = checkFileName(name, field); !st.ok()) return st;
    if (!content.is_string()) {
      return absl::InvalidArgumentError(strCat(field, ": must be a string, got ", content.dump()));
    }
    out[name] = content.get<std::string>();
  }
  return out;
}

absl::Status ioError(std::string_view what, const fs::path& path, const std::error_code& ec) {
  // The disk, not the spec: may work later, so the agent retries.
  return absl::UnavailableError(strCat("cannot ", what, " ", path.string(), ": ", ec.message()));
}

absl::Status writeFile(const fs::path& path, const std::string& content) {
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  if (ec) return ioError("create", path.parent_path(), ec);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(content.data(), static_cast<std::streamsize>(content.size()));
  out.close();
  if (!out) return ioError("write", path, std::make_error_code(std::errc::io_error));
  return absl::OkStatus();
}

class StaticSitePlugin final : public sdk::Plugin {
 public:
  absl::Status init(sdk::Host& host, std::string_view config_text) override {
    auto config = parseConfig(config_text);
    if (!config.ok()) return config.status();
    config_ = *std::move(config);
    std::error_code ec;
    fs::create_directories(config_.root / ".staging", ec);
    if (ec) return ioError("create", config_.root / ".staging", ec);
    host_ = &host;
    host.log(sdk::LogLevel::kInfo, strCat("static-site: writing sites to ", config_.root.string()));
    return absl::OkStatus();
  }

  std::vector<std::string> resourceTypes() override { return {kType}; }

  // Called for different sites in parallel, never twice at once for one site: nothing here
  // needs a lock. The same change may arrive twice (after a host restart); writing the same
  // files again is harmless.
  absl::Status apply(const Change& change) override {
    const auto& r = change.resource();
    if (auto st = checkSiteId(r.id()); !st.ok()) return st;
    if (!r.has_generic()) return absl::InvalidArgumentError("the change carries no generic spec");
    auto files = parseSpec(r.generic(), config_.max_files);
    if (!files.ok()) return files.status();

    // Write the new site next to the live one, then swap them.
    const fs::path staging = config_.root / ".staging" / r.id();
    const fs::path live = config_.root / r.id();
    std::error_code ec;
    fs::remove_all(staging, ec);  // what an interrupted apply left behind
    size_t bytes = 0;
    for (const auto& [name, content] : *files) {
      if (auto st = writeFile(staging / name, content); !st.ok()) return st;
      bytes += content.size();
    }
    json marker = {{"region", r.region()},
                   {"version", krane::sdk::resourceVersion(change)},
                   {"files", json::array()}};
    for (const auto& [name, content] : *files) marker["files"].push_back(name);
    if (auto st = writeFile(staging / kMarker, marker.dump()); !st.ok()) return st;
    if (auto st = swapIn(staging, live); !st.ok()) return st;

    report(r.id(), r.region(), krane::sdk::resourceVersion(change),
           cluster::v1::RESOURCE_PHASE_READY,
           strCat(files->size(), " files, ", bytes, " bytes in ", live.string()));
    return absl::OkStatus();
  }

  // Only type, id and region are set. Deleting a site that is not there is OK.
  absl::Status remove(const Change& change) override {
    const auto& r = change.resource();
    if (auto st = checkSiteId(r.id()); !st.ok()) return st;
    std::error_code ec;
    fs::remove_all(config_.root / r.id(), ec);
    if (ec) return ioError("remove", config_.root / r.id(), ec);
    report(r.id(), r.region(), krane::sdk::resourceVersion(change),
           cluster::v1::RESOURCE_PHASE_DELETED, "removed");
    return absl::OkStatus();
  }

  // After a full sync: delete every site of ours that the desired state no longer has. Sites
  // are recognised by their marker; anything else in `root` is left alone.
  absl::Status syncEnd(const plugin::v1::SyncEnd& sync_end) override {
    std::set<std::string> wanted;
    for (const auto& group : sync_end.resources()) {
      if (group.resource_type() == kType) wanted.insert(group.ids().begin(), group.ids().end());
    }
    for (const auto& [id, marker] : sites()) {
      if (wanted.count(id) > 0) continue;
      std::error_code ec;
      fs::remove_all(config_.root / id, ec);
      if (ec) return ioError("remove", config_.root / id, ec);
      host_->log(sdk::LogLevel::kInfo,
                 strCat("static-site: removed ", id, ", which the desired state no longer has"));
      report(id, marker.value("region", ""), sync_end.snapshot_version(),
             cluster::v1::RESOURCE_PHASE_DELETED, "removed by garbage collection");
    }
    return absl::OkStatus();
  }

  // The status of every site, from disk: READY when all its files are there, DEGRADED naming
  // the first missing one (someone deleted it behind Krane's back).
  absl::Status observe() override {
    for (const auto& [id, marker] : sites()) {
      std::string missing;
      for (const auto& name : marker.value("files", json::array())) {
        if (!fs::exists(config_.root / id / name.get<std::string>())) {
          missing = name.get<std::string>();
          break;
        }
      }
      const uint64_t version = marker.value("version", uint64_t{0});
      const std::string region = marker.value("region", "");
      if (missing.empty()) {
        report(id, region, version, cluster::v1::RESOURCE_PHASE_READY,
               strCat(marker["files"].size(), " files"));
      } else {
        report(id, region, version, cluster::v1::RESOURCE_PHASE_DEGRADED,
               strCat(missing, " is missing"));
      }
    }
    return absl::OkStatus();
  }

 private:
  // Replaces `live` with `staging` in one step where the file system allows it (Linux
  // renameat2 RENAME_EXCHANGE), then drops the old copy.
  absl::Status swapIn(const fs::path& staging, const fs::path& live) {
    std::error_code ec;
    if (!fs::exists(live)) {
      fs::rename(staging, live, ec);
      return ec ? ioError("rename into", live, ec) : absl::OkStatus();
    }
    if (::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, live.c_str(), RENAME_EXCHANGE) != 0) {
      // No atomic exchange here: move the old site out of the way first.
      fs::remove_all(live, ec);
      if (ec) return ioError("remove", live, ec);
      fs::rename(staging, live, ec);
      return ec ? ioError("rename into", live, ec) : absl::OkStatus();
    }
    fs::remove_all(staging, ec);  // now holds the previous site
    return absl::OkStatus();
  }

  // The sites under `root` that carry our marker, by id, with the marker's contents.
  std::map<std::string, json> sites() const {
    std::map<std::string, json> out;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(config_.root, ec)) {
      const std::string id = entry.path().filename().string();
      if (id[0] == '.' || !entry.is_directory()) continue;
      std::ifstream in(entry.path() / kMarker);
      if (!in) continue;  // not ours
      json marker = json::parse(in, nullptr, false);
      if (marker.is_object()) out[id] = std::move(marker);
    }
    return out;
  }

  void report(const std::string& id, const std::string& region, uint64_t version,
              cluster::v1::ResourcePhase phase, const std::string& message) {
    cluster::v1::ReportResourceStatusRequest status;
    status.set_type(kType);
    status.set_id(id);
    status.set_region(region);
    status.set_version(version);
    status.set_phase(phase);
    status.set_message(message);
    status.set_plugin(kPluginName);
    host_->reportResourceStatus(status);
  }

  sdk::Host* host_ = nullptr;
  Config config_;
};

}  // namespace
}  // namespace krane::examples

KRANE_DEFINE_PLUGIN(krane::examples::StaticSitePlugin, krane::examples::kPluginName, "1.0.0");
