#include "ipc/inspect.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "ipc/cursor_store.h"
#include "tests/ipc/temp_dir.h"
#include "tests/support/matchers.h"
#include "tests/support/process.h"

namespace krane::ipc {
namespace {

using ::krane::ipc::testing::TempDir;

void populate(const std::string& dir) {
  CursorStoreOptions options;
  options.region = "eu-inspect-1";
  options.max_resources = 1000;
  auto store = CursorStore::open(dir, options);
  REQUIRE_THAT(store, IsOk());
  CursorStore& s = **store;
  REQUIRE(s.advanceWatermark(1234));
  s.recordFullSync(1000, 1'700'000'000'000);
  for (int i = 0; i < 10; ++i) {
    REQUIRE_THAT(s.recordApplied("deployment", std::to_string(i), 7), IsOk());
  }
  const int slot = s.registerPlugin("deployment").value();
  s.setPluginPid(slot, 321);
  s.heartbeat(slot);
  s.ackPlugin(slot, 1230);
  s.countApplied(slot, 10);
  s.recordRestart(slot);
  REQUIRE_THAT(s.park({"sentinel", "s-1", 1200, 5, "spec rejected: \"bad\"\n", 1'700'000'000'500}),
               IsOk());
}

CursorSnapshot snapshotOf(const std::string& dir) {
  CursorStoreOptions options;
  options.mode = OpenMode::kReadOnly;
  auto store = CursorStore::open(dir, options);
  CHECK_THAT(store, IsOk());
  return (*store)->snapshot();
}

TEST_CASE("text shows every section", "[inspect]") {
  TempDir dir;
  populate(dir.path());
  const std::string text = renderText(snapshotOf(dir.path()));
  CHECK_THAT(text, Catch::Contains(dir.file("cursor.store")));
  CHECK_THAT(text, Catch::Contains("eu-inspect-1"));
  CHECK_THAT(text, Catch::Contains("watermark     1234 (advanced "));
  CHECK_THAT(text, Catch::Contains("version 1000 at 2023-11-14T22:13:20.000Z"));
  CHECK_THAT(text, Catch::Contains("10 tracked of max 1000 (1.0 %)"));
  CHECK_THAT(text, Catch::Contains("plugins (1)"));
  CHECK_THAT(text, Catch::Contains("deployment"));
  CHECK_THAT(text, Catch::Contains("321"));
  CHECK_THAT(text, Catch::Contains("parked events (1)"));
  CHECK_THAT(text, Catch::Contains("sentinel/s-1 version 1200, 5 attempts"));
  CHECK_THAT(text, Catch::Contains("last error: spec rejected"));
}

TEST_CASE("json round trips", "[inspect]") {
  TempDir dir;
  populate(dir.path());
  const auto doc = nlohmann::json::parse(renderJson(snapshotOf(dir.path())));
  CHECK(doc["region"] == "eu-inspect-1");
  CHECK(doc["watermark"]["version"] == 1234);
  CHECK(doc["full_sync"]["version"] == 1000);
  CHECK(doc["full_sync"]["at"] == "2023-11-14T22:13:20.000Z");
  CHECK(doc["layout"]["layout_version"] == 1);
  CHECK(doc["layout"]["max_resources"] == 1000);
  CHECK(doc["layout"]["table_entries"] == 2000);
  CHECK(doc["resources"]["tracked"] == 10);
  CHECK(doc["resources"]["scan"]["live"] == 10);
  CHECK(doc["resources"]["scan"]["damaged"] == 0);
  REQUIRE(doc["plugins"].size() == 1u);
  CHECK(doc["plugins"][0]["name"] == "deployment");
  CHECK(doc["plugins"][0]["pid"] == 321);
  CHECK(doc["plugins"][0]["acked_version"] == 1230);
  CHECK(doc["plugins"][0]["restarts"] == 1);
  CHECK(doc["plugins"][0]["heartbeat_age_ms"].is_number());
  REQUIRE(doc["parked"].size() == 1u);
  CHECK(doc["parked"][0]["last_error"] == "spec rejected: \"bad\"\n");
  CHECK(doc["parked"][0]["attempts"] == 5);
}

TEST_CASE("binary prints text json and errors", "[inspect]") {
  TempDir dir;
  populate(dir.path());
  const std::string binary = krane::testing::runfile("ipc/krane-inspect-store");
  auto text = krane::testing::runCommand({binary, "--state-dir", dir.path()});
  INFO(text.err);
  CHECK(text.exit_code == 0);
  CHECK_THAT(text.out, Catch::Contains("parked events (1)"));
  auto json = krane::testing::runCommand({binary, "--state-dir", dir.path(), "--json"});
  INFO(json.err);
  CHECK(json.exit_code == 0);
  CHECK(nlohmann::json::parse(json.out)["watermark"]["version"] == 1234);
  auto help = krane::testing::runCommand({binary, "--help"});
  CHECK(help.exit_code == 0);
  CHECK_THAT(help.out, Catch::Contains("--state-dir"));
  auto missing = krane::testing::runCommand({binary, "--state-dir", dir.file("nowhere")});
  CHECK(missing.exit_code == 1);
  CHECK_THAT(missing.err, Catch::Contains("no cursor store at"));
  // Inspecting never creates anything.
  CHECK_FALSE(std::filesystem::exists(dir.file("nowhere")));
}

}  // namespace
}  // namespace krane::ipc
