#include "ipc/inspect.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "ipc/cursor_store.h"
#include "tests/ipc/temp_dir.h"
#include "tests/support/process.h"

namespace krane::ipc {
namespace {

using ::krane::ipc::testing::TempDir;
using ::testing::HasSubstr;

void populate(const std::string& dir) {
  CursorStoreOptions options;
  options.region = "eu-inspect-1";
  options.max_resources = 1000;
  auto store = CursorStore::open(dir, options);
  ASSERT_TRUE(store.ok()) << store.status();
  CursorStore& s = **store;
  ASSERT_TRUE(s.advanceWatermark(1234));
  s.recordFullSync(1000, 1'700'000'000'000);
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(s.recordApplied("deployment", std::to_string(i), 7).ok());
  }
  const int slot = s.registerPlugin("deployment").value();
  s.setPluginPid(slot, 321);
  s.heartbeat(slot);
  s.ackPlugin(slot, 1230);
  s.countApplied(slot, 10);
  s.recordRestart(slot);
  ASSERT_TRUE(
      s.park({"sentinel", "s-1", 1200, 5, "spec rejected: \"bad\"\n", 1'700'000'000'500}).ok());
}

CursorSnapshot snapshotOf(const std::string& dir) {
  CursorStoreOptions options;
  options.mode = OpenMode::kReadOnly;
  auto store = CursorStore::open(dir, options);
  EXPECT_TRUE(store.ok()) << store.status();
  return (*store)->snapshot();
}

TEST(InspectTest, TextShowsEverySection) {
  TempDir dir;
  populate(dir.path());
  const std::string text = renderText(snapshotOf(dir.path()));
  EXPECT_THAT(text, HasSubstr(dir.file("cursor.store")));
  EXPECT_THAT(text, HasSubstr("eu-inspect-1"));
  EXPECT_THAT(text, HasSubstr("watermark     1234 (advanced "));
  EXPECT_THAT(text, HasSubstr("version 1000 at 2023-11-14T22:13:20.000Z"));
  EXPECT_THAT(text, HasSubstr("10 tracked of max 1000 (1.0 %)"));
  EXPECT_THAT(text, HasSubstr("plugins (1)"));
  EXPECT_THAT(text, HasSubstr("deployment"));
  EXPECT_THAT(text, HasSubstr("321"));
  EXPECT_THAT(text, HasSubstr("parked events (1)"));
  EXPECT_THAT(text, HasSubstr("sentinel/s-1 version 1200, 5 attempts"));
  EXPECT_THAT(text, HasSubstr("last error: spec rejected"));
}

TEST(InspectTest, JsonRoundTrips) {
  TempDir dir;
  populate(dir.path());
  const auto doc = nlohmann::json::parse(renderJson(snapshotOf(dir.path())));
  EXPECT_EQ(doc["region"], "eu-inspect-1");
  EXPECT_EQ(doc["watermark"]["version"], 1234);
  EXPECT_EQ(doc["full_sync"]["version"], 1000);
  EXPECT_EQ(doc["full_sync"]["at"], "2023-11-14T22:13:20.000Z");
  EXPECT_EQ(doc["layout"]["layout_version"], 1);
  EXPECT_EQ(doc["layout"]["max_resources"], 1000);
  EXPECT_EQ(doc["layout"]["table_entries"], 2000);
  EXPECT_EQ(doc["resources"]["tracked"], 10);
  EXPECT_EQ(doc["resources"]["scan"]["live"], 10);
  EXPECT_EQ(doc["resources"]["scan"]["damaged"], 0);
  ASSERT_EQ(doc["plugins"].size(), 1u);
  EXPECT_EQ(doc["plugins"][0]["name"], "deployment");
  EXPECT_EQ(doc["plugins"][0]["pid"], 321);
  EXPECT_EQ(doc["plugins"][0]["acked_version"], 1230);
  EXPECT_EQ(doc["plugins"][0]["restarts"], 1);
  EXPECT_TRUE(doc["plugins"][0]["heartbeat_age_ms"].is_number());
  ASSERT_EQ(doc["parked"].size(), 1u);
  EXPECT_EQ(doc["parked"][0]["last_error"], "spec rejected: \"bad\"\n");
  EXPECT_EQ(doc["parked"][0]["attempts"], 5);
}

TEST(InspectTest, BinaryPrintsTextJsonAndErrors) {
  TempDir dir;
  populate(dir.path());
  const std::string binary = krane::testing::runfile("ipc/krane-inspect-store");
  auto text = krane::testing::runCommand({binary, "--state-dir", dir.path()});
  EXPECT_EQ(text.exit_code, 0) << text.err;
  EXPECT_THAT(text.out, HasSubstr("parked events (1)"));
  auto json = krane::testing::runCommand({binary, "--state-dir", dir.path(), "--json"});
  EXPECT_EQ(json.exit_code, 0) << json.err;
  EXPECT_EQ(nlohmann::json::parse(json.out)["watermark"]["version"], 1234);
  auto help = krane::testing::runCommand({binary, "--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_THAT(help.out, HasSubstr("--state-dir"));
  auto missing = krane::testing::runCommand({binary, "--state-dir", dir.file("nowhere")});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_THAT(missing.err, HasSubstr("no cursor store at"));
  // Inspecting never creates anything.
  EXPECT_FALSE(std::filesystem::exists(dir.file("nowhere")));
}

}  // namespace
}  // namespace krane::ipc
