// The ResourceTable implementations against a real MariaDB with the real schema: every proto
// field persisted, updates, soft deletes, locking, validation, scans, listings and purging.
#include "controlplane/feed/tables.h"

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/status.h"
#include "common/strings.h"
#include "controlplane/db/migrate.h"
#include "controlplane/db/pool.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "google/protobuf/util/message_differencer.h"
#include "tests/support/mariadb.h"

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
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

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

// Named by GoogleTest, which prints parameters through it.
// NOLINTNEXTLINE(readability-identifier-naming)
void PrintTo(const TableCase& c, std::ostream* os) { *os << c.name; }

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
    p->set_policy_json("{}");
  };
  c.stored_minimal = [](Resource& r) {
    auto* p = r.mutable_cilium_network_policy();
    p->set_policy_id(r.id());
    p->set_region(r.region());
  };
  c.change = [](Resource& r) {
    auto* p = r.mutable_cilium_network_policy();
    p->set_name("allow-web");
    p->set_policy_json("{\"spec\":{\"egress\":[{}]}}");
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

class TablesTest : public krane::testing::MariaDbTest,
                   public ::testing::WithParamInterface<TableCase> {
 protected:
  void SetUp() override {
    MariaDbTest::SetUp();
    auto pool = db::Pool::create(dsn_, {.max_connections = 2});
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = *pool;
    auto migrations = db::builtinMigrations();
    ASSERT_TRUE(migrations.ok()) << migrations.status();
    auto applied = db::Migrator(pool_, *migrations).migrate();
    ASSERT_TRUE(applied.ok()) << applied.status();
    auto conn = pool_->acquire();
    ASSERT_TRUE(conn.ok()) << conn.status();
    conn_ = std::move(*conn);
    for (std::string_view region : {kRegion, kOtherRegion}) {
      ASSERT_TRUE(conn_
                      ->exec("INSERT INTO regions (id, display_name, created_at) VALUES (?, ?, ?)",
                             {region, strCat("Region ", region), int64_t{1}})
                      .ok());
    }
    table_ = GetParam().make();
  }

  const TableCase& tc() const { return GetParam(); }
  db::Connection& conn() { return *conn_; }

  void write(const Resource& r, uint64_t version, int64_t now_ms = 1000) {
    ASSERT_TRUE(table_->validate(r).ok()) << table_->validate(r) << "\n" << r.DebugString();
    const absl::Status status = Peer::write(*table_, conn(), r, version, now_ms);
    ASSERT_TRUE(status.ok()) << status;
  }

  std::optional<StoredResource> load(std::string_view id, std::string_view region) {
    auto loaded =
        table_->load(conn(), ResourceKey{tc().type, std::string(id), std::string(region)});
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    return loaded.ok() ? *loaded : std::nullopt;
  }

  std::vector<std::string> scan(std::string_view region) {
    std::vector<std::string> ids;
    const absl::Status status = table_->scanRegion(conn(), region, [&](Resource&& r) {
      EXPECT_EQ(r.region(), region);
      EXPECT_EQ(r.type(), tc().type);
      EXPECT_NE(r.kind_case(), Resource::KIND_NOT_SET);
      ids.push_back(r.id());
      return absl::OkStatus();
    });
    EXPECT_TRUE(status.ok()) << status;
    return ids;
  }

  // "region/id" of each listed resource.
  std::vector<std::string> list(std::string_view region, std::string_view type,
                                const ListCursor& after, size_t limit) {
    auto listed = table_->list(conn(), region, type, after, limit);
    EXPECT_TRUE(listed.ok()) << listed.status();
    std::vector<std::string> out;
    if (!listed.ok()) return out;
    for (const Resource& r : *listed) {
      EXPECT_EQ(r.type(), tc().type);
      EXPECT_NE(r.kind_case(), Resource::KIND_NOT_SET);
      out.push_back(strCat(r.region(), "/", r.id()));
    }
    return out;
  }

  static void expectSame(const Resource& expected, const Resource& actual) {
    MessageDifferencer differencer;
    std::string diff;
    differencer.ReportDifferencesToString(&diff);
    EXPECT_TRUE(differencer.Compare(expected, actual)) << diff << "\nexpected:\n"
                                                       << expected.DebugString() << "actual:\n"
                                                       << actual.DebugString();
    EXPECT_TRUE(MessageDifferencer::Equals(expected, actual));
  }

  std::shared_ptr<db::Pool> pool_;
  db::PooledConnection conn_;
  std::unique_ptr<ResourceTable> table_;
};

TEST_P(TablesTest, TypeIsTheOneStored) {
  if (tc().type == kGenericType) {
    EXPECT_EQ(table_->type(), "");
  } else {
    EXPECT_EQ(table_->type(), tc().type);
  }
}

TEST_P(TablesTest, EveryFieldOfTheKindIsPersisted) {
  Resource r = envelope(tc(), "res-1", kRegion);
  Filler().fill(tc().kind(r));
  tc().fix(r);
  std::vector<std::string> unset;
  unsetFields(*tc().kind(r), "", &unset);
  ASSERT_THAT(unset, IsEmpty()) << "the test resource must set every field";

  ASSERT_TRUE(table_->validate(r).ok()) << table_->validate(r) << "\n" << r.DebugString();
  write(r, 7);
  auto stored = load("res-1", kRegion);
  ASSERT_TRUE(stored.has_value());
  EXPECT_FALSE(stored->deleted);
  Resource expected = r;
  expected.set_version(7);
  expectSame(expected, stored->resource);

  // The same through scanRegion and list.
  std::vector<Resource> scanned;
  ASSERT_TRUE(table_
                  ->scanRegion(conn(), kRegion,
                               [&](Resource&& x) {
                                 scanned.push_back(std::move(x));
                                 return absl::OkStatus();
                               })
                  .ok());
  ASSERT_EQ(scanned.size(), 1u);
  expectSame(expected, scanned[0]);
  auto listed = table_->list(conn(), "", "", ListCursor{}, 10);
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 1u);
  expectSame(expected, (*listed)[0]);
}

TEST_P(TablesTest, MinimalResourceTakesIdsFromTheEnvelope) {
  const Resource r = minimalResource(tc(), "res-1", kRegion);
  write(r, 3);
  auto stored = load("res-1", kRegion);
  ASSERT_TRUE(stored.has_value());
  Resource expected = r;
  expected.set_version(3);
  tc().stored_minimal(expected);
  expectSame(expected, stored->resource);
}

TEST_P(TablesTest, UpdateInPlaceDeleteAndRevive) {
  Resource r = envelope(tc(), "res-1", kRegion);
  Filler().fill(tc().kind(r));
  tc().fix(r);
  write(r, 7, 1000);

  tc().change(r);
  write(r, 9, 2000);
  auto stored = load("res-1", kRegion);
  ASSERT_TRUE(stored.has_value());
  EXPECT_FALSE(stored->deleted);
  Resource expected = r;
  expected.set_version(9);
  expectSame(expected, stored->resource);
  auto created = conn().query(strCat("SELECT COUNT(*) FROM ",
                                     tc().type == kGenericType           ? "resources"
                                     : tc().type == kSentinel            ? "sentinels"
                                     : tc().type == kCiliumNetworkPolicy ? "cilium_network_policies"
                                                                         : "deployment_topology",
                                     " WHERE created_at = 1000 AND updated_at = 2000"));
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_EQ(created->rows[0].i64(0), 1) << "created_at kept, updated_at moved";

  const ResourceKey key{tc().type, "res-1", std::string(kRegion)};
  ASSERT_TRUE(Peer::markDeleted(*table_, conn(), key, 10, 3000).ok());
  stored = load("res-1", kRegion);
  ASSERT_TRUE(stored.has_value());
  EXPECT_TRUE(stored->deleted);
  EXPECT_EQ(stored->resource.version(), 10u);
  expected.set_version(10);
  expectSame(expected, stored->resource);  // the kind stays readable
  EXPECT_THAT(scan(kRegion), IsEmpty());
  EXPECT_THAT(list("", "", ListCursor{}, 10), IsEmpty());

  write(r, 11, 4000);
  stored = load("res-1", kRegion);
  ASSERT_TRUE(stored.has_value());
  EXPECT_FALSE(stored->deleted);
  EXPECT_EQ(stored->resource.version(), 11u);
  EXPECT_THAT(scan(kRegion), ElementsAre("res-1"));
}

TEST_P(TablesTest, Lock) {
  const ResourceKey key{tc().type, "res-1", std::string(kRegion)};
  const ResourceKey elsewhere{tc().type, "res-1", std::string(kOtherRegion)};
  ASSERT_TRUE(conn().execText("START TRANSACTION").ok());
  auto info = table_->lock(conn(), key);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_FALSE(info->has_value());
  ASSERT_TRUE(conn().execText("COMMIT").ok());

  write(minimalResource(tc(), "res-1", kRegion), 7);
  ASSERT_TRUE(conn().execText("START TRANSACTION").ok());
  info = table_->lock(conn(), key);
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_TRUE(info->has_value());
  EXPECT_EQ((*info)->region, kRegion);
  EXPECT_EQ((*info)->version, 7u);
  EXPECT_FALSE((*info)->deleted);

  info = table_->lock(conn(), elsewhere);
  ASSERT_TRUE(info.ok()) << info.status();
  if (tc().keyed_by_id) {
    ASSERT_TRUE(info->has_value()) << "a row keyed by id is found in any region";
    EXPECT_EQ((*info)->region, kRegion);
    EXPECT_EQ((*info)->version, 7u);
  } else {
    EXPECT_FALSE(info->has_value());
  }
  ASSERT_TRUE(conn().execText("COMMIT").ok());

  ASSERT_TRUE(Peer::markDeleted(*table_, conn(), key, 8, 2000).ok());
  info = table_->lock(conn(), key);
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_TRUE(info->has_value());
  EXPECT_EQ((*info)->region, kRegion);
  EXPECT_EQ((*info)->version, 8u);
  EXPECT_TRUE((*info)->deleted);

  // The lock is held: another session cannot lock the same row until the first commits.
  ASSERT_TRUE(conn().execText("START TRANSACTION").ok());
  ASSERT_TRUE(table_->lock(conn(), key).ok());
  auto other = pool_->acquire();
  ASSERT_TRUE(other.ok()) << other.status();
  ASSERT_TRUE((*other)->execText("SET SESSION innodb_lock_wait_timeout = 1").ok());
  ASSERT_TRUE((*other)->execText("START TRANSACTION").ok());
  EXPECT_FALSE(table_->lock(**other, key).ok());
  ASSERT_TRUE((*other)->execText("ROLLBACK").ok());
  ASSERT_TRUE(conn().execText("COMMIT").ok());
}

TEST_P(TablesTest, ValidateRejectsBadInputNamingTheField) {
  EXPECT_TRUE(table_->validate(minimalResource(tc(), "res-1", kRegion)).ok());
  ASSERT_GE(tc().invalid.size(), 3u);
  for (size_t i = 0; i < tc().invalid.size(); ++i) {
    const auto& [mutate, expected] = tc().invalid[i];
    Resource r = minimalResource(tc(), "res-1", kRegion);
    mutate(r);
    const absl::Status status = table_->validate(r);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument)
        << "case " << i << " (" << expected << "): " << status;
    EXPECT_THAT(messageOf(status), HasSubstr(expected)) << "case " << i;
  }
}

TEST_P(TablesTest, ScanRegionReturnsLiveRowsOfTheRegionInIdOrder) {
  write(minimalResource(tc(), "r-3", kRegion), 1);
  write(minimalResource(tc(), "r-1", kRegion), 2);
  write(minimalResource(tc(), "r-2", kOtherRegion), 3);
  write(minimalResource(tc(), "r-5", kRegion), 4);
  write(minimalResource(tc(), "r-4", kRegion), 5);
  ASSERT_TRUE(
      Peer::markDeleted(*table_, conn(), ResourceKey{tc().type, "r-4", std::string(kRegion)}, 6, 1)
          .ok());
  EXPECT_THAT(scan(kRegion), ElementsAre("r-1", "r-3", "r-5"));
  EXPECT_THAT(scan(kOtherRegion), ElementsAre("r-2"));
  EXPECT_THAT(scan("nowhere"), IsEmpty());

  // An error of the callback stops the scan and is returned.
  int calls = 0;
  const absl::Status status = table_->scanRegion(conn(), kRegion, [&](Resource&&) {
    ++calls;
    return absl::CancelledError("enough");
  });
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(calls, 1);
}

TEST_P(TablesTest, ListOrdersAndPages) {
  write(minimalResource(tc(), "r-5", kRegion), 1);
  write(minimalResource(tc(), "r-2", kOtherRegion), 1);
  write(minimalResource(tc(), "r-1", kRegion), 2);
  write(minimalResource(tc(), "r-4", kOtherRegion), 2);
  write(minimalResource(tc(), "r-3", kRegion), 3);
  write(minimalResource(tc(), "r-6", kRegion), 4);
  ASSERT_TRUE(
      Peer::markDeleted(*table_, conn(), ResourceKey{tc().type, "r-6", std::string(kRegion)}, 5, 1)
          .ok());
  const std::vector<std::string> all = {"eu-1/r-1", "eu-1/r-3", "eu-1/r-5", "us-1/r-2", "us-1/r-4"};

  EXPECT_EQ(list("", "", ListCursor{}, 100), all);
  EXPECT_EQ(list("", tc().type, ListCursor{}, 100), all);
  EXPECT_THAT(list("", "zz.other/type", ListCursor{}, 100), IsEmpty());
  EXPECT_THAT(list(kOtherRegion, "", ListCursor{}, 100), ElementsAre("us-1/r-2", "us-1/r-4"));
  EXPECT_EQ(list("", "", ListCursor{"", "a", ""}, 100), all) << "a cursor of an earlier type";
  EXPECT_EQ(list("", "", ListCursor{"zz", "a", "zz"}, 100), all);
  EXPECT_THAT(list("", "", ListCursor{"", tc().type + "~", ""}, 100), IsEmpty())
      << "a cursor of a later type";
  EXPECT_THAT(list(kOtherRegion, "", ListCursor{std::string(kOtherRegion), tc().type, "r-2"}, 100),
              ElementsAre("us-1/r-4"));
  EXPECT_THAT(list("", "", ListCursor{"eu-1", tc().type, "r-4"}, 100),
              ElementsAre("eu-1/r-5", "us-1/r-2", "us-1/r-4"))
      << "the cursor need not name an existing row";

  // Pages of two, each continuing after the last resource of the previous one.
  std::vector<std::string> paged;
  ListCursor cursor;
  for (int page = 0; page < 10; ++page) {
    auto listed = table_->list(conn(), "", "", cursor, 2);
    ASSERT_TRUE(listed.ok()) << listed.status();
    if (listed->empty()) break;
    EXPECT_LE(listed->size(), 2u);
    for (const Resource& r : *listed) paged.push_back(strCat(r.region(), "/", r.id()));
    const Resource& last = listed->back();
    cursor = ListCursor{last.region(), last.type(), last.id()};
  }
  EXPECT_EQ(paged, all);
  EXPECT_THAT(list("", "", ListCursor{}, 0), IsEmpty());
}

TEST_P(TablesTest, PurgeRemovesOnlyRowsDeletedBeforeTheCutoff) {
  write(minimalResource(tc(), "r-1", kRegion), 1);
  write(minimalResource(tc(), "r-2", kRegion), 2);
  write(minimalResource(tc(), "r-3", kOtherRegion), 3);
  write(minimalResource(tc(), "r-4", kRegion), 4);
  const auto key = [&](std::string_view id, std::string_view region) {
    return ResourceKey{tc().type, std::string(id), std::string(region)};
  };
  ASSERT_TRUE(Peer::markDeleted(*table_, conn(), key("r-1", kRegion), 5, 1000).ok());
  ASSERT_TRUE(Peer::markDeleted(*table_, conn(), key("r-2", kRegion), 6, 3000).ok());
  ASSERT_TRUE(Peer::markDeleted(*table_, conn(), key("r-3", kOtherRegion), 7, 1500).ok());

  auto purged = table_->purgeDeleted(conn(), 2000, 1);
  ASSERT_TRUE(purged.ok()) << purged.status();
  EXPECT_EQ(*purged, 1u) << "the limit holds";
  purged = table_->purgeDeleted(conn(), 2000, 100);
  ASSERT_TRUE(purged.ok()) << purged.status();
  EXPECT_EQ(*purged, 1u);
  EXPECT_FALSE(load("r-1", kRegion).has_value());
  EXPECT_FALSE(load("r-3", kOtherRegion).has_value());
  auto r2 = load("r-2", kRegion);
  ASSERT_TRUE(r2.has_value());
  EXPECT_TRUE(r2->deleted);
  auto r4 = load("r-4", kRegion);
  ASSERT_TRUE(r4.has_value());
  EXPECT_FALSE(r4->deleted);

  purged = table_->purgeDeleted(conn(), 2000, 100);
  ASSERT_TRUE(purged.ok());
  EXPECT_EQ(*purged, 0u);
  purged = table_->purgeDeleted(conn(), 3001, 100);
  ASSERT_TRUE(purged.ok());
  EXPECT_EQ(*purged, 1u);
  EXPECT_TRUE(load("r-4", kRegion).has_value());
}

INSTANTIATE_TEST_SUITE_P(AllTables, TablesTest,
                         ::testing::Values(deploymentTopologyCase(), sentinelCase(), ciliumCase(),
                                           genericCase()),
                         [](const ::testing::TestParamInfo<TableCase>& info) {
                           return info.param.name;
                         });

// Checks particular to one table.
class TypedTableTest : public krane::testing::MariaDbTest {
 protected:
  void SetUp() override {
    MariaDbTest::SetUp();
    auto pool = db::Pool::create(dsn_, {.max_connections = 2});
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = *pool;
    auto migrations = db::builtinMigrations();
    ASSERT_TRUE(migrations.ok()) << migrations.status();
    ASSERT_TRUE(db::Migrator(pool_, *migrations).migrate().ok());
    auto conn = pool_->acquire();
    ASSERT_TRUE(conn.ok()) << conn.status();
    conn_ = std::move(*conn);
    for (std::string_view region : {kRegion, kOtherRegion}) {
      ASSERT_TRUE(conn_
                      ->exec("INSERT INTO regions (id, display_name, created_at) VALUES (?, ?, ?)",
                             {region, region, int64_t{1}})
                      .ok());
    }
  }

  std::shared_ptr<db::Pool> pool_;
  db::PooledConnection conn_;
};

TEST_F(TypedTableTest, SentinelWriteLeavesObservedColumnsAlone) {
  const auto table = makeSentinelTable();
  Resource r = minimalResource(sentinelCase(), "sen-1", kRegion);
  ASSERT_TRUE(Peer::write(*table, *conn_, r, 1, 1000).ok());
  auto row = conn_->query(
      "SELECT deploy_status, available_replicas, updated_replicas, ready_replicas,"
      " observed_generation, running_image, health, status_reported_at, config FROM sentinels");
  ASSERT_TRUE(row.ok()) << row.status();
  ASSERT_EQ(row->rows.size(), 1u);
  EXPECT_EQ(row->rows[0].str("deploy_status"), "idle");
  EXPECT_EQ(row->rows[0].i64("available_replicas"), 0);
  EXPECT_EQ(row->rows[0].str("health"), "unknown");
  EXPECT_TRUE(row->rows[0].isNull("running_image"));
  EXPECT_TRUE(row->rows[0].isNull("status_reported_at"));
  EXPECT_TRUE(row->rows[0].isNull("config")) << "no configuration is NULL";

  ASSERT_TRUE(
      conn_
          ->exec("UPDATE sentinels SET deploy_status = 'progressing', available_replicas = 1,"
                 " updated_replicas = 2, ready_replicas = 3, observed_generation = 4,"
                 " running_image = 'sentinel:0', health = 'healthy',"
                 " status_reported_at = 5")
          .ok());
  r.mutable_sentinel()->set_image("sentinel:9");
  r.mutable_sentinel()->set_desired_state(cluster::v1::SENTINEL_DESIRED_STATE_ARCHIVED);
  ASSERT_TRUE(Peer::write(*table, *conn_, r, 2, 2000).ok());
  ASSERT_TRUE(
      Peer::markDeleted(*table, *conn_, {"sentinel", "sen-1", std::string(kRegion)}, 3, 3000).ok());
  ASSERT_TRUE(Peer::write(*table, *conn_, r, 4, 4000).ok());
  row = conn_->query(
      "SELECT deploy_status, available_replicas, updated_replicas, ready_replicas,"
      " observed_generation, running_image, health, status_reported_at, image, desired_state"
      " FROM sentinels");
  ASSERT_TRUE(row.ok()) << row.status();
  const db::Row& x = row->rows[0];
  EXPECT_EQ(x.str("deploy_status"), "progressing");
  EXPECT_EQ(x.i64("available_replicas"), 1);
  EXPECT_EQ(x.i64("updated_replicas"), 2);
  EXPECT_EQ(x.i64("ready_replicas"), 3);
  EXPECT_EQ(x.i64("observed_generation"), 4);
  EXPECT_EQ(x.str("running_image"), "sentinel:0");
  EXPECT_EQ(x.str("health"), "healthy");
  EXPECT_EQ(x.i64("status_reported_at"), 5);
  EXPECT_EQ(x.str("image"), "sentinel:9");
  EXPECT_EQ(x.str("desired_state"), "archived");
}

TEST_F(TypedTableTest, JsonAsDeepAsValidationAllowsIsStored) {
  const auto sentinels = makeSentinelTable();
  Resource s = minimalResource(sentinelCase(), "sen-1", kRegion);
  s.mutable_sentinel()->set_config_json(nested(31));
  ASSERT_TRUE(sentinels->validate(s).ok()) << sentinels->validate(s);
  const absl::Status written = Peer::write(*sentinels, *conn_, s, 1, 1000);
  ASSERT_TRUE(written.ok()) << written;

  const auto policies = makeCiliumPolicyTable();
  Resource p = minimalResource(ciliumCase(), "pol-1", kRegion);
  p.mutable_cilium_network_policy()->set_policy_json(strCat("{\"a\":", nested(30), "}"));
  ASSERT_TRUE(policies->validate(p).ok()) << policies->validate(p);
  const absl::Status policy_written = Peer::write(*policies, *conn_, p, 1, 1000);
  ASSERT_TRUE(policy_written.ok()) << policy_written;
}

TEST_F(TypedTableTest, DeploymentTopologyColumnsHoldTheDocumentedJson) {
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
  ASSERT_TRUE(table->validate(r).ok()) << table->validate(r);
  ASSERT_TRUE(Peer::write(*table, *conn_, r, 1, 1000).ok());

  auto rows = conn_->query(
      "SELECT command, args, env, labels, healthcheck, autoscale_min_replicas,"
      " autoscale_max_replicas, autoscale_target_cpu_percent, desired_status, shutdown_signal"
      " FROM deployment_topology");
  ASSERT_TRUE(rows.ok()) << rows.status();
  const db::Row& row = rows->rows[0];
  using nlohmann::json;
  EXPECT_EQ(json::parse(row.str("command")), json::parse(R"(["/bin/app"])"));
  EXPECT_EQ(json::parse(row.str("args")), json::parse(R"(["--verbose"])"));
  EXPECT_EQ(json::parse(row.str("env")),
            json::parse(R"([{"name": "EMPTY", "value": ""}, {"name": "B", "value": "2"}])"));
  EXPECT_EQ(json::parse(row.str("labels")), json::parse(R"({"tier": "web"})"));
  EXPECT_EQ(json::parse(row.str("healthcheck")),
            json::parse(R"({"readiness": {"initialDelaySeconds": 5}})"));
  EXPECT_EQ(row.i64("autoscale_min_replicas"), 1);
  EXPECT_EQ(row.i64("autoscale_max_replicas"), 4);
  EXPECT_EQ(row.i64("autoscale_target_cpu_percent"), 60);
  EXPECT_EQ(row.str("desired_status"), "running");

  // Without autoscaling or lists, the columns are NULL.
  t->clear_command();
  t->clear_args();
  t->clear_env();
  t->clear_labels();
  t->clear_healthcheck();
  t->clear_autoscaling();
  ASSERT_TRUE(Peer::write(*table, *conn_, r, 2, 2000).ok());
  rows = conn_->query(
      "SELECT command IS NULL AND args IS NULL AND env IS NULL AND labels IS NULL AND"
      " healthcheck IS NULL AND autoscale_min_replicas IS NULL AND autoscale_max_replicas IS NULL"
      " AND autoscale_target_cpu_percent IS NULL FROM deployment_topology");
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(rows->rows[0].i64(0), 1);
}

TEST_F(TypedTableTest, DeploymentTopologyIsKeyedByIdAndRegion) {
  const auto table = makeDeploymentTopologyTable();
  Resource eu = minimalResource(deploymentTopologyCase(), "dep-1", kRegion);
  Resource us = minimalResource(deploymentTopologyCase(), "dep-1", kOtherRegion);
  us.mutable_deployment_topology()->set_image("app:us");
  ASSERT_TRUE(Peer::write(*table, *conn_, eu, 1, 1000).ok());
  ASSERT_TRUE(Peer::write(*table, *conn_, us, 2, 1000).ok());
  auto a = table->load(*conn_, {"deployment_topology", "dep-1", std::string(kRegion)});
  auto b = table->load(*conn_, {"deployment_topology", "dep-1", std::string(kOtherRegion)});
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(a->has_value() && b->has_value());
  EXPECT_EQ((*a)->resource.deployment_topology().image(), "app:1");
  EXPECT_EQ((*b)->resource.deployment_topology().image(), "app:us");
  EXPECT_EQ((*b)->resource.version(), 2u);
}

TEST_F(TypedTableTest, IdKeyedTablesMoveARevivedRowToTheNewRegion) {
  for (const TableCase& c : {sentinelCase(), ciliumCase()}) {
    SCOPED_TRACE(c.name);
    const auto table = c.make();
    ASSERT_TRUE(Peer::write(*table, *conn_, minimalResource(c, "x-1", kRegion), 1, 1000).ok());
    ASSERT_TRUE(
        Peer::markDeleted(*table, *conn_, {c.type, "x-1", std::string(kRegion)}, 2, 2000).ok());
    ASSERT_TRUE(Peer::write(*table, *conn_, minimalResource(c, "x-1", kOtherRegion), 3, 3000).ok());
    auto old_place = table->load(*conn_, {c.type, "x-1", std::string(kRegion)});
    ASSERT_TRUE(old_place.ok());
    EXPECT_FALSE(old_place->has_value());
    auto new_place = table->load(*conn_, {c.type, "x-1", std::string(kOtherRegion)});
    ASSERT_TRUE(new_place.ok());
    ASSERT_TRUE(new_place->has_value());
    EXPECT_FALSE((*new_place)->deleted);
    EXPECT_EQ((*new_place)->resource.region(), kOtherRegion);
    EXPECT_EQ((*new_place)->resource.version(), 3u);
  }
}

}  // namespace
}  // namespace krane::feed
