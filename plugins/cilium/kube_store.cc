#include "plugins/cilium/kube_store.h"

#include <map>
#include <mutex>
#include <utility>

#include "common/status.h"
#include "common/strings.h"
#include "plugins/cilium/policy.h"

namespace krane::cilium {
namespace {

using nlohmann::json;

// Failures the next delivery may fix (RBAC granted, Cilium installed, the server back) are
// retried; only the API server refusing the object itself is final.
absl::Status classify(const absl::Status& st, std::string_view context) {
  if (st.ok()) return st;
  const std::string message = strCat(context, st.message());
  if (st.code() == absl::StatusCode::kInvalidArgument) return absl::InvalidArgumentError(message);
  return absl::UnavailableError(message);
}

std::string stringAt(const json& object, const char* a, const char* b) {
  if (!object.contains(a) || !object[a].is_object()) return "";
  const json& inner = object[a];
  if (!inner.contains(b) || !inner[b].is_string()) return "";
  return inner[b].get<std::string>();
}

class KubeStore final : public PolicyStore {
 public:
  explicit KubeStore(kube::Client& client) : client_(client) {}

  absl::StatusOr<std::string> apply(const std::string& id, const json& object,
                                    uint64_t version) override {
    const std::string ns = object["metadata"]["namespace"].get<std::string>();
    const std::string name = object["metadata"]["name"].get<std::string>();
    auto applied = client_.apply(object);
    if (!applied.ok() && applied.status().code() == absl::StatusCode::kNotFound) {
      KRANE_RETURN_IF_ERROR(ensureNamespace(ns));
      applied = client_.apply(object);
      if (!applied.ok() && applied.status().code() == absl::StatusCode::kNotFound) {
        return absl::UnavailableError(
            strCat("CiliumNetworkPolicy is not served by this cluster (is Cilium installed?): ",
                   applied.status().message()));
      }
    }
    if (!applied.ok()) return classify(applied.status(), "");

    // The same policy under an earlier name or namespace: remove that object.
    const std::pair<std::string, std::string> here{ns, name};
    bool known;
    {
      std::lock_guard lock(mutex_);
      auto it = known_.find(id);
      known = it != known_.end() && it->second == here;
    }
    if (!known) {
      KRANE_ASSIGN_OR_RETURN(auto held, list(id));
      for (const auto& h : held) {
        if (h.ns == ns && h.name == name) continue;
        KRANE_RETURN_IF_ERROR(erase(h));
      }
      std::lock_guard lock(mutex_);
      known_[id] = here;
    }
    return strCat("applied as ", ns, "/", name, " (resourceVersion ",
                  stringAt(*applied, "metadata", "resourceVersion"), ")");
  }

  absl::StatusOr<std::vector<HeldPolicy>> list(const std::string& id) override {
    kube::ListRequest request;
    request.api_version = kApiVersion;
    request.kind = kKind;
    request.label_selector = kManagedSelector;
    if (!id.empty() && isLabelValue(id)) {
      strAppend(&request.label_selector, ",", kPolicyIdKey, "=", id);
    }
    request.limit = 500;
    auto page = client_.listAll(request);
    if (!page.ok()) {
      if (page.status().code() == absl::StatusCode::kNotFound) return std::vector<HeldPolicy>{};
      return classify(page.status(), "listing CiliumNetworkPolicies: ");
    }
    std::vector<HeldPolicy> out;
    for (const auto& item : page->items) {
      HeldPolicy held{stringAt(item["metadata"], "annotations", kPolicyIdKey),
                      stringAt(item, "metadata", "namespace"), stringAt(item, "metadata", "name"),
                      stringAt(item["metadata"], "labels", kRegionLabel)};
      if (!id.empty() && held.id != id) continue;
      out.push_back(std::move(held));
    }
    return out;
  }

  absl::Status erase(const HeldPolicy& held) override {
    const auto st = client_.remove({kApiVersion, kKind, held.ns, held.name});
    if (!st.ok() && st.code() != absl::StatusCode::kNotFound) {
      return classify(st, strCat("deleting CiliumNetworkPolicy ", held.ns, "/", held.name, ": "));
    }
    std::lock_guard lock(mutex_);
    auto it = known_.find(held.id);
    if (it != known_.end() && it->second == std::make_pair(held.ns, held.name)) known_.erase(it);
    return absl::OkStatus();
  }

 private:
  // Namespaces normally come from the deployment plugin; a policy may arrive first.
  absl::Status ensureNamespace(const std::string& ns) {
    auto existing = client_.get({"v1", "Namespace", "", ns});
    if (existing.ok()) return absl::OkStatus();
    if (existing.status().code() != absl::StatusCode::kNotFound) {
      return classify(existing.status(), "");
    }
    const json object = {{"apiVersion", "v1"},
                         {"kind", "Namespace"},
                         {"metadata", {{"name", ns}, {"labels", {{kManagedByLabel, "krane"}}}}}};
    auto created = client_.create(object);
    if (!created.ok() && created.status().code() != absl::StatusCode::kAlreadyExists) {
      return classify(created.status(), strCat("creating namespace ", ns, ": "));
    }
    return absl::OkStatus();
  }

  kube::Client& client_;
  std::mutex mutex_;
  // Where each policy was last applied, so a rename is noticed without a list per apply.
  std::map<std::string, std::pair<std::string, std::string>> known_;
};

}  // namespace

std::unique_ptr<PolicyStore> makeKubeStore(kube::Client& client) {
  return std::make_unique<KubeStore>(client);
}

}  // namespace krane::cilium
