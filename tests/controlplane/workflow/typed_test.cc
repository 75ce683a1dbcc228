// Typed handlers, calls, state and results over protobuf messages (controlplane/workflow/typed.h),
// with the well-known protobuf types standing in for a service's messages.
#include "controlplane/workflow/typed.h"

#include <atomic>

#include <catch2/catch.hpp>
#include <google/protobuf/source_context.pb.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/wrappers.pb.h>

#include "tests/controlplane/workflow/fixture.h"
#include "tests/support/matchers.h"

namespace krane::workflow {
namespace {

using google::protobuf::SourceContext;
using google::protobuf::StringValue;
using google::protobuf::Struct;
using namespace std::chrono_literals;

Struct greeting(const std::string& name, double times) {
  Struct s;
  (*s.mutable_fields())["name"].set_string_value(name);
  (*s.mutable_fields())["times"].set_number_value(times);
  return s;
}

StringValue text(std::string v) {
  StringValue s;
  s.set_value(std::move(v));
  return s;
}

class TypedTest : public WorkflowTest {
 protected:
  Engine& start() {
    return engine([&](Engine& e) {
      Handler echo = typed<SourceContext, StringValue>(
          [](Context&, const SourceContext& in) -> absl::StatusOr<StringValue> {
            if (in.file_name() == "bad") {
              return terminalError(absl::StatusCode::kInvalidArgument, "file_name: bad");
            }
            return text("echo " + in.file_name());
          });
      REQUIRE_THAT(e.registerService(ServiceDefinition::service("Echo").handler("h", echo)),
                   IsOk());
      Handler greet = typed<Struct, StringValue>(
          [&](Context& ctx, const Struct& in) -> absl::StatusOr<StringValue> {
            ++runs_;
            const std::string name = in.fields().at("name").string_value();
            // A message through run(), state and a suspension (the timer).
            auto stamped = run<StringValue>(ctx, "stamp", [&]() -> absl::StatusOr<StringValue> {
              ++stamps_;
              return text("stamp-" + name);
            });
            if (!stamped.ok()) return stamped.status();
            auto seen = getState<Struct>(ctx, "last");
            if (!seen.ok()) return seen.status();
            setState(ctx, "last", in);
            if (auto slept = ctx.sleep(20ms); !slept.ok()) return slept;
            std::vector<TypedFuture<StringValue>> calls;
            for (const char* f : {"a", "bad", "c"}) {
              SourceContext req;
              req.set_file_name(f);
              calls.push_back(call<StringValue>(ctx, "Echo", "h", "", req));
            }
            auto all = awaitAll(ctx, calls);
            if (!all.ok()) return all.status();
            std::string out = stamped->value() + " previous=" +
                              (*seen ? (**seen).fields().at("name").string_value() : "none");
            for (const auto& r : *all) {
              out += " | " + (r.ok() ? r->value() : messageOf(r.status()));
            }
            return text(out);
          });
      REQUIRE_THAT(
          e.registerService(ServiceDefinition::virtualObject("Greeter").exclusive("greet", greet)),
          IsOk());
    });
  }
  std::atomic<int> runs_{0}, stamps_{0};
};

TEST_CASE_METHOD(TypedTest, "typed handlers take and return messages", "[typed]") {
  Engine& e = start();
  auto first = resultAs<StringValue>(
      e.call(invocation("Greeter", "greet", "ws-1", greeting("ada", 2)), 20s));
  REQUIRE_THAT(first, IsOk());
  CHECK(first->value() == "stamp-ada previous=none | echo a | file_name: bad | echo c");
  CHECK(stamps_.load() == 1);  // journaled: the replays after the sleep did not run it again
  CHECK(runs_.load() >= 2);

  auto second = resultAs<StringValue>(
      e.call(invocation("Greeter", "greet", "ws-1", greeting("bob", 1)), 20s));
  REQUIRE_THAT(second, IsOk());
  CHECK_THAT(second->value(), Catch::StartsWith("stamp-bob previous=ada |"));
}

TEST_CASE_METHOD(TypedTest, "payloads are readable JSON with the proto field names", "[typed]") {
  SourceContext req;
  req.set_file_name("x.yaml");
  CHECK(encodeMessage(req) == R"({"file_name":"x.yaml"})");
  CHECK(encodeMessage(SourceContext()) == "{}");
  // An empty payload is the empty message; fields a newer version added are ignored.
  auto empty = decodeAs<SourceContext>("", "input");
  REQUIRE_THAT(empty, IsOk());
  CHECK(empty->file_name().empty());
  auto newer = decodeAs<SourceContext>(R"({"file_name":"y","added_later":{"n":1}})", "input");
  REQUIRE_THAT(newer, IsOk());
  CHECK(newer->file_name() == "y");
}

TEST_CASE_METHOD(TypedTest, "an input that is not the message is a terminal error naming it",
                 "[typed]") {
  Engine& e = start();
  InvokeRequest raw{"Echo", "h", "", "not json"};
  auto r = e.call(raw, 20s);
  REQUIRE_FALSE(r.ok());
  CHECK(isTerminal(r.status()));
  CHECK(absl::IsInvalidArgument(r.status()));
  CHECK_THAT(messageOf(r.status()),
             Catch::StartsWith("input: not a valid google.protobuf.SourceContext"));

  InvokeRequest wrong_type{"Echo", "h", "", R"({"file_name": 7})"};
  auto w = e.call(wrong_type, 20s);
  CHECK_THAT(messageOf(w.status()), Catch::Contains("input: not a valid"));

  // A result that is not the expected message is refused the same way.
  auto as_struct = resultAs<Struct>(absl::StatusOr<std::string>(std::string("[1,2]")));
  CHECK_THAT(as_struct, IsError(absl::StatusCode::kInvalidArgument));
  CHECK_THAT(messageOf(as_struct.status()),
             Catch::StartsWith("result: not a valid google.protobuf.Struct"));
}

}  // namespace
}  // namespace krane::workflow
