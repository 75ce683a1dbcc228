#include "plugins/runtime/kubernetes/objects.h"

#include "common/strings.h"

namespace krane::kube {

ObjectRef refOf(const Json& object) {
  const Json& m = object.value("metadata", Json::object());
  return {object.value("apiVersion", ""), object.value("kind", ""), m.value("namespace", ""),
          m.value("name", "")};
}

std::string labelOf(const Json& object, const std::string& key) {
  const Json& labels = object.value("metadata", Json::object()).value("labels", Json::object());
  auto it = labels.find(key);
  return it != labels.end() && it->is_string() ? it->get<std::string>() : "";
}

void setAppliedVersion(Json& object, uint64_t version) {
  object["metadata"]["annotations"][kAppliedVersionAnnotation] = std::to_string(version);
}

uint64_t appliedVersionOf(const Json& object) {
  const Json& annotations =
      object.value("metadata", Json::object()).value("annotations", Json::object());
  auto it = annotations.find(kAppliedVersionAnnotation);
  if (it == annotations.end() || !it->is_string()) return 0;
  return parseUint64(it->get_ref<const std::string&>()).value_or(0);
}

absl::Status removeIfPresent(Client& client, const ObjectRef& ref) {
  absl::Status st = client.remove(ref, Propagation::kBackground);
  if (st.ok() || absl::IsNotFound(st)) return absl::OkStatus();
  return st;
}

absl::StatusOr<std::vector<Json>> listMatching(Client& client, const std::string& api_version,
                                               const std::string& kind, const std::string& ns,
                                               const std::string& label_selector) {
  ListRequest request;
  request.api_version = api_version;
  request.kind = kind;
  request.ns = ns;
  request.label_selector = label_selector;
  request.limit = 500;
  auto page = client.listAll(request);
  if (!page.ok()) return page.status();
  return std::move(page->items);
}

}  // namespace krane::kube
