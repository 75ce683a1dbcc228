// Builders with real processes: a prebuilt image is checked and recorded; a build command runs
// without a shell in its directory with the KRANE_ variables, its output kept in a log; a failing
// build quotes its log, a build past its timeout is stopped with everything it started, and bad
// requests are refused naming the field.
#include "controlplane/services/builder/builder.h"

#include <signal.h>
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include <catch2/catch.hpp>

#include "controlplane/workflow/service.h"
#include "tests/support/matchers.h"

namespace krane::services::builder {
namespace {

std::string messageOf(const absl::Status& s) { return std::string(s.message()); }

std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class BuilderTest {
 protected:
  BuilderTest() {
    const char* tmp = std::getenv("TEST_TMPDIR");
    dir_ = std::filesystem::path(tmp != nullptr ? tmp : "/tmp") /
           ("builder-" + std::to_string(::getpid()) + "-" + std::to_string(++counter_));
    std::filesystem::create_directories(dir_ / "src");
  }
  ~BuilderTest() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  CommandBuilder builder() {
    return CommandBuilder({.log_dir = dir_ / "logs",
                           .default_timeout = std::chrono::seconds(60),
                           .kill_grace = std::chrono::milliseconds(200),
                           .tail_lines = 3});
  }
  BuildRequest shell(const std::string& script, uint32_t timeout_seconds = 0) {
    BuildRequest r;
    r.set_deployment_id("dep_1");
    r.set_commit_sha("abc123");
    auto* c = r.mutable_command();
    c->add_argv("/bin/sh");
    c->add_argv("-c");
    c->add_argv(script);
    c->set_working_dir((dir_ / "src").string());
    c->set_image_name("demo-app");
    c->set_timeout_seconds(timeout_seconds);
    return r;
  }

  static inline int counter_ = 0;
  std::filesystem::path dir_;
};

TEST_CASE_METHOD(BuilderTest, "a prebuilt image is checked and recorded", "[builder]") {
  PrebuiltBuilder prebuilt;
  BuildRequest r;
  r.set_image("registry.example.com/app:v2");
  auto built = prebuilt.build(r);
  REQUIRE_THAT(built, IsOk());
  CHECK(built->image() == "registry.example.com/app:v2");
  CHECK(built->builder() == "prebuilt");
  CHECK(built->log_path().empty());
  r.set_image("");
  CHECK_THAT(messageOf(prebuilt.build(r).status()), Catch::Equals("image: required"));
  r.set_image("app v2");
  CHECK_THAT(messageOf(prebuilt.build(r).status()), Catch::StartsWith("image: must not contain"));
  CHECK(workflow::isTerminal(prebuilt.build(r).status()));
}

TEST_CASE_METHOD(BuilderTest, "a build command runs in its directory and its output is kept",
                 "[builder]") {
  CommandBuilder command = builder();
  auto built = command.build(
      shell("echo building $KRANE_DEPLOYMENT_ID at $KRANE_COMMIT_SHA; echo warning >&2;"
            " echo \"$KRANE_IMAGE\" > produced.txt"));
  REQUIRE_THAT(built, IsOk());
  CHECK(built->image() == "demo-app:abc123");
  CHECK(built->builder() == "command");
  CHECK(built->log_path() == (dir_ / "logs" / "dep_1.log").string());
  CHECK(slurp(built->log_path()) == "building dep_1 at abc123\nwarning\n");
  CHECK(slurp(dir_ / "src" / "produced.txt") == "demo-app:abc123\n");

  // Without a commit the deployment id is the tag.
  BuildRequest no_commit = shell("true");
  no_commit.clear_commit_sha();
  CHECK(command.build(no_commit)->image() == "demo-app:dep_1");
}

TEST_CASE_METHOD(BuilderTest, "a failing build quotes the end of its log", "[builder]") {
  CommandBuilder command = builder();
  auto failed = command.build(shell("echo one; echo two; echo three; echo boom >&2; exit 3"));
  REQUIRE_FALSE(failed.ok());
  CHECK(failed.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(workflow::isTerminal(failed.status()));
  const std::string message = messageOf(failed.status());
  CHECK_THAT(message, Catch::Contains("build of dep_1 failed: '/bin/sh' exited with status 3"));
  INFO(message);
  CHECK_THAT(message, Catch::EndsWith("two\nthree\nboom\n"));  // the last three lines
  CHECK_THAT(message, !Catch::Contains("one\n"));
}

TEST_CASE_METHOD(BuilderTest, "a build past its timeout is stopped with what it started",
                 "[builder]") {
  CommandBuilder command = builder();
  const auto started = std::chrono::steady_clock::now();
  auto late = command.build(shell("sleep 30 & echo $! > bg.pid; echo waiting; wait", 1));
  const auto took = std::chrono::steady_clock::now() - started;
  REQUIRE_FALSE(late.ok());
  CHECK(late.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK_THAT(messageOf(late.status()), Catch::Contains("timed out after 1 s"));
  CHECK_THAT(messageOf(late.status()), Catch::Contains("waiting"));
  CHECK(took < std::chrono::seconds(10));
  const pid_t background = std::stoi(slurp(dir_ / "src" / "bg.pid"));
  INFO("the build's background sleep was killed with its process group");
  bool gone = false;
  for (int i = 0; i < 100 && !gone; ++i) {
    gone = ::kill(background, 0) != 0;
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CHECK(gone);
}

TEST_CASE_METHOD(BuilderTest, "bad build requests are refused naming the field", "[builder]") {
  CommandBuilder command = builder();
  PrebuiltBuilder prebuilt;
  BuildRequest no_argv = shell("true");
  no_argv.mutable_command()->clear_argv();
  CHECK_THAT(messageOf(command.build(no_argv).status()),
             Catch::StartsWith("command.argv: required"));
  BuildRequest bad_dir = shell("true");
  bad_dir.mutable_command()->set_working_dir((dir_ / "nope").string());
  CHECK_THAT(messageOf(command.build(bad_dir).status()), Catch::StartsWith("command.working_dir:"));
  BuildRequest bad_id = shell("true");
  bad_id.set_deployment_id("../escape");
  CHECK_THAT(messageOf(command.build(bad_id).status()), Catch::StartsWith("deployment_id:"));
  BuildRequest no_name = shell("true");
  no_name.mutable_command()->clear_image_name();
  CHECK_THAT(messageOf(command.build(no_name).status()), Catch::StartsWith("command.image_name:"));
  CHECK_FALSE(std::filesystem::exists(dir_ / "logs" / "dep_1.log"));  // nothing ran
  BuildRequest missing = shell("true");
  missing.mutable_command()->set_argv(0, "no-such-build-tool");
  CHECK_THAT(messageOf(command.build(missing).status()),
             Catch::StartsWith("command.argv[0]: cannot run 'no-such-build-tool'"));
  INFO("the log says why, for kranectl to show");
  CHECK_THAT(slurp(dir_ / "logs" / "dep_1.log"),
             Catch::Contains("cannot run 'no-such-build-tool'"));

  BuildRequest none;
  none.set_deployment_id("dep_1");
  auto which = builderFor(none, prebuilt, command);
  CHECK_THAT(messageOf(which.status()), Catch::StartsWith("source:"));
  none.set_image("app:v1");
  CHECK(*builderFor(none, prebuilt, command) == &prebuilt);
  CHECK(*builderFor(shell("true"), prebuilt, command) == &command);
}

}  // namespace
}  // namespace krane::services::builder
