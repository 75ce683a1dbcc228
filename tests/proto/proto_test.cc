// Tests of Krane's protobuf messages (//proto).
//
// RoundTrip: messages with every field set, a Resource of every kind in particular, survive the
// binary and the JSON encoding unchanged.
//
// FieldNumbers: guards wire compatibility. field_numbers.golden lists every field of every
// message in Krane's .proto files as `message field number type`, and every enum value as
// `enum VALUE number enum_value`. The test fails, naming the field, when an entry is missing
// or its number or type changed. A field retired properly (its number and name both
// `reserved`) is accepted, and so is a singular scalar that gains `optional` (the same bytes on
// the wire; the golden then records it as optional). Fields not in the golden yet are accepted and
// listed in the log.
//
// To record added fields in the golden, run from the workspace:
//
//   KRANE_UPDATE_FIELD_NUMBERS=1 bazel run //tests/proto:proto_test
//
// This rewrites tests/proto/field_numbers.golden from the compiled descriptors. It refuses to
// while any existing entry would change, so the golden only ever grows. Outside `bazel run`
// (no BUILD_WORKSPACE_DIRECTORY) it prints the listing to stdout instead.
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>
#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>
#include <google/protobuf/message.h>
#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/message_differencer.h>

#include "krane/api/v1/agents.pb.h"
#include "krane/api/v1/deployments.pb.h"
#include "krane/api/v1/resources.pb.h"
#include "krane/api/v1/rollouts.pb.h"
#include "krane/api/v1/sentinels.pb.h"
#include "krane/api/v1/tenancy.pb.h"
#include "krane/api/v1/workflows.pb.h"
#include "krane/cluster/v1/cluster.pb.h"
#include "krane/cluster/v1/state.pb.h"
#include "krane/plugin/v1/plugin.pb.h"
#include "krane/services/v1/build.pb.h"
#include "krane/services/v1/buildslot.pb.h"
#include "krane/services/v1/deploy.pb.h"
#include "krane/services/v1/deployment.pb.h"
#include "krane/services/v1/routing.pb.h"
#include "krane/services/v1/sentinel.pb.h"
#include "tests/support/matchers.h"

namespace krane {
namespace {

namespace pb = google::protobuf;

constexpr char kUpdateEnv[] = "KRANE_UPDATE_FIELD_NUMBERS";
constexpr char kGoldenPath[] = "tests/proto/field_numbers.golden";
constexpr char kUpdateCommand[] = "KRANE_UPDATE_FIELD_NUMBERS=1 bazel run //tests/proto:proto_test";

// The files the tests cover. Reaching each through one of its generated types also keeps the
// linker from dropping a file's descriptor.
std::vector<const pb::FileDescriptor*> KraneFiles() {
  return {
      cluster::v1::Resource::descriptor()->file(),
      cluster::v1::WatchEvent::descriptor()->file(),
      api::v1::PutResourceRequest::descriptor()->file(),
      api::v1::ListAgentsRequest::descriptor()->file(),
      api::v1::CreateDeploymentRequest::descriptor()->file(),
      api::v1::CreateWorkspaceRequest::descriptor()->file(),
      api::v1::ListInvocationsRequest::descriptor()->file(),
      plugin::v1::Frame::descriptor()->file(),
      services::v1::BuildRequest::descriptor()->file(),
      services::v1::BuildSlots::descriptor()->file(),
      services::v1::DeployRequest::descriptor()->file(),
      services::v1::ScheduleDesiredStateRequest::descriptor()->file(),
      services::v1::SwapLiveRequest::descriptor()->file(),
      services::v1::SentinelRollout::descriptor()->file(),
      api::v1::StartSentinelRolloutRequest::descriptor()->file(),
      api::v1::ListSentinelsRequest::descriptor()->file(),
  };
}

void CollectMessages(const pb::Descriptor* d, std::vector<const pb::Descriptor*>& out) {
  if (d->options().map_entry()) return;
  out.push_back(d);
  for (int i = 0; i < d->nested_type_count(); ++i) CollectMessages(d->nested_type(i), out);
}

std::vector<const pb::Descriptor*> KraneMessages() {
  std::vector<const pb::Descriptor*> out;
  for (const pb::FileDescriptor* file : KraneFiles()) {
    for (int i = 0; i < file->message_type_count(); ++i) {
      CollectMessages(file->message_type(i), out);
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Round trips

// Sets every field of a message, recursively, each to a different value. Repeated fields and
// maps get two elements. In each oneof of the outermost message it sets the member given in
// `choices`, else (and in every nested message) the first.
class Filler {
 public:
  using Choices = std::map<const pb::OneofDescriptor*, const pb::FieldDescriptor*>;

  explicit Filler(Choices choices = {}) : choices_(std::move(choices)) {}

  void Fill(pb::Message& message, int depth = 0) {
    INFO("messages nest too deep (recursive type?) at " << message.GetDescriptor()->full_name());
    REQUIRE(depth < 10);
    const pb::Descriptor* d = message.GetDescriptor();
    for (int i = 0; i < d->field_count(); ++i) {
      const pb::FieldDescriptor* field = d->field(i);
      if (const pb::OneofDescriptor* oneof = field->real_containing_oneof()) {
        // Only the outermost message takes the choice: a message nested in itself (a batch of
        // WatchEvents) takes the first member inside, which ends the recursion.
        auto chosen = depth == 0 ? choices_.find(oneof) : choices_.end();
        if (field != (chosen != choices_.end() ? chosen->second : oneof->field(0))) continue;
      }
      if (field->is_repeated()) {
        Set(message, field, depth, /*add=*/true);
        Set(message, field, depth, /*add=*/true);
      } else {
        Set(message, field, depth, /*add=*/false);
      }
    }
  }

 private:
  void Set(pb::Message& m, const pb::FieldDescriptor* f, int depth, bool add) {
    const pb::Reflection* r = m.GetReflection();
    const uint32_t n = next_++;
    switch (f->cpp_type()) {
      case pb::FieldDescriptor::CPPTYPE_INT32:
        add ? r->AddInt32(&m, f, -static_cast<int32_t>(n))
            : r->SetInt32(&m, f, -static_cast<int32_t>(n));
        break;
      case pb::FieldDescriptor::CPPTYPE_INT64:
        add ? r->AddInt64(&m, f, -(int64_t{1} << 40) - n)
            : r->SetInt64(&m, f, -(int64_t{1} << 40) - n);
        break;
      case pb::FieldDescriptor::CPPTYPE_UINT32:
        add ? r->AddUInt32(&m, f, n) : r->SetUInt32(&m, f, n);
        break;
      case pb::FieldDescriptor::CPPTYPE_UINT64:
        add ? r->AddUInt64(&m, f, (uint64_t{1} << 40) + n)
            : r->SetUInt64(&m, f, (uint64_t{1} << 40) + n);
        break;
      case pb::FieldDescriptor::CPPTYPE_DOUBLE:
        add ? r->AddDouble(&m, f, n + 0.5) : r->SetDouble(&m, f, n + 0.5);
        break;
      case pb::FieldDescriptor::CPPTYPE_FLOAT:
        add ? r->AddFloat(&m, f, n + 0.5f) : r->SetFloat(&m, f, n + 0.5f);
        break;
      case pb::FieldDescriptor::CPPTYPE_BOOL:
        add ? r->AddBool(&m, f, true) : r->SetBool(&m, f, true);
        break;
      case pb::FieldDescriptor::CPPTYPE_ENUM: {
        // Any value but the zero default, which would not be serialized.
        const pb::EnumDescriptor* e = f->enum_type();
        const pb::EnumValueDescriptor* v =
            e->value(e->value_count() > 1 ? 1 + n % (e->value_count() - 1) : 0);
        add ? r->AddEnum(&m, f, v) : r->SetEnum(&m, f, v);
        break;
      }
      case pb::FieldDescriptor::CPPTYPE_STRING: {
        std::string value = f->name() + "-" + std::to_string(n);
        if (f->type() == pb::FieldDescriptor::TYPE_BYTES) value += std::string("\0\xff\x80", 3);
        add ? r->AddString(&m, f, value) : r->SetString(&m, f, value);
        break;
      }
      case pb::FieldDescriptor::CPPTYPE_MESSAGE:
        Fill(add ? *r->AddMessage(&m, f) : *r->MutableMessage(&m, f), depth + 1);
        break;
    }
  }

  Choices choices_;
  uint32_t next_ = 1;
};

// Number of fields a message can have set at once: one per oneof.
int SettableFieldCount(const pb::Descriptor* d) {
  int count = 0;
  for (int i = 0; i < d->field_count(); ++i) {
    const pb::OneofDescriptor* oneof = d->field(i)->real_containing_oneof();
    if (oneof == nullptr || oneof->field(0) == d->field(i)) ++count;
  }
  return count;
}

void ExpectRoundTrips(const pb::Message& original) {
  INFO(original.GetDescriptor()->full_name());

  std::string wire;
  REQUIRE(original.SerializeToString(&wire));
  std::unique_ptr<pb::Message> parsed(original.New());
  REQUIRE(parsed->ParseFromString(wire));
  INFO("binary round trip changed the message:\n"
       << original.DebugString() << "---\n"
       << parsed->DebugString());
  CHECK(pb::util::MessageDifferencer::Equals(original, *parsed));

  std::string json;
  REQUIRE_THAT(pb::util::MessageToJsonString(original, &json), IsOk());
  std::unique_ptr<pb::Message> from_json(original.New());
  const auto status = pb::util::JsonStringToMessage(json, from_json.get());
  INFO(status.ToString() << "\n" << json);
  REQUIRE_THAT(status, IsOk());
  INFO("JSON round trip changed the message:\n" << json);
  CHECK(pb::util::MessageDifferencer::Equals(original, *from_json));
}

constexpr char kGenericType[] = "example.krane.dev/Bucket";

TEST_CASE("resource of every kind", "[round-trip]") {
  const pb::OneofDescriptor* kind = cluster::v1::Resource::descriptor()->FindOneofByName("kind");
  REQUIRE(kind != nullptr);
  REQUIRE(kind->field_count() == 4);

  for (int i = 0; i < kind->field_count(); ++i) {
    const pb::FieldDescriptor* member = kind->field(i);
    INFO(member->name());

    cluster::v1::Resource resource;
    Filler({{kind, member}}).Fill(resource);
    // The envelope's type names the kind: the member's name for well-known types, the
    // plugin's own type for generic resources.
    if (member->number() == cluster::v1::Resource::kGenericFieldNumber) {
      resource.set_type(kGenericType);
      resource.mutable_generic()->set_type(kGenericType);
    } else {
      resource.set_type(member->name());
    }
    REQUIRE(resource.kind_case() == member->number());

    const pb::Message& payload = resource.GetReflection()->GetMessage(resource, member);
    std::vector<const pb::FieldDescriptor*> set;
    payload.GetReflection()->ListFields(payload, &set);
    INFO("not every field of " << payload.GetDescriptor()->full_name() << " is set");
    CHECK(static_cast<int>(set.size()) == SettableFieldCount(payload.GetDescriptor()));

    ExpectRoundTrips(resource);

    std::string wire;
    REQUIRE(resource.SerializeToString(&wire));
    cluster::v1::Resource parsed;
    REQUIRE(parsed.ParseFromString(wire));
    CHECK(parsed.kind_case() == member->number());
    CHECK(parsed.type() == resource.type());
  }
}

TEST_CASE("well known type names match the kind members", "[round-trip]") {
  const pb::Descriptor* d = cluster::v1::Resource::descriptor();
  for (const char* type : {"deployment_topology", "sentinel", "cilium_network_policy"}) {
    const pb::FieldDescriptor* member = d->FindFieldByName(type);
    INFO(type);
    REQUIRE(member != nullptr);
    INFO(type);
    REQUIRE(member->real_containing_oneof() != nullptr);
    INFO(type);
    CHECK(member->real_containing_oneof()->name() == "kind");
  }
}

// Every message of every file, once per member of each of its oneofs.
TEST_CASE("every message with every oneof member", "[round-trip]") {
  const std::vector<const pb::Descriptor*> messages = KraneMessages();
  REQUIRE(messages.size() > 40u);
  for (const pb::Descriptor* d : messages) {
    const pb::Message* prototype = pb::MessageFactory::generated_factory()->GetPrototype(d);
    INFO(d->full_name());
    REQUIRE(prototype != nullptr);

    std::vector<Filler::Choices> variants = {{}};
    for (int o = 0; o < d->real_oneof_decl_count(); ++o) {
      const pb::OneofDescriptor* oneof = d->oneof_decl(o);
      for (int i = 1; i < oneof->field_count(); ++i) variants.push_back({{oneof, oneof->field(i)}});
    }
    for (const Filler::Choices& choices : variants) {
      std::unique_ptr<pb::Message> message(prototype->New());
      Filler(choices).Fill(*message);
      ExpectRoundTrips(*message);
    }
  }
}

TEST_CASE("plugin frame carries a change", "[round-trip]") {
  plugin::v1::Frame frame;
  plugin::v1::Event& event = *frame.mutable_event();
  event.set_sequence(7);
  event.set_attempt(1);
  cluster::v1::Change& change = *event.mutable_change();
  change.set_op(cluster::v1::CHANGE_OP_APPLY);
  change.set_version(42);
  cluster::v1::Resource& resource = *change.mutable_resource();
  resource.set_type("sentinel");
  resource.set_id("snt_1");
  resource.set_region("eu-central-1");
  resource.set_version(42);
  resource.mutable_sentinel()->set_image("sentinel:v2");

  std::string wire;
  REQUIRE(frame.SerializeToString(&wire));
  plugin::v1::Frame parsed;
  REQUIRE(parsed.ParseFromString(wire));
  REQUIRE(parsed.body_case() == plugin::v1::Frame::kEvent);
  CHECK(parsed.event().change().resource().sentinel().image() == "sentinel:v2");
  CHECK(parsed.event().change().version() == 42u);
}

// ---------------------------------------------------------------------------------------------
// Field numbers

struct Entry {
  std::string scope;  // full name of the message or enum
  std::string name;   // field or enum value
  int number = 0;
  std::string type;
};

using Key = std::pair<std::string, std::string>;

std::string TypeOf(const pb::FieldDescriptor* f) {
  if (f->is_map()) {
    return "map<" + TypeOf(f->message_type()->map_key()) + "," +
           TypeOf(f->message_type()->map_value()) + ">";
  }
  std::string base;
  switch (f->type()) {
    case pb::FieldDescriptor::TYPE_MESSAGE:
    case pb::FieldDescriptor::TYPE_GROUP:
      base = "message:" + f->message_type()->full_name();
      break;
    case pb::FieldDescriptor::TYPE_ENUM:
      base = "enum:" + f->enum_type()->full_name();
      break;
    default:
      base = f->type_name();
  }
  if (f->is_repeated()) return "repeated:" + base;
  if (f->has_optional_keyword()) return "optional:" + base;
  if (const pb::OneofDescriptor* oneof = f->real_containing_oneof()) {
    return "oneof(" + oneof->name() + "):" + base;
  }
  return base;
}

void ListEnum(const pb::EnumDescriptor* e, std::vector<Entry>& out) {
  for (int i = 0; i < e->value_count(); ++i) {
    out.push_back({e->full_name(), e->value(i)->name(), e->value(i)->number(), "enum_value"});
  }
}

void ListMessage(const pb::Descriptor* d, std::vector<Entry>& out) {
  if (d->options().map_entry()) return;
  for (int i = 0; i < d->field_count(); ++i) {
    const pb::FieldDescriptor* f = d->field(i);
    out.push_back({d->full_name(), f->name(), f->number(), TypeOf(f)});
  }
  for (int i = 0; i < d->enum_type_count(); ++i) ListEnum(d->enum_type(i), out);
  for (int i = 0; i < d->nested_type_count(); ++i) ListMessage(d->nested_type(i), out);
}

// Every field and enum value of Krane's files, in declaration order.
std::vector<Entry> CurrentListing() {
  std::vector<Entry> out;
  for (const pb::FileDescriptor* file : KraneFiles()) {
    for (int i = 0; i < file->enum_type_count(); ++i) ListEnum(file->enum_type(i), out);
    for (int i = 0; i < file->message_type_count(); ++i) ListMessage(file->message_type(i), out);
  }
  return out;
}

std::string Render(const std::vector<Entry>& entries) {
  std::ostringstream out;
  out << "# Field and enum-value numbers of Krane's .proto files: `scope name number type`.\n"
      << "# Checked by //tests/proto:proto_test. Entries are only ever added; after adding fields "
         "run\n"
      << "#   " << kUpdateCommand << "\n";
  for (const Entry& e : entries) {
    out << e.scope << ' ' << e.name << ' ' << e.number << ' ' << e.type << '\n';
  }
  return out.str();
}

// Reads a golden file; a missing file reads as empty. Malformed lines are test failures.
std::vector<Entry> ReadGolden(const std::string& path, bool* found) {
  std::vector<Entry> entries;
  std::ifstream in(path);
  *found = in.good();
  std::string line;
  for (int line_number = 1; std::getline(in, line); ++line_number) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    Entry e;
    std::string extra;
    if (!(fields >> e.scope >> e.name >> e.number >> e.type) || (fields >> extra)) {
      FAIL_CHECK(path << ":" << line_number
                      << ": expected `scope name number type`, got: " << line);
      continue;
    }
    entries.push_back(e);
  }
  return entries;
}

struct Diff {
  std::vector<std::string> breaks;     // one message per changed or missing entry
  std::vector<std::string> additions;  // "scope.name" of entries not in the golden
};

// Whether `scope` retired `name` and `number` properly: both listed as reserved.
bool IsRetired(const std::string& scope, const std::string& name, int number) {
  const pb::DescriptorPool* pool = pb::DescriptorPool::generated_pool();
  if (const pb::Descriptor* d = pool->FindMessageTypeByName(scope)) {
    return d->IsReservedNumber(number) && d->IsReservedName(name);
  }
  if (const pb::EnumDescriptor* e = pool->FindEnumTypeByName(scope)) {
    return e->IsReservedNumber(number) && e->IsReservedName(name);
  }
  return false;
}

Diff Compare(const std::vector<Entry>& golden, const std::vector<Entry>& current) {
  std::map<Key, const Entry*> by_name;
  std::map<std::pair<std::string, int>, const Entry*> by_number;
  for (const Entry& e : current) {
    by_name[{e.scope, e.name}] = &e;
    by_number[{e.scope, e.number}] = &e;
  }

  Diff diff;
  std::map<Key, bool> in_golden;
  for (const Entry& g : golden) {
    in_golden[{g.scope, g.name}] = true;
    const std::string where = g.scope + "." + g.name;
    auto now = by_name.find({g.scope, g.name});
    if (now == by_name.end()) {
      if (IsRetired(g.scope, g.name, g.number)) continue;
      auto reuse = by_number.find({g.scope, g.number});
      if (reuse != by_number.end()) {
        diff.breaks.push_back(where + " (number " + std::to_string(g.number) + ", " + g.type +
                              ") is gone and its number is now used by `" + reuse->second->name +
                              "`: a number is never reused.");
      } else {
        diff.breaks.push_back(where + " (number " + std::to_string(g.number) + ", " + g.type +
                              ") is gone: never remove or rename a field or enum value; to retire "
                              "one, reserve both its number and its name.");
      }
      continue;
    }
    const Entry& c = *now->second;
    if (c.number != g.number) {
      diff.breaks.push_back(where + ": number changed from " + std::to_string(g.number) + " to " +
                            std::to_string(c.number) + ": never renumber; put " +
                            std::to_string(g.number) + " back.");
    }
    // A singular scalar that gains `optional` keeps its wire form (only presence is tracked).
    const bool gained_optional = c.type == "optional:" + g.type &&
                                 g.type.find(':') == std::string::npos &&
                                 g.type.find('<') == std::string::npos;
    if (c.type != g.type && !gained_optional) {
      diff.breaks.push_back(where + " (number " + std::to_string(g.number) +
                            "): type changed from " + g.type + " to " + c.type +
                            ": add a new field with a new number instead.");
    }
  }
  for (const Entry& c : current) {
    if (!in_golden.count({c.scope, c.name})) diff.additions.push_back(c.scope + "." + c.name);
  }
  return diff;
}

std::string RunfilesGoldenPath() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  if (srcdir == nullptr) return kGoldenPath;  // run by hand from the workspace root
  return std::string(srcdir) + "/" + (workspace != nullptr ? workspace : "krane") + "/" +
         kGoldenPath;
}

void UpdateGolden(const std::vector<Entry>& current) {
  const char* workspace_dir = std::getenv("BUILD_WORKSPACE_DIRECTORY");
  if (workspace_dir == nullptr) {
    std::cout << Render(current);
    return;
  }
  const std::string path = std::string(workspace_dir) + "/" + kGoldenPath;
  bool found = false;
  const std::vector<Entry> golden = ReadGolden(path, &found);
  const Diff diff = Compare(golden, current);
  for (const std::string& b : diff.breaks) FAIL_CHECK(b);
  if (!diff.breaks.empty()) {
    FAIL_CHECK("not rewriting "
               << path
               << ": existing entries would change (see above). The golden only ever grows.");
    return;
  }
  std::ofstream out(path, std::ios::trunc);
  out << Render(current);
  out.close();
  INFO("cannot write " << path);
  REQUIRE(out.good());
  std::cout << "wrote " << path << ": " << current.size() << " entries, " << diff.additions.size()
            << " new\n";
}

TEST_CASE("match the golden", "[field-numbers]") {
  const std::vector<Entry> current = CurrentListing();
  if (std::getenv(kUpdateEnv) != nullptr) {
    UpdateGolden(current);
    return;
  }

  const std::string path = RunfilesGoldenPath();
  bool found = false;
  const std::vector<Entry> golden = ReadGolden(path, &found);
  INFO("cannot read " << path);
  REQUIRE(found);
  INFO(path << " has no entries; create it with: " << kUpdateCommand);
  REQUIRE_FALSE(golden.empty());

  const Diff diff = Compare(golden, current);
  for (const std::string& b : diff.breaks) FAIL_CHECK(b);
  if (!diff.breaks.empty()) {
    FAIL_CHECK(
        "Field numbers and types are part of the wire format that agents, plugins and "
        "stored payloads rely "
        "on: restore the entries above instead of editing "
        << kGoldenPath << ". Regenerate the golden only after adding fields: " << kUpdateCommand);
  }
  if (!diff.additions.empty()) {
    std::cout << diff.additions.size() << " field(s) not yet recorded in " << kGoldenPath
              << " (first: " << diff.additions.front() << "); record them with: " << kUpdateCommand
              << "\n";
  }
}

// The guard itself: it must catch a renumbered, retyped, removed or reused field.
TEST_CASE("compare catches every kind of change", "[field-numbers]") {
  const std::vector<Entry> golden = {
      {"krane.test.M", "a", 1, "string"},
      {"krane.test.M", "b", 2, "uint64"},
      {"krane.test.M", "c", 3, "bool"},
      {"krane.test.M", "d", 4, "string"},
  };
  const std::vector<Entry> current = {
      {"krane.test.M", "a", 5, "string"},  // renumbered
      {"krane.test.M", "b", 2, "int64"},   // retyped
      // c removed
      {"krane.test.M", "e", 4, "string"},  // d renamed: number 4 reused
      {"krane.test.M", "f", 6, "bytes"},   // added
  };
  const Diff diff = Compare(golden, current);
  REQUIRE(diff.breaks.size() == 4u);
  INFO(diff.breaks[0]);
  CHECK(diff.breaks[0].find("krane.test.M.a: number changed from 1 to 5") != std::string::npos);
  INFO(diff.breaks[1]);
  CHECK(diff.breaks[1].find("krane.test.M.b (number 2): type changed from uint64 to int64") !=
        std::string::npos);
  INFO(diff.breaks[2]);
  CHECK(diff.breaks[2].find("krane.test.M.c (number 3, bool) is gone") != std::string::npos);
  INFO(diff.breaks[3]);
  CHECK(diff.breaks[3].find("now used by `e`") != std::string::npos);
  REQUIRE(diff.additions.size() == 2u);
  CHECK(diff.additions[0] == "krane.test.M.e");
  CHECK(diff.additions[1] == "krane.test.M.f");

  CHECK(Compare(golden, golden).breaks.empty());
  CHECK(Compare(golden, golden).additions.empty());
}

TEST_CASE("a scalar may gain optional, nothing else may change its label", "[field-numbers]") {
  const std::vector<Entry> golden = {
      {"krane.test.M", "a", 1, "uint32"},
      {"krane.test.M", "b", 2, "optional:uint32"},
      {"krane.test.M", "c", 3, "message:krane.test.N"},
      {"krane.test.M", "d", 4, "string"},
  };
  const std::vector<Entry> current = {
      {"krane.test.M", "a", 1, "optional:uint32"},                // same wire form: accepted
      {"krane.test.M", "b", 2, "uint32"},                         // loses presence: refused
      {"krane.test.M", "c", 3, "repeated:message:krane.test.N"},  // refused
      {"krane.test.M", "d", 4, "optional:bytes"},                 // another type: refused
  };
  const Diff diff = Compare(golden, current);
  REQUIRE(diff.breaks.size() == 3u);
  CHECK(diff.breaks[0].find("krane.test.M.b") != std::string::npos);
  CHECK(diff.breaks[1].find("krane.test.M.c") != std::string::npos);
  CHECK(diff.breaks[2].find("krane.test.M.d") != std::string::npos);
}

TEST_CASE("types name labels and targets", "[field-numbers]") {
  const pb::Descriptor* topology = cluster::v1::DeploymentTopology::descriptor();
  CHECK(TypeOf(topology->FindFieldByName("command")) == "repeated:string");
  CHECK(TypeOf(topology->FindFieldByName("labels")) == "map<string,string>");
  CHECK(TypeOf(topology->FindFieldByName("healthcheck")) == "message:krane.cluster.v1.Healthcheck");
  CHECK(TypeOf(topology->FindFieldByName("desired_status")) ==
        "enum:krane.cluster.v1.DesiredStatus");
  CHECK(TypeOf(cluster::v1::Resource::descriptor()->FindFieldByName("sentinel")) ==
        "oneof(kind):message:krane.cluster.v1.Sentinel");
  CHECK(TypeOf(cluster::v1::Instance::descriptor()->FindFieldByName("cpu_millicores")) ==
        "optional:uint32");
}

}  // namespace
}  // namespace krane
