// The ResourceTable implementations against a real MariaDB with the real schema: every proto
// field persisted, updates, soft deletes, locking, validation, scans, listings and purging.
#include "controlplane/feed/tables.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "common/status.h"
#include "common/strings.h"
#include "controlplane/db/migrate.h"
#include "controlplane/db/pool.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "google/protobuf/util/message_differencer.h"
#include "tests/support/mariadb.h"
#include "tests/support/matchers.h"

namespace krane::feed {

// Reaches the mutating methods, which only the writer may call otherwise.
class ResourceTableTestPeer {
 public:
  static absl::Status write(const ResourceTable& table, db::Connection& conn,
                            const Resource& resource, uint64_t version, int64_t now_ms) {
    return table.write(conn, resource, version, now_ms);
  }
  static absl::Status markDeleted(const ResourceTable& table, db::Connection& conn,
                                  const ResourceKey& key, uint64_t version, int64_t now_ms) {
    return table.markDeleted(conn, key, version, now_ms);
  }
};

namespace {

using Peer = ResourceTableTestPeer;

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::util::MessageDifferencer;

constexpr std::string_view kRegion = "eu-1";
constexpr std::string_view kOtherRegion = "us-1";
constexpr std::string_view kGenericType = "example.krane.dev/Bucket";

std::string messageOf(const absl::Status& status) { return std::string(toStd(status.message())); }

// Sets every field of a message, recursively, to a value different from its default: scalars
// to small distinct numbers, strings to "<field-name>-<n>" (which passes id, label and name
// checks), enums to their last value, repeated fields to two elements and maps to two entries.
// A field added to a proto later is filled without a change here.
class Filler {
 public:
  void fill(Message* m) {
    const auto* d = m->GetDescriptor();
    const auto* r = m->GetReflection();
    for (int i = 0; i < d->field_count(); ++i) {
      const FieldDescriptor* f = d->field(i);
      // Of a oneof, only the first member can be set.
      if (f->real_containing_oneof() != nullptr && f->index_in_oneof() != 0) continue;
      if (f->is_repeated()) {
        for (int k = 0; k < 2; ++k) addValue(m, r, f);
      } else {
        setValue(m, r, f);
      }
    }
  }

 private:
  std::string text(const FieldDescriptor* f) {
    std::string s(f->name());
    for (char& c : s) {
      if (c == '_') c = '-';
    }
    return strCat(s, "-", ++counter_);
  }
  std::string bytes() { return strCat(std::string("\0\xff\x01", 3), ++counter_); }
  int32_t number() { return 2 + (++counter_ % 40); }
  const google::protobuf::EnumValueDescriptor* enumValue(const FieldDescriptor* f) {
    const auto* e = f->enum_type();
    return e->value(e->value_count() - 1);
  }

  void setValue(Message* m, const google::protobuf::Reflection* r, const FieldDescriptor* f) {
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32:
        r->SetInt32(m, f, number());
        break;
      case FieldDescriptor::CPPTYPE_INT64:
        r->SetInt64(m, f, number());
        break;
      case FieldDescriptor::CPPTYPE_UINT32:
        r->SetUInt32(m, f, number());
        break;
      case FieldDescriptor::CPPTYPE_UINT64:
        r->SetUInt64(m, f, number());
        break;
      case FieldDescriptor::CPPTYPE_DOUBLE:
        r->SetDouble(m, f, number() + 0.5);
        break;
      case FieldDescriptor::CPPTYPE_FLOAT:
        r->SetFloat(m, f, static_cast<float>(number()) + 0.5f);
        break;
      case FieldDescriptor::CPPTYPE_BOOL:
        r->SetBool(m, f, true);
        break;
      case FieldDescriptor::CPPTYPE_ENUM:
        r->SetEnum(m, f, enumValue(f));
        break;
      case FieldDescriptor::CPPTYPE_STRING:
        r->SetString(m, f, f->type() == FieldDescriptor::TYPE_BYTES ? bytes() : text(f));
        break;
      case FieldDescriptor::CPPTYPE_MESSAGE:
        fill(r->MutableMessage(m, f));
        break;
    }
  }

  void addValue(Message* m, const google::protobuf::Reflection* r, const FieldDescriptor* f) {
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32:
        r->AddInt32(m, f, number());
        break;
      case FieldDescriptor::CPPTYPE_INT64:
        r->AddInt64(m, f, number());
        break;
      case FieldDescriptor::CPPTYPE_UINT32:
        r->AddUInt32(m, f, number());
        break;
      case FieldDescriptor::CPPTYPE_UINT64:
        r->AddUInt64(m, f, number());
        break;
      case FieldDescriptor::CPPTYPE_DOUBLE:
        r->AddDouble(m, f, number() + 0.5);
        break;
      case FieldDescriptor::CPPTYPE_FLOAT:
        r->AddFloat(m, f, static_cast<float>(number()) + 0.5f);
        break;
      case FieldDescriptor::CPPTYPE_BOOL:
        r->AddBool(m, f, true);
        break;
      case FieldDescriptor::CPPTYPE_ENUM:
        r->AddEnum(m, f, enumValue(f));
        break;
      case FieldDescriptor::CPPTYPE_STRING:
        r->AddString(m, f, f->type() == FieldDescriptor::TYPE_BYTES ? bytes() : text(f));
        break;
      // A map entry is a message with `key` and `value`: distinct keys come from the counter.
      case FieldDescriptor::CPPTYPE_MESSAGE:
        fill(r->AddMessage(m, f));
        break;
    }
  }

  int counter_ = 0;
};

// Names of the fields of `m` (recursively) left at their default value.
void unsetFields(const Message& m, const std::string& prefix, std::vector<std::string>* out) {
  const auto* d = m.GetDescriptor();
  const auto* r = m.GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->real_containing_oneof() != nullptr && f->index_in_oneof() != 0) continue;
    const std::string path = strCat(prefix, f->name());
    if (f->is_repeated()) {
      if (r->FieldSize(m, f) < 2) out->push_back(path);
      if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE && !f->is_map()) {
        for (int k = 0; k < r->FieldSize(m, f); ++k) {
          unsetFields(r->GetRepeatedMessage(m, f, k), strCat(path, "[", k, "]."), out);
        }
      }
    } else if (!r->HasField(m, f)) {
      out->push_back(path);
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      unsetFields(r->GetMessage(m, f), strCat(path, "."), out);
    }
  }
}

using Mutation = std::function<void(Resource&)>;

// How one table is exercised: its resources and what is valid for them.
struct TableCase {
  std::string name;
  std::function<std::unique_ptr<ResourceTable>()> make;
  std::string type;
  // lock() finds the id in any region (tables keyed by id alone).
  bool keyed_by_id = true;
  // The kind member of a resource, created when missing.
  std::function<Message*(Resource&)> kind;
  // Turns a filled kind into a valid one (fields a generic filler cannot satisfy).
  Mutation fix;
  // Sets the smallest valid kind, inner ids left empty (taken from the envelope).
  Mutation minimal;
  // What load() returns for a minimal resource, besides the envelope: ids inside the kind and
  // normalised defaults.
  Mutation stored_minimal;
  // Changes some desired fields, for an update in place.
  Mutation change;
  // Invalid inputs (applied to a minimal resource) and a piece of the expected message.
  std::vector<std::pair<Mutation, std::string>> invalid;
};

Resource envelope(const TableCase& c, std::string_view id, std::string_view region) {
  Resource r;
  r.set_type(c.type);
  r.set_id(std::string(id));
  r.set_region(std::string(region));
  return r;
}

Resource minimalResource(const TableCase& c, std::string_view id, std::string_view region) {
  Resource r = envelope(c, id, region);
  c.minimal(r);
  return r;
}

std::string nested(int depth) {
  std::string s;
  for (int i = 0; i < depth; ++i) s += "[";
  for (int i = 0; i < depth; ++i) s += "]";
  return s;
}

TableCase deploymentTopologyCase() {
  TableCase c;
  c.name = "DeploymentTopology";
  c.make = makeDeploymentTopologyTable;
  c.type = std::string(kDeploymentTopology);
  c.keyed_by_id = false;
  c.kind = [](Resource& r) -> Message* { return r.mutable_deployment_topology(); };
  c.fix = [](Resource& r) {
    auto* t = r.mutable_deployment_topology();
    t->set_deployment_id(r.id());
    t->set_region(r.region());
    t->set_image("registry.example.com/app@sha256:0123abcd");
    t->set_port(8443);
    t->set_shutdown_signal("SIGINT");
    t->mutable_healthcheck()->mutable_liveness()->set_path("/healthz");
    t->mutable_healthcheck()->mutable_liveness()->set_success_threshold(1);
    t->mutable_healthcheck()->mutable_readiness()->set_path("/ready?full=1");
    t->mutable_rolling_update()->mutable_max_surge()->set_value(25);
    t->mutable_rolling_update()->mutable_max_surge()->set_percent(true);
    t->mutable_rolling_update()->mutable_max_unavailable()->set_value(1);
    t->mutable_rolling_update()->set_min_ready_seconds(5);
    t->mutable_autoscaling()->set_min_replicas(2);
    t->mutable_autoscaling()->set_max_replicas(9);
    t->mutable_autoscaling()->set_target_cpu_percent(75);
    // Text that must survive JSON encoding unchanged.
    t->mutable_command(0)->assign("/bin/sh \"quoted\" \\ é ✓");
    t->mutable_env(1)->set_value("line1\nline2\t{\"json\": [1]}");
  };
  c.minimal = [](Resource& r) {
    auto* t = r.mutable_deployment_topology();
    t->set_workspace_id("ws-1");
    t->set_project_id("proj-1");
    t->set_app_id("app-1");
    t->set_environment_id("env-1");
    t->set_image("app:1");
    t->set_port(8080);
    t->set_cpu_millicores(250);
    t->set_memory_mib(256);
  };
  c.stored_minimal = [](Resource& r) {
    auto* t = r.mutable_deployment_topology();
    t->set_deployment_id(r.id());
    t->set_region(r.region());
    t->set_desired_status(cluster::v1::DESIRED_STATUS_RUNNING);
  };
  c.change = [](Resource& r) {
    auto* t = r.mutable_deployment_topology();
    t->set_image("app:2");
    t->set_replicas(5);
    t->clear_autoscaling();
    t->clear_healthcheck();
    t->clear_command();
    t->clear_labels();
    t->mutable_env()->RemoveLast();
    t->set_desired_status(cluster::v1::DESIRED_STATUS_STOPPED);
    (*t->mutable_labels())["team"] = "edge";
  };
  auto t = [](Resource& r) { return r.mutable_deployment_topology(); };
  c.invalid = {
      {[](Resource& r) { r.clear_kind(); }, "resource.deployment_topology: required"},
      {[](Resource& r) { r.mutable_sentinel(); }, "resource.deployment_topology: required"},
      {[=](Resource& r) { t(r)->set_deployment_id("other"); },
       "deployment_topology.deployment_id: \"other\" differs from resource.id"},
      {[=](Resource& r) { t(r)->set_region("us-1"); },
       "deployment_topology.region: \"us-1\" differs"},
      {[=](Resource& r) { t(r)->clear_workspace_id(); },
       "deployment_topology.workspace_id: required"},
      {[=](Resource& r) { t(r)->set_app_id("no spaces"); },
       "deployment_topology.app_id: \"no spaces\""},
      {[=](Resource& r) { t(r)->clear_image(); }, "deployment_topology.image: required"},
      {[=](Resource& r) { t(r)->set_image(std::string(513, 'a')); },
       "deployment_topology.image: at most 512 bytes"},
      {[=](Resource& r) { t(r)->set_image("app 1"); },
       "deployment_topology.image: must be printable"},
      {[=](Resource& r) { t(r)->set_port(0); },
       "deployment_topology.port: must be between 1 and 65535"},
      {[=](Resource& r) { t(r)->set_port(65536); },
       "deployment_topology.port: must be between 1 and 65535"},
      {[=](Resource& r) { t(r)->set_replicas(1001); },
       "deployment_topology.replicas: must be at most 1000"},
      {[=](Resource& r) {
         t(r)->mutable_rolling_update()->mutable_max_surge()->set_value(0);
         t(r)->mutable_rolling_update()->mutable_max_unavailable()->set_value(0);
       },
       "deployment_topology.rolling_update.max_surge, deployment_topology.rolling_update."
       "max_unavailable: at least one must be positive"},
      {[=](Resource& r) {
         t(r)->mutable_rolling_update()->mutable_max_surge()->set_value(101);
         t(r)->mutable_rolling_update()->mutable_max_surge()->set_percent(true);
       },
       "deployment_topology.rolling_update.max_surge: at most 100%, got 101%"},
      {[=](Resource& r) { t(r)->set_cpu_millicores(0); },
       "deployment_topology.cpu_millicores: must be between 1 and 64000"},
      {[=](Resource& r) { t(r)->set_memory_mib(1024 * 1024 + 1); },
       "deployment_topology.memory_mib: must be between 1 and 1048576"},
      {[=](Resource& r) {
         t(r)->mutable_autoscaling()->set_min_replicas(5);
         t(r)->mutable_autoscaling()->set_max_replicas(3);
         t(r)->mutable_autoscaling()->set_target_cpu_percent(50);
       },
       "deployment_topology.autoscaling.min_replicas: must not exceed max_replicas"},
      {[=](Resource& r) {
         t(r)->mutable_autoscaling()->set_min_replicas(1);
         t(r)->mutable_autoscaling()->set_max_replicas(3);
       },
       "deployment_topology.autoscaling.target_cpu_percent: must be between 1 and 100"},
      {[=](Resource& r) {
         for (const char* name : {"A", "B", "1X"}) t(r)->add_env()->set_name(name);
       },
       "deployment_topology.env[2].name: \"1X\""},
      {[=](Resource& r) {
         for (const char* name : {"A", "B", "A"}) t(r)->add_env()->set_name(name);
       },
       "deployment_topology.env[2].name: \"A\" already set by env[0]"},
      {[=](Resource& r) { t(r)->add_env(); }, "deployment_topology.env[0].name: required"},
      {[=](Resource& r) {
         for (int i = 0; i < 201; ++i) t(r)->add_env()->set_name(strCat("V", i));
       },
       "deployment_topology.env: at most 200 entries"},
      {[=](Resource& r) { t(r)->add_args(std::string("\xff\xfe", 2)); },
       "deployment_topology.args[0]: not valid UTF-8"},
      {[=](Resource& r) { t(r)->set_shutdown_signal("SIGFOO"); },
       "deployment_topology.shutdown_signal: \"SIGFOO\" is not a signal (use e.g. SIGTERM)"},
      {[=](Resource& r) { t(r)->set_termination_grace_period_seconds(3601); },
       "deployment_topology.termination_grace_period_seconds: must be at most 3600"},
      {[=](Resource& r) { t(r)->set_desired_status(static_cast<cluster::v1::DesiredStatus>(7)); },
       "deployment_topology.desired_status: unknown value 7"},
      {[=](Resource& r) { t(r)->mutable_healthcheck()->mutable_liveness()->set_path("healthz"); },
       "deployment_topology.healthcheck.liveness.path: must start with '/'"},
      {[=](Resource& r) { t(r)->mutable_healthcheck()->mutable_readiness()->set_port(70000); },
       "deployment_topology.healthcheck.readiness.port: must be at most 65535"},
      {[=](Resource& r) {
         t(r)->mutable_healthcheck()->mutable_liveness()->set_success_threshold(2);
       },
       "deployment_topology.healthcheck.liveness.success_threshold: must be 0 or 1"},
      {[=](Resource& r) { (*t(r)->mutable_labels())["bad key"] = "v"; },
       "deployment_topology.labels[\"bad key\"]: key name"},
      {[=](Resource& r) { (*t(r)->mutable_labels())["Example.com/x"] = "v"; },
       "deployment_topology.labels[\"Example.com/x\"]: key prefix"},
      {[=](Resource& r) { (*t(r)->mutable_labels())["team"] = std::string(64, 'a'); },
       "deployment_topology.labels[\"team\"]: value"},
  };
  return c;
}

TableCase sentinelCase() {
  TableCase c;
  c.name = "Sentinel";
  c.make = makeSentinelTable;
  c.type = std::string(kSentinel);
  c.kind = [](Resource& r) -> Message* { return r.mutable_sentinel(); };
  c.fix = [](Resource& r) {
    auto* s = r.mutable_sentinel();
    s->set_sentinel_id(r.id());
    s->set_region(r.region());
    // Whitespace and key order are kept as given.
    s->set_config_json("{\"z\": 1,  \"a\": [true, null, \"\\u00e9\"]}");
    s->set_live_deployment_id("dep-live");
    auto* h = s->mutable_healthcheck();
    h->mutable_liveness()->set_path("/healthz/live");
    h->mutable_liveness()->set_success_threshold(1);
    h->mutable_readiness()->set_path("/healthz/ready");
  };
  c.minimal = [](Resource& r) {
    auto* s = r.mutable_sentinel();
    s->set_workspace_id("ws-1");
    s->set_project_id("proj-1");
    s->set_app_id("app-1");
    s->set_environment_id("env-1");
    s->set_image("sentinel:1");
    s->set_replicas(2);
    s->set_cpu_millicores(100);
    s->set_memory_mib(128);
  };
  c.stored_minimal = [](Resource& r) {
    auto* s = r.mutable_sentinel();
    s->set_sentinel_id(r.id());
    s->set_region(r.region());
    s->set_desired_state(cluster::v1::SENTINEL_DESIRED_STATE_RUNNING);
  };
  c.change = [](Resource& r) {
    auto* s = r.mutable_sentinel();
    s->set_image("sentinel:2");
    s->set_replicas(0);
    s->set_desired_state(cluster::v1::SENTINEL_DESIRED_STATE_STANDBY);
    s->clear_config_json();
  };
  auto s = [](Resource& r) { return r.mutable_sentinel(); };
  c.invalid = {
      {[](Resource& r) { r.clear_kind(); }, "resource.sentinel: required"},
      {[=](Resource& r) { s(r)->set_sentinel_id("other"); },
       "sentinel.sentinel_id: \"other\" differs from resource.id"},
      {[=](Resource& r) { s(r)->set_region("us-1"); }, "sentinel.region: \"us-1\" differs"},
      {[=](Resource& r) { s(r)->clear_environment_id(); }, "sentinel.environment_id: required"},
      {[=](Resource& r) { s(r)->clear_image(); }, "sentinel.image: required"},
      {[=](Resource& r) { s(r)->set_replicas(1001); }, "sentinel.replicas: must be at most 1000"},
      {[=](Resource& r) { s(r)->set_cpu_millicores(64001); },
       "sentinel.cpu_millicores: must be between 1 and 64000"},
      {[=](Resource& r) { s(r)->set_memory_mib(0); }, "sentinel.memory_mib: must be between 1"},
      {[=](Resource& r) {
         s(r)->set_desired_state(static_cast<cluster::v1::SentinelDesiredState>(9));
       },
       "sentinel.desired_state: unknown value 9"},
      {[=](Resource& r) { s(r)->set_config_json("{\"a\": "); },
       "sentinel.config_json: not valid JSON"},
      {[=](Resource& r) { s(r)->set_config_json("{} trailing"); },
       "sentinel.config_json: not valid JSON"},
      {[=](Resource& r) { s(r)->set_config_json(nested(32)); },
       "sentinel.config_json: nested deeper than 31 levels"},
      {[=](Resource& r) { s(r)->set_live_deployment_id("has space"); },
       "sentinel.live_deployment_id"},
      {[=](Resource& r) { s(r)->mutable_healthcheck()->mutable_liveness()->set_path("live"); },
       "sentinel.healthcheck.liveness.path: must start with '/'"},
      {[=](Resource& r) {
         s(r)->mutable_healthcheck()->mutable_liveness()->set_path("/healthz");
         s(r)->mutable_healthcheck()->mutable_readiness()->set_path("/healthz");
       },
       "sentinel.healthcheck.readiness.path: \"/healthz\" is the liveness path"},
  };
  return c;
}

TableCase ciliumCase() {
  TableCase c;
  c.name = "CiliumNetworkPolicy";
  c.make = makeCiliumPolicyTable;
  c.type = std::string(kCiliumNetworkPolicy);
  c.kind = [](Resource& r) -> Message* { return r.mutable_cilium_network_policy(); };
  c.fix = [](Resource& r) {
    auto* p = r.mutable_cilium_network_policy();
    p->set_policy_id(r.id());
    p->set_region(r.region());
    p->set_policy_json(
        "{\"endpointSelector\": {\"matchLabels\": {\"app\": \"web\"}},  \"ingress\": []}");
  };
  c.minimal = [](Resource& r) {
    auto* p = r.mutable_cilium_network_policy();
    p->set_workspace_id("ws-1");
    p->set_project_id("proj-1");
    p->set_environment_id("env-1");
    p->set_policy_json("{\"endpointSelector\": {}}");
  };
  c.stored_minimal = [](Resource& r) {
    auto* p = r.mutable_cilium_network_policy();
    p->set_policy_id(r.id());
    p->set_region(r.region());
  };
  c.change = [](Resource& r) {
    auto* p = r.mutable_cilium_network_policy();
    p->set_name("allow-web");
    p->set_policy_json("{\"spec\":{\"endpointSelector\":{},\"egress\":[{}]}}");
  };
  auto p = [](Resource& r) { return r.mutable_cilium_network_policy(); };
  c.invalid = {
      {[](Resource& r) { r.mutable_generic(); }, "resource.cilium_network_policy: required"},
      {[=](Resource& r) { p(r)->set_policy_id("other"); },
       "cilium_network_policy.policy_id: \"other\" differs from resource.id"},
      {[=](Resource& r) { p(r)->set_region("us-1"); },
       "cilium_network_policy.region: \"us-1\" differs"},
      {[=](Resource& r) { p(r)->clear_project_id(); },
       "cilium_network_policy.project_id: required"},
      {[=](Resource& r) { p(r)->set_name("Bad_Name"); },
       "cilium_network_policy.name: \"Bad_Name\""},
      {[=](Resource& r) { p(r)->set_name(std::string(254, 'a')); }, "cilium_network_policy.name"},
      {[=](Resource& r) { p(r)->clear_policy_json(); },
       "cilium_network_policy.policy_json: required"},
      {[=](Resource& r) { p(r)->set_policy_json("{]"); },
       "cilium_network_policy.policy_json: not valid JSON: "},
      {[=](Resource& r) { p(r)->set_policy_json("[1, 2]"); },
       "cilium_network_policy.policy_json: must be a JSON object"},
      {[=](Resource& r) { p(r)->set_policy_json(strCat("{\"a\":", nested(31), "}")); },
       "cilium_network_policy.policy_json: nested deeper than 31 levels"},
      // What the Cilium plugin would refuse is refused when written (its own check).
      {[=](Resource& r) {
         p(r)->set_policy_json("{\"spec\": {\"endpointSelector\": {}, \"ingress\": {}}}");
       },
       "cilium_network_policy.policy_json.spec.ingress: must be an array"},
      {[=](Resource& r) { p(r)->set_policy_json("{\"ingress\": []}"); },
       "cilium_network_policy.policy_json: endpointSelector required"},
  };
  return c;
}

TableCase genericCase() {
  TableCase c;
  c.name = "Generic";
  c.make = makeGenericTable;
  c.type = std::string(kGenericType);
  c.kind = [](Resource& r) -> Message* { return r.mutable_generic(); };
  c.fix = [](Resource& r) {
    auto* g = r.mutable_generic();
    g->set_type(r.type());
    g->set_id(r.id());
    g->set_region(r.region());
  };
  c.minimal = [](Resource& r) { r.mutable_generic()->set_spec("{}"); };
  c.stored_minimal = [](Resource& r) {
    auto* g = r.mutable_generic();
    g->set_type(r.type());
    g->set_id(r.id());
    g->set_region(r.region());
  };
  c.change = [](Resource& r) {
    r.mutable_generic()->set_spec(std::string("\x00\x01\x02", 3));
    r.mutable_generic()->set_content_type("application/octet-stream");
  };
  auto g = [](Resource& r) { return r.mutable_generic(); };
  c.invalid = {
      {[](Resource& r) { r.clear_kind(); }, "resource.generic: required"},
      {[=](Resource& r) { g(r)->set_type("other.type"); },
       "resource.generic.type: \"other.type\" differs"},
      {[=](Resource& r) { g(r)->set_id("other"); }, "resource.generic.id: differs"},
      {[=](Resource& r) { g(r)->set_region("us-1"); }, "resource.generic.region: differs"},
      {[=](Resource& r) { g(r)->set_workspace_id("a b"); }, "resource.generic.workspace_id"},
      {[=](Resource& r) { g(r)->set_spec(std::string((1 << 20) + 1, 'x')); },
       "resource.generic.spec: at most"},
      {[=](Resource& r) { g(r)->set_content_type(std::string(256, 'x')); },
       "resource.generic.content_type"},
  };
  return c;
}

// Every resource table; TablesTest cases run once for each (GENERATE over the index).
const std::vector<TableCase>& allTables() {
  static const std::vector<TableCase> cases = {deploymentTopologyCase(), sentinelCase(),
                                               ciliumCase(), genericCase()};
  return cases;
}

class TablesTest : public krane::testing::MariaDbTest {
 protected:
  TablesTest() {
    auto pool = db::Pool::create(dsn_, {.max_connections = 2});
    REQUIRE_THAT(pool, IsOk());
    pool_ = *pool;
    auto migrations = db::builtinMigrations();
    REQUIRE_THAT(migrations, IsOk());
    auto applied = db::Migrator(pool_, *migrations).migrate();
    REQUIRE_THAT(applied, IsOk());
    auto conn = pool_->acquire();
    REQUIRE_THAT(conn, IsOk());
    conn_ = std::move(*conn);
    for (std::string_view region : {kRegion, kOtherRegion}) {
      REQUIRE_THAT(
          conn_->exec("INSERT INTO regions (id, display_name, created_at) VALUES (?, ?, ?)",
                      {region, strCat("Region ", region), int64_t{1}}),
          IsOk());
    }
  }

  // Makes this run of the test case about table `index` of allTables().
  void useTable(size_t index) {
    case_ = &allTables().at(index);
    table_ = case_->make();
  }

  const TableCase& tc() const { return *case_; }
  db::Connection& conn() { return *conn_; }

  void write(const Resource& r, uint64_t version, int64_t now_ms = 1000) {
    INFO(table_->validate(r) << "\n" << r.DebugString());
    REQUIRE_THAT(table_->validate(r), IsOk());
    const absl::Status status = Peer::write(*table_, conn(), r, version, now_ms);
    REQUIRE_THAT(status, IsOk());
  }

  std::optional<StoredResource> load(std::string_view id, std::string_view region) {
    auto loaded =
        table_->load(conn(), ResourceKey{tc().type, std::string(id), std::string(region)});
    CHECK_THAT(loaded, IsOk());
    return loaded.ok() ? *loaded : std::nullopt;
  }

  std::vector<std::string> scan(std::string_view region) {
    std::vector<std::string> ids;
    auto listed = table_->list(conn(), region, "", ListCursor{}, 1000);
    CHECK_THAT(listed, IsOk());
    if (!listed.ok()) return ids;
    for (const auto& r : *listed) {
      CHECK(r.region() == region);
      CHECK(r.type() == tc().type);
      CHECK(r.kind_case() != Resource::KIND_NOT_SET);
      ids.push_back(r.id());
    }
    return ids;
  }

  // "region/id" of each listed resource.
  std::vector<std::string> list(std::string_view region, std::string_view type,
                                const ListCursor& after, size_t limit) {
    auto listed = table_->list(conn(), region, type, after, limit);
    CHECK_THAT(listed, IsOk());
    std::vector<std::string> out;
    if (!listed.ok()) return out;
    for (const Resource& r : *listed) {
      CHECK(r.type() == tc().type);
      CHECK(r.kind_case() != Resource::KIND_NOT_SET);
      out.push_back(strCat(r.region(), "/", r.id()));
    }
    return out;
  }

  static void expectSame(const Resource& expected, const Resource& actual) {
    MessageDifferencer differencer;
    std::string diff;
    differencer.ReportDifferencesToString(&diff);
    INFO(diff << "\nexpected:\n" << expected.DebugString() << "actual:\n" << actual.DebugString());
    CHECK(differencer.Compare(expected, actual));
    CHECK(MessageDifferencer::Equals(expected, actual));
  }

  std::shared_ptr<db::Pool> pool_;
  db::PooledConnection conn_;
  std::unique_ptr<ResourceTable> table_;
  const TableCase* case_ = nullptr;
};

TEST_CASE_METHOD(TablesTest, "type is the one stored", "[tables]") {
  useTable(GENERATE(range(size_t{0}, allTables().size())));
  INFO("table " << tc().name);
  if (tc().type == kGenericType) {
    CHECK(table_->type() == "");
  } else {
    CHECK(table_->type() == tc().type);
  }
}

TEST_CASE_METHOD(TablesTest, "every field of the kind is persisted", "[tables]") {
  useTable(GENERATE(range(size_t{0}, allTables().size())));
  INFO("table " << tc().name);
  Resource r = envelope(tc(), "res-1", kRegion);
  Filler().fill(tc().kind(r));
  tc().fix(r);
  std::vector<std::string> unset;
  unsetFields(*tc().kind(r), "", &unset);
  INFO("the test resource must set every field");
  REQUIRE(unset.empty());

  INFO(table_->validate(r) << "\n" << r.DebugString());
  REQUIRE_THAT(table_->validate(r), IsOk());
  write(r, 7);
  auto stored = load("res-1", kRegion);
  REQUIRE(stored.has_value());
  CHECK_FALSE(stored->deleted);
  Resource expected = r;
  expected.set_version(7);
  expectSame(expected, stored->resource);

  // The same through list.
  auto listed = table_->list(conn(), "", "", ListCursor{}, 10);
  REQUIRE_THAT(listed, IsOk());
  REQUIRE(listed->size() == 1u);
  expectSame(expected, (*listed)[0]);
}

TEST_CASE_METHOD(TablesTest, "minimal resource takes ids from the envelope", "[tables]") {
  useTable(GENERATE(range(size_t{0}, allTables().size())));
  INFO("table " << tc().name);
  const Resource r = minimalResource(tc(), "res-1", kRegion);
  write(r, 3);
  auto stored = load("res-1", kRegion);
  REQUIRE(stored.has_value());
  Resource expected = r;
  expected.set_version(3);
  tc().stored_minimal(expected);
  expectSame(expected, stored->resource);
}

TEST_CASE_METHOD(TablesTest, "update in place delete and revive", "[tables]") {
  useTable(GENERATE(range(size_t{0}, allTables().size())));
  INFO("table " << tc().name);
  Resource r = envelope(tc(), "res-1", kRegion);
  Filler().fill(tc().kind(r));
  tc().fix(r);
  write(r, 7, 1000);

  tc().change(r);
  write(r, 9, 2000);
  auto stored = load("res-1", kRegion);
  REQUIRE(stored.has_value());
  CHECK_FALSE(stored->deleted);
  Resource expected = r;
  expected.set_version(9);
  expectSame(expected, stored->resource);
  auto created = conn().query(strCat("SELECT COUNT(*) FROM ",
                                     tc().type == kGenericType           ? "resources"
                                     : tc().type == kSentinel            ? "sentinels"
                                     : tc().type == kCiliumNetworkPolicy ? "cilium_network_policies"
                                                                         : "deployment_topology",
                                     " WHERE created_at = 1000 AND updated_at = 2000"));
  REQUIRE_THAT(created, IsOk());
  INFO("created_at kept, updated_at moved");
  CHECK(created->rows[0].i64(0) == 1);

  const ResourceKey key{tc().type, "res-1", std::string(kRegion)};
  REQUIRE_THAT(Peer::markDeleted(*table_, conn(), key, 10, 3000), IsOk());
  stored = load("res-1", kRegion);
  REQUIRE(stored.has_value());
  CHECK(stored->deleted);
  CHECK(stored->resource.version() == 10u);
  expected.set_version(10);
  expectSame(expected, stored->resource);  // the kind stays readable
  CHECK(scan(kRegion).empty());
  CHECK(list("", "", ListCursor{}, 10).empty());

  write(r, 11, 4000);
  stored = load("res-1", kRegion);
  REQUIRE(stored.has_value());
  CHECK_FALSE(stored->deleted);
  CHECK(stored->resource.version() == 11u);
  CHECK(scan(kRegion) == std::vector<std::string>{"res-1"});
}

TEST_CASE_METHOD(TablesTest, "lock", "[tables]") {
  useTable(GENERATE(range(size_t{0}, allTables().size())));
  INFO("table " << tc().name);
  const ResourceKey key{tc().type, "res-1", std::string(kRegion)};
  const ResourceKey elsewhere{tc().type, "res-1", std::string(kOtherRegion)};
  REQUIRE_THAT(conn().execText("START TRANSACTION"), IsOk());
  auto info = table_->lock(conn(), key);
  REQUIRE_THAT(info, IsOk());
  CHECK_FALSE(info->has_value());
  REQUIRE_THAT(conn().execText("COMMIT"), IsOk());

  write(minimalResource(tc(), "res-1", kRegion), 7);
  REQUIRE_THAT(conn().execText("START TRANSACTION"), IsOk());
  info = table_->lock(conn(), key);
  REQUIRE_THAT(info, IsOk());
  REQUIRE(info->has_value());
  CHECK((*info)->region == kRegion);
  CHECK((*info)->version == 7u);
  CHECK_FALSE((*info)->deleted);

  info = table_->lock(conn(), elsewhere);
  REQUIRE_THAT(info, IsOk());
  if (tc().keyed_by_id) {
    INFO("a row keyed by id is found in any region");
    REQUIRE(info->has_value());
    CHECK((*info)->region == kRegion);
    CHECK((*info)->version == 7u);
  } else {
    CHECK_FALSE(info->has_value());
  }
  REQUIRE_THAT(conn().execText("COMMIT"), IsOk());

  REQUIRE_THAT(Peer::markDeleted(*table_, conn(), key, 8, 2000), IsOk());
  info = table_->lock(conn(), key);
  REQUIRE_THAT(info, IsOk());
  REQUIRE(info->has_value());
  CHECK((*info)->region == kRegion);
  CHECK((*info)->version == 8u);
  CHECK((*info)->deleted);

  // The lock is held: another session cannot lock the same row until the first commits.
  REQUIRE_THAT(conn().execText("START TRANSACTION"), IsOk());
  REQUIRE_THAT(table_->lock(conn(), key), IsOk());
  auto other = pool_->acquire();
  REQUIRE_THAT(other, IsOk());
  REQUIRE_THAT((*other)->execText("SET SESSION innodb_lock_wait_timeout = 1"), IsOk());
  REQUIRE_THAT((*other)->execText("START TRANSACTION"), IsOk());
  CHECK_FALSE(table_->lock(**other, key).ok());
  REQUIRE_THAT((*other)->execText("ROLLBACK"), IsOk());
  REQUIRE_THAT(conn().execText("COMMIT"), IsOk());
}

TEST_CASE_METHOD(TablesTest, "validate rejects bad input naming the field", "[tables]") {
  useTable(GENERATE(range(size_t{0}, allTables().size())));
  INFO("table " << tc().name);
  CHECK_THAT(table_->validate(minimalResource(tc(), "res-1", kRegion)), IsOk());
  REQUIRE(tc().invalid.size() >= 3u);
  for (size_t i = 0; i < tc().invalid.size(); ++i) {
    const auto& [mutate, expected] = tc().invalid[i];
    Resource r = minimalResource(tc(), "res-1", kRegion);
    mutate(r);
    const absl::Status status = table_->validate(r);
    INFO("case " << i << " (" << expected << "): " << status);
    CHECK(status.code() == absl::StatusCode::kInvalidArgument);
    INFO("case " << i);
    CHECK_THAT(messageOf(status), Catch::Contains(expected));
  }
}

TEST_CASE_METHOD(TablesTest, "scan region returns live rows of the region in id order",
                 "[tables]") {
  useTable(GENERATE(range(size_t{0}, allTables().size())));
  INFO("table " << tc().name);
  write(minimalResource(tc(), "r-3", kRegion), 1);
  write(minimalResource(tc(), "r-1", kRegion), 2);
  write(minimalResource(tc(), "r-2", kOtherRegion), 3);
  write(minimalResource(tc(), "r-5", kRegion), 4);
  write(minimalResource(tc(), "r-4", kRegion), 5);
  REQUIRE_THAT(
      Peer::markDeleted(*table_, conn(), ResourceKey{tc().type, "r-4", std::string(kRegion)}, 6, 1),
      IsOk());
  CHECK(scan(kRegion) == std::vector<std::string>{"r-1", "r-3", "r-5"});
  CHECK(scan(kOtherRegion) == std::vector<std::string>{"r-2"});
  CHECK(scan("nowhere").empty());
}

TEST_CASE_METHOD(TablesTest, "list orders and pages", "[tables]") {
  useTable(GENERATE(range(size_t{0}, allTables().size())));
  INFO("table " << tc().name);
  write(minimalResource(tc(), "r-5", kRegion), 1);
  write(minimalResource(tc(), "r-2", kOtherRegion), 1);
  write(minimalResource(tc(), "r-1", kRegion), 2);
  write(minimalResource(tc(), "r-4", kOtherRegion), 2);
  write(minimalResource(tc(), "r-3", kRegion), 3);
  write(minimalResource(tc(), "r-6", kRegion), 4);
  REQUIRE_THAT(
      Peer::markDeleted(*table_, conn(), ResourceKey{tc().type, "r-6", std::string(kRegion)}, 5, 1),
      IsOk());
  const std::vector<std::string> all = {"eu-1/r-1", "eu-1/r-3", "eu-1/r-5", "us-1/r-2", "us-1/r-4"};

  CHECK(list("", "", ListCursor{}, 100) == all);
  CHECK(list("", tc().type, ListCursor{}, 100) == all);
  CHECK(list("", "zz.other/type", ListCursor{}, 100).empty());
  CHECK(list(kOtherRegion, "", ListCursor{}, 100) ==
        std::vector<std::string>{"us-1/r-2", "us-1/r-4"});
  INFO("a cursor of an earlier type");
  CHECK(list("", "", ListCursor{"", "a", ""}, 100) == all);
  CHECK(list("", "", ListCursor{"zz", "a", "zz"}, 100) == all);
  INFO("a cursor of a later type");
  CHECK(list("", "", ListCursor{"", tc().type + "~", ""}, 100).empty());
  CHECK(list(kOtherRegion, "", ListCursor{std::string(kOtherRegion), tc().type, "r-2"}, 100) ==
        std::vector<std::string>{"us-1/r-4"});
  INFO("the cursor need not name an existing row");
  CHECK(list("", "", ListCursor{"eu-1", tc().type, "r-4"}, 100) ==
        std::vector<std::string>{"eu-1/r-5", "us-1/r-2", "us-1/r-4"});

  // Pages of two, each continuing after the last resource of the previous one.
  std::vector<std::string> paged;
  ListCursor cursor;
  for (int page = 0; page < 10; ++page) {
    auto listed = table_->list(conn(), "", "", cursor, 2);
    REQUIRE_THAT(listed, IsOk());
    if (listed->empty()) break;
    CHECK(listed->size() <= 2u);
    for (const Resource& r : *listed) paged.push_back(strCat(r.region(), "/", r.id()));
    const Resource& last = listed->back();
    cursor = ListCursor{last.region(), last.type(), last.id()};
  }
  CHECK(paged == all);
  CHECK(list("", "", ListCursor{}, 0).empty());

  // One region, as a full sync lists it: cursors in the region, before it and after it.
  const std::vector<std::string> eu = {"eu-1/r-1", "eu-1/r-3", "eu-1/r-5"};
  const std::vector<std::string> us = {"us-1/r-2", "us-1/r-4"};
  CHECK(list(kRegion, "", ListCursor{std::string(kRegion), tc().type, "r-1"}, 100) ==
        std::vector<std::string>{"eu-1/r-3", "eu-1/r-5"});
  CHECK(list(kRegion, tc().type, ListCursor{std::string(kRegion), tc().type, "r-2"}, 100) ==
        std::vector<std::string>{"eu-1/r-3", "eu-1/r-5"});
  CHECK(list(kOtherRegion, "", ListCursor{std::string(kRegion), tc().type, "r-9"}, 100) == us);
  CHECK(list(kRegion, "", ListCursor{std::string(kOtherRegion), tc().type, ""}, 100).empty());
  CHECK(list(kRegion, "", ListCursor{"zz", "a", "zz"}, 100) == eu);
  CHECK(list(kRegion, "", ListCursor{"", tc().type + "~", ""}, 100).empty());
  CHECK(list(kRegion, "zz.other/type", ListCursor{}, 100).empty());
  std::vector<std::string> region_paged;
  cursor = ListCursor{};
  for (int page = 0; page < 10; ++page) {
    auto listed = table_->list(conn(), kRegion, "", cursor, 2);
    REQUIRE_THAT(listed, IsOk());
    if (listed->empty()) break;
    for (const Resource& r : *listed) region_paged.push_back(strCat(r.region(), "/", r.id()));
    const Resource& last = listed->back();
    cursor = ListCursor{last.region(), last.type(), last.id()};
  }
  CHECK(region_paged == eu);
}

// All regions, as the API lists them: every cursor (before, inside, between and after the
// stored types, regions and ids) and every type filter gives exactly the live rows after the
// cursor in (type, region, id) order, and pages of two add up to the whole listing.
TEST_CASE_METHOD(TablesTest, "list of all regions continues after any cursor", "[tables]") {
  useTable(GENERATE(range(size_t{0}, allTables().size())));
  INFO("table " << tc().name);
  for (std::string_view region : {"ap-1", "sa-1"}) {
    REQUIRE_THAT(conn().exec("INSERT INTO regions (id, display_name, created_at) VALUES (?, ?, ?)",
                             {region, region, int64_t{1}}),
                 IsOk());
  }
  // The generic table holds every other type: one sorting before the case's type and one
  // after it (which the case's type is a prefix of). The others hold one type.
  std::vector<std::string> types = {tc().type};
  if (tc().type == kGenericType) {
    types = {"alpha.krane.dev/Queue", tc().type, strCat(tc().type, "-v2")};
  }
  // (type, region, id) of every live row. Ids do not follow the regions' order, ids repeat
  // across types, and some rows are deleted.
  using Key = std::tuple<std::string, std::string, std::string>;
  std::vector<Key> live;
  const std::vector<std::pair<std::string, std::string>> placed = {
      {"eu-1", "r-5"}, {"ap-1", "r-7"}, {"us-1", "r-4"}, {"eu-1", "r-1"}, {"sa-1", "r-3"},
      {"ap-1", "r-2"}, {"us-1", "r-8"}, {"eu-1", "r-9"}, {"us-1", "r-6"}};
  uint64_t version = 0;
  for (size_t t = 0; t < types.size(); ++t) {
    for (size_t i = 0; i < placed.size(); ++i) {
      const auto& [region, id] = placed[i];
      Resource r = minimalResource(tc(), id, region);
      r.set_type(types[t]);
      write(r, ++version);
      if ((i + t) % 4 == 3) {
        REQUIRE_THAT(
            Peer::markDeleted(*table_, conn(), ResourceKey{types[t], id, region}, ++version, 1),
            IsOk());
      } else {
        live.emplace_back(types[t], region, id);
      }
    }
  }
  std::sort(live.begin(), live.end());
  const auto show = [](const Key& k) {
    return strCat(std::get<0>(k), " ", std::get<1>(k), "/", std::get<2>(k));
  };
  const auto listed = [&](std::string_view type, const ListCursor& after, size_t limit) {
    std::vector<std::string> out;
    auto rows = table_->list(conn(), "", type, after, limit);
    CHECK_THAT(rows, IsOk());
    if (!rows.ok()) return out;
    for (const Resource& r : *rows) {
      CHECK(r.kind_case() != Resource::KIND_NOT_SET);
      out.push_back(show(Key{r.type(), r.region(), r.id()}));
    }
    return out;
  };
  const auto expected = [&](std::string_view type, const ListCursor& after) {
    std::vector<std::string> out;
    for (const Key& k : live) {
      if (!type.empty() && std::get<0>(k) != type) continue;
      if (k > Key{after.type, after.region, after.id}) out.push_back(show(k));
    }
    return out;
  };

  std::vector<std::string> filters = {"", "zz.other/type"};
  filters.insert(filters.end(), types.begin(), types.end());
  std::vector<std::string> cursor_types = {"", "a", "b", "zz", tc().type.substr(0, 5)};
  for (const auto& t : types) {
    cursor_types.push_back(t);
    cursor_types.push_back(strCat(t, "~"));
  }
  const std::vector<std::string> cursor_regions = {"",     "a",    "ap-1", "b",     "eu-1",
                                                   "eu-2", "sa-1", "us-1", "us-10", "zz"};
  const std::vector<std::string> cursor_ids = {"", "r-0", "r-1", "r-4", "r-45", "r-9", "zz"};
  for (const auto& filter : filters) {
    INFO("type filter " << quote(filter));
    CHECK(listed(filter, ListCursor{}, 100) == expected(filter, ListCursor{}));
    for (const auto& ct : cursor_types) {
      for (const auto& cr : cursor_regions) {
        for (const auto& ci : cursor_ids) {
          const ListCursor after{cr, ct, ci};
          INFO("after " << quote(ct) << " " << quote(cr) << " " << quote(ci));
          CHECK(listed(filter, after, 100) == expected(filter, after));
        }
      }
    }

    // Pages of two, each continuing after the last resource of the previous one: together
    // the whole listing, nothing twice and nothing missing.
    std::vector<std::string> paged;
    ListCursor cursor;
    for (int page = 0; page < 30; ++page) {
      auto rows = table_->list(conn(), "", filter, cursor, 2);
      REQUIRE_THAT(rows, IsOk());
      if (rows->empty()) break;
      CHECK(rows->size() <= 2u);
      for (const Resource& r : *rows) paged.push_back(show(Key{r.type(), r.region(), r.id()}));
      const Resource& last = rows->back();
      cursor = ListCursor{last.region(), last.type(), last.id()};
    }
    CHECK(paged == expected(filter, ListCursor{}));
  }
  CHECK(live.size() == 7 * types.size());
}

TEST_CASE_METHOD(TablesTest, "purge removes only rows deleted before the cutoff", "[tables]") {
  useTable(GENERATE(range(size_t{0}, allTables().size())));
  INFO("table " << tc().name);
  write(minimalResource(tc(), "r-1", kRegion), 1);
  write(minimalResource(tc(), "r-2", kRegion), 2);
  write(minimalResource(tc(), "r-3", kOtherRegion), 3);
  write(minimalResource(tc(), "r-4", kRegion), 4);
  const auto key = [&](std::string_view id, std::string_view region) {
    return ResourceKey{tc().type, std::string(id), std::string(region)};
  };
  REQUIRE_THAT(Peer::markDeleted(*table_, conn(), key("r-1", kRegion), 5, 1000), IsOk());
  REQUIRE_THAT(Peer::markDeleted(*table_, conn(), key("r-2", kRegion), 6, 3000), IsOk());
  REQUIRE_THAT(Peer::markDeleted(*table_, conn(), key("r-3", kOtherRegion), 7, 1500), IsOk());

  auto purged = table_->purgeDeleted(conn(), 2000, 1);
  REQUIRE_THAT(purged, IsOk());
  INFO("the limit holds");
  CHECK(*purged == 1u);
  purged = table_->purgeDeleted(conn(), 2000, 100);
  REQUIRE_THAT(purged, IsOk());
  CHECK(*purged == 1u);
  CHECK_FALSE(load("r-1", kRegion).has_value());
  CHECK_FALSE(load("r-3", kOtherRegion).has_value());
  auto r2 = load("r-2", kRegion);
  REQUIRE(r2.has_value());
  CHECK(r2->deleted);
  auto r4 = load("r-4", kRegion);
  REQUIRE(r4.has_value());
  CHECK_FALSE(r4->deleted);

  purged = table_->purgeDeleted(conn(), 2000, 100);
  REQUIRE_THAT(purged, IsOk());
  CHECK(*purged == 0u);
  purged = table_->purgeDeleted(conn(), 3001, 100);
  REQUIRE_THAT(purged, IsOk());
  CHECK(*purged == 1u);
  CHECK(load("r-4", kRegion).has_value());
}

// Checks particular to one table.
class TypedTableTest : public krane::testing::MariaDbTest {
 protected:
  TypedTableTest() {
    auto pool = db::Pool::create(dsn_, {.max_connections = 2});
    REQUIRE_THAT(pool, IsOk());
    pool_ = *pool;
    auto migrations = db::builtinMigrations();
    REQUIRE_THAT(migrations, IsOk());
    REQUIRE_THAT(db::Migrator(pool_, *migrations).migrate(), IsOk());
    auto conn = pool_->acquire();
    REQUIRE_THAT(conn, IsOk());
    conn_ = std::move(*conn);
    for (std::string_view region : {kRegion, kOtherRegion}) {
      REQUIRE_THAT(
          conn_->exec("INSERT INTO regions (id, display_name, created_at) VALUES (?, ?, ?)",
                      {region, region, int64_t{1}}),
          IsOk());
    }
  }

  std::shared_ptr<db::Pool> pool_;
  db::PooledConnection conn_;
};

TEST_CASE_METHOD(TypedTableTest, "sentinel write leaves observed columns alone", "[typed-table]") {
  const auto table = makeSentinelTable();
  Resource r = minimalResource(sentinelCase(), "sen-1", kRegion);
  REQUIRE_THAT(Peer::write(*table, *conn_, r, 1, 1000), IsOk());
  auto row = conn_->query(
      "SELECT deploy_status, available_replicas, updated_replicas, ready_replicas,"
      " observed_generation, running_image, health, status_reported_at, config FROM sentinels");
  REQUIRE_THAT(row, IsOk());
  REQUIRE(row->rows.size() == 1u);
  CHECK(row->rows[0].str("deploy_status") == "idle");
  CHECK(row->rows[0].i64("available_replicas") == 0);
  CHECK(row->rows[0].str("health") == "unknown");
  CHECK(row->rows[0].isNull("running_image"));
  CHECK(row->rows[0].isNull("status_reported_at"));
  INFO("no configuration is NULL");
  CHECK(row->rows[0].isNull("config"));

  REQUIRE_THAT(
      conn_->exec("UPDATE sentinels SET deploy_status = 'progressing', available_replicas = 1,"
                  " updated_replicas = 2, ready_replicas = 3, observed_generation = 4,"
                  " running_image = 'sentinel:0', health = 'healthy',"
                  " status_reported_at = 5"),
      IsOk());
  r.mutable_sentinel()->set_image("sentinel:9");
  r.mutable_sentinel()->set_desired_state(cluster::v1::SENTINEL_DESIRED_STATE_ARCHIVED);
  REQUIRE_THAT(Peer::write(*table, *conn_, r, 2, 2000), IsOk());
  REQUIRE_THAT(
      Peer::markDeleted(*table, *conn_, {"sentinel", "sen-1", std::string(kRegion)}, 3, 3000),
      IsOk());
  REQUIRE_THAT(Peer::write(*table, *conn_, r, 4, 4000), IsOk());
  row = conn_->query(
      "SELECT deploy_status, available_replicas, updated_replicas, ready_replicas,"
      " observed_generation, running_image, health, status_reported_at, image, desired_state"
      " FROM sentinels");
  REQUIRE_THAT(row, IsOk());
  const db::Row& x = row->rows[0];
  CHECK(x.str("deploy_status") == "progressing");
  CHECK(x.i64("available_replicas") == 1);
  CHECK(x.i64("updated_replicas") == 2);
  CHECK(x.i64("ready_replicas") == 3);
  CHECK(x.i64("observed_generation") == 4);
  CHECK(x.str("running_image") == "sentinel:0");
  CHECK(x.str("health") == "healthy");
  CHECK(x.i64("status_reported_at") == 5);
  CHECK(x.str("image") == "sentinel:9");
  CHECK(x.str("desired_state") == "archived");
}

TEST_CASE_METHOD(TypedTableTest, "json as deep as validation allows is stored", "[typed-table]") {
  const auto sentinels = makeSentinelTable();
  Resource s = minimalResource(sentinelCase(), "sen-1", kRegion);
  s.mutable_sentinel()->set_config_json(nested(31));
  REQUIRE_THAT(sentinels->validate(s), IsOk());
  const absl::Status written = Peer::write(*sentinels, *conn_, s, 1, 1000);
  REQUIRE_THAT(written, IsOk());

  const auto policies = makeCiliumPolicyTable();
  Resource p = minimalResource(ciliumCase(), "pol-1", kRegion);
  p.mutable_cilium_network_policy()->set_policy_json(
      strCat("{\"endpointSelector\": {\"matchExpressions\":", nested(29), "}}"));
  REQUIRE_THAT(policies->validate(p), IsOk());
  const absl::Status policy_written = Peer::write(*policies, *conn_, p, 1, 1000);
  REQUIRE_THAT(policy_written, IsOk());
}

TEST_CASE_METHOD(TypedTableTest, "deployment topology columns hold the documented json",
                 "[typed-table]") {
  const auto table = makeDeploymentTopologyTable();
  Resource r = minimalResource(deploymentTopologyCase(), "dep-1", kRegion);
  auto* t = r.mutable_deployment_topology();
  t->add_command("/bin/app");
  t->add_args("--verbose");
  auto* env = t->add_env();
  env->set_name("EMPTY");
  t->add_env()->set_name("B");
  t->mutable_env(1)->set_value("2");
  (*t->mutable_labels())["tier"] = "web";
  t->mutable_healthcheck()->mutable_readiness()->set_initial_delay_seconds(5);
  t->mutable_autoscaling()->set_min_replicas(1);
  t->mutable_autoscaling()->set_max_replicas(4);
  t->mutable_autoscaling()->set_target_cpu_percent(60);
  REQUIRE_THAT(table->validate(r), IsOk());
  REQUIRE_THAT(Peer::write(*table, *conn_, r, 1, 1000), IsOk());

  auto rows = conn_->query(
      "SELECT command, args, env, labels, healthcheck, autoscale_min_replicas,"
      " autoscale_max_replicas, autoscale_target_cpu_percent, desired_status, shutdown_signal"
      " FROM deployment_topology");
  REQUIRE_THAT(rows, IsOk());
  const db::Row& row = rows->rows[0];
  using nlohmann::json;
  CHECK(json::parse(row.str("command")) == json::parse(R"(["/bin/app"])"));
  CHECK(json::parse(row.str("args")) == json::parse(R"(["--verbose"])"));
  CHECK(json::parse(row.str("env")) ==
        json::parse(R"([{"name": "EMPTY", "value": ""}, {"name": "B", "value": "2"}])"));
  CHECK(json::parse(row.str("labels")) == json::parse(R"({"tier": "web"})"));
  CHECK(json::parse(row.str("healthcheck")) ==
        json::parse(R"({"readiness": {"initialDelaySeconds": 5}})"));
  CHECK(row.i64("autoscale_min_replicas") == 1);
  CHECK(row.i64("autoscale_max_replicas") == 4);
  CHECK(row.i64("autoscale_target_cpu_percent") == 60);
  CHECK(row.str("desired_status") == "running");

  // Without autoscaling or lists, the columns are NULL.
  t->clear_command();
  t->clear_args();
  t->clear_env();
  t->clear_labels();
  t->clear_healthcheck();
  t->clear_autoscaling();
  REQUIRE_THAT(Peer::write(*table, *conn_, r, 2, 2000), IsOk());
  rows = conn_->query(
      "SELECT command IS NULL AND args IS NULL AND env IS NULL AND labels IS NULL AND"
      " healthcheck IS NULL AND autoscale_min_replicas IS NULL AND autoscale_max_replicas IS NULL"
      " AND autoscale_target_cpu_percent IS NULL FROM deployment_topology");
  REQUIRE_THAT(rows, IsOk());
  CHECK(rows->rows[0].i64(0) == 1);
}

TEST_CASE_METHOD(TypedTableTest, "deployment topology is keyed by id and region", "[typed-table]") {
  const auto table = makeDeploymentTopologyTable();
  Resource eu = minimalResource(deploymentTopologyCase(), "dep-1", kRegion);
  Resource us = minimalResource(deploymentTopologyCase(), "dep-1", kOtherRegion);
  us.mutable_deployment_topology()->set_image("app:us");
  REQUIRE_THAT(Peer::write(*table, *conn_, eu, 1, 1000), IsOk());
  REQUIRE_THAT(Peer::write(*table, *conn_, us, 2, 1000), IsOk());
  auto a = table->load(*conn_, {"deployment_topology", "dep-1", std::string(kRegion)});
  auto b = table->load(*conn_, {"deployment_topology", "dep-1", std::string(kOtherRegion)});
  REQUIRE((a.ok() && b.ok()));
  REQUIRE((a->has_value() && b->has_value()));
  CHECK((*a)->resource.deployment_topology().image() == "app:1");
  CHECK((*b)->resource.deployment_topology().image() == "app:us");
  CHECK((*b)->resource.version() == 2u);
}

TEST_CASE_METHOD(TypedTableTest, "id keyed tables move a revived row to the new region",
                 "[typed-table]") {
  for (const TableCase& c : {sentinelCase(), ciliumCase()}) {
    INFO(c.name);
    const auto table = c.make();
    REQUIRE_THAT(Peer::write(*table, *conn_, minimalResource(c, "x-1", kRegion), 1, 1000), IsOk());
    REQUIRE_THAT(Peer::markDeleted(*table, *conn_, {c.type, "x-1", std::string(kRegion)}, 2, 2000),
                 IsOk());
    REQUIRE_THAT(Peer::write(*table, *conn_, minimalResource(c, "x-1", kOtherRegion), 3, 3000),
                 IsOk());
    auto old_place = table->load(*conn_, {c.type, "x-1", std::string(kRegion)});
    REQUIRE_THAT(old_place, IsOk());
    CHECK_FALSE(old_place->has_value());
    auto new_place = table->load(*conn_, {c.type, "x-1", std::string(kOtherRegion)});
    REQUIRE_THAT(new_place, IsOk());
    REQUIRE(new_place->has_value());
    CHECK_FALSE((*new_place)->deleted);
    CHECK((*new_place)->resource.region() == kOtherRegion);
    CHECK((*new_place)->resource.version() == 3u);
  }
}

}  // namespace
}  // namespace krane::feed
