// The process runtime's policy store: <state_dir>/<dnsLabel(id)>.json holding
// {"id", "version", "object"}. Written to a temporary file and renamed, so a file is always whole.
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "common/files.h"
#include "common/strings.h"
#include "plugins/cilium/policy.h"
#include "plugins/cilium/store.h"

namespace krane::cilium {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class ProcessStore final : public PolicyStore {
 public:
  explicit ProcessStore(fs::path dir) : dir_(std::move(dir)) {}

  absl::StatusOr<std::string> apply(const std::string& id, const json& object,
                                    uint64_t version) override {
    const fs::path path = fileFor(id);
    const fs::path tmp = strCat(path.string(), ".tmp.", ::getpid());
    {
      std::ofstream out(tmp, std::ios::trunc);
      out << json{{"id", id}, {"version", version}, {"object", object}}.dump(2) << "\n";
      out.close();
      if (!out) return absl::UnavailableError(strCat("cannot write ", tmp.string()));
    }
    std::error_code ec;
    fs::rename(tmp, path, ec);
    if (ec) {
      return absl::UnavailableError(
          strCat("cannot rename ", tmp.string(), " to ", path.string(), ": ", ec.message()));
    }
    return strCat("recorded in ", path.string(), "; not enforced on the process runtime");
  }

  absl::StatusOr<std::vector<HeldPolicy>> list(const std::string& id) override {
    std::vector<HeldPolicy> out;
    std::error_code ec;
    for (auto it = fs::directory_iterator(dir_, ec); !ec && it != fs::directory_iterator();
         it.increment(ec)) {
      if (it->path().extension() != ".json") continue;
      auto text = readFile(it->path().string(), "policy record");
      if (!text.ok()) continue;  // removed meanwhile
      const json record = json::parse(*text, nullptr, false);
      HeldPolicy held;
      held.name = it->path().filename().string();
      if (record.is_object() && record.contains("id") && record["id"].is_string()) {
        held.id = record["id"].get<std::string>();
      }
      if (!id.empty() && held.id != id) continue;
      out.push_back(std::move(held));
    }
    if (ec) {
      return absl::UnavailableError(strCat("cannot list ", dir_.string(), ": ", ec.message()));
    }
    return out;
  }

  absl::Status erase(const HeldPolicy& held) override {
    std::error_code ec;
    fs::remove(dir_ / held.name, ec);
    if (ec) {
      return absl::UnavailableError(
          strCat("cannot remove ", (dir_ / held.name).string(), ": ", ec.message()));
    }
    return absl::OkStatus();
  }

 private:
  fs::path fileFor(const std::string& id) const { return dir_ / strCat(dnsLabel("", id), ".json"); }

  const fs::path dir_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<PolicyStore>> makeProcessStore(const std::string& state_dir) {
  std::error_code ec;
  fs::create_directories(state_dir, ec);
  if (ec || !fs::is_directory(state_dir)) {
    return absl::InvalidArgumentError(
        strCat("process.state_dir: cannot create ", state_dir, ": ", ec.message()));
  }
  return std::unique_ptr<PolicyStore>(new ProcessStore(state_dir));
}

}  // namespace krane::cilium
