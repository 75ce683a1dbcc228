// Every field of DeploymentTopology reaches the process runtime's workload and the Kubernetes
// objects, or is listed in kNotOnProcessRuntime / kNotOnKubernetes with its reason. A field added
// to the proto and forgotten on either runtime fails here, by name (the original lost the command
// override five times).
#include <catch2/catch.hpp>
#include <google/protobuf/descriptor.h>
#include <google/protobuf/reflection.h>

#include "common/strings.h"
#include "plugins/deployment/kube_objects.h"
#include "plugins/deployment/workload.h"
#include "tests/support/matchers.h"

namespace krane::deployment {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

// A base topology every field is varied against.
cluster::v1::DeploymentTopology base() {
  cluster::v1::DeploymentTopology t;
  t.set_workspace_id("ws1");
  t.set_image("krane.dev/demo-app:v1");
  t.set_replicas(2);
  t.set_port(8080);
  return t;
}

// Sets `field` of `m` to a value unlike its default (recursing into messages).
void setDistinct(Message& m, const FieldDescriptor* field) {
  const auto* r = m.GetReflection();
  const std::string text = strCat("x-", field->name());
  if (field->is_map()) {
    Message* entry = r->AddMessage(&m, field);
    const auto* d = entry->GetDescriptor();
    entry->GetReflection()->SetString(entry, d->FindFieldByName("key"), text);
    entry->GetReflection()->SetString(entry, d->FindFieldByName("value"), text);
    return;
  }
  if (field->is_repeated()) {
    switch (field->cpp_type()) {
      case FieldDescriptor::CPPTYPE_STRING:
        r->AddString(&m, field, text);
        return;
      case FieldDescriptor::CPPTYPE_MESSAGE: {
        Message* item = r->AddMessage(&m, field);
        const auto* d = item->GetDescriptor();
        for (int i = 0; i < d->field_count(); ++i) setDistinct(*item, d->field(i));
        return;
      }
      default:
        FAIL("repeated " << field->full_name() << ": teach this test its type");
    }
  }
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_STRING:
      // A shutdown signal must be a real one.
      r->SetString(&m, field, field->name() == "shutdown_signal" ? "SIGINT" : text);
      return;
    case FieldDescriptor::CPPTYPE_UINT32:
      // A progress deadline must be above min_ready_seconds (7).
      r->SetUInt32(&m, field, field->name() == "progress_deadline_seconds" ? 600 : 7);
      return;
    case FieldDescriptor::CPPTYPE_BOOL:
      r->SetBool(&m, field, true);
      return;
    case FieldDescriptor::CPPTYPE_ENUM:
      r->SetEnumValue(&m, field,
                      field->enum_type()->value(field->enum_type()->value_count() - 1)->number());
      return;
    case FieldDescriptor::CPPTYPE_MESSAGE: {
      Message* sub = r->MutableMessage(&m, field);
      const auto* d = sub->GetDescriptor();
      for (int i = 0; i < d->field_count(); ++i) setDistinct(*sub, d->field(i));
      return;
    }
    default:
      FAIL(field->full_name() << ": teach this test its type");
  }
}

std::string rendered(const cluster::v1::DeploymentTopology& t) {
  auto w = toWorkload(t, "d-1");
  CHECK_THAT(w, IsOk());
  return w.ok() ? runtime::toJson(*w) : "";
}

// Every object of the Kubernetes path; a refused topology renders as its error.
std::string renderedKube(const cluster::v1::DeploymentTopology& t) {
  auto objects = kubeObjects(t, "d-1");
  if (!objects.ok()) return strCat("error: ", objects.status().message());
  std::string out;
  for (const auto& o : *objects) strAppend(&out, o.dump(), "\n");
  return out;
}

using Exemptions = std::vector<std::pair<std::string, std::string>>;

bool exempt(const std::string& name, const Exemptions& list = kNotOnProcessRuntime) {
  for (const auto& [field, reason] : list) {
    if (field == name) return true;
  }
  return false;
}

TEST_CASE("every topology field reaches the workload or says why not", "[deployment-fields]") {
  const std::string baseline = rendered(base());
  const auto* d = cluster::v1::DeploymentTopology::descriptor();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* field = d->field(i);
    if (exempt(field->name())) continue;
    cluster::v1::DeploymentTopology t = base();
    t.GetReflection()->ClearField(&t, field);
    const std::string without = rendered(t);
    setDistinct(t, field);
    INFO("DeploymentTopology."
         << field->name()
         << " does not reach the process runtime's workload: carry it in toWorkload(), or list it "
            "in kNotOnProcessRuntime with the reason");
    CHECK(rendered(t) != without);
  }
}

TEST_CASE("every topology field reaches a kubernetes object or says why not",
          "[deployment-fields]") {
  REQUIRE_THAT(renderedKube(base()), !Catch::StartsWith("error"));
  const auto* d = cluster::v1::DeploymentTopology::descriptor();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* field = d->field(i);
    if (exempt(field->name(), kNotOnKubernetes)) continue;
    cluster::v1::DeploymentTopology t = base();
    t.GetReflection()->ClearField(&t, field);
    const std::string without = renderedKube(t);
    setDistinct(t, field);
    const std::string with = renderedKube(t);
    INFO("DeploymentTopology." << field->name() << " set to a valid value is refused: " << with);
    CHECK_THAT(with, !Catch::StartsWith("error"));
    INFO("DeploymentTopology."
         << field->name()
         << " does not reach any Kubernetes object: carry it in kubeObjects(), or list it in "
            "kNotOnKubernetes with the reason");
    CHECK(with != without);
  }
}

TEST_CASE("exemptions name real fields", "[deployment-fields]") {
  const auto* d = cluster::v1::DeploymentTopology::descriptor();
  for (const auto* list : {&kNotOnProcessRuntime, &kNotOnKubernetes}) {
    for (const auto& [field, reason] : *list) {
      INFO(field << " is not a field any more");
      CHECK(d->FindFieldByName(field) != nullptr);
      CHECK_FALSE(reason.empty());
    }
  }
}

TEST_CASE("kubernetes probes carry every field", "[deployment-fields]") {
  // Every field of a probe reaches the pod spec; a liveness probe's success threshold is the
  // one exception (Kubernetes requires 1 there).
  const auto* d = cluster::v1::HttpProbe::descriptor();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* field = d->field(i);
    for (bool liveness : {true, false}) {
      if (liveness && field->name() == "success_threshold") continue;
      cluster::v1::DeploymentTopology t = base();
      auto* probe = liveness ? t.mutable_healthcheck()->mutable_liveness()
                             : t.mutable_healthcheck()->mutable_readiness();
      probe->set_path("/p");
      const std::string before = renderedKube(t);
      setDistinct(*probe, field);
      if (field->name() == "path") probe->set_path("/other");
      INFO((liveness ? "liveness." : "readiness.") << field->name());
      CHECK(renderedKube(t) != before);
    }
  }
}

TEST_CASE("probes carry every timing field", "[deployment-fields]") {
  // Each numeric field of a probe changes the workload (0 keeps the default).
  const auto* d = cluster::v1::HttpProbe::descriptor();
  const std::vector<std::string> not_carried = {"port", "success_threshold"};
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* field = d->field(i);
    if (std::find(not_carried.begin(), not_carried.end(), field->name()) != not_carried.end()) {
      continue;
    }
    for (bool liveness : {true, false}) {
      cluster::v1::DeploymentTopology t = base();
      auto* probe = liveness ? t.mutable_healthcheck()->mutable_liveness()
                             : t.mutable_healthcheck()->mutable_readiness();
      probe->set_path("/p");
      const std::string before = rendered(t);
      setDistinct(*probe, field);
      if (field->name() == "path") probe->set_path("/other");
      INFO((liveness ? "liveness." : "readiness.") << field->name());
      CHECK(rendered(t) != before);
    }
  }
}

TEST_CASE("the command override is kept", "[deployment-fields]") {
  auto t = base();
  t.add_command("/opt/app/server");
  t.add_command("--serve");
  t.add_args("--port=8080");
  auto w = toWorkload(t, "d-1");
  REQUIRE_THAT(w, IsOk());
  CHECK(w->command == std::vector<std::string>{"/opt/app/server", "--serve"});
  CHECK(w->args == std::vector<std::string>{"--port=8080"});
}

TEST_CASE("stopped means no instances and autoscaling clamps", "[deployment-fields]") {
  auto t = base();
  t.set_replicas(10);
  t.mutable_autoscaling()->set_min_replicas(1);
  t.mutable_autoscaling()->set_max_replicas(4);
  CHECK(toWorkload(t, "d")->replicas == 4);
  t.set_desired_status(cluster::v1::DESIRED_STATUS_STOPPED);
  CHECK(toWorkload(t, "d")->replicas == 0);
}

TEST_CASE("an unknown shutdown signal is refused by name", "[deployment-fields]") {
  auto t = base();
  t.set_shutdown_signal("SIGBOGUS");
  auto w = toWorkload(t, "d");
  CHECK(w.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(toStd(w.status().message())),
             Catch::Contains("shutdown_signal: \"SIGBOGUS\" is not one of"));
  t.set_shutdown_signal("INT");
  CHECK(toWorkload(t, "d")->shutdown_signal == SIGINT);
}

}  // namespace
}  // namespace krane::deployment
